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
    let zoo =
        config::zoo_config(&config, seq, batch, lora).map_err(|reason| FrontendError::HfModel {
            path: file.clone(),
            reason,
        })?;
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

/// What `fsdpc train --save-hf` writes beside the weights: the
/// `config.json` (the source directory's own for `hf:` models, else one
/// written from the zoo config: Llama family and GPT-2) and the source
/// directory's files a saved model keeps (tokenizer and generation
/// settings; none for a zoo model).
pub fn saved_config(model: &str) -> Result<(Value, Vec<PathBuf>), FrontendError> {
    if let Some(rest) = model.strip_prefix("hf:") {
        let m = parse(rest)?;
        let companions = [
            "generation_config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "tokenizer.model",
            "special_tokens_map.json",
            "vocab.json",
            "merges.txt",
        ]
        .iter()
        .map(|f| m.dir.join(f))
        .filter(|p| p.is_file())
        .collect();
        return Ok((m.config, companions));
    }
    let cfg = zoo::parse(model)?;
    let config = config::hf_config(&cfg).ok_or_else(|| {
        FrontendError::bad_spec(
            model,
            "--save-hf writes Llama-family, GPT-2 and hf: models; this family has no Hugging Face config here",
        )
    })?;
    Ok((config, Vec::new()))
}

/// Folds LoRA adapters into the weights they adapt (`W += B A` for the
/// `[out, in]` layouts of the Llama family, `W += A B` for GPT-2's `[in,
/// out]`; scaling 1) and drops them, so `params` are the Hugging Face
/// model's. `shape` gives a parameter's shape by name.
pub fn merge_lora(
    params: &mut Vec<(String, Vec<f32>)>,
    shape: impl Fn(&str) -> Option<Vec<usize>>,
) -> Result<usize, String> {
    let adapters: Vec<String> = params
        .iter()
        .filter_map(|(n, _)| n.strip_suffix(".lora_A").map(str::to_string))
        .collect();
    for module in &adapters {
        let get = |leaf: &str| -> Result<(usize, Vec<usize>), String> {
            let name = format!("{module}.{leaf}");
            let i = params
                .iter()
                .position(|(n, _)| *n == name)
                .ok_or_else(|| format!("`{name}` is missing"))?;
            let s = shape(&name).ok_or_else(|| format!("`{name}` has no shape"))?;
            Ok((i, s))
        };
        let (ia, sa) = get("lora_A")?;
        let (ib, sb) = get("lora_B")?;
        let (iw, sw) = get("weight")?;
        let (a, b) = (params[ia].1.clone(), params[ib].1.clone());
        let w = &mut params[iw].1;
        let gpt = module.starts_with("transformer.");
        match (gpt, sa.as_slice(), sb.as_slice(), sw.as_slice()) {
            // Llama family: A [r, in], B [out, r], W [out, in].
            (false, &[r, fan_in], &[out, r2], &[wo, wi])
                if r == r2 && wo == out && wi == fan_in =>
            {
                for o in 0..out {
                    for i in 0..fan_in {
                        let d: f32 = (0..r).map(|k| b[o * r + k] * a[k * fan_in + i]).sum();
                        w[o * fan_in + i] += d;
                    }
                }
            }
            // GPT-2: A [in, r], B [r, out], W [in, out].
            (true, &[fan_in, r], &[r2, out], &[wi, wo]) if r == r2 && wi == fan_in && wo == out => {
                for i in 0..fan_in {
                    for o in 0..out {
                        let d: f32 = (0..r).map(|k| a[i * r + k] * b[k * out + o]).sum();
                        w[i * out + o] += d;
                    }
                }
            }
            _ => {
                return Err(format!(
                    "the adapter of `{module}` ({sa:?} x {sb:?}) does not fit its weight {sw:?}"
                ))
            }
        }
    }
    params.retain(|(n, _)| !n.ends_with(".lora_A") && !n.ends_with(".lora_B"));
    Ok(adapters.len())
}
