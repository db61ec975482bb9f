//! What `fsdpc train` writes after training: the trained parameters as
//! safetensors, as a Hugging Face directory, or back into the ONNX model.

use super::train::TrainArgs;
use super::{print_out, CliError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Writes the trained parameters where `--save-onnx`/`--save-safetensors` ask,
/// with rank 0's module buffers (running statistics) beside them.
pub(super) fn save(
    a: &TrainArgs,
    plan: &fsdpc_plan::Plan,
    params: &[(String, Vec<f32>)],
    buffers: &[(String, Vec<f32>)],
    hf_config: Option<(serde_json::Value, Vec<PathBuf>)>,
) -> Result<(), CliError> {
    let with_buffers: Vec<(String, Vec<f32>)> = params.iter().chain(buffers).cloned().collect();
    let buffer_note = match buffers.len() {
        0 => String::new(),
        n => format!(", {n} module buffers"),
    };
    if let Some(out) = &a.save_safetensors {
        fsdpc_runtime::export::save_params(plan, &with_buffers, out)?;
        print_out(&format!(
            "wrote {} ({} parameters{buffer_note})\n",
            out.display(),
            params.len()
        ))?;
    }
    if let (Some(out), Some(config)) = (&a.save_hf, hf_config) {
        save_hf(plan, params, config, out)?;
    }
    if let Some(out) = &a.save_onnx {
        let map: HashMap<String, Vec<f32>> = with_buffers.into_iter().collect();
        let s = fsdpc_frontends::onnx::write_with_params(Path::new(&a.model), &map, out)?;
        let ext = s
            .external_data
            .map(|p| format!(", data in {}", p.display()))
            .unwrap_or_default();
        print_out(&format!(
            "wrote {} ({} initializers updated{ext})\n",
            out.display(),
            s.replaced
        ))?;
    }
    Ok(())
}

/// Writes the Hugging Face directory `out` of the trained `params`.
fn save_hf(
    plan: &fsdpc_plan::Plan,
    params: &[(String, Vec<f32>)],
    (config, companions): (serde_json::Value, Vec<PathBuf>),
    out: &Path,
) -> Result<(), CliError> {
    let io = |path: &Path, source| CliError::Io {
        path: path.display().to_string(),
        source,
    };
    std::fs::create_dir_all(out).map_err(|e| io(out, e))?;
    let shapes: HashMap<&str, Vec<usize>> = plan
        .training
        .graph
        .params
        .iter()
        .map(|p| (p.name.as_str(), p.whole().ty.shape.dims().to_vec()))
        .collect();
    let mut params = params.to_vec();
    let merged = fsdpc_frontends::hf::merge_lora(&mut params, |n| shapes.get(n).cloned())
        .map_err(|e| CliError::Usage(format!("--save-hf: {e}")))?;
    fsdpc_runtime::export::save_params(plan, &params, &out.join("model.safetensors"))?;
    let text = serde_json::to_string_pretty(&config).expect("a JSON value serialises") + "\n";
    let cfg = out.join("config.json");
    std::fs::write(&cfg, text).map_err(|e| io(&cfg, e))?;
    for f in companions {
        let to = out.join(f.file_name().expect("a file"));
        std::fs::copy(&f, &to).map_err(|e| io(&to, e))?;
    }
    let lora = if merged > 0 {
        format!(", {merged} LoRA adapters merged")
    } else {
        String::new()
    };
    print_out(&format!(
        "wrote {} (Hugging Face directory: config.json, model.safetensors with {} tensors{lora})\n",
        out.display(),
        params.len()
    ))
}
