//! `fsdpc export CHECKPOINT_DIR -o model.safetensors [--save-onnx OUT.onnx
//! --model MODEL.onnx]`: the full parameters of the latest checkpoint in a
//! directory, under their original names, after every file is verified.

use super::{print_out, CliError};
use clap::Args;
use fsdpc_runtime::checkpoint::Checkpoint;
use std::collections::HashMap;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ExportArgs {
    /// A checkpoint directory written by `fsdpc train --checkpoint-dir`.
    pub dir: PathBuf,
    /// Write every parameter (f32, original names) to this safetensors
    /// file, one parameter at a time.
    #[arg(short, long, value_name = "OUT.safetensors")]
    pub output: Option<PathBuf>,
    /// Write the ONNX model given by --model with its initializers replaced
    /// by the checkpoint's parameters.
    #[arg(long, value_name = "OUT.onnx", requires = "model")]
    pub save_onnx: Option<PathBuf>,
    /// The ONNX model the checkpoint was trained from (for --save-onnx).
    #[arg(long, value_name = "MODEL.onnx", requires = "save_onnx")]
    pub model: Option<PathBuf>,
}

pub fn run(a: ExportArgs) -> Result<(), CliError> {
    if a.output.is_none() && a.save_onnx.is_none() {
        return Err(CliError::Usage(
            "say what to write: -o OUT.safetensors and/or --save-onnx OUT.onnx --model MODEL.onnx"
                .into(),
        ));
    }
    let ckpt = Checkpoint::open(&a.dir).map_err(fsdpc_runtime::RuntimeError::from)?;
    let step = ckpt.manifest.step;
    if let Some(out) = &a.output {
        let n = ckpt
            .export_safetensors(out)
            .map_err(fsdpc_runtime::RuntimeError::from)?;
        print_out(&format!(
            "wrote {} ({n} tensors, step {step})\n",
            out.display()
        ))?;
    }
    if let (Some(out), Some(model)) = (&a.save_onnx, &a.model) {
        // The ONNX write-back takes every parameter at once.
        let mut params = HashMap::new();
        for p in ckpt.params() {
            let v = ckpt
                .param_values(p)
                .map_err(fsdpc_runtime::RuntimeError::from)?;
            params.insert(p.name.clone(), v);
        }
        for b in &ckpt.manifest.buffers {
            let v = ckpt
                .buffer_values(&b.name)
                .map_err(fsdpc_runtime::RuntimeError::from)?;
            params.insert(b.name.clone(), v);
        }
        let s = fsdpc_frontends::onnx::write_with_params(model, &params, out)?;
        print_out(&format!(
            "wrote {} ({} initializers updated, step {step})\n",
            out.display(),
            s.replaced
        ))?;
    }
    Ok(())
}
