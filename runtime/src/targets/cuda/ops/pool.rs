//! `MaxPool`, `AvgPool` and their gradients over `[n, c, h, w]` planes:
//! one thread per output going forward, one per input element going back
//! (it gathers the outputs whose windows read it, so no atomics and no
//! scratch; `MaxPoolGrad` recomputes each window's first maximum from `x`).

use super::{ew, inferred, ins, n_arg, Lowered, Operand, R};
use crate::targets::cuda::device::Arg;
use crate::targets::cuda::geometry::Win;
use fsdpc_ir::{Op, Window2d};

/// `(planes, window descriptor)` of an `[n, c, h, w]` input `x` pooled into
/// `y`, after checking the operands against `op`'s shape rule.
fn planes(
    op: &Op,
    window: &Window2d,
    xs: &[Operand],
    ys: &[Operand],
    x: &Operand,
    y: &Operand,
) -> R<(u64, Win)> {
    inferred(op, xs, ys)?;
    let (xd, yd) = (x.dims(), y.dims());
    let win = Win::new(window, [xd[2], xd[3]], [yd[2], yd[3]])?;
    Ok(((xd[0] * xd[1]) as u64, win))
}

/// `MaxPool` (`AvgPool` when `include_pad` is given): `x -> y`.
pub(super) fn forward(
    op: &Op,
    window: &Window2d,
    include_pad: Option<bool>,
    xs: &[Operand],
    ys: &[Operand],
    l: &mut Lowered,
) -> R<()> {
    let (x, y) = (only(xs, "x")?, only(ys, "y")?);
    let (p, win) = planes(op, window, xs, ys, &x, &y)?;
    let mut args = vec![x.p(), x.dt(), y.p(), y.dt(), n_arg(p), Arg::Win(win)];
    let kernel = match include_pad {
        None => "maxpool_fwd",
        Some(inc) => {
            args.push(Arg::I32(inc as i32));
            "avgpool_fwd"
        }
    };
    l.actions.push(ew(kernel, y.numel(), args));
    Ok(())
}

/// `MaxPoolGrad`: `(x, dy) -> dx`.
pub(super) fn max_grad(
    op: &Op,
    window: &Window2d,
    xs: &[Operand],
    ys: &[Operand],
    l: &mut Lowered,
) -> R<()> {
    let [x, dy] = ins::<2>(xs)?;
    let dx = only(ys, "dx")?;
    let (p, win) = planes(op, window, xs, ys, &x, &dy)?;
    l.actions.push(ew(
        "maxpool_bwd",
        dx.numel(),
        vec![
            x.p(),
            x.dt(),
            dy.p(),
            dy.dt(),
            dx.p(),
            dx.dt(),
            n_arg(p),
            Arg::Win(win),
        ],
    ));
    Ok(())
}

/// `AvgPoolGrad`: `dy -> dx`.
pub(super) fn avg_grad(
    op: &Op,
    window: &Window2d,
    include_pad: bool,
    xs: &[Operand],
    ys: &[Operand],
    l: &mut Lowered,
) -> R<()> {
    let (dy, dx) = (only(xs, "dy")?, only(ys, "dx")?);
    let (p, win) = planes(op, window, xs, ys, &dx, &dy)?;
    l.actions.push(ew(
        "avgpool_bwd",
        dx.numel(),
        vec![
            dy.p(),
            dy.dt(),
            dx.p(),
            dx.dt(),
            n_arg(p),
            Arg::Win(win),
            Arg::I32(include_pad as i32),
        ],
    ));
    Ok(())
}

/// The one operand of `xs`, named `what` in the error.
fn only<'a>(xs: &[Operand<'a>], what: &str) -> R<Operand<'a>> {
    match xs {
        [x] => Ok(*x),
        _ => Err(format!("expected one operand ({what}), got {}", xs.len())),
    }
}
