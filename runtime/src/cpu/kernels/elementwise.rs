//! Broadcasting elementwise kernels: `Binary`, `Compare`, `Logical`, `Not`,
//! `Where`. Loops are planned by `layout::Blocks`, so same-shape, row
//! (last-axes) and column broadcasts all run as tight inner loops over
//! contiguous or repeated operands.

use super::layout::Blocks;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};
use fsdpc_ir::{BinaryFn, CompareFn, DType, LogicalFn};

/// `Binary { f }`.
pub fn binary(f: BinaryFn, a: &TensorRef, b: &TensorRef, out: &mut TensorMut) -> KResult<()> {
    let blocks = Blocks::new(out.dims(), [a.dims(), b.dims()])?;
    match (a.dtype(), b.dtype()) {
        (DType::F32, DType::F32) => {
            let (x, y, o) = (a.f32()?, b.f32()?, out.f32_mut()?);
            binary_f32(f, &blocks, x, y, o);
            Ok(())
        }
        (da, db) if da.is_int() && db.is_int() => binary_int(f, &blocks, a, b, out),
        (da, db) => crate::kbail!("binary.{f:?} on {da} and {db} is not supported"),
    }
}

crate::multiversion! {
    fn binary_f32(f: BinaryFn, blocks: &Blocks<2>, a: &[f32], b: &[f32], o: &mut [f32]) {
        match f {
            BinaryFn::Add => zip_f32(blocks, a, b, o, |x, y| x + y),
            BinaryFn::Sub => zip_f32(blocks, a, b, o, |x, y| x - y),
            BinaryFn::Mul => zip_f32(blocks, a, b, o, |x, y| x * y),
            BinaryFn::Div => zip_f32(blocks, a, b, o, |x, y| x / y),
            BinaryFn::Pow => zip_f32(blocks, a, b, o, f32::powf),
            BinaryFn::Max => zip_f32(blocks, a, b, o, f32::max),
            BinaryFn::Min => zip_f32(blocks, a, b, o, f32::min),
        }
    }
}

/// The inner loops: each operand is contiguous or a repeated scalar.
#[inline(always)]
fn zip_f32(blocks: &Blocks<2>, a: &[f32], b: &[f32], o: &mut [f32], g: impl Fn(f32, f32) -> f32) {
    let n = blocks.inner;
    let [sa, sb] = blocks.inner_strides;
    blocks.for_each(|[oa, ob], oo| {
        let out = &mut o[oo..oo + n];
        match (sa, sb) {
            (1, 1) => {
                for ((r, &x), &y) in out.iter_mut().zip(&a[oa..oa + n]).zip(&b[ob..ob + n]) {
                    *r = g(x, y);
                }
            }
            (1, _) => {
                let y = b[ob];
                for (r, &x) in out.iter_mut().zip(&a[oa..oa + n]) {
                    *r = g(x, y);
                }
            }
            (_, 1) => {
                let x = a[oa];
                for (r, &y) in out.iter_mut().zip(&b[ob..ob + n]) {
                    *r = g(x, y);
                }
            }
            _ => out.fill(g(a[oa], b[ob])),
        }
    });
}

fn binary_int(
    f: BinaryFn,
    blocks: &Blocks<2>,
    a: &TensorRef,
    b: &TensorRef,
    out: &mut TensorMut,
) -> KResult<()> {
    let [sa, sb] = blocks.inner_strides;
    let mut err = None;
    blocks.for_each(|[oa, ob], oo| {
        for j in 0..blocks.inner {
            let (x, y) = (a.get_i64(oa + j * sa), b.get_i64(ob + j * sb));
            let v = match f {
                BinaryFn::Add => x.wrapping_add(y),
                BinaryFn::Sub => x.wrapping_sub(y),
                BinaryFn::Mul => x.wrapping_mul(y),
                BinaryFn::Div if y == 0 => {
                    err = Some("integer division by zero");
                    0
                }
                BinaryFn::Div => x.wrapping_div(y),
                BinaryFn::Pow => x.wrapping_pow(y.clamp(0, u32::MAX as i64) as u32),
                BinaryFn::Max => x.max(y),
                BinaryFn::Min => x.min(y),
            };
            out.set_i64(oo + j, v);
        }
    });
    match err {
        Some(e) => crate::kbail!("{e}"),
        None => Ok(()),
    }
}

