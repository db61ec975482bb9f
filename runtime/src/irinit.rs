//! The IR's counter-based generators (parameter init and dropout masks),
//! named in one place so the runtime's use of them is easy to find.

use crate::error::RuntimeError;
use fsdpc_ir::{DType, Init};
use std::path::Path;

/// Whether element `element` of a dropout at `step` is kept.
pub fn dropout_keep(seed: u64, step: u64, element: u64, p: f64) -> bool {
    fsdpc_ir::init::dropout_keep(seed, step, element, p)
}

/// Fills `out` with elements `start..start + out.len()` of parameter `spec`'s
/// initial value: from the IR's generators, or for a checkpoint tensor
/// (`Init::File`) from its file, mapped and read over those elements only.
pub fn fill_f32(
    spec: &fsdpc_ir::ParamSpec,
    seed: u64,
    start: u64,
    out: &mut [f32],
) -> Result<(), RuntimeError> {
    if let Init::File {
        path,
        tensor,
        dtype,
        offset,
    } = &spec.init
    {
        return read_elements(Path::new(path), *dtype, *offset, start, out).map_err(|reason| {
            RuntimeError::plan(format!(
                "loading parameter `{}` from tensor `{tensor}` of `{path}`: {reason}",
                spec.name
            ))
        });
    }
    fsdpc_ir::init::fill_f32(spec, seed, start, out)
        .map_err(|e| RuntimeError::plan(format!("initialising `{}`: {e}", spec.name)))
}

/// Reads elements `start..start + out.len()` of the row-major `dtype`
/// tensor at byte `offset` of `path` as f32. The map is dropped on return,
/// so only the pages of these elements were ever resident.
fn read_elements(
    path: &Path,
    dtype: DType,
    offset: u64,
    start: u64,
    out: &mut [f32],
) -> Result<(), String> {
    let size = dtype.size() as u64;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let begin = offset + start * size;
    let end = begin + out.len() as u64 * size;
    if end > len {
        return Err(format!(
            "the file has {len} bytes, the elements end at byte {end} (changed since the plan was made?)"
        ));
    }
    if out.is_empty() {
        return Ok(());
    }
    // SAFETY: the map is read-only and private to this call; a checkpoint
    // changed underneath a running job is outside what can be guarded.
    let map = unsafe {
        memmap2::MmapOptions::new()
            .offset(begin)
            .len((end - begin) as usize)
            .map(&file)
    }
    .map_err(|e| e.to_string())?;
    let bytes = &map[..];
    match dtype {
        DType::F32 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(4)) {
                *o = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::Bf16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::bf16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        DType::F16 => {
            for (o, c) in out.iter_mut().zip(bytes.chunks_exact(2)) {
                *o = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
            }
        }
        other => return Err(format!("elements of dtype {other} are not parameters")),
    }
    Ok(())
}
