//! Elementwise ops: `Unary`, `Binary`, `Compare`, `Logical`, `Not`, `Where`.
//! Binary, comparison, logical and `Where` inputs broadcast as numpy does;
//! the gradient of a broadcast input is summed back to its shape (`SumTo`).

use super::check::{arity, boolean, broadcast_shapes, float, same_dtype};
use super::vjp::not_differentiable;
use super::{misrouted, out_numel, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::{BinaryFn, CompareFn, Op, UnaryFn};
use crate::types::{DType, TensorType};

pub(crate) struct Elementwise;

impl Family for Elementwise {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        match op {
            Op::Unary { f } => infer_unary(*f, inputs),
            Op::Binary { f } => infer_binary(*f, inputs),
            Op::Compare { .. } => infer_compare(inputs),
            Op::Logical { .. } => infer_logical(inputs),
            Op::Not => {
                arity(inputs, 1, "x")?;
                boolean(inputs[0], "the input of `not`")?;
                Ok(vec![inputs[0].clone()])
            }
            Op::Where => infer_where(inputs),
            _ => Err(misrouted(op, "elementwise")),
        }
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        match op {
            Op::Unary { f } if *f != UnaryFn::IsNan => {
                let (x, dy) = (cx.x(0)?, cx.dy());
                Ok(vec![Some(cx.emit(Op::UnaryGrad { f: *f }, &[x, dy])?)])
            }
            Op::Binary { f } => vjp_binary(*f, cx),
            Op::Where => vjp_where(cx),
            _ => Err(not_differentiable(op)),
        }
    }

    fn flops(&self, op: &Op, _inputs: &[&TensorType], outputs: &[TensorType]) -> f64 {
        let per = match op {
            Op::Unary { f } => unary_cost(*f),
            Op::Binary { f: BinaryFn::Pow } => 4.0,
            _ => 1.0,
        };
        per * out_numel(outputs)
    }
}

/// FLOPs per element of a unary function.
pub(crate) fn unary_cost(f: UnaryFn) -> f64 {
    use UnaryFn::*;
    match f {
        Neg | Abs | Relu | Square | IsNan | Reciprocal => 1.0,
        Exp | Log | Sqrt | Rsqrt | Tanh | Sigmoid | Erf => 4.0,
        Silu => 5.0,
        GeluTanh | GeluErf => 8.0,
    }
}

fn infer_unary(f: UnaryFn, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    arity(inputs, 1, "x")?;
    let x = inputs[0];
    match f {
        UnaryFn::IsNan => {
            float(x, "the input of `is_nan`")?;
            Ok(vec![TensorType {
                dtype: DType::Bool,
                shape: x.shape.clone(),
            }])
        }
        UnaryFn::Neg | UnaryFn::Abs | UnaryFn::Relu | UnaryFn::Square => {
            if x.dtype == DType::Bool {
                return Err(format!("the input must be numeric, got {x}"));
            }
            Ok(vec![x.clone()])
        }
        _ => {
            float(x, "the input")?;
            Ok(vec![x.clone()])
        }
    }
}

/// The broadcast type of two inputs of one dtype, with dtype `out`.
fn broadcast2(inputs: &[&TensorType], what: &str) -> Result<TensorType, String> {
    arity(inputs, 2, what)?;
    let (a, b) = (inputs[0], inputs[1]);
    same_dtype(a, b, "both inputs")?;
    Ok(TensorType {
        dtype: a.dtype,
        shape: crate::types::Shape(broadcast_shapes(a.shape.dims(), b.shape.dims())?),
    })
}

fn infer_binary(f: BinaryFn, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    let t = broadcast2(inputs, "a, b")?;
    if t.dtype == DType::Bool {
        return Err(format!(
            "`{f:?}` needs numeric inputs, got bool (use `logical`)"
        ));
    }
    Ok(vec![t])
}

fn infer_compare(inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    let t = broadcast2(inputs, "a, b")?;
    Ok(vec![TensorType {
        dtype: DType::Bool,
        shape: t.shape,
    }])
}

fn infer_logical(inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    let t = broadcast2(inputs, "a, b")?;
    boolean(&t, "the inputs of `logical`")?;
    Ok(vec![t])
}

fn infer_where(inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    arity(inputs, 3, "cond, a, b")?;
    let (c, a, b) = (inputs[0], inputs[1], inputs[2]);
    boolean(c, "the condition of `where`")?;
    same_dtype(a, b, "the two branches of `where`")?;
    let ab = broadcast_shapes(a.shape.dims(), b.shape.dims())?;
    let shape = broadcast_shapes(c.shape.dims(), &ab)?;
    Ok(vec![TensorType::new(a.dtype, shape)])
}

/// Gradients of `a op b` before summing back to the input shapes.
fn vjp_binary(f: BinaryFn, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
    let (a, b, dy) = (cx.x(0)?, cx.x(1)?, cx.dy());
    let (da, db) = match f {
        BinaryFn::Add => (Some(dy), Some(dy)),
        BinaryFn::Sub => (Some(dy), neg_if(cx, 1, dy)?),
        BinaryFn::Mul => (mul_if(cx, 0, dy, b)?, mul_if(cx, 1, dy, a)?),
        BinaryFn::Div => div_grads(cx, b, dy)?,
        BinaryFn::Pow => pow_grads(cx, a, b, dy)?,
        BinaryFn::Max => select_grads(cx, a, b, dy, CompareFn::GreaterOrEqual, CompareFn::Less)?,
        BinaryFn::Min => select_grads(cx, a, b, dy, CompareFn::LessOrEqual, CompareFn::Greater)?,
    };
    let da = sum_back(cx, 0, da, a)?;
    let db = sum_back(cx, 1, db, b)?;
    Ok(vec![da, db])
}

