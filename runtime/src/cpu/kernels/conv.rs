//! `Conv`, `ConvGradInput` and `ConvGradWeight` as packed matrix products:
//! each image's group is unfolded into its im2col matrix (`taps x pixels`,
//! `fsdpc_ir::ops::conv::Geometry`) in the workspace and multiplied through
//! `gemm_f32`; a pointwise convolution multiplies the input itself. The
//! input gradient multiplies back into that matrix and folds it onto `dx`
//! (col2im); the weight gradient accumulates one product per image, in
//! image order.

use super::matmul::{gemm_f32, Mat};
use super::Cfg;
use crate::backend::Workspace;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};
use fsdpc_ir::ops::conv::Geometry;
use fsdpc_ir::Op;

/// The geometry of `op` on these operands, checked against the buffers.
fn geometry(op: &Op, a: &TensorRef, b: &TensorRef) -> KResult<Geometry> {
    match Geometry::of(op, &[a.dims(), b.dims()]) {
        Some(g) => Ok(g),
        None => crate::kbail!(
            "{}: operands {:?} and {:?} do not fit the op",
            op.name(),
            a.dims(),
            b.dims()
        ),
    }
}

/// `y = conv(x, w) [+ b]`.
pub fn conv(
    cfg: &Cfg,
    op: &Op,
    xs: &[TensorRef],
    y: &mut TensorMut,
    ws: &mut Workspace,
) -> KResult<()> {
    let (x, w, bias) = match xs {
        [x, w] => (x, w, None),
        [x, w, b] => (x, w, Some(b.f32()?)),
        _ => crate::kbail!("conv takes (x, w[, b]), got {} inputs", xs.len()),
    };
    let g = geometry(op, x, w)?;
    let (xv, wv, yv) = (x.f32()?, w.f32()?, y.f32_mut()?);
    let (cg, og, taps, pix) = (g.group_in(), g.group_out(), g.taps(), g.pixels());
    let plane = g.hw[0] * g.hw[1];
    let cols = ws.f32s(g.scratch())?;
    for img in 0..g.n {
        for grp in 0..g.groups {
            let xg = &xv[(img * g.c + grp * cg) * plane..][..cg * plane];
            let b = if g.pointwise() {
                xg
            } else {
                im2col(&g, xg, cols);
                &*cols
            };
            let yg = &mut yv[(img * g.o + grp * og) * pix..][..og * pix];
            let a = Mat {
                data: &wv[grp * og * taps..][..og * taps],
                rows: og,
                cols: taps,
                trans: false,
            };
            let b = Mat {
                data: b,
                rows: taps,
                cols: pix,
                trans: false,
            };
            gemm_f32(cfg.par, yg, a, b, 1.0, false)?;
            if let Some(bias) = bias {
                for (row, &bv) in yg.chunks_exact_mut(pix).zip(&bias[grp * og..][..og]) {
                    row.iter_mut().for_each(|v| *v += bv);
                }
            }
        }
    }
    Ok(())
}

/// `dx` of a convolution from `(w, dy)`.
pub fn conv_grad_input(
    cfg: &Cfg,
    op: &Op,
    [w, dy]: [&TensorRef; 2],
    dx: &mut TensorMut,
    ws: &mut Workspace,
) -> KResult<()> {
    let g = geometry(op, w, dy)?;
    let (wv, dyv, dxv) = (w.f32()?, dy.f32()?, dx.f32_mut()?);
    let (cg, og, taps, pix) = (g.group_in(), g.group_out(), g.taps(), g.pixels());
    let plane = g.hw[0] * g.hw[1];
    let cols = ws.f32s(g.scratch())?;
    for img in 0..g.n {
        for grp in 0..g.groups {
            let a = Mat {
                data: &wv[grp * og * taps..][..og * taps],
                rows: taps,
                cols: og,
                trans: true,
            };
            let b = Mat {
                data: &dyv[(img * g.o + grp * og) * pix..][..og * pix],
                rows: og,
                cols: pix,
                trans: false,
            };
            let dxg = &mut dxv[(img * g.c + grp * cg) * plane..][..cg * plane];
            if g.pointwise() {
                gemm_f32(cfg.par, dxg, a, b, 1.0, false)?;
            } else {
                gemm_f32(cfg.par, cols, a, b, 1.0, false)?;
                col2im(&g, cols, dxg);
            }
        }
    }
    Ok(())
}

