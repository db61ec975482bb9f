//! `Conv`, `ConvGradInput` and `ConvGradWeight` as packed matrix products:
//! each channel group of `images_per_product` images is unfolded into its
//! im2col matrix (`taps x images · pixels`, `fsdpc_ir::ops::conv::Geometry`)
//! in the workspace and multiplied through `gemm_f32`, one image at a time
//! where an image's output is wide enough alone (a pointwise convolution
//! then multiplies the input itself), several where it is small, with
//! their output (or `dy`) gathered into a matrix of the workspace. The
//! input gradient multiplies back into the im2col matrix and folds it onto
//! `dx` (col2im); the weight gradient accumulates one product per group of
//! images, in image order.

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

/// One product's images: `first .. first + count`.
#[derive(Copy, Clone)]
struct Chunk {
    first: usize,
    count: usize,
}

/// The geometry's images in products of `images_per_product`.
fn chunks(g: &Geometry) -> impl Iterator<Item = Chunk> + '_ {
    let b = g.images_per_product();
    (0..g.n).step_by(b).map(move |first| Chunk {
        first,
        count: b.min(g.n - first),
    })
}

/// The scratch of one product: its im2col matrix and, when it covers
/// several images, its output (or `dy`) matrix (`Geometry::scratch`).
fn split_scratch<'w>(
    g: &Geometry,
    ws: &'w mut Workspace,
) -> KResult<(&'w mut [f32], &'w mut [f32])> {
    let scratch = ws.f32s(g.scratch())?;
    let cols = if g.images_per_product() > 1 || !g.pointwise() {
        g.taps() * g.images_per_product() * g.pixels()
    } else {
        0
    };
    Ok(scratch.split_at_mut(cols))
}

/// Channel group `grp`'s plane block of image `img` in an `[n, ch, plane]`
/// tensor: `per` channels of `plane` elements.
fn block(img: usize, ch: usize, grp: usize, per: usize, plane: usize) -> std::ops::Range<usize> {
    let start = (img * ch + grp * per) * plane;
    start..start + per * plane
}

