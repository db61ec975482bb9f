//! Normalisation over the last axis: `LayerNorm`, `RmsNorm` and their
//! gradients, which recompute the row statistics instead of storing them.
//! Statistics use the biased variance, as PyTorch does. The row loops are
//! multiversioned (`simd`); the gradient kernels use rows of workspace.

use super::simd;
use crate::backend::Workspace;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};

/// (rows, row length) of `x`, checking `gamma` (and `beta`) have the row length.
fn rows(x: &TensorRef, params: &[&TensorRef]) -> KResult<(usize, usize)> {
    let d = x.dims().last().copied().unwrap_or(1);
    for p in params {
        if p.numel() != d {
            crate::kbail!(
                "normalisation parameter {} does not match the last axis of {}",
                p.ty,
                x.ty
            );
        }
    }
    if d == 0 {
        crate::kbail!("cannot normalise over an empty last axis ({})", x.ty);
    }
    Ok((x.numel() / d, d))
}

/// Mean and 1/sqrt(var + eps) of one row.
#[inline(always)]
fn moments(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = simd::sum(row) / n;
    let var = simd::sum_sq_dev(row, mean) / n;
    (mean, 1.0 / (var + eps).sqrt())
}

/// `LayerNorm { eps }`: inputs `(x, gamma)` or `(x, gamma, beta)`.
pub fn layer_norm(
    eps: f64,
    x: &TensorRef,
    gamma: &TensorRef,
    beta: Option<&TensorRef>,
    y: &mut TensorMut,
) -> KResult<()> {
    let (_, d) = match beta {
        Some(b) => rows(x, &[gamma, b])?,
        None => rows(x, &[gamma])?,
    };
    let (xs, g) = (x.f32()?, gamma.f32()?);
    let b = beta.map(|b| b.f32()).transpose()?;
    ln_rows(xs, g, b, y.f32_mut()?, d, eps as f32);
    Ok(())
}

crate::multiversion! {
    fn ln_rows(xs: &[f32], g: &[f32], b: Option<&[f32]>, ys: &mut [f32], d: usize, eps: f32) {
        for (xr, yr) in xs.chunks_exact(d).zip(ys.chunks_exact_mut(d)) {
            let (mean, rstd) = moments(xr, eps);
            for j in 0..d {
                yr[j] = (xr[j] - mean) * rstd * g[j];
            }
            if let Some(b) = b {
                for j in 0..d {
                    yr[j] += b[j];
                }
            }
        }
    }
}

/// `LayerNormGrad { eps, has_beta }`: `(x, gamma, dy) -> (dx, dgamma[, dbeta])`.
pub fn layer_norm_grad(
    eps: f64,
    ins: [&TensorRef; 3],
    outs: &mut [TensorMut],
    ws: &mut Workspace,
) -> KResult<()> {
    let [x, gamma, dy] = ins;
    let (_, d) = rows(x, &[gamma])?;
    let (xs, g, dys) = (x.f32()?, gamma.f32()?, dy.f32()?);
    let [dx, dgamma, rest @ ..] = outs else {
        crate::kbail!("layer_norm_grad needs at least two outputs");
    };
    let (dxs, dg) = (dx.f32_mut()?, dgamma.f32_mut()?);
    let db = match rest.first_mut() {
        Some(t) => Some(t.f32_mut()?),
        None => None,
    };
    let (xh, gy) = ws.f32s(2 * d)?.split_at_mut(d);
    ln_grad_rows(
        LnGrad {
            xs,
            g,
            dys,
            eps: eps as f32,
        },
        dxs,
        dg,
        db,
        xh,
        gy,
    );
    Ok(())
}

/// Read-only operands of the layer-norm gradient.
#[derive(Copy, Clone)]
struct LnGrad<'a> {
    xs: &'a [f32],
    g: &'a [f32],
    dys: &'a [f32],
    eps: f32,
}