/// `dw` of a convolution from `(x, dy)`.
pub fn conv_grad_weight(
    cfg: &Cfg,
    op: &Op,
    [x, dy]: [&TensorRef; 2],
    dw: &mut TensorMut,
    ws: &mut Workspace,
) -> KResult<()> {
    let g = geometry(op, x, dy)?;
    let (xv, dyv, dwv) = (x.f32()?, dy.f32()?, dw.f32_mut()?);
    let (cg, og, taps, pix) = (g.group_in(), g.group_out(), g.taps(), g.pixels());
    let plane = g.hw[0] * g.hw[1];
    let cols = ws.f32s(g.scratch())?;
    if g.n == 0 {
        dwv.fill(0.0);
    }
    for grp in 0..g.groups {
        let dwg = &mut dwv[grp * og * taps..][..og * taps];
        for img in 0..g.n {
            let xg = &xv[(img * g.c + grp * cg) * plane..][..cg * plane];
            let b = if g.pointwise() {
                xg
            } else {
                im2col(&g, xg, cols);
                &*cols
            };
            let a = Mat {
                data: &dyv[(img * g.o + grp * og) * pix..][..og * pix],
                rows: og,
                cols: pix,
                trans: false,
            };
            let b = Mat {
                data: b,
                rows: pix,
                cols: taps,
                trans: true,
            };
            gemm_f32(cfg.par, dwg, a, b, 1.0, img > 0)?;
        }
    }
    Ok(())
}

/// For each tap `(channel, a, b)` of one image's group, the input row it
/// reads at every output row (`None` in the padding) and the range of
/// output columns inside the input with the first column they read.
struct Taps<'g> {
    g: &'g Geometry,
}

impl Taps<'_> {
    /// Output columns `j` whose input column `j·stride + b·dilation - pad`
    /// lies inside the input, as `(first j, end j, input column of first)`.
    fn columns(&self, b: usize) -> (usize, usize, usize) {
        let (win, w, ow) = (&self.g.window, self.g.hw[1], self.g.out_hw[1]);
        let (s, off) = (
            win.stride[1] as isize,
            (b * win.dilation[1]) as isize - win.pads[1] as isize,
        );
        // j·s + off >= 0 and j·s + off < w.
        let lo = if off >= 0 {
            0
        } else {
            ((-off) as usize).div_ceil(s as usize)
        };
        let hi = if (w as isize) <= off {
            0
        } else {
            ((w as isize - off) as usize).div_ceil(s as usize)
        };
        let hi = hi.min(ow);
        let lo = lo.min(hi);
        (lo, hi, (lo as isize * s + off).max(0) as usize)
    }

    /// The input row of output row `i` for kernel row `a`, if inside.
    fn row(&self, i: usize, a: usize) -> Option<usize> {
        let r = self.g.window.position(0, i, a);
        (0..self.g.hw[0] as isize)
            .contains(&r)
            .then_some(r as usize)
    }
}

/// Unfolds one image's group `xg[cg, h, w]` into `cols[taps, pixels]`.
fn im2col(g: &Geometry, xg: &[f32], cols: &mut [f32]) {
    let t = Taps { g };
    let ([kh, kw], [h, w], [oh, ow]) = (g.window.kernel, g.hw, g.out_hw);
    let s = g.window.stride[1];
    let mut rows = cols.chunks_exact_mut(oh * ow);
    for ch in 0..g.group_in() {
        let plane = &xg[ch * h * w..][..h * w];
        for a in 0..kh {
            for b in 0..kw {
                let Some(dst) = rows.next() else { return };
                let (lo, hi, c0) = t.columns(b);
                for (i, out) in dst.chunks_exact_mut(ow).enumerate() {
                    let Some(r) = t.row(i, a) else {
                        out.fill(0.0);
                        continue;
                    };
                    let src = &plane[r * w..][..w];
                    out[..lo].fill(0.0);
                    out[hi..].fill(0.0);
                    if s == 1 {
                        out[lo..hi].copy_from_slice(&src[c0..c0 + hi - lo]);
                    } else {
                        for (k, v) in out[lo..hi].iter_mut().enumerate() {
                            *v = src[c0 + k * s];
                        }
                    }
                }
            }
        }
    }
}

/// Folds `cols[taps, pixels]` back onto one image's group `dxg[cg, h, w]`,
/// summing every tap that read an input element (in tap order).
fn col2im(g: &Geometry, cols: &[f32], dxg: &mut [f32]) {
    let t = Taps { g };
    let ([kh, kw], [h, w], [oh, ow]) = (g.window.kernel, g.hw, g.out_hw);
    let s = g.window.stride[1];
    dxg.fill(0.0);
    let mut rows = cols.chunks_exact(oh * ow);
    for ch in 0..g.group_in() {
        let plane = &mut dxg[ch * h * w..][..h * w];
        for a in 0..kh {
            for b in 0..kw {
                let Some(src) = rows.next() else { return };
                let (lo, hi, c0) = t.columns(b);
                for (i, part) in src.chunks_exact(ow).enumerate() {
                    let Some(r) = t.row(i, a) else { continue };
                    let dst = &mut plane[r * w..][..w];
                    for (k, &v) in part[lo..hi].iter().enumerate() {
                        dst[c0 + k * s] += v;
                    }
                }
            }
        }
    }
}
