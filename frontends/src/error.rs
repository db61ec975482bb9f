//! The frontend's error type: every way a model description, file or spec can
//! be rejected, with the fields a caller needs to tell the user what to fix.

use fsdpc_ir::IrError;
use std::path::PathBuf;
use thiserror::Error;

/// An error of a frontend (zoo spec, fsdpc IR JSON or ONNX import).
#[derive(Debug, Error)]
pub enum FrontendError {
    /// A zoo spec (`gpt:layers=12,...`) that cannot be built.
    #[error("invalid model spec `{spec}`: {reason}")]
    BadSpec {
        /// The spec as the user wrote it.
        spec: String,
        /// What is wrong and what is allowed.
        reason: String,
    },
    /// A model name that is neither a preset, a family spec nor a file.
    #[error(
        "unknown model `{name}`: known presets are {}; a family spec looks like \
         `gpt:layers=12,hidden=768,heads=12,seq=1024,vocab=50257` or \
         `mlp:layers=3,in=64,hidden=256,classes=10`; a file must end in `.json` or `.onnx`",
        .known.join(", ")
    )]
    UnknownPreset {
        /// The name that was not recognised.
        name: String,
        /// Every preset name the zoo knows.
        known: Vec<String>,
    },
    /// A file that could not be read.
    #[error("cannot read `{}`: {source}", .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A JSON file that is not valid fsdpc IR; `line`/`column` are 1-based
    /// (0 when the problem has no position, e.g. an empty file).
    #[error("`{}`:{line}:{column}: not a valid fsdpc IR file: {reason}", .path.display())]
    Json {
        /// The file.
        path: PathBuf,
        /// Line of the problem (1-based).
        line: usize,
        /// Column of the problem (1-based).
        column: usize,
        /// serde's description of the problem.
        reason: String,
    },
    /// A graph or program that parsed but is not usable (no scalar loss, dangling
    /// references). All problems found are listed.
    #[error("`{}` is not a usable model: {}", .path.display(), .problems.join("; "))]
    BadGraph {
        /// The file.
        path: PathBuf,
        /// Every problem found, each naming where it is.
        problems: Vec<String>,
    },
    /// A model file of a kind fsdpc does not read.
    #[error(
        "`{}` is not a format fsdpc reads: use an ONNX file (`.onnx`, e.g. from \
         `torch.onnx.export`), an fsdpc IR file (`.json`) or a zoo spec",
        .path.display()
    )]
    UnsupportedFormat {
        /// The file.
        path: PathBuf,
    },
    /// ONNX import was requested but is not available in this build.
    #[error("ONNX import is not available yet (`{}`); use a zoo spec or an fsdpc IR `.json` file", .path.display())]
    OnnxUnavailable {
        /// The ONNX file.
        path: PathBuf,
    },
    /// The IR rejected the graph (a shape rule failed, autodiff failed).
    #[error(transparent)]
    Ir(#[from] IrError),
}

impl FrontendError {
    /// A `BadSpec` for `spec` with `reason`.
    pub(crate) fn bad_spec(spec: &str, reason: impl Into<String>) -> FrontendError {
        FrontendError::BadSpec {
            spec: spec.to_string(),
            reason: reason.into(),
        }
    }
}
