//! Normalisation and softmax — ONNX operators LayerNormalization (opsets
//! 17–21: the axes from `axis` on are flattened into the IR's last-axis
//! `LayerNorm`; the Mean and InvStdDev outputs are computed in f32), Softmax
//! and LogSoftmax (opsets 13–21, one axis).

use super::Convert;
use crate::onnx::context::{norm_axis, NodeCx, Val};
use crate::onnx::tensor::HostTensor;
use fsdpc_ir::{BinaryFn, DType, Op, ReduceFn, UnaryFn, ValueId};

pub(super) const OPS: &[(&str, Convert)] = &[
    ("LayerNormalization", layer_norm),
    ("Softmax", |cx| softmax(cx, false)),
    ("LogSoftmax", |cx| softmax(cx, true)),
];

fn layer_norm(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let tx = cx.ty(0)?;
    let dims = tx.shape.dims().to_vec();
    let axis = norm_axis(cx.attr_i("axis", -1)?, dims.len())?;
    let eps = cx.attr_f("epsilon", 1e-5)?;
    let inner: usize = dims[axis..].iter().product();
    let x = cx.ir(0)?;
    let flat = if axis + 1 == dims.len() {
        x
    } else {
        reshaped(cx, x, vec![dims[..axis].iter().product(), inner])?
    };
    let mut ins = vec![flat];
    for i in 1..cx.n_inputs().min(3) {
        if cx.opt(i)?.is_some() {
            let p = cx.ir_like(i, &tx)?;
            if cx.imp.g.value_type(p).numel() != inner as u64 {
                return Err(format!("input {i} does not have the normalised shape"));
            }
            ins.push(reshaped(cx, p, vec![inner])?);
        }
    }
    let y = cx.add(Op::LayerNorm { eps }, &ins, "layer_norm")?;
    let y = reshaped(cx, y, dims)?;
    cx.set(0, Val::Ir(y));
    if cx.wants(1) || cx.wants(2) {
        stats(cx, x, axis, eps)?;
    }
    Ok(())
}

/// `v` in shape `dims` (itself when it already has it).
fn reshaped(cx: &mut NodeCx<'_>, v: ValueId, dims: Vec<usize>) -> Result<ValueId, String> {
    if cx.imp.g.value_type(v).shape.dims() == dims.as_slice() {
        return Ok(v);
    }
    cx.add(Op::Reshape { shape: dims }, &[v], "reshape")
}

/// LayerNormalization's Mean and InvStdDev outputs (f32, reduced axes kept).
fn stats(cx: &mut NodeCx<'_>, x: ValueId, axis: usize, eps: f64) -> Result<(), String> {
    let rank = cx.imp.g.value_type(x).shape.rank();
    let mut x = x;
    if cx.imp.g.value_type(x).dtype != DType::F32 {
        x = cx.add(Op::Cast { to: DType::F32 }, &[x], "stash")?;
    }
    let mean_op = Op::Reduce {
        f: ReduceFn::Mean,
        axes: (axis..rank).collect(),
        keepdims: true,
    };
    let mean = cx.add(mean_op.clone(), &[x], "mean")?;
    let d = cx.add(Op::Binary { f: BinaryFn::Sub }, &[x, mean], "centred")?;
    let sq = cx.add(Op::Unary { f: UnaryFn::Square }, &[d], "square")?;
    let var = cx.add(mean_op, &[sq], "variance")?;
    let e = cx.constant(&HostTensor::floats(DType::F32, vec![], vec![eps]))?;
    let var = cx.add(Op::Binary { f: BinaryFn::Add }, &[var, e], "variance_eps")?;
    let inv = cx.add(Op::Unary { f: UnaryFn::Rsqrt }, &[var], "inv_std")?;
    cx.set(1, Val::Ir(mean));
    cx.set(2, Val::Ir(inv));
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
