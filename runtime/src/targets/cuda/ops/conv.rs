//! `Conv`, `ConvGradInput` and `ConvGradWeight` as cuBLAS products over one
//! image's group at a time, as `cpu/kernels/conv.rs` does: `conv_im2col`
//! unfolds the group into its `taps x pixels` matrix (`Geometry`) in the
//! instruction's workspace, `conv_col2im` folds the input gradient's matrix
//! back onto `dx` (each element gathering its taps, no atomics), and the
//! weight gradient adds one product per image, in image order. A pointwise
//! convolution multiplies the input itself: the forward and the input
//! gradient then take every image of a group in one strided-batched call.
//!
//! bf16/f16 operands go into the products as they are (f32 accumulation):
//! the unfolded matrix is kept in the operands' type, the input gradient's
//! in f32, and the weight gradient is summed over the images in f32 (in
//! the workspace, then rounded into `dw` once). The bias is written into
//! `y` first and the products added to it, so `y` is rounded once. The
//! workspace the plan gives (`fsdpc_plan::workspace`: one f32 im2col
//! matrix, plus f32 copies of the half-precision operands) holds all of it.

use super::gather::cast_back;
use super::{ew, inferred, n_arg, Action, Lowered, Operand, R};
use crate::targets::cuda::blas::{Gemm, Stored};
use crate::targets::cuda::device::{Arg, Ptr};
use crate::targets::cuda::geometry::Win;
use fsdpc_ir::ops::conv::Geometry;
use fsdpc_ir::{DType, Op};

/// The checked geometry of a convolution kernel and its window descriptor.
struct Conv {
    g: Geometry,
    win: Win,
    /// Element bytes of the operands.
    es: u64,
}

impl Conv {
    /// Checks `xs` and `ys` against `op`'s shape rule; the geometry.
    fn of(op: &Op, xs: &[Operand], ys: &[Operand]) -> R<Conv> {
        inferred(op, xs, ys)?;
        let dims: Vec<&[usize]> = xs.iter().map(|x| x.dims()).collect();
        let g = Geometry::of(op, &dims)
            .ok_or_else(|| format!("operands {dims:?} do not fit the convolution"))?;
        let win = Win::new(&g.window, g.hw, g.out_hw)?;
        let es = xs[0].ty.dtype.size() as u64;
        Ok(Conv { g, win, es })
    }

    fn plane(&self) -> u64 {
        (self.g.hw[0] * self.g.hw[1]) as u64
    }

    fn pix(&self) -> u64 {
        self.g.pixels() as u64
    }

    fn taps(&self) -> u64 {
        self.g.taps() as u64
    }

    /// `(og, cg)`: output and input channels per group.
    fn per_group(&self) -> (u64, u64) {
        (self.g.group_out() as u64, self.g.group_in() as u64)
    }

    /// Address of image `img`'s group `grp` of an `[n, ch, plane]` operand.
    fn at(&self, x: &Operand, img: usize, grp: usize, per_group: u64, plane: u64) -> u64 {
        let ch = x.dims()[1] as u64;
        let es = x.ty.dtype.size() as u64;
        x.ptr + ((img as u64 * ch + grp as u64 * per_group) * plane) * es
    }

    /// `conv_im2col` of image `img`'s group `grp` of `x` into `cols`.
    fn im2col(&self, x: &Operand, img: usize, grp: usize, cols: u64, a: &mut Vec<Action>) {
        let (_, cg) = self.per_group();
        let src = self.at(x, img, grp, cg, self.plane());
        a.push(ew(
            "conv_im2col",
            self.taps() * self.pix(),
            vec![
                Arg::Ptr(Ptr::Abs(src)),
                x.dt(),
                Arg::Ptr(Ptr::Abs(cols)),
                x.dt(),
                Arg::I32(cg as i32),
                Arg::Win(self.win),
            ],
        ));
    }

    /// The workspace's address when it holds `need` bytes.
    fn workspace(&self, op: &Op, ws: Option<(u64, u64)>, need: u64) -> R<u64> {
        match ws {
            _ if need == 0 => Ok(0),
            Some((p, bytes)) if bytes >= need => Ok(p),
            _ => Err(format!(
                "{} needs {need} bytes of workspace, the plan gave {}",
                op.name(),
                ws.map_or(0, |w| w.1)
            )),
        }
    }
}

/// A row-major matrix of `rows x cols` at `ptr`, used as stored.
fn mat(ptr: u64, rows: u64, cols: u64) -> Stored {
    Stored {
        ptr,
        rows,
        cols,
        trans: false,
        stride: 0,
    }
}