/// Copies chunk `c`'s group blocks of `src` (`[n, ch, pix]`, `per` channels
/// a group) into `mat[per x c.count · pix]`, image after image along each
/// row.
fn gather(
    src: &[f32],
    mat: &mut [f32],
    c: Chunk,
    (ch, grp, per, pix): (usize, usize, usize, usize),
) {
    let ld = c.count * pix;
    for k in 0..c.count {
        let b = &src[block(c.first + k, ch, grp, per, pix)];
        for (row, part) in b.chunks_exact(pix).enumerate() {
            mat[row * ld + k * pix..][..pix].copy_from_slice(part);
        }
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
    let (cols, out) = split_scratch(&g, ws)?;
    for c in chunks(&g) {
        let cols_n = c.count * pix;
        for grp in 0..g.groups {
            let a = Mat {
                data: &wv[grp * og * taps..][..og * taps],
                rows: og,
                cols: taps,
                trans: false,
            };
            if c.count == 1 {
                let xg = &xv[block(c.first, g.c, grp, cg, plane)];
                let b = if g.pointwise() {
                    xg
                } else {
                    im2col(&g, xg, cols, pix, 0);
                    &cols[..taps * pix]
                };
                let yg = &mut yv[block(c.first, g.o, grp, og, pix)];
                gemm_f32(
                    cfg.par,
                    yg,
                    a,
                    Mat {
                        data: b,
                        rows: taps,
                        cols: pix,
                        trans: false,
                    },
                    1.0,
                    false,
                )?;
            } else {
                for k in 0..c.count {
                    let xg = &xv[block(c.first + k, g.c, grp, cg, plane)];
                    im2col(&g, xg, cols, cols_n, k * pix);
                }
                let b = Mat {
                    data: &cols[..taps * cols_n],
                    rows: taps,
                    cols: cols_n,
                    trans: false,
                };
                gemm_f32(cfg.par, &mut out[..og * cols_n], a, b, 1.0, false)?;
                for k in 0..c.count {
                    let yg = &mut yv[block(c.first + k, g.o, grp, og, pix)];
                    for (row, dst) in yg.chunks_exact_mut(pix).enumerate() {
                        dst.copy_from_slice(&out[row * cols_n + k * pix..][..pix]);
                    }
                }
            }
            if let Some(bias) = bias {
                for k in 0..c.count {
                    let yg = &mut yv[block(c.first + k, g.o, grp, og, pix)];
                    for (row, &bv) in yg.chunks_exact_mut(pix).zip(&bias[grp * og..][..og]) {
                        row.iter_mut().for_each(|v| *v += bv);
                    }
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
    let (cols, dys) = split_scratch(&g, ws)?;
    for c in chunks(&g) {
        let cols_n = c.count * pix;
        for grp in 0..g.groups {
            let a = Mat {
                data: &wv[grp * og * taps..][..og * taps],
                rows: taps,
                cols: og,
                trans: true,
            };
            if c.count == 1 {
                let b = Mat {
                    data: &dyv[block(c.first, g.o, grp, og, pix)],
                    rows: og,
                    cols: pix,
                    trans: false,
                };
                let dxg = &mut dxv[block(c.first, g.c, grp, cg, plane)];
                if g.pointwise() {
                    gemm_f32(cfg.par, dxg, a, b, 1.0, false)?;
                } else {
                    gemm_f32(cfg.par, &mut cols[..taps * pix], a, b, 1.0, false)?;
                    col2im(&g, cols, pix, 0, dxg);
                }
            } else {
                gather(dyv, dys, c, (g.o, grp, og, pix));
                let b = Mat {
                    data: &dys[..og * cols_n],
                    rows: og,
                    cols: cols_n,
                    trans: false,
                };
                gemm_f32(cfg.par, &mut cols[..taps * cols_n], a, b, 1.0, false)?;
                for k in 0..c.count {
                    let dxg = &mut dxv[block(c.first + k, g.c, grp, cg, plane)];
                    col2im(&g, cols, cols_n, k * pix, dxg);
                }
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
    let (cols, dys) = split_scratch(&g, ws)?;
    if g.n == 0 {
        dwv.fill(0.0);
    }
    for grp in 0..g.groups {
        let dwg = &mut dwv[grp * og * taps..][..og * taps];
        for c in chunks(&g) {
            let cols_n = c.count * pix;
            let (a, b) = if c.count == 1 {
                let xg = &xv[block(c.first, g.c, grp, cg, plane)];
                let b = if g.pointwise() {
                    xg
                } else {
                    im2col(&g, xg, cols, pix, 0);
                    &cols[..taps * pix]
                };
                (&dyv[block(c.first, g.o, grp, og, pix)], b)
            } else {
                for k in 0..c.count {
                    let xg = &xv[block(c.first + k, g.c, grp, cg, plane)];
                    im2col(&g, xg, cols, cols_n, k * pix);
                }
                gather(dyv, dys, c, (g.o, grp, og, pix));
                (&dys[..og * cols_n], &cols[..taps * cols_n])
            };
            let a = Mat {
                data: a,
                rows: og,
                cols: cols_n,
                trans: false,
            };
            let b = Mat {
                data: b,
                rows: cols_n,
                cols: taps,
                trans: true,
            };
            gemm_f32(cfg.par, dwg, a, b, 1.0, c.first > 0)?;
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

/// Unfolds one image's group `xg[cg, h, w]` into its `taps x pixels`
/// block of `cols`: tap row `r` at `r · ld + offset`.
fn im2col(g: &Geometry, xg: &[f32], cols: &mut [f32], ld: usize, offset: usize) {
    let t = Taps { g };
    let ([kh, kw], [h, w], [oh, ow]) = (g.window.kernel, g.hw, g.out_hw);
    let s = g.window.stride[1];
    let mut r = 0;
    for ch in 0..g.group_in() {
        let plane = &xg[ch * h * w..][..h * w];
        for a in 0..kh {
            for b in 0..kw {
                let dst = &mut cols[r * ld + offset..][..oh * ow];
                r += 1;
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

/// Folds one image's `taps x pixels` block of `cols` (tap row `r` at `r ·
/// ld + offset`) back onto its group `dxg[cg, h, w]`, summing every tap
/// that read an input element (in tap order).
fn col2im(g: &Geometry, cols: &[f32], ld: usize, offset: usize, dxg: &mut [f32]) {
    let t = Taps { g };
    let ([kh, kw], [h, w], [oh, ow]) = (g.window.kernel, g.hw, g.out_hw);
    let s = g.window.stride[1];
    dxg.fill(0.0);
    let mut r = 0;
    for ch in 0..g.group_in() {
        let plane = &mut dxg[ch * h * w..][..h * w];
        for a in 0..kh {
            for b in 0..kw {
                let src = &cols[r * ld + offset..][..oh * ow];
                r += 1;
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
