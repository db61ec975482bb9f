//! Elementwise arithmetic — ONNX operators Add, Sub, Mul, Div, Pow, Min, Max
//! (opsets 13–21, numpy broadcasting), Neg, Abs, Exp, Log, Sqrt, Reciprocal,
//! Tanh, Relu, Sigmoid, Erf (13+), Gelu (20+), Clip (13+). All-constant
//! inputs fold. Sin and Cos (7+) fold only: the IR has no trigonometric op,
//! and exporters apply them to constant rotary tables.

use super::Convert;
use crate::onnx::context::{NodeCx, Val};
use crate::onnx::tensor::{zip, HostData, HostTensor};
use fsdpc_ir::{BinaryFn, Op, UnaryFn};

pub(super) const OPS: &[(&str, Convert)] = &[
    ("Add", |cx| binary(cx, BinaryFn::Add)),
    ("Sub", |cx| binary(cx, BinaryFn::Sub)),
    ("Mul", |cx| binary(cx, BinaryFn::Mul)),
    ("Div", |cx| binary(cx, BinaryFn::Div)),
    ("Pow", |cx| binary(cx, BinaryFn::Pow)),
    ("Min", |cx| variadic(cx, BinaryFn::Min)),
    ("Max", |cx| variadic(cx, BinaryFn::Max)),
    ("Neg", |cx| unary(cx, UnaryFn::Neg)),
    ("Abs", |cx| unary(cx, UnaryFn::Abs)),
    ("Exp", |cx| unary(cx, UnaryFn::Exp)),
    ("Log", |cx| unary(cx, UnaryFn::Log)),
    ("Sqrt", |cx| unary(cx, UnaryFn::Sqrt)),
    ("Reciprocal", |cx| unary(cx, UnaryFn::Reciprocal)),
    ("Tanh", |cx| unary(cx, UnaryFn::Tanh)),
    ("Relu", |cx| unary(cx, UnaryFn::Relu)),
    ("Sigmoid", |cx| unary(cx, UnaryFn::Sigmoid)),
    ("Erf", |cx| unary(cx, UnaryFn::Erf)),
    ("Gelu", gelu),
    ("Clip", clip),
    ("Sin", |cx| fold_only(cx, f64::sin)),
    ("Cos", |cx| fold_only(cx, f64::cos)),
];

/// Folds `f` on two constants.
pub(super) fn fold_binary(
    a: &HostTensor,
    b: &HostTensor,
    f: BinaryFn,
) -> Result<HostTensor, String> {
    let fi = move |x: i64, y: i64| match f {
        BinaryFn::Add => x.wrapping_add(y),
        BinaryFn::Sub => x.wrapping_sub(y),
        BinaryFn::Mul => x.wrapping_mul(y),
        BinaryFn::Div => x.checked_div(y).unwrap_or(0),
        BinaryFn::Pow => x.wrapping_pow(u32::try_from(y).unwrap_or(0)),
        BinaryFn::Max => x.max(y),
        BinaryFn::Min => x.min(y),
    };
    let ff = move |x: f64, y: f64| match f {
        BinaryFn::Add => x + y,
        BinaryFn::Sub => x - y,
        BinaryFn::Mul => x * y,
        BinaryFn::Div => x / y,
        BinaryFn::Pow => x.powf(y),
        BinaryFn::Max => x.max(y),
        BinaryFn::Min => x.min(y),
    };
    zip(a, b, a.dtype, fi, ff)
}

