//! The tensor-parallel boundaries (Megatron's `f` and `g`): `TpCopy` enters
//! a region whose matrices are split over the tensor group (identity
//! forward; its gradient, the sum of the members' partial gradients, is a
//! `TpReduce`), and `TpReduce` leaves it (the members' partial results
//! summed; its gradient passes through, since what follows is replicated).
//! Both keep their input's type. With sequence parallelism the activations
//! between regions are split into row chunks over the group: `TpGather`,
//! `TpReduceScatter` and `TpSplit` move between chunks and whole tensors.
//! What group they run over is the plan's business: the graph only marks
//! where the communication is.

use super::check::{arity, float};
use super::{misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct TensorParallel;

impl Family for TensorParallel {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        arity(inputs, 1, "x")?;
        // Sums need numbers; chunk moves carry any element.
        if matches!(op, Op::TpCopy | Op::TpReduce | Op::TpReduceScatter { .. }) {
            float(inputs[0], "x")?;
        }
        let x = inputs[0];
        let scaled = |axis: usize, parts: u32, grow: bool| -> Result<TensorType, String> {
            let dims = x.shape.dims();
            if axis + 1 >= dims.len() || dims[..axis].iter().any(|&d| d != 1) {
                return Err(format!(
                    "axis {axis} of {x} is not the first axis of size other than 1 before the last"
                ));
            }
            let parts = parts.max(1) as usize;
            let mut out = x.clone();
            let d = &mut out.shape.0[axis];
            if grow {
                *d *= parts;
            } else if d.is_multiple_of(parts) {
                *d /= parts;
            } else {
                return Err(format!(
                    "axis {axis} of {x} does not split into {parts} parts"
                ));
            }
            Ok(out)
        };
        match *op {
            Op::TpCopy | Op::TpReduce => Ok(vec![x.clone()]),
            Op::TpGather { axis, parts, .. } => Ok(vec![scaled(axis, parts, true)?]),
            Op::TpReduceScatter { axis, parts } | Op::TpSplit { axis, parts } => {
                Ok(vec![scaled(axis, parts, false)?])
            }
            _ => Err(misrouted(op, "tensor-parallel")),
        }
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let dy = cx.dy();
        let grad = match *op {
            Op::TpCopy => cx.emit(Op::TpReduce, &[dy])?,
            Op::TpReduce => dy,
            Op::TpGather {
                axis,
                parts,
                partial_grad: true,
            } => cx.emit(Op::TpReduceScatter { axis, parts }, &[dy])?,
            Op::TpGather {
                axis,
                parts,
                partial_grad: false,
            } => cx.emit(Op::TpSplit { axis, parts }, &[dy])?,
            Op::TpReduceScatter { axis, parts } | Op::TpSplit { axis, parts } => cx.emit(
                Op::TpGather {
                    axis,
                    parts,
                    partial_grad: true,
                },
                &[dy],
            )?,
            _ => return Err(misrouted(op, "tensor-parallel")),
        };
        Ok(vec![Some(grad)])
    }

    /// A copy computes nothing; a reduction's additions are the
    /// collective's, charged by the cost model as communication.
    fn flops(&self, _op: &Op, _inputs: &[&TensorType], _outputs: &[TensorType]) -> f64 {
        0.0
    }
}
