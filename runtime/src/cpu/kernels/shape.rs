//! Data movement: `Reshape`, `Transpose`, `Slice`, `SliceGrad`, `Concat`,
//! `Expand`, `Pad`. These copy whole elements, so they work on every dtype;
//! contiguous runs along the last axis are copied with one `memcpy`.

use super::layout::{broadcast_strides, split_axis, strides};
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};

/// Calls `f(index of the run's first element, run length)` for every run along
/// the last axis of `dims`, in row-major order.
fn for_each_run(dims: &[usize], mut f: impl FnMut(&[usize], usize)) {
    if dims.contains(&0) {
        return;
    }
    let Some((&last, lead)) = dims.split_last() else {
        f(&[], 1);
        return;
    };
    let mut idx = vec![0usize; dims.len()];
    loop {
        f(&idx, last);
        let mut ax = lead.len();
        loop {
            if ax == 0 {
                return;
            }
            ax -= 1;
            idx[ax] += 1;
            if idx[ax] < dims[ax] {
                break;
            }
            idx[ax] = 0;
        }
    }
}

/// Copies a run of `n` elements of `es` bytes from `src` (element stride
/// `stride`) to contiguous `dst`.
#[inline]
fn copy_run(src: &[u8], start: usize, stride: usize, n: usize, es: usize, dst: &mut [u8]) {
    if stride == 1 {
        dst[..n * es].copy_from_slice(&src[start * es..(start + n) * es]);
        return;
    }
    match es {
        1 => gather_elems::<1>(src, start, stride, n, dst),
        2 => gather_elems::<2>(src, start, stride, n, dst),
        4 => gather_elems::<4>(src, start, stride, n, dst),
        _ => gather_elems::<8>(src, start, stride, n, dst),
    }
}

/// Strided gather of `n` elements of `ES` bytes (fixed-size moves).
#[inline]
fn gather_elems<const ES: usize>(
    src: &[u8],
    start: usize,
    stride: usize,
    n: usize,
    dst: &mut [u8],
) {
    for (j, d) in dst[..n * ES].chunks_exact_mut(ES).enumerate() {
        let s = (start + j * stride) * ES;
        d.copy_from_slice(&src[s..s + ES]);
    }
}

/// Strided scatter of `n` contiguous elements of `ES` bytes.
#[inline]
fn scatter_elems<const ES: usize>(
    src: &[u8],
    dst: &mut [u8],
    start: usize,
    stride: usize,
    n: usize,
) {
    for (j, v) in src[..n * ES].chunks_exact(ES).enumerate() {
        let d = (start + j * stride) * ES;
        dst[d..d + ES].copy_from_slice(v);
    }
}

/// `dst[out index] = src[base + sum(idx * in_strides)]` over `out_dims`.
fn gather_strided(
    src: &[u8],
    base: usize,
    in_strides: &[usize],
    out_dims: &[usize],
    es: usize,
    dst: &mut [u8],
) {
    let mut o = 0usize;
    let inner = in_strides.last().copied().unwrap_or(1);
    for_each_run(out_dims, |idx, n| {
        let start = base
            + idx
                .iter()
                .zip(in_strides)
                .map(|(i, s)| i * s)
                .sum::<usize>();
        copy_run(src, start, inner, n, es, &mut dst[o * es..]);
        o += n;
    });
}

fn same_dtype(x: &TensorRef, y: &TensorMut) -> KResult<usize> {
    if x.dtype() != y.dtype() {
        crate::kbail!("input {} and output {} dtypes differ", x.ty, y.ty);
    }
    Ok(x.dtype().size())
}

/// `Reshape`: the bytes are unchanged.
pub fn reshape(x: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    same_dtype(x, y)?;
    if x.bytes.len() != y.bytes.len() {
        crate::kbail!(
            "reshape from {} to {} changes the element count",
            x.ty,
            y.ty
        );
    }
    y.bytes.copy_from_slice(x.bytes);
    Ok(())
}

/// `Transpose { perm }`.
pub fn transpose(perm: &[usize], x: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    let es = same_dtype(x, y)?;
    let dims = x.dims();
    let mut seen = vec![false; dims.len()];
    if perm.len() != dims.len()
        || perm
            .iter()
            .any(|&p| p >= dims.len() || std::mem::replace(&mut seen[p], true))
    {
        crate::kbail!(
            "transpose: {perm:?} is not a permutation of the axes of {}",
            x.ty
        );
    }
    let st = strides(dims);
    let in_strides: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    if out_dims != y.dims() {
        crate::kbail!("transpose output {} does not match {perm:?}", y.ty);
    }
    gather_strided(x.bytes, 0, &in_strides, &out_dims, es, y.bytes);
    Ok(())
}

/// The output length of a slice, with `end` clamped to `dim`.
fn slice_len(dim: usize, start: usize, end: usize, step: usize) -> KResult<usize> {
    if step == 0 {
        crate::kbail!("slice step must be >= 1");
    }
    let end = end.min(dim);
    Ok(if start >= end {
        0
    } else {
        (end - start).div_ceil(step)
    })
}

