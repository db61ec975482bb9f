//! The tensor-parallel boundaries (Megatron's `f` and `g`): `TpCopy` enters
//! a region whose matrices are split over the tensor group (identity
//! forward; its gradient, the sum of the members' partial gradients, is a
//! `TpReduce`), and `TpReduce` leaves it (the members' partial results
//! summed; its gradient passes through, since what follows is replicated).
//! Both keep their input's type. What group they run over is the plan's
//! business: the graph only marks where the sums are.

use super::check::{arity, float};
use super::{misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct TensorParallel;

impl Family for TensorParallel {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        if !matches!(op, Op::TpCopy | Op::TpReduce) {
            return Err(misrouted(op, "tensor-parallel"));
        }
        arity(inputs, 1, "x")?;
        float(inputs[0], "x")?;
        Ok(vec![inputs[0].clone()])
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let dy = cx.dy();
        match op {
            Op::TpCopy => Ok(vec![Some(cx.emit(Op::TpReduce, &[dy])?)]),
            Op::TpReduce => Ok(vec![Some(dy)]),
            _ => Err(misrouted(op, "tensor-parallel")),
        }
    }

    /// A copy computes nothing; a reduction's additions are the
    /// collective's, charged by the cost model as communication.
    fn flops(&self, _op: &Op, _inputs: &[&TensorType], _outputs: &[TensorType]) -> f64 {
        0.0
    }
}
