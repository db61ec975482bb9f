//! `Cast`: one elementwise conversion between any two dtypes.

use super::{ew, ins, n_arg, out1, same_count, Action, Operand, R};

/// `Cast`: `y = x` in the output's dtype.
pub(super) fn cast(xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
    same_count(&x, &y)?;
    let n = y.numel();
    a.push(ew("cast", n, vec![x.p(), x.dt(), y.p(), y.dt(), n_arg(n)]));
    Ok(())
}
