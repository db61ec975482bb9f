//! Reductions: `Reduce` (sum, mean, max over axes), `ReduceMaxGrad` and
//! `SumTo` (a broadcast's gradient), on the reduction geometry of
//! `geometry::reduction`; long reductions go through chunk partials.

use super::{ew, float, ins, n_arg, out1, same_count, Action, Lowered, Operand, R};
use crate::targets::cuda::device::{blocks_for, Arg, Launch, Ptr, THREADS};
use crate::targets::cuda::geometry::{self, reduction};
use fsdpc_ir::ReduceFn;

/// `Reduce { f, axes }` (no axes: every axis).
pub(super) fn reduce_axes(
    f: ReduceFn,
    axes: &[usize],
    xs: &[Operand],
    ys: &[Operand],
    l: &mut Lowered,
) -> R<()> {
    let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
    float(&x)?;
    let mut kept = x.dims().to_vec();
    if axes.is_empty() {
        kept.iter_mut().for_each(|d| *d = 1);
    }
    for &ax in axes {
        *kept
            .get_mut(ax)
            .ok_or_else(|| format!("reduce axis {ax} out of range for {}", x.ty))? = 1;
    }
    if y.numel() != kept.iter().map(|&d| d as u64).product::<u64>() {
        return Err(format!("reduce output {} does not match {}", y.ty, x.ty));
    }
    let g = reduction(x.dims(), &kept)?;
    let code = match f {
        ReduceFn::Sum => 0,
        ReduceFn::Mean => 1,
        ReduceFn::Max => 2,
    };
    reduce(&x, &y, code, g, l);
    Ok(())
}

/// `ReduceMaxGrad { axes }`: the gradient of a max reduction.
pub(super) fn reduce_max_grad(
    axes: &[usize],
    xs: &[Operand],
    ys: &[Operand],
    l: &mut Lowered,
) -> R<()> {
    let ([x, y, dy], dx) = (ins::<3>(xs)?, out1(ys)?);
    same_count(&x, &dx)?;
    let mut kept = x.dims().to_vec();
    if axes.is_empty() {
        kept.iter_mut().for_each(|d| *d = 1);
    }
    for &ax in axes {
        *kept
            .get_mut(ax)
            .ok_or_else(|| format!("axis {ax} out of range for {}", x.ty))? = 1;
    }
    let g = reduction(x.dims(), &kept)?;
    let n = y.numel();
    if dy.numel() != n {
        return Err(format!(
            "reduce_max_grad: dy {} does not match y {}",
            dy.ty, y.ty
        ));
    }
    l.actions.push(ew(
        "reduce_max_grad",
        n,
        vec![
            x.p(),
            x.dt(),
            y.p(),
            y.dt(),
            dy.p(),
            dy.dt(),
            dx.p(),
            dx.dt(),
            n_arg(n),
            Arg::RGeo(g),
        ],
    ));
    Ok(())
}

/// `SumTo`: `dy` summed down to the shape of `dx`.
pub(super) fn sum_to(xs: &[Operand], ys: &[Operand], l: &mut Lowered) -> R<()> {
    let ([dy], dx) = (ins::<1>(xs)?, out1(ys)?);
    let g = reduction(dy.dims(), dx.dims())?;
    reduce(&dy, &dx, 0, g, l);
    Ok(())
}

/// Reduced elements per output above which a reduction is split into
/// chunks (one thread per output would walk them alone).
const LONG_REDUCTION: i64 = 4096;
/// Chunks of a long reduction.
const REDUCE_CHUNKS: i64 = 64;

/// `y = reduce(x)` with `f` (0 sum, 1 mean, 2 max) over `g`: one thread
/// per output, or for a long reduction chunk partials in scratch combined
/// in chunk order (the sum's association then differs from the CPU's
/// row-major one).
fn reduce(x: &Operand, y: &Operand, f: i32, g: geometry::RGeo, l: &mut Lowered) {
    let n = y.numel();
    if g.count < LONG_REDUCTION {
        l.actions.push(ew(
            "reduce_to",
            n,
            vec![
                x.p(),
                x.dt(),
                y.p(),
                y.dt(),
                n_arg(n),
                Arg::I32(f),
                Arg::RGeo(g),
            ],
        ));
        return;
    }
    let chunks = REDUCE_CHUNKS.min(g.count / 256).max(2) as u64;
    l.scratch = 4 * chunks * n;
    let part = Arg::Ptr(Ptr::Scratch(0));
    l.actions.push(Action::Launch(Launch {
        kernel: "reduce_partial",
        grid: (
            if n == 0 { 0 } else { blocks_for(n).min(65_535) },
            chunks as u32,
            1,
        ),
        block: THREADS,
        smem: 0,
        args: vec![x.p(), x.dt(), part, n_arg(n), Arg::I32(f), Arg::RGeo(g)],
    }));
    l.actions.push(ew(
        "reduce_finish",
        n,
        vec![
            part,
            Arg::I32(chunks as i32),
            y.p(),
            y.dt(),
            n_arg(n),
            Arg::I32(f),
            Arg::I64(g.count),
        ],
    ));
}
