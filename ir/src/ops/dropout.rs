//! `Dropout { p, seed }`: inverted dropout, `x · keep / (1 - p)`, with the
//! keep mask drawn by `crate::init::dropout_keep(seed, step, element, p)`.
//! Since the mask depends only on (seed, step, element), the gradient is the
//! same dropout applied to `dy`: it reproduces the forward mask.

use super::check::{arity, float};
use super::{misrouted, out_numel, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct Dropout;

impl Family for Dropout {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        let Op::Dropout { p, .. } = op else {
            return Err(misrouted(op, "dropout"));
        };
        arity(inputs, 1, "x")?;
        float(inputs[0], "x")?;
        if !(0.0..1.0).contains(p) {
            return Err(format!("p must lie in [0, 1), got {p}"));
        }
        Ok(vec![inputs[0].clone()])
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let Op::Dropout { p, seed } = *op else {
            return Err(misrouted(op, "dropout"));
        };
        let dy = cx.dy();
        Ok(vec![Some(cx.emit(Op::Dropout { p, seed }, &[dy])?)])
    }

    fn flops(&self, _op: &Op, _inputs: &[&TensorType], outputs: &[TensorType]) -> f64 {
        2.0 * out_numel(outputs)
    }
}
