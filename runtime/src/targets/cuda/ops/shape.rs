//! Data movement: `Reshape`, `Transpose`, `Slice`, `SliceGrad`, `Concat`,
//! `Expand`, `Pad`. These copy whole elements of any dtype: a reshape is a
//! device copy, the rest strided copies (`strided_copy`) over views.

use super::{ew, ins, n_arg, out1, same_dtype, split_axis, Action, Operand, R};
use crate::targets::cuda::device::{Arg, Ptr};
use crate::targets::cuda::geometry::{broadcast_strides, geo, strides};

/// `Reshape`: a copy of the bytes.
pub(super) fn reshape(xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
    same_dtype(&x, &y)?;
    if x.ty.bytes() != y.ty.bytes() {
        return Err(format!(
            "reshape from {} to {} changes the element count",
            x.ty, y.ty
        ));
    }
    a.push(Action::Copy {
        src: x.ptr,
        dst: y.ptr,
        bytes: y.ty.bytes(),
    });
    Ok(())
}

/// `Transpose { perm }`.
pub(super) fn transpose(
    perm: &[usize],
    xs: &[Operand],
    ys: &[Operand],
    a: &mut Vec<Action>,
) -> R<()> {
    let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
    let es = same_dtype(&x, &y)?;
    let dims = x.dims();
    let mut seen = vec![false; dims.len()];
    if perm.len() != dims.len()
        || perm
            .iter()
            .any(|&p| p >= dims.len() || std::mem::replace(&mut seen[p], true))
    {
        return Err(format!(
            "transpose: {perm:?} is not a permutation of the axes of {}",
            x.ty
        ));
    }
    let st = strides(dims);
    let out: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    if out != y.dims() {
        return Err(format!("transpose output {} does not match {perm:?}", y.ty));
    }
    let sst = perm.iter().map(|&p| st[p]).collect();
    a.push(strided(
        view(x.ptr, sst),
        view(y.ptr, strides(&out)),
        &out,
        es,
    )?);
    Ok(())
}

/// `Slice { axis, start, end, step }`.
pub(super) fn slice(
    axis: usize,
    start: usize,
    end: usize,
    step: usize,
    xs: &[Operand],
    ys: &[Operand],
    a: &mut Vec<Action>,
) -> R<()> {
    let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
    let es = same_dtype(&x, &y)?;
    let (base, st, dims) = slice_geometry(x.dims(), axis, start, end, step)?;
    if dims != y.dims() {
        return Err(format!("slice output {} does not match {dims:?}", y.ty));
    }
    a.push(strided(
        View {
            ptr: x.ptr,
            base,
            st,
        },
        view(y.ptr, strides(&dims)),
        &dims,
        es,
    )?);
    Ok(())
}

/// `SliceGrad`: zeros, then `dy` into the slice.
pub(super) fn slice_grad(
    axis: usize,
    start: usize,
    end: usize,
    step: usize,
    xs: &[Operand],
    ys: &[Operand],
    a: &mut Vec<Action>,
) -> R<()> {
    let ([dy], dx) = (ins::<1>(xs)?, out1(ys)?);
    let es = same_dtype(&dy, &dx)?;
    let (base, st, dims) = slice_geometry(dx.dims(), axis, start, end, step)?;
    if dims != dy.dims() {
        return Err(format!(
            "slice_grad: dy {} does not match the slice {dims:?}",
            dy.ty
        ));
    }
    a.push(Action::Zero {
        ptr: Ptr::Abs(dx.ptr),
        bytes: dx.ty.bytes(),
    });
    a.push(strided(
        view(dy.ptr, strides(&dims)),
        View {
            ptr: dx.ptr,
            base,
            st,
        },
        &dims,
        es,
    )?);
    Ok(())
}

