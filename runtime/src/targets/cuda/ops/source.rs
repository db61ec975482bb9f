//! `Constant`: a source op, its bytes uploaded into the output (inputs
//! and parameters are not kernels: the dispatch refuses them).

use super::{out1, Action, Operand, R};
use fsdpc_ir::TensorData;

/// `Constant { value }`: the value copied from the host into the output.
pub(super) fn constant(value: &TensorData, ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let y = out1(ys)?;
    if value.ty != *y.ty || value.bytes.len() as u64 != y.ty.bytes() {
        return Err(format!(
            "constant {} does not match the output {}",
            value.ty, y.ty
        ));
    }
    a.push(Action::Upload {
        dst: y.ptr,
        bytes: value.bytes.clone(),
    });
    Ok(())
}