crate::multiversion! {
    fn ln_grad_rows(a: LnGrad<'_>, dxs: &mut [f32], dg: &mut [f32], db: Option<&mut [f32]>, xh: &mut [f32], gy: &mut [f32]) {
        let mut db = db;
        let d = a.g.len();
        dg.fill(0.0);
        if let Some(db) = db.as_deref_mut() {
            db.fill(0.0);
        }
        for ((xr, dyr), dxr) in a.xs.chunks_exact(d).zip(a.dys.chunks_exact(d)).zip(dxs.chunks_exact_mut(d)) {
            let (mean, rstd) = moments(xr, a.eps);
            for j in 0..d {
                xh[j] = (xr[j] - mean) * rstd;
                gy[j] = dyr[j] * a.g[j];
                dg[j] += dyr[j] * xh[j];
            }
            if let Some(db) = db.as_deref_mut() {
                for j in 0..d {
                    db[j] += dyr[j];
                }
            }
            let (mg, mgx) = (simd::sum(gy) / d as f32, simd::dot(gy, xh) / d as f32);
            for j in 0..d {
                dxr[j] = rstd * (gy[j] - mg - xh[j] * mgx);
            }
        }
    }
}

/// 1/sqrt(mean(x^2) + eps) of one row.
#[inline(always)]
fn rms(row: &[f32], eps: f32) -> f32 {
    let ms = simd::dot(row, row) / row.len() as f32;
    1.0 / (ms + eps).sqrt()
}

/// `RmsNorm { eps }`: `(x, gamma)`.
pub fn rms_norm(eps: f64, x: &TensorRef, gamma: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    let (_, d) = rows(x, &[gamma])?;
    let (xs, g, ys) = (x.f32()?, gamma.f32()?, y.f32_mut()?);
    rms_rows(xs, g, ys, d, eps as f32);
    Ok(())
}

crate::multiversion! {
    fn rms_rows(xs: &[f32], g: &[f32], ys: &mut [f32], d: usize, eps: f32) {
        for (xr, yr) in xs.chunks_exact(d).zip(ys.chunks_exact_mut(d)) {
            let r = rms(xr, eps);
            for j in 0..d {
                yr[j] = xr[j] * r * g[j];
            }
        }
    }
}

/// `RmsNormGrad { eps }`: `(x, gamma, dy) -> (dx, dgamma)`.
pub fn rms_norm_grad(
    eps: f64,
    ins: [&TensorRef; 3],
    outs: &mut [TensorMut],
    ws: &mut Workspace,
) -> KResult<()> {
    let [x, gamma, dy] = ins;
    let (_, d) = rows(x, &[gamma])?;
    let (xs, g, dys) = (x.f32()?, gamma.f32()?, dy.f32()?);
    let [dx, dgamma, ..] = outs else {
        crate::kbail!("rms_norm_grad needs two outputs");
    };
    let (dxs, dg) = (dx.f32_mut()?, dgamma.f32_mut()?);
    rms_grad_rows(
        LnGrad {
            xs,
            g,
            dys,
            eps: eps as f32,
        },
        dxs,
        dg,
        ws.f32s(d)?,
    );
    Ok(())
}

crate::multiversion! {
    fn rms_grad_rows(a: LnGrad<'_>, dxs: &mut [f32], dg: &mut [f32], gy: &mut [f32]) {
        let d = a.g.len();
        dg.fill(0.0);
        for ((xr, dyr), dxr) in a.xs.chunks_exact(d).zip(a.dys.chunks_exact(d)).zip(dxs.chunks_exact_mut(d)) {
            let r = rms(xr, a.eps);
            for j in 0..d {
                gy[j] = dyr[j] * a.g[j];
                dg[j] += dyr[j] * xr[j] * r;
            }
            let c = r * r * r * simd::dot(gy, xr) / d as f32;
            for j in 0..d {
                dxr[j] = r * gy[j] - xr[j] * c;
            }
        }
    }
}
