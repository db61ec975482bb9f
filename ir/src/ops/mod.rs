//! Per-op rules, dispatched by op family: output types (shape and dtype
//! inference), vector-Jacobian products and FLOP counts.

use crate::op::Op;
use crate::types::TensorType;

/// Output types of `op` applied to inputs of types `inputs`. The error is a
/// reason; the caller adds the node's name.
pub fn infer(op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    match op {
        Op::Constant { value } => Ok(vec![value.ty.clone()]),
        _ => Err(format!(
            "no shape rule for `{}` with {} inputs yet",
            op.name(),
            inputs.len()
        )),
    }
}