/// `Compare { f }`: bool output; integers compare exactly.
pub fn compare(f: CompareFn, a: &TensorRef, b: &TensorRef, out: &mut TensorMut) -> KResult<()> {
    if out.dtype() != DType::Bool {
        crate::kbail!("compare writes bool, the output is {}", out.ty);
    }
    let blocks = Blocks::new(out.dims(), [a.dims(), b.dims()])?;
    let ints = a.dtype().is_int() && b.dtype().is_int();
    let [sa, sb] = blocks.inner_strides;
    blocks.for_each(|[oa, ob], oo| {
        for j in 0..blocks.inner {
            let (ia, ib) = (oa + j * sa, ob + j * sb);
            let ord = if ints {
                a.get_i64(ia).partial_cmp(&b.get_i64(ib))
            } else {
                a.get_f64(ia).partial_cmp(&b.get_f64(ib))
            };
            out.bytes[oo + j] = u8::from(compare_holds(f, ord));
        }
    });
    Ok(())
}

fn compare_holds(f: CompareFn, ord: Option<std::cmp::Ordering>) -> bool {
    use std::cmp::Ordering::*;
    matches!(
        (f, ord),
        (CompareFn::Equal, Some(Equal))
            | (CompareFn::Less, Some(Less))
            | (CompareFn::LessOrEqual, Some(Less | Equal))
            | (CompareFn::Greater, Some(Greater))
            | (CompareFn::GreaterOrEqual, Some(Greater | Equal))
    )
}

/// `Logical { f }` on bool tensors.
pub fn logical(f: LogicalFn, a: &TensorRef, b: &TensorRef, out: &mut TensorMut) -> KResult<()> {
    let blocks = Blocks::new(out.dims(), [a.dims(), b.dims()])?;
    let [sa, sb] = blocks.inner_strides;
    blocks.for_each(|[oa, ob], oo| {
        for j in 0..blocks.inner {
            let (x, y) = (a.bytes[oa + j * sa] != 0, b.bytes[ob + j * sb] != 0);
            let v = match f {
                LogicalFn::And => x && y,
                LogicalFn::Or => x || y,
                LogicalFn::Xor => x != y,
            };
            out.bytes[oo + j] = u8::from(v);
        }
    });
    Ok(())
}

/// `Not` on a bool tensor.
pub fn not(a: &TensorRef, out: &mut TensorMut) -> KResult<()> {
    for (o, &x) in out.bytes.iter_mut().zip(a.bytes) {
        *o = u8::from(x == 0);
    }
    Ok(())
}

/// `Where`: `(cond, a, b)`, all three broadcast; copies whole elements, so
/// any dtype works as long as `a` and `b` agree with the output.
pub fn where_(c: &TensorRef, a: &TensorRef, b: &TensorRef, out: &mut TensorMut) -> KResult<()> {
    if c.dtype() != DType::Bool {
        crate::kbail!("where: the condition must be bool, got {}", c.ty);
    }
    if a.dtype() != out.dtype() || b.dtype() != out.dtype() {
        crate::kbail!(
            "where: branches {} and {} must match the output {}",
            a.ty,
            b.ty,
            out.ty
        );
    }
    let blocks = Blocks::new(out.dims(), [c.dims(), a.dims(), b.dims()])?;
    let es = out.dtype().size();
    let [sc, sa, sb] = blocks.inner_strides;
    blocks.for_each(|[oc, oa, ob], oo| {
        for j in 0..blocks.inner {
            let src = if c.bytes[oc + j * sc] != 0 {
                &a.bytes[(oa + j * sa) * es..][..es]
            } else {
                &b.bytes[(ob + j * sb) * es..][..es]
            };
            out.bytes[(oo + j) * es..][..es].copy_from_slice(src);
        }
    });
    Ok(())
}
