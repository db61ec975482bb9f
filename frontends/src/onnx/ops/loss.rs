//! Losses — ONNX operators SoftmaxCrossEntropyLoss (opsets 13–21) and
//! NegativeLogLikelihoodLoss (13–21) when its input is a LogSoftmax over the
//! class axis (what `F.cross_entropy` exports), both with mean reduction and
//! no class weights, onto the IR's `CrossEntropy`. Scores `[N, C, d...]` are
//! moved to `[N * d..., C]`.

use super::Convert;
use crate::onnx::context::{NodeCx, Val};
use fsdpc_ir::{Op, ValueId};

pub(super) const OPS: &[(&str, Convert)] = &[
    ("SoftmaxCrossEntropyLoss", softmax_cross_entropy),
    ("NegativeLogLikelihoodLoss", nll),
];

fn check_attrs(cx: &NodeCx<'_>) -> Result<Option<i64>, String> {
    let reduction = cx.attr_s("reduction", "mean")?;
    if reduction != "mean" {
        return Err(format!("reduction `{reduction}`: only mean is supported"));
    }
    if cx.opt(2)?.is_some() {
        return Err("class weights are not supported".into());
    }
    Ok(
        if cx.node.attribute.iter().any(|a| a.name == "ignore_index") {
            Some(cx.attr_i("ignore_index", -100)?)
        } else {
            None
        },
    )
}

fn softmax_cross_entropy(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let ignore_index = check_attrs(cx)?;
    if cx.wants(1) {
        return Err("the log_prob output is not supported".into());
    }
    let scores = cx.ir(0)?;
    let y = cross_entropy(cx, scores, ignore_index)?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

fn nll(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let ignore_index = check_attrs(cx)?;
    let input = cx.node.input.first().cloned().unwrap_or_default();
    let Some(&(logits, axis)) = cx.imp.log_softmax_of.get(&input) else {
        return Err("supported only on the output of a LogSoftmax (cross-entropy)".into());
    };
    if axis != 1 {
        return Err(format!(
            "the LogSoftmax is over axis {axis}, not the class axis 1"
        ));
    }
    let y = cross_entropy(cx, logits, ignore_index)?;
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
        let rows = dims.iter().product::<usize>() / dims[1];
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
