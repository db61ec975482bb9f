//! Convolution, pooling and batch normalisation — ONNX operators Conv
//! (opsets 11–22), MaxPool (12–22, without its Indices output), AveragePool
//! (11–22, `dilations` from 19) over `[n, c, h, w]` images and `[n, c, l]`
//! sequences (as images of one row), GlobalAveragePool and GlobalMaxPool
//! (1–22), and BatchNormalization (9–15). `auto_pad` (`SAME_UPPER`,
//! `SAME_LOWER`, `VALID`) becomes explicit padding. Inference-mode batch
//! normalisation is the per-channel affine map
//! `x · scale / sqrt(var + eps) + (B - mean · scale / sqrt(var + eps))`
//! whose running statistics are constants (`initializers`); training mode normalises with the batch's
//! statistics and makes its running statistics module buffers, updated
//! every forward (`batch_norm_training`). A normalisation the dynamo
//! exporter wrote in inference mode although the module ran it in training
//! mode (its metadata says so) is refused naming the node.

use super::Convert;
use crate::onnx::context::{NodeCx, Val};
use crate::onnx::tensor::HostTensor;
use fsdpc_ir::{BinaryFn, Op, ReduceFn, UnaryFn, ValueId, Window2d};

pub(super) const OPS: &[(&str, Convert)] = &[
    ("Conv", conv),
    ("MaxPool", |cx| pool(cx, true)),
    ("AveragePool", |cx| pool(cx, false)),
    ("GlobalAveragePool", |cx| global(cx, ReduceFn::Mean)),
    ("GlobalMaxPool", |cx| global(cx, ReduceFn::Max)),
    ("BatchNormalization", batch_norm),
];

/// The spatial axes of input 0, an `[n, c, l]` or `[n, c, h, w]` tensor,
/// and their `[h, w]` (a 1-D input is one row: `[1, l]`).
fn spatial(cx: &NodeCx<'_>) -> Result<(usize, [usize; 2]), String> {
    let ty = cx.ty(0)?;
    match ty.shape.dims() {
        [_, _, l] => Ok((1, [1, *l])),
        [_, _, h, w] => Ok((2, [*h, *w])),
        d => Err(format!(
            "{}-D {} (input {ty}) is not supported yet: only 1-D and 2-D, over [n, c, l] or \
             [n, c, h, w] inputs",
            d.len().saturating_sub(2),
            cx.node.op_type
        )),
    }
}

/// `values` for `axes` spatial axes as `[h, w]` (a 1-D value is the width's).
fn lift_pair(values: &[i64], axes: usize, name: &str) -> Result<[usize; 2], String> {
    if values.len() != axes || values.iter().any(|&v| v < 0) {
        return Err(format!(
            "attribute `{name}` must hold {axes} non-negative value{}, got {values:?}",
            if axes == 1 { "" } else { "s" }
        ));
    }
    Ok(match values {
        [w] => [1, *w as usize],
        _ => [values[0] as usize, values[1] as usize],
    })
}

/// Attribute `name` over `axes` spatial axes (`default` on each when absent).
fn pair(cx: &NodeCx<'_>, name: &str, axes: usize, default: usize) -> Result<[usize; 2], String> {
    match cx.attr_ints(name)? {
        None => Ok([if axes == 1 { 1 } else { default }, default]),
        Some(v) => lift_pair(&v, axes, name),
    }
}

