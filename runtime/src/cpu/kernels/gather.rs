//! `Gather { axis }` (numpy `take`; an embedding lookup is axis 0) and
//! `GatherGrad` (scatter-add into zeros). Negative indices count from the end,
//! as in ONNX; an index out of range is an error, never a wild read.

use super::layout::split_axis;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};

/// Resolves index `i` against an axis of length `n`.
#[inline]
fn resolve(i: i64, n: usize) -> KResult<usize> {
    let r = if i < 0 { i + n as i64 } else { i };
    if r < 0 || r >= n as i64 {
        crate::kbail!("index {i} out of range for an axis of length {n}");
    }
    Ok(r as usize)
}

/// `Gather { axis }`: `(data, indices)`.
pub fn gather(
    axis: usize,
    data: &TensorRef,
    indices: &TensorRef,
    y: &mut TensorMut,
) -> KResult<()> {
    let (outer, n, inner) = split_axis(data.dims(), axis)?;
    if data.dtype() != y.dtype() {
        crate::kbail!("gather: data {} and output {} dtypes differ", data.ty, y.ty);
    }
    let idx = indices.ints()?;
    if y.numel() != outer * idx.len() * inner {
        crate::kbail!(
            "gather: output {} does not match data {} and indices {}",
            y.ty,
            data.ty,
            indices.ty
        );
    }
    let run = inner * data.dtype().size();
    let mut o = 0;
    for b in 0..outer {
        for i in idx.iter() {
            let r = resolve(i, n)?;
            let src = (b * n + r) * run;
            y.bytes[o..o + run].copy_from_slice(&data.bytes[src..src + run]);
            o += run;
        }
    }
    Ok(())
}

/// `GatherGrad { axis, data_shape }`: `(indices, dy) -> d data`.
pub fn gather_grad(
    axis: usize,
    indices: &TensorRef,
    dy: &TensorRef,
    dx: &mut TensorMut,
) -> KResult<()> {
    let (outer, n, inner) = split_axis(dx.dims(), axis)?;
    let idx = indices.ints()?;
    let (g, d) = (dy.f32()?, dx.f32_mut()?);
    if g.len() != outer * idx.len() * inner {
        crate::kbail!(
            "gather_grad: dy {} does not match indices {}",
            dy.ty,
            indices.ty
        );
    }
    d.fill(0.0);
    let mut o = 0;
    for b in 0..outer {
        for i in idx.iter() {
            let r = resolve(i, n)?;
            let dst = &mut d[(b * n + r) * inner..(b * n + r + 1) * inner];
            for (a, &v) in dst.iter_mut().zip(&g[o..o + inner]) {
                *a += v;
            }
            o += inner;
        }
    }
    Ok(())
}
