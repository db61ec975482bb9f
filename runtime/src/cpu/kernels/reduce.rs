//! Reductions: `Reduce { Sum | Mean | Max }`, `SumTo` (the inverse of
//! broadcasting) and `ReduceMaxGrad`. The input is walked in row-major order
//! with `Blocks`, the reduced output treated as an operand broadcast over the
//! reduced axes, so accumulation order is fixed and deterministic.

use super::layout::Blocks;
use crate::backend::Workspace;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};
use fsdpc_ir::ReduceFn;

/// The keepdims shape of reducing `dims` over `axes` (empty: every axis).
fn kept(dims: &[usize], axes: &[usize]) -> KResult<Vec<usize>> {
    if axes.is_empty() {
        return Ok(vec![1; dims.len()]);
    }
    let mut k = dims.to_vec();
    for &a in axes {
        if a >= dims.len() {
            crate::kbail!("reduce axis {a} out of range for shape {dims:?}");
        }
        k[a] = 1;
    }
    Ok(k)
}

/// Calls `f(output index, input index)` for every input element.
fn walk(in_dims: &[usize], out_kept: &[usize], mut f: impl FnMut(usize, usize)) -> KResult<()> {
    let blocks = Blocks::new(in_dims, [out_kept])?;
    let [s] = blocks.inner_strides;
    blocks.for_each(|[o], i| {
        for j in 0..blocks.inner {
            f(o + j * s, i + j);
        }
    });
    Ok(())
}

/// `Reduce { f, axes, keepdims }`.
pub fn reduce(f: ReduceFn, axes: &[usize], x: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    let k = kept(x.dims(), axes)?;
    let xs = x.f32()?;
    let ys = y.f32_mut()?;
    if ys.len() != k.iter().product::<usize>() {
        crate::kbail!("reduce output {} does not match {}", y.ty, x.ty);
    }
    let init = if f == ReduceFn::Max {
        f32::NEG_INFINITY
    } else {
        0.0
    };
    ys.fill(init);
    match f {
        ReduceFn::Max => walk(x.dims(), &k, |o, i| ys[o] = ys[o].max(xs[i]))?,
        _ => walk(x.dims(), &k, |o, i| ys[o] += xs[i])?,
    }
    if f == ReduceFn::Mean && !ys.is_empty() {
        let count = (xs.len() / ys.len()) as f32;
        for v in ys.iter_mut() {
            *v /= count;
        }
    }
    Ok(())
}

/// `SumTo { shape }`: sums `dy` over its broadcast axes.
pub fn sum_to(dy: &TensorRef, dx: &mut TensorMut) -> KResult<()> {
    let target = dx.dims();
    let (g, d) = (dy.f32()?, dx.f32_mut()?);
    d.fill(0.0);
    let blocks = Blocks::new(dy.dims(), [target])?;
    sum_runs(&blocks, g, d);
    Ok(())
}

/// `ReduceMaxGrad { axes }`: `(x, y, dy) -> dx`, routing each `dy` to the
/// first position that attains the maximum.
pub fn reduce_max_grad(
    axes: &[usize],
    ins: [&TensorRef; 3],
    dx: &mut TensorMut,
    ws: &mut Workspace,
) -> KResult<()> {
    let [x, y, dy] = ins;
    let k = kept(x.dims(), axes)?;
    let (xs, ys, dys, dxs) = (x.f32()?, y.f32()?, dy.f32()?, dx.f32_mut()?);
    if ys.len() != k.iter().product::<usize>() || dys.len() != ys.len() {
        crate::kbail!(
            "reduce_max_grad: y {} or dy {} does not match x {}",
            y.ty,
            dy.ty,
            x.ty
        );
    }
    let taken = ws.f32s(ys.len())?;
    taken.fill(0.0);
    walk(x.dims(), &k, |o, i| {
        let hit = taken[o] == 0.0 && xs[i] == ys[o];
        if hit {
            taken[o] = 1.0;
        }
        dxs[i] = if hit { dys[o] } else { 0.0 };
    })
}

crate::multiversion! {
    /// Accumulates every inner run of `g` into `d` (stride 1: elementwise;
    /// stride 0: the run's sum into one element).
    fn sum_runs(blocks: &Blocks<1>, g: &[f32], d: &mut [f32]) {
        let [s] = blocks.inner_strides;
        let n = blocks.inner;
        blocks.for_each(|[o], i| {
            if s == 1 {
                for (a, &v) in d[o..o + n].iter_mut().zip(&g[i..i + n]) {
                    *a += v;
                }
            } else {
                d[o] += super::simd::sum(&g[i..i + n]);
            }
        })
    }
}