/// The window of a Conv or pooling node over an input of `hw` with `axes`
/// spatial axes: kernel, strides, dilations and `pads` or `auto_pad`.
fn window(
    cx: &NodeCx<'_>,
    kernel: [usize; 2],
    (axes, hw): (usize, [usize; 2]),
    ceil_mode: bool,
) -> Result<Window2d, String> {
    let mut w = Window2d {
        kernel,
        stride: pair(cx, "strides", axes, 1)?,
        dilation: pair(cx, "dilations", axes, 1)?,
        pads: [0; 4],
        ceil_mode,
    };
    w.check()?;
    let auto = cx.attr_s("auto_pad", "NOTSET")?;
    match auto.as_str() {
        "NOTSET" => {
            if let Some(p) = cx.attr_ints("pads")? {
                if p.len() != 2 * axes {
                    return Err(format!(
                        "attribute `pads` must hold {} values, got {p:?}",
                        2 * axes
                    ));
                }
                if p.iter().any(|&v| v < 0) {
                    return Err(format!("attribute `pads` {p:?} has a negative value"));
                }
                let p: Vec<usize> = p.iter().map(|&v| v as usize).collect();
                // A 1-D op's one row has no padding above or below.
                w.pads = match p[..] {
                    [b, e] => [0, b, 0, e],
                    _ => [p[0], p[1], p[2], p[3]],
                };
            }
        }
        "VALID" => {}
        "SAME_UPPER" | "SAME_LOWER" => {
            // The output is ceil(input / stride); the padding that takes,
            // split evenly with the odd one at the end (UPPER) or start.
            for (axis, len) in hw.into_iter().enumerate() {
                let out = len.div_ceil(w.stride[axis]);
                let total = ((out - 1) * w.stride[axis] + w.span(axis)).saturating_sub(len);
                let (small, big) = (total / 2, total - total / 2);
                let (before, after) = if auto == "SAME_UPPER" {
                    (small, big)
                } else {
                    (big, small)
                };
                w.pads[axis] = before;
                w.pads[axis + 2] = after;
            }
        }
        other => {
            return Err(format!(
                "auto_pad `{other}` is not one of NOTSET, SAME_UPPER, SAME_LOWER, VALID"
            ))
        }
    }
    Ok(w)
}

/// `v` with a unit height axis inserted at 2 (`[n, c, l]` -> `[n, c, 1,
/// l]`), or as it is for a 2-D op.
fn as_image(cx: &mut NodeCx<'_>, v: ValueId, axes: usize) -> Result<ValueId, String> {
    if axes == 2 {
        return Ok(v);
    }
    let mut shape = cx.imp.g.value_type(v).shape.dims().to_vec();
    shape.insert(2, 1);
    cx.add(Op::Reshape { shape }, &[v], "as_image")
}

