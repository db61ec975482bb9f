//! `Constant`: copies the literal into the output.

use crate::error::KResult;
use crate::tensor::TensorMut;
use fsdpc_ir::TensorData;

/// `Constant { value }`.
pub fn constant(value: &TensorData, y: &mut TensorMut) -> KResult<()> {
    if value.ty != *y.ty || value.bytes.len() != y.bytes.len() {
        crate::kbail!(
            "constant literal {} does not match the output {}",
            value.ty,
            y.ty
        );
    }
    y.bytes.copy_from_slice(&value.bytes);
    Ok(())
}
