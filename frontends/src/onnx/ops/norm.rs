//! Normalisation and softmax — ONNX operators LayerNormalization (opsets
//! 17–21, over the last axis), Softmax and LogSoftmax (opsets 13–21, one
//! axis).

use super::Convert;
use crate::onnx::context::{norm_axis, NodeCx, Val};
use fsdpc_ir::Op;

pub(super) const OPS: &[(&str, Convert)] = &[
    ("LayerNormalization", layer_norm),
    ("Softmax", |cx| softmax(cx, false)),
    ("LogSoftmax", |cx| softmax(cx, true)),
];

fn layer_norm(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let rank = cx.rank(0)?;
    let axis = norm_axis(cx.attr_i("axis", -1)?, rank)?;
    if axis + 1 != rank {
        return Err(format!(
            "normalises from axis {axis} of a rank-{rank} input; only the last axis is supported"
        ));
    }
    if cx.wants(1) || cx.wants(2) {
        return Err("the Mean and InvStdDev outputs are not supported".into());
    }
    let eps = cx.attr_f("epsilon", 1e-5)?;
    let tx = cx.ty(0)?;
    let mut ins = vec![cx.ir(0)?, cx.ir_like(1, &tx)?];
    if cx.opt(2)?.is_some() {
        ins.push(cx.ir_like(2, &tx)?);
    }
    let y = cx.add(Op::LayerNorm { eps }, &ins, "layer_norm")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

fn softmax(cx: &mut NodeCx<'_>, log: bool) -> Result<(), String> {
    let axis = norm_axis(cx.attr_i("axis", -1)?, cx.rank(0)?)?;
    let x = cx.ir(0)?;
    let op = if log {
        Op::LogSoftmax { axis }
    } else {
        Op::Softmax { axis }
    };
    let y = cx.add(op, &[x], if log { "log_softmax" } else { "softmax" })?;
    if log {
        if let Some(name) = cx.node.output.first() {
            cx.imp.log_softmax_of.insert(name.clone(), (x, axis));
        }
    }
    cx.set(0, Val::Ir(y));
    Ok(())
}
