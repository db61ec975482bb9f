//! `Cast`: any dtype to any dtype, same shape. Its gradient casts back (and
//! is defined only between floating-point types).

use super::check::arity;
use super::{misrouted, out_numel, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct Cast;

impl Family for Cast {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        let Op::Cast { to } = op else {
            return Err(misrouted(op, "cast"));
        };
        arity(inputs, 1, "x")?;
        Ok(vec![TensorType {
            dtype: *to,
            shape: inputs[0].shape.clone(),
        }])
    }

    fn vjp(&self, _op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let x = cx.ty(cx.x(0)?)?;
        if !x.dtype.is_float() {
            return Ok(vec![None]);
        }
        let to = x.dtype;
        Ok(vec![Some(cx.emit(Op::Cast { to }, &[cx.dy()])?)])
    }

    fn flops(&self, _op: &Op, _inputs: &[&TensorType], outputs: &[TensorType]) -> f64 {
        out_numel(outputs)
    }
}
