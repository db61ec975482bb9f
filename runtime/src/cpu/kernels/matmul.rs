//! `MatMul { trans_a, trans_b }` through the `gemm` crate, and the one
//! checked wrapper around `gemm::gemm` that the attention kernels share.
//! Leading (batch) dimensions broadcast; a rank-1 operand is a row (`a`) or
//! column (`b`) vector whose unit axis is dropped from the output, as numpy
//! does. When `b` has no batch dimensions and `a` is not transposed, the batch
//! folds into the rows of a single product (the geometry is
//! `fsdpc_ir::ops::matmul::Geometry`'s, which the planner sizes with).

use super::layout::Blocks;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};
use fsdpc_ir::ops::matmul::Geometry;
use gemm::Parallelism;

/// A logical `rows x cols` matrix stored row-major, or transposed (stored as
/// `cols x rows`).
#[derive(Copy, Clone, Debug)]
pub struct Mat<'a> {
    /// The stored elements.
    pub data: &'a [f32],
    /// Logical rows.
    pub rows: usize,
    /// Logical columns.
    pub cols: usize,
    /// Stored transposed (`cols x rows`).
    pub trans: bool,
}

impl Mat<'_> {
    /// (row stride, column stride) of the logical matrix.
    fn strides(&self) -> (isize, isize) {
        if self.trans {
            (1, self.rows as isize)
        } else {
            (self.cols as isize, 1)
        }
    }
}

/// `out[m x n] = scale * a[m x k] b[k x n]` (plus `out` if `accumulate`).
pub fn gemm_f32(
    par: Parallelism,
    out: &mut [f32],
    a: Mat,
    b: Mat,
    scale: f32,
    accumulate: bool,
) -> KResult<()> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || out.len() < m * n || a.data.len() < m * k || b.data.len() < k * n {
        crate::kbail!(
            "gemm: inconsistent operands ({m}x{k}) x ({}x{n}) into {}",
            b.rows,
            out.len()
        );
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if !accumulate {
            out[..m * n].fill(0.0);
        }
        return Ok(());
    }
    let (a_rs, a_cs) = a.strides();
    let (b_rs, b_cs) = b.strides();
    // The inner dimension in panels of at most `K_PANEL`: gemm packs one
    // `kc x nc` block of `b` (and for few rows a `kc x m` block of `a`) per
    // call with `kc = k` when `k <= 512`, so the panels bound what it
    // allocates (`fsdpc_plan::workspace::gemm_heap`).
    let mut k0 = 0;
    while k0 < k {
        let kp = K_PANEL.min(k - k0);
        // SAFETY: the checks above guarantee every index gemm forms,
        // (rows-1)*rs + (cols-1)*cs, lies inside each slice (the panel
        // starts `k0` columns into `a` and `k0` rows into `b`, and spans
        // `kp <= k - k0` of them); `out` is a unique borrow, so it aliases
        // neither `a` nor `b`.
        unsafe {
            gemm::gemm(
                m,
                n,
                kp,
                out.as_mut_ptr(),
                1,
                n as isize,
                accumulate || k0 > 0,
                a.data.as_ptr().offset(k0 as isize * a_cs),
                a_cs,
                a_rs,
                b.data.as_ptr().offset(k0 as isize * b_rs),
                b_cs,
                b_rs,
                1.0,
                scale,
                false,
                false,
                false,
                par,
            );
        }
        k0 += kp;
    }
    Ok(())
}

/// Largest inner dimension of one gemm call (`fsdpc_plan::workspace::K_PANEL`).
const K_PANEL: usize = fsdpc_plan::workspace::K_PANEL as usize;

/// The geometry of one matmul (rank-1 operands promoted) and its output
/// batch.
struct Dims {
    g: Geometry,
    batch_out: Vec<usize>,
}

fn dims(a: &[usize], b: &[usize], trans_a: bool, trans_b: bool, out: &[usize]) -> KResult<Dims> {
    let Some(g) = Geometry::of(a, b, trans_a, trans_b) else {
        crate::kbail!("matmul needs operands of rank >= 1, got {a:?} and {b:?}");
    };
    if g.k != g.k_b {
        crate::kbail!("matmul: inner dimensions differ ({a:?} x {b:?})");
    }
    let Ok(batch_out) = g.batch() else {
        crate::kbail!(
            "shapes {:?} and {:?} do not broadcast",
            g.batch_a,
            g.batch_b
        );
    };
    let numel: usize = batch_out.iter().product::<usize>() * g.m * g.n;
    if numel != out.iter().product::<usize>() {
        crate::kbail!("matmul: output {out:?} does not match {a:?} x {b:?}");
    }
    Ok(Dims { g, batch_out })
}

/// `MatMul`.
pub fn matmul(
    par: Parallelism,
    trans_a: bool,
    trans_b: bool,
    a: &TensorRef,
    b: &TensorRef,
    y: &mut TensorMut,
) -> KResult<()> {
    let Dims { g, batch_out } = dims(a.dims(), b.dims(), trans_a, trans_b, y.dims())?;
    let (av, bv, out) = (a.f32()?, b.f32()?, y.f32_mut()?);
    let (m, k, n) = (g.m, g.k, g.n);
    let batch: usize = batch_out.iter().product();
    if g.folds() {
        let am = Mat {
            data: av,
            rows: batch * m,
            cols: k,
            trans: false,
        };
        let bm = Mat {
            data: bv,
            rows: k,
            cols: n,
            trans: trans_b,
        };
        return gemm_f32(par, out, am, bm, 1.0, false);
    }
    let blocks = Blocks::new(&batch_out, [&g.batch_a, &g.batch_b])?;
    let [sa, sb] = blocks.inner_strides;
    let mut res = Ok(());
    blocks.for_each(|[oa, ob], oo| {
        for j in 0..blocks.inner {
            let (ia, ib, io) = (
                (oa + j * sa) * m * k,
                (ob + j * sb) * k * n,
                (oo + j) * m * n,
            );
            let am = Mat {
                data: &av[ia..ia + m * k],
                rows: m,
                cols: k,
                trans: trans_a,
            };
            let bm = Mat {
                data: &bv[ib..ib + k * n],
                rows: k,
                cols: n,
                trans: trans_b,
            };
            if res.is_ok() {
                res = gemm_f32(par, &mut out[io..io + m * n], am, bm, 1.0, false);
            }
        }
    });
    res
}
