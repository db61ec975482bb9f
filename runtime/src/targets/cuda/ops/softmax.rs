//! `Softmax`, `LogSoftmax` and their gradients along one axis: one block
//! per (outer, inner) row.

use super::{ins, n_arg, out1, rows_launch, same_count, split_axis, Lowered, Operand, R};
use crate::targets::cuda::device::Arg;
use fsdpc_ir::Op;

/// `Softmax { axis }` or `LogSoftmax { axis }` (`op` says which).
pub(super) fn forward(
    op: &Op,
    axis: usize,
    xs: &[Operand],
    ys: &[Operand],
    l: &mut Lowered,
) -> R<()> {
    let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
    same_count(&x, &y)?;
    let (outer, len, inner) = split_axis(x.dims(), axis)?;
    let log = matches!(op, Op::LogSoftmax { .. }) as i32;
    l.actions.push(rows_launch(
        "softmax_fwd",
        outer * inner,
        vec![
            x.p(),
            x.dt(),
            y.p(),
            y.dt(),
            n_arg(outer),
            n_arg(len),
            n_arg(inner),
            Arg::I32(log),
        ],
    ));
    Ok(())
}

/// `SoftmaxGrad { axis }` or `LogSoftmaxGrad { axis }` (`op` says which).
pub(super) fn backward(
    op: &Op,
    axis: usize,
    xs: &[Operand],
    ys: &[Operand],
    l: &mut Lowered,
) -> R<()> {
    let ([y, dy], dx) = (ins::<2>(xs)?, out1(ys)?);
    same_count(&y, &dx)?;
    same_count(&dy, &dx)?;
    let (outer, len, inner) = split_axis(y.dims(), axis)?;
    let log = matches!(op, Op::LogSoftmaxGrad { .. }) as i32;
    l.actions.push(rows_launch(
        "softmax_bwd",
        outer * inner,
        vec![
            y.p(),
            y.dt(),
            dy.p(),
            dy.dt(),
            dx.p(),
            dx.dt(),
            n_arg(outer),
            n_arg(len),
            n_arg(inner),
            Arg::I32(log),
        ],
    ));
    Ok(())
}
