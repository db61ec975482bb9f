//! Losses — ONNX operators SoftmaxCrossEntropyLoss (opsets 13–21) and
//! NegativeLogLikelihoodLoss (13–21). With mean reduction and no class
//! weights (and, for NegativeLogLikelihoodLoss, on a LogSoftmax over the class
//! axis: what `F.cross_entropy` exports) they become the IR's `CrossEntropy`,
//! scores `[N, C, d...]` moved to `[N * d..., C]`; every other form is built
//! from elementwise ops (`nll`).

use super::{nll, Convert};
use crate::onnx::context::{NodeCx, Val};
use fsdpc_ir::{Op, ValueId};

pub(super) const OPS: &[(&str, Convert)] = &[
    ("SoftmaxCrossEntropyLoss", softmax_cross_entropy),
    ("NegativeLogLikelihoodLoss", nll),
];

/// The attributes both losses share.
pub(super) struct LossAttrs {
    /// `none`, `sum` or `mean`.
    pub reduction: String,
    pub ignore_index: Option<i64>,
    /// True when class weights (input 2) are given.
    pub weighted: bool,
}

impl LossAttrs {
    /// True when the IR's `CrossEntropy` computes the loss.
    fn fused(&self) -> bool {
        self.reduction == "mean" && !self.weighted
    }
}

/// The attributes, after checking that the scores (input 0) are `[N, C, d...]`
/// with at least one class.
fn attrs(cx: &NodeCx<'_>) -> Result<LossAttrs, String> {
    let scores = cx.ty(0)?;
    match scores.shape.dims() {
        [_, 0, ..] => {
            return Err(format!(
                "the scores {scores} have no classes (axis 1 has length 0)"
            ))
        }
        [_, _, ..] => {}
        _ => return Err(format!("scores {scores}: need [N, C, ...]")),
    }
    let reduction = cx.attr_s("reduction", "mean")?;
    if !["none", "sum", "mean"].contains(&reduction.as_str()) {
        return Err(format!(
            "reduction `{reduction}` (expected none, sum or mean)"
        ));
    }
    let ignore_index = if cx.has_attr("ignore_index") {
        Some(cx.attr_i("ignore_index", -100)?)
    } else {
        None
    };
    Ok(LossAttrs {
        reduction,
        ignore_index,
        weighted: cx.opt(2)?.is_some(),
    })
}

fn softmax_cross_entropy(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let a = attrs(cx)?;
    let scores = cx.ir(0)?;
    let y = if a.fused() && !cx.wants(1) {
        cross_entropy(cx, scores, a.ignore_index)?
    } else {
        let log_prob = cx.add(Op::LogSoftmax { axis: 1 }, &[scores], "log_prob")?;
        cx.set(1, Val::Ir(log_prob));
        nll::nll(cx, log_prob, &a)?
    };
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// A cross-entropy when the input is a LogSoftmax over the class axis and
/// the loss a plain mean; otherwise the general form of `nll`.
fn nll(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let a = attrs(cx)?;
    let input = cx.node.input.first().cloned().unwrap_or_default();
    let y = match cx.imp.log_softmax_of.get(&input) {
        Some(&(logits, 1)) if a.fused() => cross_entropy(cx, logits, a.ignore_index)?,
        _ => {
            let log_prob = cx.ir(0)?;
            nll::nll(cx, log_prob, &a)?
        }
    };
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// Mean cross-entropy of `scores [N, C, d...]` against labels (input 1).
fn cross_entropy(
    cx: &mut NodeCx<'_>,
    scores: ValueId,
    ignore_index: Option<i64>,
) -> Result<ValueId, String> {
    let dims = cx.imp.g.value_type(scores).shape.dims().to_vec();
    if dims.len() < 2 {
        return Err(format!("scores of shape {dims:?}: need [N, C, ...]"));
    }
    let mut logits = scores;
    if dims.len() > 2 {
        let mut perm: Vec<usize> = vec![0];
        perm.extend(2..dims.len());
        perm.push(1);
        logits = cx.add(Op::Transpose { perm }, &[logits], "classes_last")?;
        // N · d...: the rows once the class axis is last (`attrs` checked
        // the axis is not empty; no division needed).
        let rows = dims[0] * dims[2..].iter().product::<usize>();
        logits = cx.add(
            Op::Reshape {
                shape: vec![rows, dims[1]],
            },
            &[logits],
            "flatten",
        )?;
    }
    let rows = cx.imp.g.value_type(logits).shape.dims()[0];
    let mut labels = cx.ir(1)?;
    if cx.imp.g.value_type(labels).shape.rank() != 1 {
        labels = cx.add(Op::Reshape { shape: vec![rows] }, &[labels], "labels_flat")?;
    }
    cx.add(
        Op::CrossEntropy { ignore_index },
        &[logits, labels],
        "cross_entropy",
    )
}
