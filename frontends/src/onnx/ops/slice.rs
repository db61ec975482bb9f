//! Slicing and joining — ONNX operators Slice (opsets 13–21; a negative step
//! becomes a `Gather` of the indices it visits), Split (13–21: `split` as an
//! input, `num_outputs` from 18), Concat (13–21) and Pad (13–21, `axes` from
//! 18; constant mode, and edge, reflect and wrap as a `Gather` per axis).
//! Constant operands fold.

use super::Convert;
use crate::onnx::context::{norm_axis, NodeCx, Val};
use crate::onnx::tensor::{check_numel, check_size, HostTensor};
use fsdpc_ir::{Op, ValueId};

pub(super) const OPS: &[(&str, Convert)] = &[
    ("Slice", slice),
    ("Split", split),
    ("Concat", concat),
    ("Pad", pad),
];

/// One axis of a slice: `start..end` by `step`, already clamped.
#[derive(Clone, Copy)]
struct Range1 {
    axis: usize,
    start: usize,
    end: usize,
    step: usize,
}

/// A value being sliced: folded or in the graph.
enum Sliced {
    Const(HostTensor),
    Ir(ValueId),
}

fn apply(cx: &mut NodeCx<'_>, x: Sliced, r: Range1, suffix: &str) -> Result<Sliced, String> {
    Ok(match x {
        Sliced::Const(t) => Sliced::Const(fold_slice(&t, r)?),
        Sliced::Ir(v) => {
            let op = Op::Slice {
                axis: r.axis,
                start: r.start,
                end: r.end,
                step: r.step,
            };
            Sliced::Ir(cx.add(op, &[v], suffix)?)
        }
    })
}

fn fold_slice(t: &HostTensor, r: Range1) -> Result<HostTensor, String> {
    let dim = t.shape[r.axis];
    let outer: usize = t.shape[..r.axis].iter().product();
    let inner: usize = t.shape[r.axis + 1..].iter().product();
    let ks: Vec<usize> = (r.start..r.end).step_by(r.step).collect();
    let mut shape = t.shape.clone();
    shape[r.axis] = ks.len();
    check_size(&shape)?;
    let mut flat = Vec::with_capacity(shape.iter().product());
    for o in 0..outer {
        for &k in &ks {
            let base = (o * dim + k) * inner;
            flat.extend(base..base + inner);
        }
    }
    Ok(t.pick(&flat, shape))
}

/// `x[start..end]` along `axis` (`start <= end <= ` the axis length): folded
/// for a constant, a `Slice` node otherwise, `x` itself for the whole axis.
pub(super) fn slice_val(
    cx: &mut NodeCx<'_>,
    x: &Val,
    axis: usize,
    (start, end): (usize, usize),
    suffix: &str,
) -> Result<Val, String> {
    let x = match x {
        Val::Const(t) => Sliced::Const(t.clone()),
        Val::Ir(v) if cx.imp.g.value_type(*v).shape.dims().get(axis) == Some(&(end - start)) => {
            return Ok(Val::Ir(*v))
        }
        Val::Ir(v) => Sliced::Ir(*v),
    };
    let r = Range1 {
        axis,
        start,
        end,
        step: 1,
    };
    Ok(match apply(cx, x, r, suffix)? {
        Sliced::Const(t) => Val::Const(t),
        Sliced::Ir(v) => Val::Ir(v),
    })
}

/// `x` at positions `idx` of `axis` (a `Gather` with constant indices).
fn take(cx: &mut NodeCx<'_>, x: Sliced, axis: usize, idx: Vec<i64>) -> Result<Sliced, String> {
    let idx = HostTensor::vec_i64(idx);
    Ok(match x {
        Sliced::Const(t) => Sliced::Const(fold_take(&t, axis, &idx.as_i64())?),
        Sliced::Ir(v) => {
            let i = cx.constant(&idx)?;
            Sliced::Ir(cx.add(Op::Gather { axis }, &[v, i], "take")?)
        }
    })
}

fn fold_take(t: &HostTensor, axis: usize, idx: &[i64]) -> Result<HostTensor, String> {
    let dim = t.shape[axis];
    let outer: usize = t.shape[..axis].iter().product();
    let inner: usize = t.shape[axis + 1..].iter().product();
    let mut shape = t.shape.clone();
    shape[axis] = idx.len();
    check_size(&shape)?;
    let mut flat = Vec::with_capacity(shape.iter().product());
    for o in 0..outer {
        for &k in idx {
            let base = (o * dim + k as usize) * inner;
            flat.extend(base..base + inner);
        }
    }
    Ok(t.pick(&flat, shape))
}

