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
    /// A Hugging Face model directory (`hf:PATH`) that cannot be built or
    /// whose weights do not fit the model its config describes.
    #[error("`{}`: {reason}", .path.display())]
    HfModel {
        /// The directory or file.
        path: PathBuf,
        /// What is wrong, naming the field, file or tensor.
        reason: String,
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
    /// An ONNX file that cannot be decoded (truncated, corrupt, not ONNX).
    #[error("`{}` is not a readable ONNX model: {reason}", .path.display())]
    OnnxDecode {
        /// The file.
        path: PathBuf,
        /// What the decoder said.
        reason: String,
    },
    /// An ONNX model whose default-domain opset is outside what fsdpc reads.
    #[error(
        "`{}` uses ONNX opset {version}; fsdpc reads opsets {min} to {max}: re-export with \
         `torch.onnx.export(..., opset_version={max})`",
        .path.display()
    )]
    OnnxOpset {
        /// The file.
        path: PathBuf,
        /// The model's opset.
        version: i64,
        /// Oldest opset read.
        min: i64,
        /// Newest opset read.
        max: i64,
    },
    /// An ONNX tensor (initializer or constant) whose data is unusable.
    #[error("`{}`: tensor `{tensor}`: {reason}", .path.display())]
    OnnxTensor {
        /// The file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// What is wrong.
        reason: String,
    },
    /// External data of an ONNX tensor that cannot be read.
    #[error(
        "`{}`: tensor `{tensor}` keeps its data in `{}`, which cannot be read: {reason} \
         (external data files must sit next to the model)",
        .path.display(), .file.display()
    )]
    OnnxExternalData {
        /// The model file.
        path: PathBuf,
        /// The tensor's name.
        tensor: String,
        /// The external data file.
        file: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// ONNX ops the importer does not map; every one found is listed.
    #[error(
        "`{}` uses ops fsdpc cannot import: {}",
        .path.display(),
        .ops.iter().map(|o| o.to_string()).collect::<Vec<_>>().join("; ")
    )]
    UnsupportedOps {
        /// The file.
        path: PathBuf,
        /// Each unsupported op with the first node that uses it.
        ops: Vec<UnsupportedOp>,
    },
    /// Symbolic dimensions of the model's inputs with no value.
    #[error(
        "`{}` has symbolic dimensions with no value: {}; bind each with `--dim NAME=SIZE` \
         (LoadOptions::dims)",
        .path.display(), .dims.join(", ")
    )]
    UnboundDims {
        /// The file.
        path: PathBuf,
        /// Each unbound dimension and where it occurs (`seq (input ids, axis 1)`).
        dims: Vec<String>,
    },
    /// An ONNX node that cannot be converted.
    #[error("`{}`: node `{node}` ({op}): {reason}", .path.display())]
    OnnxNode {
        /// The file.
        path: PathBuf,
        /// The node's name (or its first output when unnamed).
        node: String,
        /// The ONNX op type.
        op: String,
        /// What is wrong.
        reason: String,
    },
    /// Types the import derived that differ from those the file declares.
    #[error(
        "`{}`: the import disagrees with the types the file declares (an fsdpc bug; \
         please report it with the model): {}",
        .path.display(), .mismatches.join("; ")
    )]
    OnnxTypeMismatch {
        /// The file.
        path: PathBuf,
        /// Each value whose type differs, with both types.
        mismatches: Vec<String>,
    },
    /// An ONNX model that imported but cannot be trained as it is.
    #[error("`{}`: {reason}", .path.display())]
    OnnxModel {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
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

/// One ONNX op that the importer does not map.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnsupportedOp {
    /// The op type (`NonZero`), with its domain when not the default one.
    pub op: String,
    /// The first node that uses it.
    pub node: String,
    /// The model's opset for the op's domain.
    pub opset: i64,
}

impl std::fmt::Display for UnsupportedOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (node `{}`, opset {})",
            self.op, self.node, self.opset
        )
    }
}