/// `f(a, b)` of inputs 0 and 1 into output 0.
fn binary(cx: &mut NodeCx<'_>, f: BinaryFn) -> Result<(), String> {
    if let (Val::Const(a), Val::Const(b)) = (cx.val(0)?, cx.val(1)?) {
        let y = fold_binary(a, b, f)?;
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let y = ir_binary(cx, 0, 1, f)?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// An IR `Binary` of inputs `i` and `j`; a constant takes the other's dtype
/// and a differing exponent of `Pow` is cast.
fn ir_binary(
    cx: &mut NodeCx<'_>,
    i: usize,
    j: usize,
    f: BinaryFn,
) -> Result<fsdpc_ir::ValueId, String> {
    let (ta, tb) = (cx.ty(i)?, cx.ty(j)?);
    let a = cx.ir_like(i, &tb)?;
    let mut b = cx.ir_like(j, &ta)?;
    let ta = cx.imp.g.value_type(a).clone();
    if cx.imp.g.value_type(b).dtype != ta.dtype {
        b = cx.add(Op::Cast { to: ta.dtype }, &[b], "cast")?;
    }
    cx.add(Op::Binary { f }, &[a, b], "binary")
}

/// `f` folded over every input (Min, Max).
fn variadic(cx: &mut NodeCx<'_>, f: BinaryFn) -> Result<(), String> {
    if cx.n_inputs() == 0 {
        return Err("needs at least one input".into());
    }
    if cx.all_const() {
        let mut acc = cx.konst(0, "operand")?.clone();
        for i in 1..cx.n_inputs() {
            acc = fold_binary(&acc, cx.konst(i, "operand")?, f)?;
        }
        cx.set(0, Val::Const(acc));
        return Ok(());
    }
    let mut acc = cx.ir(0)?;
    for i in 1..cx.n_inputs() {
        let like = cx.imp.g.value_type(acc).clone();
        let b = cx.ir_like(i, &like)?;
        acc = cx.add(Op::Binary { f }, &[acc, b], &format!("binary{i}"))?;
    }
    cx.set(0, Val::Ir(acc));
    Ok(())
}

/// The f64 form of `f`, for folding, where one exists.
fn host_fn(f: UnaryFn) -> Option<fn(f64) -> f64> {
    Some(match f {
        UnaryFn::Neg => |x| -x,
        UnaryFn::Abs => f64::abs,
        UnaryFn::Exp => f64::exp,
        UnaryFn::Log => f64::ln,
        UnaryFn::Sqrt => f64::sqrt,
        UnaryFn::Reciprocal => f64::recip,
        UnaryFn::Tanh => f64::tanh,
        UnaryFn::Relu => |x| x.max(0.0),
        UnaryFn::Sigmoid => |x| 1.0 / (1.0 + (-x).exp()),
        _ => return None,
    })
}

fn unary(cx: &mut NodeCx<'_>, f: UnaryFn) -> Result<(), String> {
    if let (Val::Const(t), Some(h)) = (cx.val(0)?, host_fn(f)) {
        let y = match &t.data {
            HostData::I(v) if f == UnaryFn::Neg || f == UnaryFn::Abs || f == UnaryFn::Relu => {
                let g = |x: i64| match f {
                    UnaryFn::Neg => x.wrapping_neg(),
                    UnaryFn::Abs => x.wrapping_abs(),
                    _ => x.max(0),
                };
                HostTensor::ints(t.dtype, t.shape.clone(), v.iter().map(|&x| g(x)).collect())
            }
            _ => HostTensor::floats(
                t.dtype,
                t.shape.clone(),
                t.as_f64().into_iter().map(h).collect(),
            ),
        };
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let x = cx.ir(0)?;
    let y = cx.add(Op::Unary { f }, &[x], "unary")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// Gelu (opset 20): `approximate` is "none" (erf) or "tanh".
fn gelu(cx: &mut NodeCx<'_>) -> Result<(), String> {
    match cx.attr_s("approximate", "none")?.as_str() {
        "none" => unary(cx, UnaryFn::GeluErf),
        "tanh" => unary(cx, UnaryFn::GeluTanh),
        other => Err(format!("approximate = `{other}` (expected none or tanh)")),
    }
}

/// Clip(x, min?, max?) as Max then Min.
fn clip(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let mut y = cx.ir(0)?;
    for (i, f) in [(1, BinaryFn::Max), (2, BinaryFn::Min)] {
        if cx.opt(i)?.is_some() {
            let like = cx.imp.g.value_type(y).clone();
            let b = cx.ir_like(i, &like)?;
            y = cx.add(
                Op::Binary { f },
                &[y, b],
                if i == 1 { "clip_min" } else { "clip_max" },
            )?;
        }
    }
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// `f` of a constant input (Sin, Cos); a value computed at run time is
/// refused.
fn fold_only(cx: &mut NodeCx<'_>, f: fn(f64) -> f64) -> Result<(), String> {
    let Val::Const(t) = cx.val(0)? else {
        return Err(
            "only a constant input folds: the IR has no trigonometric op (rotary \
                    tables fold when their positions and frequencies are constants)"
                .into(),
        );
    };
    let y = map_floats(t, f);
    cx.set(0, Val::Const(y));
    Ok(())
}

/// `f` of every element, as floats of the tensor's dtype.
fn map_floats(t: &HostTensor, f: fn(f64) -> f64) -> HostTensor {
    HostTensor::floats(
        t.dtype,
        t.shape.clone(),
        t.as_f64().into_iter().map(f).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use fsdpc_ir::DType;

    #[test]
    fn sin_and_cos_of_constants_fold() {
        let t = HostTensor::floats(DType::F32, vec![3], vec![0.0, 1.0, -2.5]);
        let s = map_floats(&t, f64::sin);
        let c = map_floats(&t, f64::cos);
        assert_eq!(s.shape, vec![3]);
        assert_eq!(s.as_f64(), vec![0.0, 1f64.sin(), (-2.5f64).sin()]);
        assert_eq!(c.as_f64(), vec![1.0, 1f64.cos(), (-2.5f64).cos()]);
        let names: Vec<&str> = OPS.iter().map(|(n, _)| *n).collect();
        assert!(names.contains(&"Sin") && names.contains(&"Cos"));
    }
}
