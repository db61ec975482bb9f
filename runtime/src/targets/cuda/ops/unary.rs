//! `Unary` and `UnaryGrad`: one elementwise kernel each, the function
//! chosen by its code (`unary_f` for floats, `unary_i` for the integer
//! subset).

use super::{ew, ins, n_arg, out1, same_count, Action, Operand, R};
use crate::targets::cuda::device::Arg;
use fsdpc_ir::UnaryFn;

/// `Unary { f }`: `y = f(x)`.
pub(super) fn unary(f: UnaryFn, xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
    same_count(&x, &y)?;
    let code = Arg::I32(unary_code(f));
    let kernel = if x.ty.dtype.is_float() {
        "unary_f"
    } else if matches!(
        f,
        UnaryFn::Neg | UnaryFn::Abs | UnaryFn::Square | UnaryFn::Relu
    ) {
        "unary_i"
    } else {
        return Err(format!("unary.{f:?} is not defined on {}", x.ty.dtype));
    };
    let n = y.numel();
    a.push(ew(
        kernel,
        n,
        vec![x.p(), x.dt(), y.p(), y.dt(), n_arg(n), code],
    ));
    Ok(())
}

/// `UnaryGrad { f }`: `dx = dy * f'(x)`.
pub(super) fn unary_grad(f: UnaryFn, xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let ([x, dy], dx) = (ins::<2>(xs)?, out1(ys)?);
    same_count(&x, &dx)?;
    same_count(&dy, &dx)?;
    let n = dx.numel();
    a.push(ew(
        "unary_grad",
        n,
        vec![
            x.p(),
            x.dt(),
            dy.p(),
            dy.dt(),
            dx.p(),
            dx.dt(),
            n_arg(n),
            Arg::I32(unary_code(f)),
        ],
    ));
    Ok(())
}

fn unary_code(f: UnaryFn) -> i32 {
    match f {
        UnaryFn::Neg => 0,
        UnaryFn::Exp => 1,
        UnaryFn::Log => 2,
        UnaryFn::Sqrt => 3,
        UnaryFn::Rsqrt => 4,
        UnaryFn::Reciprocal => 5,
        UnaryFn::Tanh => 6,
        UnaryFn::Relu => 7,
        UnaryFn::Sigmoid => 8,
        UnaryFn::Erf => 9,
        UnaryFn::Abs => 10,
        UnaryFn::GeluTanh => 11,
        UnaryFn::GeluErf => 12,
        UnaryFn::Silu => 13,
        UnaryFn::Square => 14,
        UnaryFn::IsNan => 15,
    }
}