/// `Concat { axis }`: each input into its place of the output.
pub(super) fn concat(axis: usize, xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let y = out1(ys)?;
    let (_, total, inner) = split_axis(y.dims(), axis)?;
    let yst = strides(y.dims());
    let mut at = 0u64;
    for x in xs {
        let es = same_dtype(x, &y)?;
        let (o, len, i) = split_axis(x.dims(), axis)?;
        let (yo, _, yi) = split_axis(y.dims(), axis)?;
        if o != yo || i != yi {
            return Err(format!(
                "concat: input {} does not match output {} off axis {axis}",
                x.ty, y.ty
            ));
        }
        a.push(strided(
            view(x.ptr, strides(x.dims())),
            View {
                ptr: y.ptr,
                base: at * inner,
                st: yst.clone(),
            },
            x.dims(),
            es,
        )?);
        at += len;
    }
    if at != total {
        return Err(format!(
            "concat: inputs add up to {at} along axis {axis}, output has {total}"
        ));
    }
    Ok(())
}

/// `Expand`: a broadcast copy.
pub(super) fn expand(xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
    let es = same_dtype(&x, &y)?;
    let sst = broadcast_strides(x.dims(), y.dims())?;
    a.push(strided(
        view(x.ptr, sst),
        view(y.ptr, strides(y.dims())),
        y.dims(),
        es,
    )?);
    Ok(())
}

/// `Pad { pads, value }`: a fill, then the input into its place.
pub(super) fn pad(
    pads: &[(usize, usize)],
    value: f64,
    xs: &[Operand],
    ys: &[Operand],
    a: &mut Vec<Action>,
) -> R<()> {
    let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
    let es = same_dtype(&x, &y)?;
    if pads.len() != x.dims().len() {
        return Err(format!("pad: {} pads for {}", pads.len(), x.ty));
    }
    let want: Vec<usize> = x
        .dims()
        .iter()
        .zip(pads)
        .map(|(&d, &(b, e))| d + b + e)
        .collect();
    if want != y.dims() {
        return Err(format!("pad output {} does not match {want:?}", y.ty));
    }
    let yst = strides(y.dims());
    let base: u64 = pads
        .iter()
        .zip(&yst)
        .map(|(&(b, _), &s)| (b * s) as u64)
        .sum();
    let n = y.numel();
    a.push(ew(
        "fill",
        n,
        vec![y.p(), y.dt(), n_arg(n), Arg::F64(value)],
    ));
    a.push(strided(
        view(x.ptr, strides(x.dims())),
        View {
            ptr: y.ptr,
            base,
            st: yst,
        },
        x.dims(),
        es,
    )?);
    Ok(())
}

/// A strided view of a buffer: its address, the first element and each
/// dimension's element stride.
struct View {
    ptr: u64,
    base: u64,
    st: Vec<usize>,
}

/// `dst[view] = src[view]` over `dims`, elements of `es` bytes.
fn strided(src: View, dst: View, dims: &[usize], es: i32) -> R<Action> {
    let n: u64 = dims.iter().map(|&d| d as u64).product();
    let g = geo(dims, &[src.st, dst.st])?;
    Ok(ew(
        "strided_copy",
        n,
        vec![
            Arg::Ptr(Ptr::Abs(src.ptr)),
            Arg::I64(src.base as i64),
            Arg::Ptr(Ptr::Abs(dst.ptr)),
            Arg::I64(dst.base as i64),
            Arg::I32(es),
            n_arg(n),
            Arg::Geo(g),
        ],
    ))
}

/// A view from element 0 with `st`.
fn view(ptr: u64, st: Vec<usize>) -> View {
    View { ptr, base: 0, st }
}

/// Slice geometry of `full` (base element, strides, sliced dims).
fn slice_geometry(
    full: &[usize],
    axis: usize,
    start: usize,
    end: usize,
    step: usize,
) -> R<(u64, Vec<usize>, Vec<usize>)> {
    split_axis(full, axis)?;
    if step == 0 {
        return Err("slice step must be >= 1".into());
    }
    let end = end.min(full[axis]);
    let n = if start >= end {
        0
    } else {
        (end - start).div_ceil(step)
    };
    let mut st = strides(full);
    let base = if n > 0 { (start * st[axis]) as u64 } else { 0 };
    st[axis] *= step;
    let mut dims = full.to_vec();
    dims[axis] = n;
    Ok((base, st, dims))
}