/// `Conv`: `(x, w[, b])`.
pub(super) fn conv(
    op: &Op,
    xs: &[Operand],
    ys: &[Operand],
    ws: Option<(u64, u64)>,
    l: &mut Lowered,
) -> R<()> {
    let c = Conv::of(op, xs, ys)?;
    let (x, w, y) = (xs[0], xs[1], ys[0]);
    let (g, a) = (&c.g, &mut l.actions);
    let ((og, cg), taps, pix, dt) = (c.per_group(), c.taps(), c.pix(), x.ty.dtype);
    if y.numel() == 0 {
        return Ok(());
    }
    let bias = xs.get(2);
    if let Some(b) = bias {
        a.push(ew(
            "conv_bias",
            y.numel(),
            vec![
                b.p(),
                b.dt(),
                y.p(),
                y.dt(),
                n_arg(y.numel()),
                n_arg(g.o as u64),
                n_arg(pix),
            ],
        ));
    }
    if taps == 0 {
        // No input channels, no products: y is the bias, or zero.
        if bias.is_none() {
            a.push(Action::Zero {
                ptr: Ptr::Abs(y.ptr),
                bytes: y.ty.bytes(),
            });
        }
        return Ok(());
    }
    let w_at = |grp: usize| w.ptr + grp as u64 * og * taps * c.es;
    let acc = bias.is_some();
    if g.pointwise() {
        for grp in 0..g.groups {
            let xg = Stored {
                stride: g.c as u64 * pix,
                ..mat(c.at(&x, 0, grp, cg, pix), cg, pix)
            };
            let yc = (c.at(&y, 0, grp, og, pix), g.o as u64 * pix);
            let w = mat(w_at(grp), og, taps);
            a.push(Action::Gemm(Gemm::row_major(
                w,
                xg,
                yc,
                g.n as u64,
                (dt, dt),
                acc,
            )?));
        }
        return Ok(());
    }
    let cols = c.workspace(op, ws, taps * pix * c.es)?;
    for img in 0..g.n {
        for grp in 0..g.groups {
            c.im2col(&x, img, grp, cols, a);
            let yc = (c.at(&y, img, grp, og, pix), 0);
            let (w, b) = (mat(w_at(grp), og, taps), mat(cols, taps, pix));
            a.push(Action::Gemm(Gemm::row_major(w, b, yc, 1, (dt, dt), acc)?));
        }
    }
    Ok(())
}

/// `ConvGradInput`: `(w, dy) -> dx`.
pub(super) fn grad_input(
    op: &Op,
    xs: &[Operand],
    ys: &[Operand],
    ws: Option<(u64, u64)>,
    l: &mut Lowered,
) -> R<()> {
    let c = Conv::of(op, xs, ys)?;
    let (w, dy, dx) = (xs[0], xs[1], ys[0]);
    let (g, a) = (&c.g, &mut l.actions);
    let ((og, cg), taps, pix, dt) = (c.per_group(), c.taps(), c.pix(), dy.ty.dtype);
    if dx.numel() == 0 {
        return Ok(());
    }
    if dy.numel() == 0 {
        // No output channels: nothing reads x.
        a.push(Action::Zero {
            ptr: Ptr::Abs(dx.ptr),
            bytes: dx.ty.bytes(),
        });
        return Ok(());
    }
    let w_at = |grp: usize| Stored {
        trans: true,
        ..mat(w.ptr + grp as u64 * og * taps * c.es, og, taps)
    };
    if g.pointwise() {
        for grp in 0..g.groups {
            let dyg = Stored {
                stride: g.o as u64 * pix,
                ..mat(c.at(&dy, 0, grp, og, pix), og, pix)
            };
            let dxc = (c.at(&dx, 0, grp, cg, pix), g.c as u64 * pix);
            let gm = Gemm::row_major(w_at(grp), dyg, dxc, g.n as u64, (dt, dt), false)?;
            a.push(Action::Gemm(gm));
        }
        return Ok(());
    }
    let cols = c.workspace(op, ws, 4 * taps * pix)?;
    for img in 0..g.n {
        for grp in 0..g.groups {
            let dyg = mat(c.at(&dy, img, grp, og, pix), og, pix);
            let gm = Gemm::row_major(w_at(grp), dyg, (cols, 0), 1, (dt, DType::F32), false)?;
            a.push(Action::Gemm(gm));
            let dst = c.at(&dx, img, grp, cg, c.plane());
            a.push(ew(
                "conv_col2im",
                cg * c.plane(),
                vec![
                    Arg::Ptr(Ptr::Abs(cols)),
                    Arg::Ptr(Ptr::Abs(dst)),
                    dx.dt(),
                    Arg::I32(cg as i32),
                    Arg::Win(c.win),
                ],
            ));
        }
    }
    Ok(())
}

/// `ConvGradWeight`: `(x, dy) -> dw`, summed over the images in f32 (in
/// `dw` itself when it is f32, else in the workspace's first bytes).
pub(super) fn grad_weight(
    op: &Op,
    xs: &[Operand],
    ys: &[Operand],
    ws: Option<(u64, u64)>,
    l: &mut Lowered,
) -> R<()> {
    let c = Conv::of(op, xs, ys)?;
    let (x, dy, dw) = (xs[0], xs[1], ys[0]);
    let (g, a) = (&c.g, &mut l.actions);
    let ((og, cg), taps, pix, dt) = (c.per_group(), c.taps(), c.pix(), x.ty.dtype);
    if dw.numel() == 0 {
        return Ok(());
    }
    if g.n == 0 {
        a.push(Action::Zero {
            ptr: Ptr::Abs(dw.ptr),
            bytes: dw.ty.bytes(),
        });
        return Ok(());
    }
    let acc_bytes = if dw.ty.dtype == DType::F32 {
        0
    } else {
        (4 * dw.numel()).div_ceil(16) * 16
    };
    let cols_bytes = if g.pointwise() { 0 } else { taps * pix * c.es };
    let base = c.workspace(op, ws, acc_bytes + cols_bytes)?;
    let (acc, cols) = if acc_bytes == 0 {
        (dw.ptr, base)
    } else {
        (base, base + acc_bytes)
    };
    for grp in 0..g.groups {
        let dwg = (acc + 4 * grp as u64 * og * taps, 0);
        for img in 0..g.n {
            let src = if g.pointwise() {
                c.at(&x, img, grp, cg, pix)
            } else {
                c.im2col(&x, img, grp, cols, a);
                cols
            };
            let colst = Stored {
                trans: true,
                ..mat(src, taps, pix)
            };
            let dyg = mat(c.at(&dy, img, grp, og, pix), og, pix);
            let gm = Gemm::row_major(dyg, colst, dwg, 1, (dt, DType::F32), img > 0)?;
            a.push(Action::Gemm(gm));
        }
    }
    cast_back(acc, &dw, a);
    Ok(())
}
