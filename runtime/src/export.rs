//! Exporting trained parameters: a safetensors file holding every parameter
//! as f32 under its original name (what `zero_to_fp32.py` and a full
//! `StateDictType.FULL` state dict give FSDP users), written atomically
//! (`fsdpc_ir::fs::write_atomic`: a temporary file in the target's
//! directory, synced, renamed over it, the directory synced).

use crate::error::RuntimeError;
use fsdpc_plan::Plan;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::HashMap;
use std::path::Path;

/// One tensor to export: its name, shape and f32 values (row-major).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExportTensor<'a> {
    /// The parameter's original name (`h.0.attn.c_attn.weight`).
    pub name: &'a str,
    /// Its shape; the product must equal `data.len()`.
    pub shape: &'a [usize],
    /// Its values.
    pub data: &'a [f32],
}

/// Writes `tensors` to the safetensors file `path` (F32, names kept).
pub fn save_safetensors(tensors: &[ExportTensor<'_>], path: &Path) -> Result<(), RuntimeError> {
    let err = |reason: String| RuntimeError::Io {
        path: path.display().to_string(),
        reason,
    };
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|t| bytemuck::cast_slice::<f32, u8>(t.data).to_vec())
        .collect();
    let mut views = Vec::with_capacity(tensors.len());
    for (t, b) in tensors.iter().zip(&bytes) {
        let view = TensorView::new(Dtype::F32, t.shape.to_vec(), b)
            .map_err(|e| err(format!("tensor `{}`: {e}", t.name)))?;
        views.push((t.name, view));
    }
    let out = safetensors::serialize(views, None).map_err(|e| err(e.to_string()))?;
    fsdpc_ir::fs::write_atomic(path, &out).map_err(|e| err(e.to_string()))
}

/// Writes the trained `params` (as `TrainReport::final_params` gives them,
/// and module buffers as `final_buffers` does) of `plan` to `path`, each
/// with its shape in the plan's training graph (the whole parameter's, for
/// one split over a tensor group).
pub fn save_params(
    plan: &Plan,
    params: &[(String, Vec<f32>)],
    path: &Path,
) -> Result<(), RuntimeError> {
    let wholes: Vec<fsdpc_ir::ParamSpec> = plan
        .training
        .graph
        .params
        .iter()
        .map(|p| p.whole())
        .collect();
    let shapes: HashMap<&str, &[usize]> = wholes
        .iter()
        .map(|p| (p.name.as_str(), p.ty.shape.dims()))
        .chain(
            plan.training
                .graph
                .buffers
                .iter()
                .map(|b| (b.name.as_str(), b.ty.shape.dims())),
        )
        .collect();
    let tensors = params
        .iter()
        .map(|(name, data)| {
            let shape = shapes.get(name.as_str()).ok_or_else(|| RuntimeError::Io {
                path: path.display().to_string(),
                reason: format!("parameter or buffer `{name}` is not in the plan's training graph"),
            })?;
            Ok(ExportTensor { name, shape, data })
        })
        .collect::<Result<Vec<_>, RuntimeError>>()?;
    save_safetensors(&tensors, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_through_the_safetensors_crate() {
        let dir = std::env::temp_dir().join(format!("fsdpc-export-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
        let path = dir.join("p.safetensors");
        let (a, b) = ([1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [0.5f32]);
        let ts = [
            ExportTensor {
                name: "w",
                shape: &[2, 3],
                data: &a,
            },
            ExportTensor {
                name: "b.bias",
                shape: &[1],
                data: &b,
            },
        ];
        save_safetensors(&ts, &path).unwrap_or_else(|e| panic!("{e}"));
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{e}"));
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{e}"));
        let w = st.tensor("w").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.shape(), &[2, 3]);
        assert_eq!(w.data(), bytemuck::cast_slice::<f32, u8>(&a));
        assert_eq!(st.names().len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_wrong_shape_is_an_error() {
        let path = std::env::temp_dir().join("fsdpc-export-never-written.safetensors");
        let ts = [ExportTensor {
            name: "w",
            shape: &[2, 2],
            data: &[1.0],
        }];
        assert!(save_safetensors(&ts, &path).is_err());
        assert!(!path.exists());
    }
}
