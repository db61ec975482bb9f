//! Broadcasting elementwise ops: `Binary`, `Compare`, `Logical`, `Not`,
//! `Where`. Each is one grid-stride kernel taking the output's broadcast
//! geometry (`geometry::broadcast`).

use super::{bool_out, ew, ins, n_arg, out1, same_count, Action, Operand, R};
use crate::targets::cuda::device::{Arg, Ptr};
use crate::targets::cuda::geometry::broadcast;
use fsdpc_ir::{BinaryFn, CompareFn, DType, LogicalFn};

/// `Binary { f }`: floats (`binary_f`) or integers (`binary_i`, which
/// reports a division by zero), not a mix.
pub(super) fn binary(f: BinaryFn, xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let ([x, z], y) = (ins::<2>(xs)?, out1(ys)?);
    let g = broadcast(y.dims(), &[x.dims(), z.dims()])?;
    let n = y.numel();
    let ints = !x.ty.dtype.is_float() && !z.ty.dtype.is_float();
    let mut args = vec![
        x.p(),
        x.dt(),
        z.p(),
        z.dt(),
        y.p(),
        y.dt(),
        n_arg(n),
        Arg::I32(binary_code(f)),
        Arg::Geo(g),
    ];
    if ints {
        args.push(Arg::Ptr(Ptr::Err));
        a.push(ew("binary_i", n, args));
    } else if x.ty.dtype.is_float() && z.ty.dtype.is_float() {
        a.push(ew("binary_f", n, args));
    } else {
        return Err(format!(
            "binary.{f:?} on {} and {} is not supported",
            x.ty.dtype, z.ty.dtype
        ));
    }
    Ok(())
}

/// `Compare { f }`: a bool output.
pub(super) fn compare(f: CompareFn, xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let ([x, z], y) = (ins::<2>(xs)?, out1(ys)?);
    bool_out(&y)?;
    let g = broadcast(y.dims(), &[x.dims(), z.dims()])?;
    let n = y.numel();
    a.push(ew(
        "compare",
        n,
        vec![
            x.p(),
            x.dt(),
            z.p(),
            z.dt(),
            y.p(),
            n_arg(n),
            Arg::I32(compare_code(f)),
            Arg::Geo(g),
        ],
    ));
    Ok(())
}

/// `Logical { f }` on bools.
pub(super) fn logical(f: LogicalFn, xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let ([x, z], y) = (ins::<2>(xs)?, out1(ys)?);
    let g = broadcast(y.dims(), &[x.dims(), z.dims()])?;
    let n = y.numel();
    let code = match f {
        LogicalFn::And => 0,
        LogicalFn::Or => 1,
        LogicalFn::Xor => 2,
    };
    a.push(ew(
        "logical",
        n,
        vec![x.p(), z.p(), y.p(), n_arg(n), Arg::I32(code), Arg::Geo(g)],
    ));
    Ok(())
}

/// `Not` on bools.
pub(super) fn not(xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
    same_count(&x, &y)?;
    let n = y.numel();
    a.push(ew("logical_not", n, vec![x.p(), y.p(), n_arg(n)]));
    Ok(())
}

/// `Where`: `y = c ? x : z`, elements of any dtype.
pub(super) fn where_(xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let ([c, x, z], y) = (ins::<3>(xs)?, out1(ys)?);
    if c.ty.dtype != DType::Bool || x.ty.dtype != y.ty.dtype || z.ty.dtype != y.ty.dtype {
        return Err(format!("where({}, {}, {}) into {}", c.ty, x.ty, z.ty, y.ty));
    }
    let g = broadcast(y.dims(), &[c.dims(), x.dims(), z.dims()])?;
    let n = y.numel();
    let es = Arg::I32(y.ty.dtype.size() as i32);
    a.push(ew(
        "where_",
        n,
        vec![c.p(), x.p(), z.p(), y.p(), es, n_arg(n), Arg::Geo(g)],
    ));
    Ok(())
}

fn binary_code(f: BinaryFn) -> i32 {
    match f {
        BinaryFn::Add => 0,
        BinaryFn::Sub => 1,
        BinaryFn::Mul => 2,
        BinaryFn::Div => 3,
        BinaryFn::Pow => 4,
        BinaryFn::Max => 5,
        BinaryFn::Min => 6,
    }
}

fn compare_code(f: CompareFn) -> i32 {
    match f {
        CompareFn::Equal => 0,
        CompareFn::Less => 1,
        CompareFn::LessOrEqual => 2,
        CompareFn::Greater => 3,
        CompareFn::GreaterOrEqual => 4,
    }
}