/// Output 0 from an image result: `y` itself, or without its unit height.
fn set_image(cx: &mut NodeCx<'_>, y: ValueId, axes: usize) -> Result<(), String> {
    let y = if axes == 2 {
        y
    } else {
        let mut shape = cx.imp.g.value_type(y).shape.dims().to_vec();
        shape.remove(2);
        cx.add(Op::Reshape { shape }, &[y], "as_sequence")?
    };
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// The metadata key under which torch's dynamo exporter records the FX
/// node an ONNX node comes from.
const FX_NODE: &str = "pkg.torch.onnx.fx_node";

/// Refuses a node the dynamo exporter made from a batch normalisation that
/// ran in training mode (`_native_batch_norm_legit_functional`, not
/// `..._no_training`): the exporter writes it in inference mode, folded
/// into the convolution before it or not, so the file would normalise with
/// its running statistics where the module normalised with the batch's.
fn refuse_frozen_training_norm(cx: &NodeCx<'_>) -> Result<(), String> {
    let traced = cx
        .node
        .metadata_props
        .iter()
        .find(|p| p.key == FX_NODE)
        .map(|p| p.value.as_str())
        .unwrap_or("");
    if traced.contains("_native_batch_norm_legit") && !traced.contains("no_training") {
        return Err(format!(
            "the exporter wrote in inference mode{} a batch normalisation the module ran in \
             training mode (batch statistics): training this file would normalise with its \
             running statistics instead. Export it with the TorchScript exporter \
             (`dynamo=False, training=torch.onnx.TrainingMode.TRAINING`) to train its batch \
             statistics, or in eval mode (`model.eval()`) to train it with frozen statistics",
            if cx.node.op_type == "Conv" {
                ", folded into this convolution,"
            } else {
                ""
            }
        ));
    }
    Ok(())
}

fn conv(cx: &mut NodeCx<'_>) -> Result<(), String> {
    refuse_frozen_training_norm(cx)?;
    let (axes, hw) = spatial(cx)?;
    let tw = cx.ty(1)?;
    let kernel = match tw.shape.dims() {
        [_, _, k] if axes == 1 => [1, *k],
        [_, _, kh, kw] if axes == 2 => [*kh, *kw],
        _ => {
            return Err(format!(
                "the weight (input 1) must be [o, c / group{}], got {tw}",
                if axes == 1 { ", k" } else { ", kh, kw" }
            ))
        }
    };
    if let Some(k) = cx.attr_ints("kernel_shape")? {
        if lift_pair(&k, axes, "kernel_shape")? != kernel {
            return Err(format!("kernel_shape {k:?} does not match the weight {tw}"));
        }
    }
    let group = cx.attr_i("group", 1)?;
    if group < 1 {
        return Err(format!("group {group} must be at least 1"));
    }
    let window = window(cx, kernel, (axes, hw), false)?;
    let tx = cx.ty(0)?;
    let (x, w) = (cx.ir(0)?, cx.ir_like(1, &tx)?);
    let mut ins = vec![as_image(cx, x, axes)?, as_image(cx, w, axes)?];
    if cx.opt(2)?.is_some() {
        ins.push(cx.ir_like(2, &tx)?);
    }
    let op = Op::Conv {
        window,
        groups: group as usize,
    };
    let y = cx.add(op, &ins, "conv")?;
    set_image(cx, y, axes)
}

fn pool(cx: &mut NodeCx<'_>, max: bool) -> Result<(), String> {
    let (axes, hw) = spatial(cx)?;
    if max && cx.wants(1) {
        return Err("MaxPool's Indices output is not supported".into());
    }
    let Some(k) = cx.attr_ints("kernel_shape")? else {
        return Err("attribute `kernel_shape` is required".into());
    };
    let kernel = lift_pair(&k, axes, "kernel_shape")?;
    let ceil_mode = cx.attr_i("ceil_mode", 0)? != 0;
    let window = window(cx, kernel, (axes, hw), ceil_mode)?;
    let op = if max {
        Op::MaxPool { window }
    } else {
        Op::AvgPool {
            window,
            count_include_pad: cx.attr_i("count_include_pad", 0)? != 0,
        }
    };
    let x = cx.ir(0)?;
    let x = as_image(cx, x, axes)?;
    let y = cx.add(op, &[x], if max { "max_pool" } else { "avg_pool" })?;
    set_image(cx, y, axes)
}

/// The mean or max over every axis after the channels, kept as size 1.
fn global(cx: &mut NodeCx<'_>, f: ReduceFn) -> Result<(), String> {
    let rank = cx.rank(0)?;
    if rank < 3 {
        return Err(format!(
            "{} needs an [n, c, ...] input, got rank {rank}",
            cx.node.op_type
        ));
    }
    let x = cx.ir(0)?;
    let op = Op::Reduce {
        f,
        axes: (2..rank).collect(),
        keepdims: true,
    };
    let y = cx.add(op, &[x], "global_pool")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// True when a BatchNormalization node normalises with the batch's
/// statistics and updates its running ones: `training_mode` from opset 14,
/// its extra outputs before.
pub(crate) fn batch_norm_trains(node: &onnx_protobuf::NodeProto, opset: i64) -> bool {
    if opset >= 14 {
        node.attribute
            .iter()
            .any(|a| a.name == "training_mode" && a.i != 0)
    } else {
        node.output.iter().skip(1).any(|o| !o.is_empty())
    }
}

fn batch_norm(cx: &mut NodeCx<'_>) -> Result<(), String> {
    refuse_frozen_training_norm(cx)?;
    if batch_norm_trains(cx.node, cx.opset()) {
        return batch_norm_training(cx);
    }
    let tx = cx.ty(0)?;
    let rank = tx.shape.rank();
    let c = channels(&tx)?;
    let eps = cx.attr_f("epsilon", 1e-5)?;
    let mut per_channel = Vec::new();
    for (i, what) in [(1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")] {
        let t = cx.ty(i)?;
        if t.shape.dims() != [c] {
            return Err(format!(
                "{what} (input {i}) must have shape [{c}] (x's channels), got {t}"
            ));
        }
        per_channel.push(cx.ir_like(i, &tx)?);
    }
    let [scale, bias, mean, var] = <[ValueId; 4]>::try_from(per_channel)
        .map_err(|v| format!("expected 4 per-channel inputs, read {}", v.len()))?;
    let e = cx.constant(&HostTensor::floats(tx.dtype, vec![], vec![eps]))?;
    let var_eps = cx.add(Op::Binary { f: BinaryFn::Add }, &[var, e], "var_eps")?;
    let inv = cx.add(Op::Unary { f: UnaryFn::Rsqrt }, &[var_eps], "inv_std")?;
    let a = cx.add(Op::Binary { f: BinaryFn::Mul }, &[scale, inv], "gain")?;
    let shift = cx.add(Op::Binary { f: BinaryFn::Mul }, &[mean, a], "mean_gain")?;
    let shift = cx.add(Op::Binary { f: BinaryFn::Sub }, &[bias, shift], "shift")?;
    // [c] -> [c, 1, ...] to broadcast over the spatial axes.
    let column = |cx: &mut NodeCx<'_>, v: ValueId, what: &str| {
        let mut shape = vec![c];
        shape.resize(rank - 1, 1);
        cx.add(Op::Reshape { shape }, &[v], what)
    };
    let a = column(cx, a, "gain_column")?;
    let shift = column(cx, shift, "shift_column")?;
    let x = cx.ir(0)?;
    let y = cx.add(Op::Binary { f: BinaryFn::Mul }, &[x, a], "scaled")?;
    let y = cx.add(Op::Binary { f: BinaryFn::Add }, &[y, shift], "batch_norm")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// The channel count of a BatchNormalization input `[n, c, ...]`.
fn channels(tx: &fsdpc_ir::TensorType) -> Result<usize, String> {
    match tx.shape.dims() {
        [_, c, ..] => Ok(*c),
        _ => Err(format!(
            "BatchNormalization needs an [n, c, ...] input, got {tx}"
        )),
    }
}

/// Training mode, as PyTorch's `BatchNorm2d.train()`: `x` normalised with
/// the statistics of this rank's micro-batch over every axis but the
/// channel's (the variance biased), then the running statistics, module
/// buffers named after their initializers, replaced by
/// `running · momentum + batch · (1 − momentum)` (ONNX's momentum is one
/// minus PyTorch's). The variance's batch value is the biased one, as the
/// ONNX operator says, except in a file PyTorch exported: there it is
/// unbiased (`· n / (n − 1)`, n values per channel), as the module keeps
/// it. A forward import outputs the new statistics as plain values.
fn batch_norm_training(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let tx = cx.ty(0)?;
    let rank = tx.shape.rank();
    let c = channels(&tx)?;
    let n: usize = tx
        .shape
        .dims()
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != 1)
        .map(|(_, d)| d)
        .product();
    if n < 2 {
        return Err(format!(
            "training mode needs more than one value per channel to normalise, got input {tx}"
        ));
    }
    if cx.node.output.iter().skip(1).len() > 2 {
        return Err(
            "training mode has at most three outputs (y, running mean, running var)".into(),
        );
    }
    let eps = cx.attr_f("epsilon", 1e-5)?;
    let momentum = cx.attr_f("momentum", 0.9)?;
    if !(0.0..=1.0).contains(&momentum) {
        return Err(format!("momentum {momentum} must lie in [0, 1]"));
    }
    for (i, what) in [(1, "scale"), (2, "B"), (3, "input_mean"), (4, "input_var")] {
        let t = cx.ty(i)?;
        if t.shape.dims() != [c] {
            return Err(format!(
                "{what} (input {i}) must have shape [{c}] (x's channels), got {t}"
            ));
        }
    }
    let scale = cx.ir_like(1, &tx)?;
    let bias = cx.ir_like(2, &tx)?;
    let x = cx.ir(0)?;
    let axes: Vec<usize> = std::iter::once(0).chain(2..rank).collect();
    let reduce = |axes: &[usize]| Op::Reduce {
        f: ReduceFn::Mean,
        axes: axes.to_vec(),
        keepdims: true,
    };
    let mean = cx.add(reduce(&axes), &[x], "batch_mean")?;
    let d = cx.add(Op::Binary { f: BinaryFn::Sub }, &[x, mean], "centred")?;
    let sq = cx.add(Op::Binary { f: BinaryFn::Mul }, &[d, d], "centred_sq")?;
    let var = cx.add(reduce(&axes), &[sq], "batch_var")?;
    let e = cx.constant(&HostTensor::floats(tx.dtype, vec![], vec![eps]))?;
    let var_eps = cx.add(Op::Binary { f: BinaryFn::Add }, &[var, e], "var_eps")?;
    let inv = cx.add(Op::Unary { f: UnaryFn::Rsqrt }, &[var_eps], "inv_std")?;
    let xhat = cx.add(Op::Binary { f: BinaryFn::Mul }, &[d, inv], "normalised")?;
    let mut column = vec![c];
    column.resize(rank - 1, 1);
    let a = cx.add(
        Op::Reshape {
            shape: column.clone(),
        },
        &[scale],
        "scale_column",
    )?;
    let b = cx.add(Op::Reshape { shape: column }, &[bias], "bias_column")?;
    let y = cx.add(Op::Binary { f: BinaryFn::Mul }, &[xhat, a], "scaled")?;
    let y = cx.add(Op::Binary { f: BinaryFn::Add }, &[y, b], "batch_norm")?;
    cx.set(0, Val::Ir(y));
    let unbias = if cx.imp.from_pytorch {
        n as f64 / (n as f64 - 1.0)
    } else {
        1.0
    };
    for (i, batch, factor, what) in [
        (3, mean, 1.0, "running_mean"),
        (4, var, unbias, "running_var"),
    ] {
        let update = running_update(cx, i, batch, c, momentum, factor, what)?;
        if cx.wants(i - 2) {
            cx.set(i - 2, Val::Ir(update));
        }
    }
    Ok(())
}

/// The running statistic of input `i` (an initializer) as a module buffer,
/// its new value `running · momentum + batch · factor · (1 − momentum)`
/// written back into it; returns the new value.
fn running_update(
    cx: &mut NodeCx<'_>,
    i: usize,
    batch: ValueId,
    c: usize,
    momentum: f64,
    factor: f64,
    what: &str,
) -> Result<ValueId, String> {
    let name = cx.node.input[i].clone();
    if cx.imp.forward_only {
        let running = cx.ir(i)?;
        let dtype = cx.imp.g.value_type(running).dtype;
        return blend(cx, running, batch, c, dtype, (momentum, factor), what);
    }
    // Kept in f32 whatever the file's type (the write-back converts back).
    let data = match cx.val(i)? {
        Val::Const(t) if t.dtype.is_float() => t.cast(fsdpc_ir::DType::F32).to_data(),
        Val::Const(t) => t.to_data(),
        Val::Ir(_) => {
            return Err(format!(
                "training mode needs its {} (input {i}, `{name}`) to be an initializer: \
                 it is a module buffer updated every step",
                if i == 3 { "input_mean" } else { "input_var" }
            ))
        }
    };
    if !data.ty.dtype.is_float() {
        return Err(format!(
            "{what} `{name}` must be floating point, got {}",
            data.ty
        ));
    }
    if cx.imp.g.buffers.iter().any(|b| b.name == name) {
        return Err(format!(
            "{what} `{name}` is also updated by another training-mode BatchNormalization; \
             a running statistic belongs to one normalisation"
        ));
    }
    let module = crate::onnx::names::param_module(&mut cx.imp.g, &name);
    let spec = fsdpc_ir::ModuleBufferSpec {
        name: name.clone(),
        ty: data.ty.clone(),
        init: fsdpc_ir::Init::Data { data },
    };
    let dtype = spec.ty.dtype;
    let id = fsdpc_ir::ModuleBufferId(cx.imp.g.buffers.len() as u32);
    let running = cx.imp.g.add_buffer(spec, module);
    let new = blend(cx, running, batch, c, dtype, (momentum, factor), what)?;
    let label = format!("{}/{what}_write", cx.label());
    cx.imp
        .g
        .add(Op::WriteBuffer { buffer: id }, &[new], label, cx.module)
        .map_err(|e| e.to_string())?;
    Ok(new)
}

/// `running · momentum + batch · factor · (1 − momentum)`, `batch` (`[1, c,
/// 1, ...]`) reshaped to `[c]` and cast to `dtype`, `running`'s.
fn blend(
    cx: &mut NodeCx<'_>,
    running: ValueId,
    batch: ValueId,
    c: usize,
    dtype: fsdpc_ir::DType,
    (momentum, factor): (f64, f64),
    what: &str,
) -> Result<ValueId, String> {
    let mut batch = cx.add(
        Op::Reshape { shape: vec![c] },
        &[batch],
        &format!("{what}_batch"),
    )?;
    if cx.imp.g.value_type(batch).dtype != dtype {
        batch = cx.add(Op::Cast { to: dtype }, &[batch], &format!("{what}_cast"))?;
    }
    let keep = cx.constant(&HostTensor::floats(dtype, vec![], vec![momentum]))?;
    let take = cx.constant(&HostTensor::floats(
        dtype,
        vec![],
        vec![(1.0 - momentum) * factor],
    ))?;
    let old = cx.add(
        Op::Binary { f: BinaryFn::Mul },
        &[running, keep],
        &format!("{what}_kept"),
    )?;
    let new = cx.add(
        Op::Binary { f: BinaryFn::Mul },
        &[batch, take],
        &format!("{what}_taken"),
    )?;
    cx.add(
        Op::Binary { f: BinaryFn::Add },
        &[old, new],
        &format!("{what}_new"),
    )
}
