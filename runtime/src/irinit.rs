//! The IR's counter-based generators (parameter init and dropout masks),
//! named in one place so the runtime's use of them is easy to find.

use crate::error::RuntimeError;

/// Whether element `element` of a dropout at `step` is kept.
pub fn dropout_keep(seed: u64, step: u64, element: u64, p: f64) -> bool {
    fsdpc_ir::init::dropout_keep(seed, step, element, p)
}

/// Fills `out` with elements `start..start + out.len()` of parameter `spec`'s
/// initial value.
pub fn fill_f32(
    spec: &fsdpc_ir::ParamSpec,
    seed: u64,
    start: u64,
    out: &mut [f32],
) -> Result<(), RuntimeError> {
    fsdpc_ir::init::fill_f32(spec, seed, start, out)
        .map_err(|e| RuntimeError::plan(format!("initialising `{}`: {e}", spec.name)))
}
