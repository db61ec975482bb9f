//! Normalisation over the last axis: `LayerNorm`, `RmsNorm` and their
//! gradients, which recompute the row statistics instead of storing them.
//! Statistics use the biased variance, as PyTorch does.

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
#[inline]
fn moments(row: &[f32], eps: f32) -> (f32, f32) {
    let n = row.len() as f32;
    let mean = row.iter().sum::<f32>() / n;
    let var = row.iter().map(|&v| (v - mean) * (v - mean)).sum::<f32>() / n;
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
    let ys = y.f32_mut()?;
    for (xr, yr) in xs.chunks_exact(d).zip(ys.chunks_exact_mut(d)) {
        let (mean, rstd) = moments(xr, eps as f32);
        match b {
            Some(b) => {
                for j in 0..d {
                    yr[j] = (xr[j] - mean) * rstd * g[j] + b[j];
                }
            }
            None => {
                for j in 0..d {
                    yr[j] = (xr[j] - mean) * rstd * g[j];
                }
            }
        }
    }
    Ok(())
}

/// `LayerNormGrad { eps, has_beta }`: `(x, gamma, dy) -> (dx, dgamma[, dbeta])`.
pub fn layer_norm_grad(
    eps: f64,
    x: &TensorRef,
    gamma: &TensorRef,
    dy: &TensorRef,
    outs: &mut [TensorMut],
) -> KResult<()> {
    let (_, d) = rows(x, &[gamma])?;
    let (xs, g, dys) = (x.f32()?, gamma.f32()?, dy.f32()?);
    let [dx, dgamma, rest @ ..] = outs else {
        crate::kbail!("layer_norm_grad needs at least two outputs");
    };
    let (dxs, dg) = (dx.f32_mut()?, dgamma.f32_mut()?);
    let mut db = match rest.first_mut() {
        Some(t) => Some(t.f32_mut()?),
        None => None,
    };
    dg.fill(0.0);
    if let Some(db) = db.as_deref_mut() {
        db.fill(0.0);
    }
    for ((xr, dyr), dxr) in xs
        .chunks_exact(d)
        .zip(dys.chunks_exact(d))
        .zip(dxs.chunks_exact_mut(d))
    {
        let (mean, rstd) = moments(xr, eps as f32);
        let (mut sum_g, mut sum_gx) = (0.0f32, 0.0f32);
        for j in 0..d {
            let xhat = (xr[j] - mean) * rstd;
            let gj = dyr[j] * g[j];
            sum_g += gj;
            sum_gx += gj * xhat;
            dg[j] += dyr[j] * xhat;
        }
        if let Some(db) = db.as_deref_mut() {
            for j in 0..d {
                db[j] += dyr[j];
            }
        }
        let (mg, mgx) = (sum_g / d as f32, sum_gx / d as f32);
        for j in 0..d {
            let xhat = (xr[j] - mean) * rstd;
            dxr[j] = rstd * (dyr[j] * g[j] - mg - xhat * mgx);
        }
    }
    Ok(())
}

/// 1/sqrt(mean(x^2) + eps) of one row.
#[inline]
fn rms(row: &[f32], eps: f32) -> f32 {
    let ms = row.iter().map(|&v| v * v).sum::<f32>() / row.len() as f32;
    1.0 / (ms + eps).sqrt()
}

/// `RmsNorm { eps }`: `(x, gamma)`.
pub fn rms_norm(eps: f64, x: &TensorRef, gamma: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    let (_, d) = rows(x, &[gamma])?;
    let (xs, g, ys) = (x.f32()?, gamma.f32()?, y.f32_mut()?);
    for (xr, yr) in xs.chunks_exact(d).zip(ys.chunks_exact_mut(d)) {
        let r = rms(xr, eps as f32);
        for j in 0..d {
            yr[j] = xr[j] * r * g[j];
        }
    }
    Ok(())
}

/// `RmsNormGrad { eps }`: `(x, gamma, dy) -> (dx, dgamma)`.
pub fn rms_norm_grad(
    eps: f64,
    x: &TensorRef,
    gamma: &TensorRef,
    dy: &TensorRef,
    outs: &mut [TensorMut],
) -> KResult<()> {
    let (_, d) = rows(x, &[gamma])?;
    let (xs, g, dys) = (x.f32()?, gamma.f32()?, dy.f32()?);
    let [dx, dgamma, ..] = outs else {
        crate::kbail!("rms_norm_grad needs two outputs");
    };
    let (dxs, dg) = (dx.f32_mut()?, dgamma.f32_mut()?);
    dg.fill(0.0);
    for ((xr, dyr), dxr) in xs
        .chunks_exact(d)
        .zip(dys.chunks_exact(d))
        .zip(dxs.chunks_exact_mut(d))
    {
        let r = rms(xr, eps as f32);
        let mut sum_gx = 0.0f32;
        for j in 0..d {
            sum_gx += dyr[j] * g[j] * xr[j];
            dg[j] += dyr[j] * xr[j] * r;
        }
        let c = r * r * r * sum_gx / d as f32;
        for j in 0..d {
            dxr[j] = r * dyr[j] * g[j] - xr[j] * c;
        }
    }
    Ok(())
}
