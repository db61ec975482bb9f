//! `MaxPool`, `AvgPool` and their gradients over `[n, c, h, w]` planes.
//! A max window keeps its first maximum in row-major order (a NaN replaces
//! any value, as in PyTorch's kernels), which `MaxPoolGrad` recomputes from `x` to route
//! `dy`; an average divides by `Window2d::taps`' count.

use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};
use fsdpc_ir::Window2d;

/// `(planes, [h, w], [oh, ow])` of an `[n, c, h, w]` input and its pooled
/// `[n, c, oh, ow]` output, checked against the window.
fn planes(window: &Window2d, x: &[usize], y: &[usize]) -> KResult<(usize, [usize; 2], [usize; 2])> {
    let (Ok([n, c, h, w]), Ok([yn, yc, oh, ow])) =
        (<[usize; 4]>::try_from(x), <[usize; 4]>::try_from(y))
    else {
        crate::kbail!("pooling takes [n, c, h, w] tensors, got {x:?} and {y:?}");
    };
    match window.out_hw([h, w]) {
        Ok(o) if o == [oh, ow] && [n, c] == [yn, yc] => Ok((n * c, [h, w], [oh, ow])),
        _ => crate::kbail!("pooling {x:?} by {window:?} does not give {y:?}"),
    }
}

/// The flat input index of tap `(a, b)` of output `(i, j)`, if inside.
fn tap(window: &Window2d, hw: [usize; 2], i: usize, j: usize, a: usize, b: usize) -> Option<usize> {
    let r = window.position(0, i, a);
    let c = window.position(1, j, b);
    ((0..hw[0] as isize).contains(&r) && (0..hw[1] as isize).contains(&c))
        .then(|| r as usize * hw[1] + c as usize)
}

/// The input index of the first maximum of output `(i, j)`'s window.
fn arg_max(window: &Window2d, hw: [usize; 2], plane: &[f32], i: usize, j: usize) -> Option<usize> {
    let mut best: Option<usize> = None;
    for a in 0..window.kernel[0] {
        for b in 0..window.kernel[1] {
            let Some(k) = tap(window, hw, i, j, a, b) else {
                continue;
            };
            let v = plane[k];
            match best {
                Some(m) if !(v > plane[m] || v.is_nan()) => {}
                _ => best = Some(k),
            }
        }
    }
    best
}

/// `y = max_pool(x)`.
pub fn max_pool(window: &Window2d, x: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    let (p, hw, [oh, ow]) = planes(window, x.dims(), y.dims())?;
    let (xv, yv) = (x.f32()?, y.f32_mut()?);
    for (plane, out) in xv
        .chunks_exact(hw[0] * hw[1])
        .zip(yv.chunks_exact_mut(oh * ow))
        .take(p)
    {
        for i in 0..oh {
            for j in 0..ow {
                // Every window holds an input element (`Window2d::out_len`).
                out[i * ow + j] =
                    arg_max(window, hw, plane, i, j).map_or(f32::NEG_INFINITY, |k| plane[k]);
            }
        }
    }
    Ok(())
}

/// `dx` of a max pooling from `(x, dy)`.
pub fn max_pool_grad(
    window: &Window2d,
    [x, dy]: [&TensorRef; 2],
    dx: &mut TensorMut,
) -> KResult<()> {
    let (p, hw, [oh, ow]) = planes(window, x.dims(), dy.dims())?;
    let (xv, dyv, dxv) = (x.f32()?, dy.f32()?, dx.f32_mut()?);
    dxv.fill(0.0);
    let size = hw[0] * hw[1];
    for ((plane, d), g) in xv
        .chunks_exact(size)
        .zip(dxv.chunks_exact_mut(size))
        .zip(dyv.chunks_exact(oh * ow))
        .take(p)
    {
        for i in 0..oh {
            for j in 0..ow {
                if let Some(k) = arg_max(window, hw, plane, i, j) {
                    d[k] += g[i * ow + j];
                }
            }
        }
    }
    Ok(())
}

/// The divisor of output `(i, j)`.
fn count(window: &Window2d, hw: [usize; 2], include_pad: bool, i: usize, j: usize) -> f32 {
    (window.taps(0, i, hw[0], include_pad) * window.taps(1, j, hw[1], include_pad)) as f32
}

/// `y = avg_pool(x)`.
pub fn avg_pool(
    window: &Window2d,
    include_pad: bool,
    x: &TensorRef,
    y: &mut TensorMut,
) -> KResult<()> {
    let (p, hw, [oh, ow]) = planes(window, x.dims(), y.dims())?;
    let (xv, yv) = (x.f32()?, y.f32_mut()?);
    for (plane, out) in xv
        .chunks_exact(hw[0] * hw[1])
        .zip(yv.chunks_exact_mut(oh * ow))
        .take(p)
    {
        for i in 0..oh {
            for j in 0..ow {
                let mut sum = 0.0f32;
                for a in 0..window.kernel[0] {
                    for b in 0..window.kernel[1] {
                        if let Some(k) = tap(window, hw, i, j, a, b) {
                            sum += plane[k];
                        }
                    }
                }
                out[i * ow + j] = sum / count(window, hw, include_pad, i, j);
            }
        }
    }
    Ok(())
}

/// `dx` of an average pooling from `dy`.
pub fn avg_pool_grad(
    window: &Window2d,
    include_pad: bool,
    dy: &TensorRef,
    dx: &mut TensorMut,
) -> KResult<()> {
    let (p, hw, [oh, ow]) = planes(window, dx.dims(), dy.dims())?;
    let (dyv, dxv) = (dy.f32()?, dx.f32_mut()?);
    dxv.fill(0.0);
    for (g, d) in dyv
        .chunks_exact(oh * ow)
        .zip(dxv.chunks_exact_mut(hw[0] * hw[1]))
        .take(p)
    {
        for i in 0..oh {
            for j in 0..ow {
                let share = g[i * ow + j] / count(window, hw, include_pad, i, j);
                for a in 0..window.kernel[0] {
                    for b in 0..window.kernel[1] {
                        if let Some(k) = tap(window, hw, i, j, a, b) {
                            d[k] += share;
                        }
                    }
                }
            }
        }
    }
    Ok(())
}