/// The indices a negative `step` visits from `start` towards `end` (the
/// spec's clamping: start into `[0, dim-1]`, end into `[-1, dim-1]`).
fn backward_indices(start: i64, end: i64, step: i64, dim: usize) -> Vec<i64> {
    let d = dim as i64;
    let norm = |v: i64| if v < 0 { v.saturating_add(d) } else { v };
    let start = norm(start).clamp(0, d - 1);
    let end = norm(end).clamp(-1, d - 1);
    let mut idx = Vec::new();
    let mut i = start;
    while i > end {
        idx.push(i);
        i = i.saturating_add(step);
    }
    idx
}

fn start_value(cx: &NodeCx<'_>) -> Result<Sliced, String> {
    Ok(match cx.val(0)? {
        Val::Const(t) => Sliced::Const(t.clone()),
        Val::Ir(v) => Sliced::Ir(*v),
    })
}

fn finish(cx: &mut NodeCx<'_>, out: usize, x: Sliced) {
    let v = match x {
        Sliced::Const(t) => Val::Const(t),
        Sliced::Ir(v) => Val::Ir(v),
    };
    cx.set(out, v);
}

/// `v` (possibly negative, possibly huge) clamped into `0..=dim`.
fn clamp(v: i64, dim: usize) -> usize {
    let d = dim as i64;
    (if v < 0 { v.saturating_add(d) } else { v }).clamp(0, d) as usize
}

fn slice(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let dims = cx.ty(0)?.shape.dims().to_vec();
    let starts = cx.konst(1, "starts")?.as_i64();
    let ends = cx.konst(2, "ends")?.as_i64();
    let n = starts.len();
    let axes = match cx.opt_konst(3, "axes")? {
        Some(t) => t.as_i64(),
        None => (0..n as i64).collect(),
    };
    let steps = match cx.opt_konst(4, "steps")? {
        Some(t) => t.as_i64(),
        None => vec![1; n],
    };
    if ends.len() != n || axes.len() != n || steps.len() != n {
        return Err("starts, ends, axes and steps differ in length".into());
    }
    let mut x = start_value(cx)?;
    for i in 0..n {
        let axis = norm_axis(axes[i], dims.len())?;
        if steps[i] == 0 {
            return Err(format!("step 0 on axis {axis}"));
        }
        if steps[i] < 0 {
            let idx = backward_indices(starts[i], ends[i], steps[i], dims[axis]);
            x = take(cx, x, axis, idx)?;
            continue;
        }
        let start = clamp(starts[i], dims[axis]);
        let end = clamp(ends[i], dims[axis]).max(start);
        if start == 0 && end == dims[axis] && steps[i] == 1 {
            continue;
        }
        let r = Range1 {
            axis,
            start,
            end,
            step: steps[i] as usize,
        };
        x = apply(cx, x, r, &format!("slice{i}"))?;
    }
    finish(cx, 0, x);
    Ok(())
}

fn split(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let dims = cx.ty(0)?.shape.dims().to_vec();
    let axis = norm_axis(cx.attr_i("axis", 0)?, dims.len())?;
    let dim = dims[axis];
    let sizes = split_sizes(cx, dim)?;
    let total = sizes.iter().try_fold(0usize, |a, &s| a.checked_add(s));
    if total != Some(dim) {
        return Err(format!("split sizes {sizes:?} do not add up to {dim}"));
    }
    let mut start = 0;
    for (i, &len) in sizes.iter().enumerate() {
        let r = Range1 {
            axis,
            start,
            end: start + len,
            step: 1,
        };
        start += len;
        if cx.wants(i) {
            let x = start_value(cx)?;
            let y = apply(cx, x, r, &format!("split{i}"))?;
            finish(cx, i, y);
        }
    }
    Ok(())
}

/// The length of each output of a Split along an axis of length `dim`: the
/// `split` input, or `num_outputs` (one per output) parts of equal length but
/// the last.
fn split_sizes(cx: &NodeCx<'_>, dim: usize) -> Result<Vec<usize>, String> {
    if let Some(t) = cx.opt_konst(1, "split")? {
        let sizes = t.as_i64();
        return sizes
            .iter()
            .map(|&s| usize::try_from(s))
            .collect::<Result<_, _>>()
            .map_err(|_| format!("split sizes {sizes:?} must not be negative"));
    }
    let outputs = cx.node.output.len();
    let n = cx.attr_i("num_outputs", outputs as i64)?;
    if n != outputs as i64 || n < 1 {
        return Err(format!(
            "num_outputs {n} does not match the node's {outputs} outputs"
        ));
    }
    let each = dim.div_ceil(outputs);
    Ok((0..outputs)
        .map(|i| each.min(dim.saturating_sub(i.saturating_mul(each))))
        .collect())
}

