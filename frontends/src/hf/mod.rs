//! A Hugging Face model directory as a model: `hf:PATH` (the directory or
//! its `config.json`), optionally followed by `:seq=N,batch=N,lora=R`
//! (`hf:models/llama3-8b:seq=2048,batch=2`). The config builds the zoo
//! model of its `model_type` (`config.rs`); the directory's safetensors
//! weights, when it has any, become the parameters' initial values without
//! being read (`weights.rs`).

pub mod config;
mod weights;

use crate::error::FrontendError;
use crate::zoo::{self, spec::Spec, ZooConfig, ZooModel};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// The keys `hf:PATH:...` accepts.
const KEYS: &[&str] = &["seq", "batch", "lora"];

/// A parsed `hf:` model: the directory, its config and the zoo config built
/// from them.
pub struct HfModel {
    /// The model directory.
    pub dir: PathBuf,
    /// `config.json` as read.
    pub config: Value,
    /// The zoo config it describes (with `seq`, `batch` and `lora` set).
    pub zoo: ZooConfig,
}

/// Splits `PATH[:key=value,...]`: options follow the last `:` when what
/// follows it contains `=`.
fn split(text: &str) -> (&str, Option<&str>) {
    match text.rsplit_once(':') {
        Some((path, opts)) if opts.contains('=') => (path, Some(opts)),
        _ => (text, None),
    }
}

/// Reads the directory and config of `text` (what follows `hf:`).
pub fn parse(text: &str) -> Result<HfModel, FrontendError> {
    let (path, opts) = split(text.trim());
    let bad = |reason: String| FrontendError::HfModel {
        path: PathBuf::from(path),
        reason,
    };
    let given = Path::new(path);
    let (dir, file) = if given.is_dir() {
        (given.to_path_buf(), given.join("config.json"))
    } else if given.file_name().is_some_and(|n| n == "config.json") {
        (
            given.parent().unwrap_or(Path::new(".")).to_path_buf(),
            given.to_path_buf(),
        )
    } else {
        return Err(bad(
            "not a model directory or its config.json (hf:PATH takes a Hugging Face model directory)"
                .into(),
        ));
    };
    let text_json = std::fs::read_to_string(&file).map_err(|source| FrontendError::Io {
        path: file.clone(),
        source,
    })?;
    let config: Value = serde_json::from_str(&text_json)
        .map_err(|e| bad(format!("`{}` is not JSON: {e}", file.display())))?;
    let spec_text = format!("hf:{}", opts.unwrap_or(""));
    let mut spec = Spec::parse(&spec_text)?;
    let seq = spec.size("seq")?;
    let batch = spec.size("batch")?.unwrap_or(1);
    let lora = spec.size("lora")?.unwrap_or(0);
    spec.finish(KEYS)?;
    let zoo = config::zoo_config(&config, seq, batch, lora)
        .map_err(|e| bad(format!("{}: {e}", file.display())))?;
    Ok(HfModel { dir, config, zoo })
}

/// Builds the model `hf:{text}` names, its parameters pointing at the
/// directory's weights when it has them. Returns the model and the number
/// of checkpoint tensors it reads (`None`: no weights, random init).
pub fn build(text: &str) -> Result<(ZooModel, Option<usize>), FrontendError> {
    let m = parse(text)?;
    let name = format!("hf:{}", text.trim());
    let mut model = zoo::build_config(&name, &m.zoo)?;
    let tensors =
        weights::attach(&m.dir, &mut model.graph).map_err(|reason| FrontendError::HfModel {
            path: m.dir.clone(),
            reason,
        })?;
    Ok((model, tensors))
}
