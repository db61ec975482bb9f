//! `Gather (data, indices)`: numpy `take` along `axis`; the output shape is
//! `data[..axis] ++ indices ++ data[axis+1..]` (an embedding lookup is axis 0).
//! Its gradient scatter-adds `dy` into zeros of the data's shape
//! (`GatherGrad`); the indices get none.

use super::check::{arity, axis, int};
use super::{misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct Gather;

impl Family for Gather {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        let Op::Gather { axis } = op else {
            return Err(misrouted(op, "gather"));
        };
        arity(inputs, 2, "data, indices")?;
        Ok(vec![gather_type(inputs[0], inputs[1], *axis)?])
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let Op::Gather { axis } = *op else {
            return Err(misrouted(op, "gather"));
        };
        let data_shape = cx.shape(cx.x(0)?)?;
        let ins = [cx.x(1)?, cx.dy()];
        let g = cx.emit(Op::GatherGrad { axis, data_shape }, &ins)?;
        Ok(vec![Some(g), None])
    }

    fn flops(&self, _op: &Op, _inputs: &[&TensorType], _outputs: &[TensorType]) -> f64 {
        0.0
    }
}

/// The type of `take(data, indices, axis)`.
pub(crate) fn gather_type(
    data: &TensorType,
    indices: &TensorType,
    ax: usize,
) -> Result<TensorType, String> {
    axis(data, ax, "data")?;
    int(indices, "indices")?;
    let d = data.shape.dims();
    let mut shape = d[..ax].to_vec();
    shape.extend_from_slice(indices.shape.dims());
    shape.extend_from_slice(&d[ax + 1..]);
    Ok(TensorType::new(data.dtype, shape))
}
