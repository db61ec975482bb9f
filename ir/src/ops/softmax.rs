//! `Softmax` and `LogSoftmax` along one axis. Their gradients are the
//! `SoftmaxGrad`/`LogSoftmaxGrad` kernels, which read the forward output.

use super::check::{arity, axis, float};
use super::{misrouted, out_numel, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct Softmax;

impl Family for Softmax {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        let (Op::Softmax { axis: a } | Op::LogSoftmax { axis: a }) = op else {
            return Err(misrouted(op, "softmax"));
        };
        arity(inputs, 1, "x")?;
        float(inputs[0], "x")?;
        axis(inputs[0], *a, "x")?;
        Ok(vec![inputs[0].clone()])
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let kernel = match *op {
            Op::Softmax { axis } => Op::SoftmaxGrad { axis },
            Op::LogSoftmax { axis } => Op::LogSoftmaxGrad { axis },
            _ => return Err(misrouted(op, "softmax")),
        };
        let (y, dy) = (cx.y(), cx.dy());
        Ok(vec![Some(cx.emit(kernel, &[y, dy])?)])
    }

    fn flops(&self, _op: &Op, _inputs: &[&TensorType], outputs: &[TensorType]) -> f64 {
        5.0 * out_numel(outputs)
    }
}