fn concat(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let rank = cx.rank(0)?;
    let axis = norm_axis(cx.attr_i("axis", 0)?, rank)?;
    if cx.all_const() {
        let parts: Vec<HostTensor> = (0..cx.n_inputs())
            .map(|i| cx.konst(i, "operand").cloned())
            .collect::<Result<_, _>>()?;
        let y = fold_concat(&parts, axis)?;
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let like = (0..cx.n_inputs())
        .find_map(|i| match cx.val(i) {
            Ok(Val::Ir(v)) => Some(cx.imp.g.value_type(*v).clone()),
            _ => None,
        })
        .ok_or("no operand computed at run time")?;
    let ins = (0..cx.n_inputs())
        .map(|i| cx.ir_like(i, &like))
        .collect::<Result<Vec<_>, _>>()?;
    let y = cx.add(Op::Concat { axis }, &ins, "concat")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

fn fold_concat(parts: &[HostTensor], axis: usize) -> Result<HostTensor, String> {
    let first = parts.first().ok_or("Concat needs at least one input")?;
    let mut shape = first.shape.clone();
    shape[axis] = parts
        .iter()
        .try_fold(0usize, |a, p| a.checked_add(p.shape.get(axis).copied()?))
        .ok_or_else(|| "the concatenated axis overflows or an operand lacks it".to_string())?;
    check_size(&shape)?;
    for p in parts {
        if p.shape.len() != shape.len()
            || p.shape[..axis] != shape[..axis]
            || p.shape[axis + 1..] != shape[axis + 1..]
        {
            return Err(format!(
                "operands of shapes {:?} and {:?} do not concatenate",
                first.shape, p.shape
            ));
        }
    }
    let outer: usize = shape[..axis].iter().product();
    let values: Vec<(Vec<i64>, Vec<f64>, usize)> = parts
        .iter()
        .map(|p| (p.as_i64(), p.as_f64(), p.shape[axis..].iter().product()))
        .collect();
    let mut ints = Vec::new();
    let mut floats = Vec::new();
    for o in 0..outer {
        for (pi, pf, chunk) in &values {
            let (lo, hi) = (o * chunk, (o + 1) * chunk);
            ints.extend_from_slice(&pi[lo..hi]);
            floats.extend_from_slice(&pf[lo..hi]);
        }
    }
    Ok(if first.dtype.is_float() {
        HostTensor::floats(first.dtype, shape, floats)
    } else {
        HostTensor::ints(first.dtype, shape, ints)
    })
}

fn pad(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let mode = cx.attr_s("mode", "constant")?;
    let rank = cx.rank(0)?;
    let pads = cx.konst(1, "pads")?.as_i64();
    let value = cx
        .opt_konst(2, "constant value")?
        .map_or(0.0, |t| t.as_f64().first().copied().unwrap_or(0.0));
    let axes: Vec<usize> = match cx.opt_konst(3, "axes")? {
        Some(t) => t
            .as_i64()
            .into_iter()
            .map(|a| norm_axis(a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() || pads.iter().any(|&p| p < 0) {
        return Err(format!(
            "pads {pads:?}: need 2 non-negative values per axis"
        ));
    }
    let mut pairs = vec![(0usize, 0usize); rank];
    for (k, &a) in axes.iter().enumerate() {
        pairs[a] = (pads[k] as usize, pads[k + axes.len()] as usize);
    }
    let dims = cx.ty(0)?.shape.dims().to_vec();
    let padded: Option<Vec<usize>> = dims
        .iter()
        .zip(&pairs)
        .map(|(&d, &(b, e))| d.checked_add(b)?.checked_add(e))
        .collect();
    check_numel(&padded.ok_or("pads overflow")?)?;
    if mode != "constant" {
        return pad_by_index(cx, &mode, &pairs, &dims);
    }
    let x = cx.ir(0)?;
    let y = cx.add(Op::Pad { pads: pairs, value }, &[x], "pad")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// Edge, reflect and wrap padding: per padded axis, a `Gather` of the source
/// index of every output position.
fn pad_by_index(
    cx: &mut NodeCx<'_>,
    mode: &str,
    pairs: &[(usize, usize)],
    dims: &[usize],
) -> Result<(), String> {
    let mut x = start_value(cx)?;
    for (axis, (&(b, e), &d)) in pairs.iter().zip(dims).enumerate() {
        if b == 0 && e == 0 {
            continue;
        }
        if d == 0 {
            return Err(format!("mode `{mode}` cannot pad the empty axis {axis}"));
        }
        let (d, b) = (d as i64, b as i64);
        let src = |j: i64| -> Result<i64, String> {
            let s = j - b;
            Ok(match mode {
                "edge" => s.clamp(0, d - 1),
                "wrap" => s.rem_euclid(d),
                "reflect" if d == 1 => 0,
                "reflect" => {
                    let m = s.rem_euclid(2 * (d - 1));
                    if m >= d {
                        2 * (d - 1) - m
                    } else {
                        m
                    }
                }
                _ => {
                    return Err(format!(
                        "mode `{mode}` (expected constant, edge, reflect or wrap)"
                    ))
                }
            })
        };
        let idx = (0..d + b + e as i64).map(src).collect::<Result<_, _>>()?;
        x = take(cx, x, axis, idx)?;
    }
    finish(cx, 0, x);
    Ok(())
}
