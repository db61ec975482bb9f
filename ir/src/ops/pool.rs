//! 2-D pooling over `x[n, c, h, w]`: `MaxPool` and `AvgPool`, and their
//! gradient kernels `MaxPoolGrad (x, dy) -> dx` (recomputing each window's
//! first maximum) and `AvgPoolGrad dy -> dx`. Each counts one FLOP per tap
//! of every output element.

use super::check::{arity, same_type};
use super::conv::{image, matches_output, typed};
use super::vjp::not_differentiable;
use super::{misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct Pool;

impl Family for Pool {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        match op {
            Op::MaxPool { window } | Op::AvgPool { window, .. } => {
                arity(inputs, 1, "x")?;
                let x = inputs[0];
                let [n, c, h, w] = image(x, "x")?;
                let [oh, ow] = window.out_hw([h, w])?;
                Ok(vec![typed(x, [n, c, oh, ow])])
            }
            Op::MaxPoolGrad { window } => {
                arity(inputs, 2, "x, dy")?;
                let (x, dy) = (inputs[0], inputs[1]);
                let [n, c, h, w] = image(x, "x")?;
                let [oh, ow] = window.out_hw([h, w])?;
                same_type(&typed(x, [n, c, oh, ow]), dy, "the pooled x and dy")?;
                Ok(vec![x.clone()])
            }
            Op::AvgPoolGrad {
                window, input_hw, ..
            } => {
                arity(inputs, 1, "dy")?;
                let dy = inputs[0];
                let [n, c, oh, ow] = image(dy, "dy")?;
                matches_output(window, *input_hw, [oh, ow], dy)?;
                Ok(vec![typed(dy, [n, c, input_hw[0], input_hw[1]])])
            }
            _ => Err(misrouted(op, "pooling")),
        }
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let (x, dy) = (cx.x(0)?, cx.dy());
        let dx = match op {
            Op::MaxPool { window } => cx.emit(Op::MaxPoolGrad { window: *window }, &[x, dy])?,
            Op::AvgPool {
                window,
                count_include_pad,
            } => {
                let xs = cx.shape(x)?;
                let op = Op::AvgPoolGrad {
                    window: *window,
                    count_include_pad: *count_include_pad,
                    input_hw: [xs[2], xs[3]],
                };
                cx.emit(op, &[dy])?
            }
            _ => return Err(not_differentiable(op)),
        };
        Ok(vec![Some(dx)])
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], outputs: &[TensorType]) -> f64 {
        let (window, y) = match op {
            Op::MaxPool { window } | Op::AvgPool { window, .. } => (window, outputs.first()),
            Op::MaxPoolGrad { window } => (window, inputs.get(1).copied()),
            Op::AvgPoolGrad { window, .. } => (window, inputs.first().copied()),
            _ => return 0.0,
        };
        let taps = (window.kernel[0] * window.kernel[1]) as f64;
        y.map_or(0.0, |y| y.numel() as f64) * taps
    }
}
