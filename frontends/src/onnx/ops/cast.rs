//! Type conversion and pass-through — ONNX operators Cast (opsets 13–21),
//! CastLike (15–21: to the element type of its second input), Identity (13–21) and Dropout (13–21: identity unless `training_mode` is
//! true, then the IR's counter-based dropout with a seed per site; the
//! optional `mask` output says which elements were kept: all true where
//! nothing is dropped, else the same counter-based mask applied to ones).

use super::Convert;
use crate::onnx::context::{NodeCx, Val};
use crate::onnx::proto::dtype;
use crate::onnx::tensor::{check_size, HostTensor};
use fsdpc_ir::{CompareFn, DType, Op, ValueId};

pub(super) const OPS: &[(&str, Convert)] = &[
    ("Cast", cast),
    ("CastLike", cast_like),
    ("Identity", identity),
    ("Dropout", dropout),
];

fn cast(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let to = i32::try_from(cx.attr_i("to", 0)?)
        .map_err(|_| "attribute `to` is out of range".to_string())?;
    cast_to(cx, dtype(to)?)
}

fn cast_like(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let to = cx.ty(1)?.dtype;
    cast_to(cx, to)
}

/// Output 0 is input 0 converted to `to` (folded for a constant).
fn cast_to(cx: &mut NodeCx<'_>, to: DType) -> Result<(), String> {
    let y = match cx.val(0)?.clone() {
        Val::Const(t) => Val::Const(t.cast(to)),
        Val::Ir(v) if cx.imp.g.value_type(v).dtype == to => Val::Ir(v),
        Val::Ir(v) => Val::Ir(cx.add(Op::Cast { to }, &[v], "cast")?),
    };
    cx.set(0, y);
    Ok(())
}

fn identity(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let v = cx.val(0)?.clone();
    cx.set(0, v);
    Ok(())
}

fn dropout(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let p = cx
        .opt_konst(1, "ratio")?
        .map_or(0.5, |t| t.as_f64().first().copied().unwrap_or(0.5));
    let training = cx
        .opt_konst(2, "training_mode")?
        .is_some_and(|t| t.as_i64().first().is_some_and(|&b| b != 0));
    if !training || p == 0.0 {
        if cx.wants(1) {
            let shape = cx.ty(0)?.shape.dims().to_vec();
            check_size(&shape)?;
            let n = shape.iter().product();
            cx.set(
                1,
                Val::Const(HostTensor::ints(DType::Bool, shape, vec![1; n])),
            );
        }
        return identity(cx);
    }
    if !(0.0..1.0).contains(&p) {
        return Err(format!("ratio {p} is not in [0, 1)"));
    }
    let seed = cx.imp.next_seed;
    cx.imp.next_seed += 1;
    let x = cx.ir(0)?;
    let y = cx.add(
        Op::Dropout {
            p,
            seed,
            whole_sample: None,
        },
        &[x],
        "dropout",
    )?;
    cx.set(0, Val::Ir(y));
    if cx.wants(1) {
        let mask = keep_mask(cx, x, p, seed)?;
        cx.set(1, Val::Ir(mask));
    }
    Ok(())
}

/// The bool mask of the elements that `Dropout { p, seed }` keeps in a
/// tensor shaped like `x`: the same dropout applied to ones is nonzero
/// exactly where it keeps an element (the mask is a function of the seed,
/// the step and the element only). It reads no parameter, so it has no
/// gradient.
fn keep_mask(cx: &mut NodeCx<'_>, x: ValueId, p: f64, seed: u64) -> Result<ValueId, String> {
    let ty = cx.imp.g.value_type(x).clone();
    let scalar = |v: f64| HostTensor::floats(ty.dtype, Vec::new(), vec![v]);
    let one = cx.constant(&scalar(1.0))?;
    let shape = ty.shape.dims().to_vec();
    let ones = cx.add(Op::Expand { shape }, &[one], "mask_ones")?;
    let kept = cx.add(
        Op::Dropout {
            p,
            seed,
            whole_sample: None,
        },
        &[ones],
        "mask_dropout",
    )?;
    let zero = cx.constant(&scalar(0.0))?;
    let f = CompareFn::Greater;
    cx.add(Op::Compare { f }, &[kept, zero], "mask")
}
