//! Comparisons and logic — ONNX operators Equal, Less, LessOrEqual, Greater,
//! GreaterOrEqual, Not, And, Or, Xor, IsNaN, Where (opsets 13–21). Constant
//! masks (a causal mask from Trilu, `Equal(shape, -1)` in reshape
//! computations) fold.

use super::Convert;
use crate::onnx::context::{NodeCx, Val};
use crate::onnx::tensor::{broadcast, broadcast_indices, check_size, zip, HostData, HostTensor};
use fsdpc_ir::{CompareFn, DType, LogicalFn, Op, UnaryFn};

pub(super) const OPS: &[(&str, Convert)] = &[
    ("Equal", |cx| compare(cx, CompareFn::Equal)),
    ("Less", |cx| compare(cx, CompareFn::Less)),
    ("LessOrEqual", |cx| compare(cx, CompareFn::LessOrEqual)),
    ("Greater", |cx| compare(cx, CompareFn::Greater)),
    ("GreaterOrEqual", |cx| {
        compare(cx, CompareFn::GreaterOrEqual)
    }),
    ("And", |cx| logical(cx, LogicalFn::And)),
    ("Or", |cx| logical(cx, LogicalFn::Or)),
    ("Xor", |cx| logical(cx, LogicalFn::Xor)),
    ("Not", not),
    ("IsNaN", is_nan),
    ("Where", where_),
];

fn compare(cx: &mut NodeCx<'_>, f: CompareFn) -> Result<(), String> {
    if let (Val::Const(a), Val::Const(b)) = (cx.val(0)?, cx.val(1)?) {
        let test = move |o: std::cmp::Ordering| match f {
            CompareFn::Equal => o.is_eq(),
            CompareFn::Less => o.is_lt(),
            CompareFn::LessOrEqual => o.is_le(),
            CompareFn::Greater => o.is_gt(),
            CompareFn::GreaterOrEqual => o.is_ge(),
        };
        let fi = move |x: i64, y: i64| i64::from(test(x.cmp(&y)));
        let ff = move |x: f64, y: f64| {
            x.partial_cmp(&y)
                .map_or(0.0, |o| f64::from(u8::from(test(o))))
        };
        let y = zip(a, b, DType::Bool, fi, ff)?;
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let (ta, tb) = (cx.ty(0)?, cx.ty(1)?);
    let a = cx.ir_like(0, &tb)?;
    let b = cx.ir_like(1, &ta)?;
    let y = cx.add(Op::Compare { f }, &[a, b], "compare")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

fn logical(cx: &mut NodeCx<'_>, f: LogicalFn) -> Result<(), String> {
    if let (Val::Const(a), Val::Const(b)) = (cx.val(0)?, cx.val(1)?) {
        let fi = move |x: i64, y: i64| {
            let (x, y) = (x != 0, y != 0);
            i64::from(match f {
                LogicalFn::And => x && y,
                LogicalFn::Or => x || y,
                LogicalFn::Xor => x != y,
            })
        };
        let y = zip(a, b, DType::Bool, fi, |_, _| 0.0)?;
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let a = cx.ir(0)?;
    let b = cx.ir(1)?;
    let y = cx.add(Op::Logical { f }, &[a, b], "logical")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

fn not(cx: &mut NodeCx<'_>) -> Result<(), String> {
    if let Val::Const(t) = cx.val(0)? {
        let v = t.as_i64().into_iter().map(|x| i64::from(x == 0)).collect();
        let y = HostTensor::ints(DType::Bool, t.shape.clone(), v);
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let x = cx.ir(0)?;
    let y = cx.add(Op::Not, &[x], "not")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

fn is_nan(cx: &mut NodeCx<'_>) -> Result<(), String> {
    if let Val::Const(t) = cx.val(0)? {
        let v = t
            .as_f64()
            .into_iter()
            .map(|x| i64::from(x.is_nan()))
            .collect();
        let y = HostTensor::ints(DType::Bool, t.shape.clone(), v);
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let x = cx.ir(0)?;
    let y = cx.add(Op::Unary { f: UnaryFn::IsNan }, &[x], "is_nan")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// Where(cond, a, b); all-constant folds, a constant branch takes the other
/// branch's dtype.
fn where_(cx: &mut NodeCx<'_>) -> Result<(), String> {
    if cx.all_const() {
        let y = fold_where(
            cx.konst(0, "condition")?,
            cx.konst(1, "x")?,
            cx.konst(2, "y")?,
        )?;
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let (ta, tb) = (cx.ty(1)?, cx.ty(2)?);
    let c = cx.ir(0)?;
    let a = cx.ir_like(1, &tb)?;
    let b = cx.ir_like(2, &ta)?;
    let y = cx.add(Op::Where, &[c, a, b], "where")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

fn fold_where(c: &HostTensor, a: &HostTensor, b: &HostTensor) -> Result<HostTensor, String> {
    let shape = broadcast(&broadcast(&c.shape, &a.shape)?, &b.shape)?;
    check_size(&shape)?;
    let (ic, ia, ib) = (
        broadcast_indices(&c.shape, &shape),
        broadcast_indices(&a.shape, &shape),
        broadcast_indices(&b.shape, &shape),
    );
    let cv = c.as_i64();
    let pick = |k: usize| cv[ic[k]] != 0;
    Ok(match (&a.data, &b.data) {
        (HostData::I(x), HostData::I(y)) => {
            let v = (0..ic.len())
                .map(|k| if pick(k) { x[ia[k]] } else { y[ib[k]] })
                .collect();
            HostTensor::ints(a.dtype, shape, v)
        }
        _ => {
            let (x, y) = (a.as_f64(), b.as_f64());
            let v = (0..ic.len())
                .map(|k| if pick(k) { x[ia[k]] } else { y[ib[k]] })
                .collect();
            HostTensor::floats(a.dtype, shape, v)
        }
    })
}
