//! `CrossEntropy { ignore_index } (logits[n, c], labels[n])`: the mean over
//! the rows whose label is not `ignore_index` of `-log_softmax(logits)[label]`,
//! a scalar f32 whatever the logits' dtype. Its gradient is the fused
//! `CrossEntropyGrad (logits, labels, dloss)` kernel; labels get none.

use super::check::{arity, float, int, rank};
use super::{in_numel, misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::{DType, TensorType};

pub(crate) struct Loss;

impl Family for Loss {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        let Op::CrossEntropy { .. } = op else {
            return Err(misrouted(op, "loss"));
        };
        arity(inputs, 2, "logits, labels")?;
        check_logits_labels(inputs[0], inputs[1])?;
        Ok(vec![TensorType::new(DType::F32, Vec::new())])
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let Op::CrossEntropy { ignore_index } = *op else {
            return Err(misrouted(op, "loss"));
        };
        let ins = [cx.x(0)?, cx.x(1)?, cx.dy()];
        let g = cx.emit(Op::CrossEntropyGrad { ignore_index }, &ins)?;
        Ok(vec![Some(g), None])
    }

    fn flops(&self, _op: &Op, inputs: &[&TensorType], _outputs: &[TensorType]) -> f64 {
        5.0 * in_numel(inputs, 0)
    }
}

/// `logits[n, c]` floating point and `labels[n]` integer.
pub(crate) fn check_logits_labels(logits: &TensorType, labels: &TensorType) -> Result<(), String> {
    float(logits, "logits")?;
    rank(logits, 2, "logits ([rows, classes])")?;
    int(labels, "labels")?;
    rank(labels, 1, "labels ([rows])")?;
    if logits.shape.dims()[1] == 0 {
        return Err(format!(
            "logits {logits} have no classes (the class axis has length 0)"
        ));
    }
    if labels.shape.dims()[0] != logits.shape.dims()[0] {
        return Err(format!(
            "logits {logits} and labels {labels} have different numbers of rows"
        ));
    }
    Ok(())
}
