//! `Dropout { p, seed, whole_sample }`: inverted dropout, `x · keep / (1 -
//! p)`, with the keep mask drawn by `crate::init::dropout_keep(seed, step,
//! element, p)`. Since the mask depends only on (seed, step, element), the
//! gradient is the same dropout applied to `dy`: it reproduces the forward
//! mask. A chunk of a whole tensor (`whole_sample`) reads a second input,
//! its `offset` in the whole, and draws the whole's mask for its elements.

use super::check::{arity, float, int};
use super::{misrouted, out_numel, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct Dropout;

impl Family for Dropout {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        let Op::Dropout {
            p, whole_sample, ..
        } = op
        else {
            return Err(misrouted(op, "dropout"));
        };
        match whole_sample {
            None => arity(inputs, 1, "x")?,
            Some(s) => {
                arity(inputs, 2, "x, offset")?;
                int(inputs[1], "offset")?;
                if inputs[1].numel() != 1 {
                    return Err(format!("offset must hold one integer, got {}", inputs[1]));
                }
                if *s == 0 {
                    return Err("a whole sample of 0 elements".into());
                }
            }
        }
        float(inputs[0], "x")?;
        if !(0.0..1.0).contains(p) {
            return Err(format!("p must lie in [0, 1), got {p}"));
        }
        Ok(vec![inputs[0].clone()])
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let Op::Dropout { whole_sample, .. } = *op else {
            return Err(misrouted(op, "dropout"));
        };
        let dy = cx.dy();
        match whole_sample {
            None => Ok(vec![Some(cx.emit(op.clone(), &[dy])?)]),
            Some(_) => {
                let offset = cx.x(1)?;
                Ok(vec![Some(cx.emit(op.clone(), &[dy, offset])?), None])
            }
        }
    }

    fn flops(&self, _op: &Op, _inputs: &[&TensorType], outputs: &[TensorType]) -> f64 {
        2.0 * out_numel(outputs)
    }
}
