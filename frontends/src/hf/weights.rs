//! A Hugging Face directory's safetensors weights as parameter inits: the
//! headers of `model.safetensors` (or of every shard a
//! `model.safetensors.index.json` names) are read from memory maps, which
//! touch the header pages only, and every parameter becomes an
//! `Init::File` pointing at its bytes, so each rank later reads its own
//! shard alone. Names are the Hugging Face ones the zoo gives parameters;
//! a missing, extra or mis-shaped tensor is an error naming it.

use fsdpc_ir::{DType, Graph, Init};
use safetensors::{Dtype, SafeTensors};
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// One checkpoint tensor: its file, dtype, shape and first byte.
struct Stored {
    file: PathBuf,
    dtype: Dtype,
    shape: Vec<usize>,
    offset: u64,
}

/// Checkpoint tensors `transformers` saves that are not parameters.
fn ignorable(name: &str) -> bool {
    name.ends_with("rotary_emb.inv_freq")
        || name.ends_with(".attn.bias")
        || name.ends_with(".attn.masked_bias")
}

/// The safetensors files of `dir`: the shards its index names, else
/// `model.safetensors`; none when it has neither.
fn files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let text = std::fs::read_to_string(&index)
            .map_err(|e| format!("cannot read `{}`: {e}", index.display()))?;
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| format!("`{}` is not JSON: {e}", index.display()))?;
        let map = v
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| format!("`{}` has no `weight_map` object", index.display()))?;
        let mut out: Vec<PathBuf> = Vec::new();
        for (tensor, file) in map {
            let file = file.as_str().ok_or_else(|| {
                format!(
                    "`{}`: the file of `{tensor}` is not a string",
                    index.display()
                )
            })?;
            let path = dir.join(file);
            if !out.contains(&path) {
                out.push(path);
            }
        }
        return Ok(out);
    }
    let single = dir.join("model.safetensors");
    Ok(if single.is_file() {
        vec![single]
    } else {
        vec![]
    })
}

/// Every tensor of `files`, by name.
fn read_headers(files: &[PathBuf]) -> Result<BTreeMap<String, Stored>, String> {
    let mut out = BTreeMap::new();
    for path in files {
        let file = std::fs::File::open(path)
            .map_err(|e| format!("cannot open `{}`: {e}", path.display()))?;
        // SAFETY: read-only; only the header is read, and the map is dropped here.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .map_err(|e| format!("cannot map `{}`: {e}", path.display()))?;
        let (n, meta) = SafeTensors::read_metadata(&map)
            .map_err(|e| format!("`{}` is not a safetensors file: {e}", path.display()))?;
        let data_start = 8 + n as u64;
        let abs = std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
        for (name, info) in meta.tensors() {
            let stored = Stored {
                file: abs.clone(),
                dtype: info.dtype,
                shape: info.shape.clone(),
                offset: data_start + info.data_offsets.0 as u64,
            };
            if out.insert(name.clone(), stored).is_some() {
                return Err(format!(
                    "tensor `{name}` is stored twice (again in `{}`)",
                    path.display()
                ));
            }
        }
    }
    Ok(out)
}

/// Points every parameter of `graph` at its tensor in `dir`'s safetensors
/// files. Returns the number of tensors used, or `None` when `dir` has no
/// weights (the parameters keep their random init). LoRA adapters are new
/// and keep theirs.
pub fn attach(dir: &Path, graph: &mut Graph) -> Result<Option<usize>, String> {
    let files = files(dir)?;
    if files.is_empty() {
        return Ok(None);
    }
    let stored = read_headers(&files)?;
    let mut used: HashSet<&str> = HashSet::new();
    let mut missing = Vec::new();
    for p in &mut graph.params {
        if p.name.contains(".lora_") {
            continue;
        }
        // GPT-2 checkpoints of the original release omit `transformer.`.
        let found = [
            p.name.as_str(),
            p.name.strip_prefix("transformer.").unwrap_or(""),
        ]
        .into_iter()
        .find_map(|n| stored.get_key_value(n));
        let Some((name, t)) = found else {
            missing.push(p.name.clone());
            continue;
        };
        let want = p.ty.shape.dims();
        if t.shape != want {
            return Err(format!(
                "tensor `{name}` in `{}` has shape {:?}; the model's parameter `{}` is {:?}",
                t.file.display(),
                t.shape,
                p.name,
                want
            ));
        }
        let dtype = match t.dtype {
            Dtype::F32 => DType::F32,
            Dtype::F16 => DType::F16,
            Dtype::BF16 => DType::Bf16,
            other => {
                return Err(format!(
                    "tensor `{name}` in `{}` is {other:?}; parameters load from F32, F16 or BF16",
                    t.file.display()
                ))
            }
        };
        p.init = Init::File {
            path: t.file.display().to_string(),
            tensor: name.clone(),
            dtype,
            offset: t.offset,
        };
        used.insert(name.as_str());
    }
    if !missing.is_empty() {
        return Err(format!(
            "{} parameter(s) have no tensor in `{}`: {}",
            missing.len(),
            dir.display(),
            list(&missing)
        ));
    }
    // Copies of a tied tensor some exporters save: a tied head is the
    // embedding, T5's stacks' embeddings are `shared.weight`.
    let has = |name: &str| graph.params.iter().any(|p| p.name == name);
    let tied_copy = |n: &str| match n {
        "lm_head.weight" => !has("lm_head.weight"),
        "encoder.embed_tokens.weight" | "decoder.embed_tokens.weight" => has("shared.weight"),
        _ => false,
    };
    let extra: Vec<String> = stored
        .keys()
        .filter(|n| !used.contains(n.as_str()) && !ignorable(n) && !tied_copy(n))
        .cloned()
        .collect();
    if !extra.is_empty() {
        return Err(format!(
            "{} tensor(s) in `{}` are not parameters of the model its config.json describes: {}",
            extra.len(),
            dir.display(),
            list(&extra)
        ));
    }
    Ok(Some(used.len()))
}

/// The first few of `names`, and how many more.
fn list(names: &[String]) -> String {
    let shown: Vec<&str> = names.iter().take(5).map(String::as_str).collect();
    let more = names.len().saturating_sub(5);
    if more > 0 {
        format!("{} and {more} more", shown.join(", "))
    } else {
        shown.join(", ")
    }
}