/// `g` summed back to the shape of `x`, if input `i` needs a gradient.
fn sum_back(
    cx: &mut VjpCtx<'_>,
    i: usize,
    g: Option<ValueId>,
    x: ValueId,
) -> Result<Option<ValueId>, String> {
    match g {
        Some(g) if cx.needs(i) => {
            let shape = cx.shape(x)?;
            Ok(Some(cx.sum_to(g, &shape)?))
        }
        _ => Ok(None),
    }
}

fn neg_if(cx: &mut VjpCtx<'_>, i: usize, dy: ValueId) -> Result<Option<ValueId>, String> {
    if !cx.needs(i) {
        return Ok(None);
    }
    cx.emit(Op::Unary { f: UnaryFn::Neg }, &[dy]).map(Some)
}

fn mul_if(
    cx: &mut VjpCtx<'_>,
    i: usize,
    dy: ValueId,
    other: ValueId,
) -> Result<Option<ValueId>, String> {
    if !cx.needs(i) {
        return Ok(None);
    }
    cx.emit(Op::Binary { f: BinaryFn::Mul }, &[dy, other])
        .map(Some)
}

type Grads2 = (Option<ValueId>, Option<ValueId>);

/// `y = a / b`: `da = dy / b`, `db = -dy * y / b`.
fn div_grads(cx: &mut VjpCtx<'_>, b: ValueId, dy: ValueId) -> Result<Grads2, String> {
    let da = if cx.needs(0) {
        Some(cx.emit(Op::Binary { f: BinaryFn::Div }, &[dy, b])?)
    } else {
        None
    };
    let db = if cx.needs(1) {
        let y = cx.y();
        let y_over_b = cx.emit(Op::Binary { f: BinaryFn::Div }, &[y, b])?;
        let t = cx.emit(Op::Binary { f: BinaryFn::Mul }, &[dy, y_over_b])?;
        Some(cx.emit(Op::Unary { f: UnaryFn::Neg }, &[t])?)
    } else {
        None
    };
    Ok((da, db))
}

/// `y = a ^ b`: `da = dy * b * a^(b-1)`, `db = dy * y * ln a`.
fn pow_grads(cx: &mut VjpCtx<'_>, a: ValueId, b: ValueId, dy: ValueId) -> Result<Grads2, String> {
    let mul = Op::Binary { f: BinaryFn::Mul };
    let da = if cx.needs(0) {
        let one = cx.scalar(cx.ty(b)?.dtype, 1.0)?;
        let bm1 = cx.emit(Op::Binary { f: BinaryFn::Sub }, &[b, one])?;
        let p = cx.emit(Op::Binary { f: BinaryFn::Pow }, &[a, bm1])?;
        let t = cx.emit(mul.clone(), &[b, p])?;
        Some(cx.emit(mul.clone(), &[dy, t])?)
    } else {
        None
    };
    let db = if cx.needs(1) {
        let ln = cx.emit(Op::Unary { f: UnaryFn::Log }, &[a])?;
        let t = cx.emit(mul.clone(), &[cx.y(), ln])?;
        Some(cx.emit(mul, &[dy, t])?)
    } else {
        None
    };
    Ok((da, db))
}

/// `max`/`min`: `dy` flows to `a` where `a_wins(a, b)` (ties go to `a`) and
/// to `b` where `b_wins(a, b)`.
fn select_grads(
    cx: &mut VjpCtx<'_>,
    a: ValueId,
    b: ValueId,
    dy: ValueId,
    a_wins: CompareFn,
    b_wins: CompareFn,
) -> Result<Grads2, String> {
    let zero = cx.scalar(cx.ty(dy)?.dtype, 0.0)?;
    let mut pick = |i: usize, f: CompareFn| -> Result<Option<ValueId>, String> {
        if !cx.needs(i) {
            return Ok(None);
        }
        let mask = cx.emit(Op::Compare { f }, &[a, b])?;
        cx.emit(Op::Where, &[mask, dy, zero]).map(Some)
    };
    Ok((pick(0, a_wins)?, pick(1, b_wins)?))
}

/// `where(c, a, b)`: `da = where(c, dy, 0)`, `db = where(c, 0, dy)`.
fn vjp_where(cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
    let (c, dy) = (cx.x(0)?, cx.dy());
    let zero = cx.scalar(cx.ty(dy)?.dtype, 0.0)?;
    let mut grads = vec![None];
    for (i, pair) in [(1, [dy, zero]), (2, [zero, dy])] {
        let g = if cx.needs(i) {
            Some(cx.emit(Op::Where, &[c, pair[0], pair[1]])?)
        } else {
            None
        };
        let x = cx.x(i)?;
        grads.push(sum_back(cx, i, g, x)?);
    }
    Ok(grads)
}
