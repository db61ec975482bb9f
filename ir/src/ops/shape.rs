//! Data-movement ops: `Reshape`, `Transpose`, `Slice`, `Concat`, `Expand`,
//! `Pad`, and `SumTo` (the inverse of broadcasting, which autodiff emits for
//! the gradient of every broadcast). They count no FLOPs, except `SumTo`
//! (one addition per input element).
//!
//! `Slice` clamps `end` to the axis length as numpy does; `start` must not
//! exceed it. `Expand` is numpy `broadcast_to`: the input must broadcast to
//! exactly `shape`.

use super::check::{arity, axis, broadcasts_to, checked_bytes, permutation};
use super::{in_numel, misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::{DType, TensorType};

pub(crate) struct ShapeOps;

impl Family for ShapeOps {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        if !matches!(op, Op::Concat { .. }) {
            arity(inputs, 1, "x")?;
        }
        let t = match op {
            Op::Reshape { shape } => reshape(inputs[0], shape)?,
            Op::Transpose { perm } => transpose(inputs[0], perm)?,
            Op::Slice {
                axis,
                start,
                end,
                step,
            } => slice(inputs[0], *axis, *start, *end, *step)?,
            Op::Concat { axis } => concat(inputs, *axis)?,
            Op::Expand { shape } => expand(inputs[0], shape)?,
            Op::Pad { pads, .. } => pad(inputs[0], pads)?,
            Op::SumTo { shape } => sum_to(inputs[0], shape)?,
            _ => return Err(misrouted(op, "shape")),
        };
        Ok(vec![t])
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        if let Op::Concat { axis } = op {
            return vjp_concat(cx, *axis);
        }
        let (x, dy) = (cx.x(0)?, cx.dy());
        let x_shape = cx.shape(x)?;
        let g = match op {
            Op::Reshape { .. } => cx.emit(Op::Reshape { shape: x_shape }, &[dy])?,
            Op::Transpose { perm } => cx.emit(
                Op::Transpose {
                    perm: inverse(perm),
                },
                &[dy],
            )?,
            Op::Slice {
                axis,
                start,
                end,
                step,
            } => {
                let (axis, start, end, step) = (*axis, *start, *end, *step);
                let input_shape = x_shape;
                let op = Op::SliceGrad {
                    axis,
                    start,
                    end,
                    step,
                    input_shape,
                };
                cx.emit(op, &[dy])?
            }
            Op::Expand { .. } => cx.sum_to(dy, &x_shape)?,
            Op::Pad { pads, .. } => vjp_pad(cx, pads, &x_shape)?,
            Op::SumTo { .. } => cx.emit(Op::Expand { shape: x_shape }, &[dy])?,
            _ => return Err(misrouted(op, "shape")),
        };
        Ok(vec![Some(g)])
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], _outputs: &[TensorType]) -> f64 {
        match op {
            Op::SumTo { .. } => in_numel(inputs, 0),
            _ => 0.0,
        }
    }
}

fn reshape(x: &TensorType, shape: &[usize]) -> Result<TensorType, String> {
    if checked_bytes(x.dtype, shape).is_none() {
        return Err(format!(
            "the target shape {shape:?} is too large (its size overflows)"
        ));
    }
    let out = TensorType::new(x.dtype, shape.to_vec());
    if out.numel() != x.numel() {
        return Err(format!(
            "cannot reshape {x} ({} elements) to {} ({} elements)",
            x.numel(),
            out.shape,
            out.numel()
        ));
    }
    Ok(out)
}

fn transpose(x: &TensorType, perm: &[usize]) -> Result<TensorType, String> {
    permutation(perm, x.shape.rank())?;
    let d = x.shape.dims();
    Ok(TensorType::new(
        x.dtype,
        perm.iter().map(|&p| d[p]).collect::<Vec<_>>(),
    ))
}

/// The inverse of a permutation.
pub(crate) fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        if let Some(slot) = inv.get_mut(p) {
            *slot = i;
        }
    }
    inv
}

