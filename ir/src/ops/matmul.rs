//! `MatMul`: `a[..., m, k] x b[..., k, n]` after the optional transposes of
//! the last two axes; the leading (batch) dimensions broadcast as numpy does.
//! Both operands have rank >= 2 (frontends reshape 1-D operands).
//!
//! Gradients are matrix products with transposes, summed back over broadcast
//! batch dimensions. The common `x[b, s, k] x w[k, n]` case computes `dw` as
//! one `[b·s, k]ᵀ x [b·s, n]` product rather than a batched product and a sum.

use super::check::{arity, broadcast_shapes, float, same_dtype};
use super::{misrouted, out_numel, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct MatMul;

impl Family for MatMul {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        let Op::MatMul { trans_a, trans_b } = op else {
            return Err(misrouted(op, "matmul"));
        };
        arity(inputs, 2, "a, b")?;
        let (a, b) = (inputs[0], inputs[1]);
        float(a, "a")?;
        same_dtype(a, b, "a and b")?;
        let (batch_a, m, ka) = split(a, *trans_a, "a")?;
        let (batch_b, kb, n) = split(b, *trans_b, "b")?;
        if ka != kb {
            return Err(format!(
                "inner dimensions differ: a {a}{} has k = {ka}, b {b}{} has k = {kb}",
                if *trans_a { " (transposed)" } else { "" },
                if *trans_b { " (transposed)" } else { "" },
            ));
        }
        let mut shape =
            broadcast_shapes(batch_a, batch_b).map_err(|e| format!("batch dimensions: {e}"))?;
        shape.extend([m, n]);
        Ok(vec![TensorType::new(a.dtype, shape)])
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let Op::MatMul { trans_a, trans_b } = *op else {
            return Err(misrouted(op, "matmul"));
        };
        let da = if cx.needs(0) {
            Some(grad_a(cx, trans_a, trans_b)?)
        } else {
            None
        };
        let db = if cx.needs(1) {
            Some(grad_b(cx, trans_a, trans_b)?)
        } else {
            None
        };
        Ok(vec![da, db])
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], outputs: &[TensorType]) -> f64 {
        let (Op::MatMul { trans_a, .. }, Some(a)) = (op, inputs.first()) else {
            return 0.0;
        };
        let d = a.shape.dims();
        let k = match (d.len(), trans_a) {
            (r, false) if r >= 1 => d[r - 1],
            (r, true) if r >= 2 => d[r - 2],
            _ => 0,
        };
        2.0 * out_numel(outputs) * k as f64
    }
}

/// `(batch dims, rows, cols)` of an operand; `transposed` swaps the last two.
fn split<'t>(
    t: &'t TensorType,
    transposed: bool,
    what: &str,
) -> Result<(&'t [usize], usize, usize), String> {
    let d = t.shape.dims();
    let r = d.len();
    if r < 2 {
        return Err(format!(
            "{what} must have rank >= 2, got {t} (reshape a vector to a matrix)"
        ));
    }
    let (x, y) = (d[r - 2], d[r - 1]);
    Ok(if transposed {
        (&d[..r - 2], y, x)
    } else {
        (&d[..r - 2], x, y)
    })
}

/// `da`: `dy · b'ᵀ` (or its transpose when `a` was transposed), summed back
/// to the shape of `a`.
fn grad_a(cx: &mut VjpCtx<'_>, ta: bool, tb: bool) -> Result<ValueId, String> {
    let (a, b, dy) = (cx.x(0)?, cx.x(1)?, cx.dy());
    let g = if ta {
        cx.emit(mm(tb, true), &[b, dy])?
    } else {
        cx.emit(mm(false, !tb), &[dy, b])?
    };
    let shape = cx.shape(a)?;
    cx.sum_to(g, &shape)
}

/// `db`: `a'ᵀ · dy` (or its transpose when `b` was transposed), summed back
/// to the shape of `b`.
fn grad_b(cx: &mut VjpCtx<'_>, ta: bool, tb: bool) -> Result<ValueId, String> {
    let (a, b, dy) = (cx.x(0)?, cx.x(1)?, cx.dy());
    let (a_shape, b_shape) = (cx.shape(a)?, cx.shape(b)?);
    if b_shape.len() == 2 && a_shape.len() > 2 && !ta {
        return grad_b_flat(cx, a, &a_shape, tb);
    }
    let g = if tb {
        cx.emit(mm(true, ta), &[dy, a])?
    } else {
        cx.emit(mm(!ta, false), &[a, dy])?
    };
    cx.sum_to(g, &b_shape)
}

/// `db` for a matrix `b` and a batched, untransposed `a[..., m, k]`: the batch
/// and row dimensions are folded into one.
fn grad_b_flat(
    cx: &mut VjpCtx<'_>,
    a: ValueId,
    a_shape: &[usize],
    tb: bool,
) -> Result<ValueId, String> {
    let dy = cx.dy();
    let (k, rows) = match a_shape.split_last() {
        Some((k, lead)) => (*k, lead.iter().product::<usize>()),
        None => return Err("internal: a batched `a` has no dimensions".into()),
    };
    let n = cx.shape(dy)?.last().copied().unwrap_or(1);
    let a2 = cx.emit(
        Op::Reshape {
            shape: vec![rows, k],
        },
        &[a],
    )?;
    let dy2 = cx.emit(
        Op::Reshape {
            shape: vec![rows, n],
        },
        &[dy],
    )?;
    if tb {
        cx.emit(mm(true, false), &[dy2, a2])
    } else {
        cx.emit(mm(true, false), &[a2, dy2])
    }
}

fn mm(trans_a: bool, trans_b: bool) -> Op {
    Op::MatMul { trans_a, trans_b }
}