/// Attributes of a `Slice` or `SliceGrad`.
#[derive(Copy, Clone, Debug)]
pub struct SliceSpec {
    /// The sliced axis.
    pub axis: usize,
    /// First index.
    pub start: usize,
    /// End index (exclusive, clamped to the axis).
    pub end: usize,
    /// Stride along the axis (>= 1).
    pub step: usize,
}

/// (base offset, strides in the full tensor, dims of the slice).
fn slice_geometry(full: &[usize], s: SliceSpec) -> KResult<(usize, Vec<usize>, Vec<usize>)> {
    split_axis(full, s.axis)?;
    let n = slice_len(full[s.axis], s.start, s.end, s.step)?;
    let mut st = strides(full);
    let base = if n > 0 { s.start * st[s.axis] } else { 0 };
    st[s.axis] *= s.step;
    let mut dims = full.to_vec();
    dims[s.axis] = n;
    Ok((base, st, dims))
}

/// `Slice`.
pub fn slice(s: SliceSpec, x: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    let es = same_dtype(x, y)?;
    let (base, st, dims) = slice_geometry(x.dims(), s)?;
    if dims != y.dims() {
        crate::kbail!("slice output {} does not match {:?}", y.ty, dims);
    }
    gather_strided(x.bytes, base, &st, &dims, es, y.bytes);
    Ok(())
}

/// `SliceGrad`: scatters `dy` into zeros of the input shape.
pub fn slice_grad(s: SliceSpec, dy: &TensorRef, dx: &mut TensorMut) -> KResult<()> {
    let es = same_dtype(dy, dx)?;
    let (base, st, dims) = slice_geometry(dx.dims(), s)?;
    if dims != dy.dims() {
        crate::kbail!(
            "slice_grad: dy {} does not match the slice {:?}",
            dy.ty,
            dims
        );
    }
    dx.bytes.fill(0);
    let inner = st.last().copied().unwrap_or(1);
    let mut o = 0usize;
    for_each_run(&dims, |idx, n| {
        let start = base + idx.iter().zip(&st).map(|(i, s)| i * s).sum::<usize>();
        let src = &dy.bytes[o * es..(o + n) * es];
        match (inner, es) {
            (1, _) => dx.bytes[start * es..(start + n) * es].copy_from_slice(src),
            (_, 1) => scatter_elems::<1>(src, dx.bytes, start, inner, n),
            (_, 2) => scatter_elems::<2>(src, dx.bytes, start, inner, n),
            (_, 4) => scatter_elems::<4>(src, dx.bytes, start, inner, n),
            _ => scatter_elems::<8>(src, dx.bytes, start, inner, n),
        }
        o += n;
    });
    Ok(())
}

/// `Concat { axis }`.
pub fn concat(axis: usize, xs: &[TensorRef], y: &mut TensorMut) -> KResult<()> {
    let (outer, _, inner) = split_axis(y.dims(), axis)?;
    let es = y.dtype().size();
    let mut total = 0;
    for x in xs {
        same_dtype(x, y)?;
        let (o, len, i) = split_axis(x.dims(), axis)?;
        if o != outer || i != inner {
            crate::kbail!(
                "concat: input {} does not match output {} off axis {axis}",
                x.ty,
                y.ty
            );
        }
        total += len;
    }
    if total != y.dims()[axis] {
        crate::kbail!(
            "concat: inputs add up to {total} along axis {axis}, output has {}",
            y.dims()[axis]
        );
    }
    let row = total * inner * es;
    let mut at = 0;
    for x in xs {
        let chunk = x.dims()[axis] * inner * es;
        for o in 0..outer {
            y.bytes[o * row + at..o * row + at + chunk]
                .copy_from_slice(&x.bytes[o * chunk..(o + 1) * chunk]);
        }
        at += chunk;
    }
    Ok(())
}

/// `Expand { shape }` (numpy broadcast).
pub fn expand(x: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    let es = same_dtype(x, y)?;
    let st = broadcast_strides(x.dims(), y.dims())?;
    let dims = y.dims();
    gather_strided(x.bytes, 0, &st, dims, es, y.bytes);
    Ok(())
}

/// `Pad { pads, value }`: constant padding.
pub fn pad(pads: &[(usize, usize)], value: f64, x: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    let es = same_dtype(x, y)?;
    let dims = x.dims();
    let want: Vec<usize> = dims.iter().zip(pads).map(|(d, (b, a))| d + b + a).collect();
    if pads.len() != dims.len() || want != y.dims() {
        crate::kbail!("pad: {pads:?} applied to {} does not give {}", x.ty, y.ty);
    }
    for i in 0..y.numel() {
        y.set_f64(i, value);
    }
    let ost = strides(y.dims());
    let mut o = 0usize;
    for_each_run(dims, |idx, n| {
        let start: usize = idx
            .iter()
            .zip(pads)
            .zip(&ost)
            .map(|((i, p), s)| (i + p.0) * s)
            .sum();
        y.bytes[start * es..(start + n) * es].copy_from_slice(&x.bytes[o * es..(o + n) * es]);
        o += n;
    });
    Ok(())
}
