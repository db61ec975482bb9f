//! `Softmax`, `LogSoftmax` along any axis and their gradients. Rows along the
//! last axis run as contiguous loops; other axes gather the strided row into
//! workspace first. Max-subtraction keeps the exponentials stable.

use super::fastmath::exp;
use super::layout::split_axis;
use super::simd;
use crate::backend::Workspace;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};

/// Softmax of one contiguous row from `x` into `y`.
#[inline(always)]
pub fn softmax_row(x: &[f32], y: &mut [f32]) {
    let m = simd::max(x);
    let s = simd::exp_sum(x, m, Some(y));
    simd::scale(y, 1.0 / s);
}

/// Log-softmax of one contiguous row.
#[inline(always)]
pub fn log_softmax_row(x: &[f32], y: &mut [f32]) {
    let m = simd::max(x);
    // `(v - m) - ln Σ`, not `v - (m + ln Σ)`: the latter loses the small
    // terms when |m| is large (ONNX test_logsoftmax_large_number).
    let ln_sum = simd::exp_sum(x, m, None).ln();
    for (o, &v) in y.iter_mut().zip(x) {
        *o = (v - m) - ln_sum;
    }
}

/// Which row function and gradient a kernel runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `Softmax`.
    Softmax,
    /// `LogSoftmax`.
    LogSoftmax,
}

/// Runs `f(row inputs..., row output)` over every row along `axis`; rows
/// off the last axis are copied through workspace.
#[inline(always)]
fn for_rows<const N: usize>(
    dims: &[usize],
    axis: usize,
    ins: [&[f32]; N],
    out: &mut [f32],
    ws: &mut Workspace,
    mut f: impl FnMut([&[f32]; N], &mut [f32]),
) -> KResult<()> {
    let (outer, len, inner) = split_axis(dims, axis)?;
    if inner == 1 {
        for r in 0..outer {
            let rows: [&[f32]; N] = std::array::from_fn(|k| &ins[k][r * len..(r + 1) * len]);
            f(rows, &mut out[r * len..(r + 1) * len]);
        }
        return Ok(());
    }
    let buf = ws.f32s((N + 1) * len)?;
    for o in 0..outer {
        for i in 0..inner {
            let base = o * len * inner + i;
            for k in 0..N {
                for j in 0..len {
                    buf[k * len + j] = ins[k][base + j * inner];
                }
            }
            let (src, dst) = buf.split_at_mut(N * len);
            let rows: [&[f32]; N] = std::array::from_fn(|k| &src[k * len..(k + 1) * len]);
            f(rows, dst);
            for j in 0..len {
                out[base + j * inner] = dst[j];
            }
        }
    }
    Ok(())
}

/// `Softmax { axis }` / `LogSoftmax { axis }`.
pub fn forward(
    kind: Kind,
    axis: usize,
    x: &TensorRef,
    y: &mut TensorMut,
    ws: &mut Workspace,
) -> KResult<()> {
    let (xs, ys) = (x.f32()?, y.f32_mut()?);
    forward_rows(kind, x.dims(), axis, xs, ys, ws)
}

/// `SoftmaxGrad` / `LogSoftmaxGrad`: `(y, dy) -> dx`.
pub fn backward(
    kind: Kind,
    axis: usize,
    y: &TensorRef,
    dy: &TensorRef,
    dx: &mut TensorMut,
    ws: &mut Workspace,
) -> KResult<()> {
    let (ys, dys, dxs) = (y.f32()?, dy.f32()?, dx.f32_mut()?);
    backward_rows(kind, y.dims(), axis, ys, dys, dxs, ws)
}

crate::multiversion! {
    /// Softmax or log-softmax of every row along `axis`.
    fn forward_rows(kind: Kind, dims: &[usize], axis: usize, xs: &[f32], ys: &mut [f32], ws: &mut Workspace) -> KResult<()> {
        for_rows(dims, axis, [xs], ys, ws, |[xr], yr| match kind {
            Kind::Softmax => softmax_row(xr, yr),
            Kind::LogSoftmax => log_softmax_row(xr, yr),
        })
    }
}

crate::multiversion! {
    /// The softmax or log-softmax gradient of every row along `axis`.
    fn backward_rows(kind: Kind, dims: &[usize], axis: usize, ys: &[f32], dys: &[f32], dxs: &mut [f32], ws: &mut Workspace) -> KResult<()> {
        for_rows(dims, axis, [ys, dys], dxs, ws, |[yr, dyr], dxr| match kind {
            Kind::Softmax => {
                let dot = simd::dot(yr, dyr);
                for j in 0..yr.len() {
                    dxr[j] = yr[j] * (dyr[j] - dot);
                }
            }
            Kind::LogSoftmax => {
                let sum = simd::sum(dyr);
                for j in 0..yr.len() {
                    dxr[j] = dyr[j] - exp(yr[j]) * sum;
                }
            }
        })
    }
}