/// The type of `x[start:end:step]` along `ax` (`end` clamped to the length).
pub(crate) fn slice(
    x: &TensorType,
    ax: usize,
    start: usize,
    end: usize,
    step: usize,
) -> Result<TensorType, String> {
    axis(x, ax, "x")?;
    let dim = x.shape.dims()[ax];
    if step == 0 {
        return Err("step must be >= 1, got 0".into());
    }
    if start > dim {
        return Err(format!(
            "start {start} is past the end of axis {ax} (length {dim}) of {x}"
        ));
    }
    let end = end.min(dim);
    let len = if end > start {
        (end - start).div_ceil(step)
    } else {
        0
    };
    let mut shape = x.shape.0.clone();
    shape[ax] = len;
    Ok(TensorType::new(x.dtype, shape))
}

fn concat(inputs: &[&TensorType], ax: usize) -> Result<TensorType, String> {
    let Some(first) = inputs.first() else {
        return Err("expects at least one input, got 0".into());
    };
    axis(first, ax, "input 0")?;
    let mut shape = first.shape.0.clone();
    shape[ax] = 0;
    for (i, t) in inputs.iter().enumerate() {
        let d = t.shape.dims();
        let compatible = t.dtype == first.dtype
            && d.len() == shape.len()
            && d.iter()
                .zip(first.shape.dims())
                .enumerate()
                .all(|(j, (a, b))| j == ax || a == b);
        if !compatible {
            return Err(format!(
                "input {i} {t} does not match input 0 {first} outside axis {ax}"
            ));
        }
        shape[ax] = shape[ax]
            .checked_add(d[ax])
            .ok_or_else(|| format!("the concatenated axis {ax} overflows at input {i} {t}"))?;
    }
    Ok(TensorType::new(first.dtype, shape))
}

fn expand(x: &TensorType, shape: &[usize]) -> Result<TensorType, String> {
    if !broadcasts_to(x.shape.dims(), shape) {
        return Err(format!("{x} does not broadcast to {shape:?}"));
    }
    Ok(TensorType::new(x.dtype, shape.to_vec()))
}

fn pad(x: &TensorType, pads: &[(usize, usize)]) -> Result<TensorType, String> {
    if pads.len() != x.shape.rank() {
        return Err(format!(
            "{} pads for {x} of rank {}",
            pads.len(),
            x.shape.rank()
        ));
    }
    let shape: Option<Vec<usize>> = x
        .shape
        .dims()
        .iter()
        .zip(pads)
        .map(|(d, (b, a))| d.checked_add(*b)?.checked_add(*a))
        .collect();
    let shape = shape.ok_or_else(|| format!("pads {pads:?} of {x} overflow"))?;
    Ok(TensorType::new(x.dtype, shape))
}

fn sum_to(x: &TensorType, shape: &[usize]) -> Result<TensorType, String> {
    if x.dtype == DType::Bool {
        return Err(format!("cannot sum a bool tensor {x}"));
    }
    if !broadcasts_to(shape, x.shape.dims()) {
        return Err(format!(
            "{shape:?} does not broadcast to {x}, so {x} cannot be summed to it"
        ));
    }
    Ok(TensorType::new(x.dtype, shape.to_vec()))
}

/// Each input's gradient is its slice of `dy` along `axis`.
fn vjp_concat(cx: &mut VjpCtx<'_>, axis: usize) -> Result<Vec<Option<ValueId>>, String> {
    let dy = cx.dy();
    let mut start = 0;
    let mut grads = Vec::new();
    for i in 0.. {
        let Ok(x) = cx.x(i) else { break };
        let len = cx.shape(x)?.get(axis).copied().unwrap_or(0);
        let end = start + len;
        grads.push(if cx.needs(i) {
            Some(cx.emit(
                Op::Slice {
                    axis,
                    start,
                    end,
                    step: 1,
                },
                &[dy],
            )?)
        } else {
            None
        });
        start = end;
    }
    Ok(grads)
}

/// The gradient of a pad is `dy` with the padding sliced off each axis.
fn vjp_pad(
    cx: &mut VjpCtx<'_>,
    pads: &[(usize, usize)],
    x_shape: &[usize],
) -> Result<ValueId, String> {
    let mut g = cx.dy();
    for (axis, (&(before, after), &dim)) in pads.iter().zip(x_shape).enumerate() {
        if before + after > 0 {
            let op = Op::Slice {
                axis,
                start: before,
                end: before + dim,
                step: 1,
            };
            g = cx.emit(op, &[g])?;
        }
    }
    Ok(g)
}
