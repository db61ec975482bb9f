//! Reductions — ONNX operators ReduceSum (opsets 13–21, axes as an input),
//! ReduceMean and ReduceMax (13–17 with an `axes` attribute, 18–21 with an
//! input); `keepdims` and `noop_with_empty_axes` as the spec defines them;
//! bool inputs (ReduceMax from opset 20) are reduced as 0.0/1.0.

use super::Convert;
use crate::onnx::context::{norm_axis, NodeCx, Val};
use fsdpc_ir::{DType, Op, ReduceFn};

pub(super) const OPS: &[(&str, Convert)] = &[
    ("ReduceSum", |cx| reduce(cx, ReduceFn::Sum, 13)),
    ("ReduceMean", |cx| reduce(cx, ReduceFn::Mean, 18)),
    ("ReduceMax", |cx| reduce(cx, ReduceFn::Max, 18)),
];

/// `f` over the axes; `axes_input_from` is the opset where axes became an input.
fn reduce(cx: &mut NodeCx<'_>, f: ReduceFn, axes_input_from: i64) -> Result<(), String> {
    let rank = cx.rank(0)?;
    let given = if cx.opset() >= axes_input_from {
        cx.opt_konst(1, "axes")?.map(|t| t.as_i64())
    } else {
        cx.attr_ints("axes")?
    };
    let keepdims = cx.attr_i("keepdims", 1)? != 0;
    let noop = cx.attr_i("noop_with_empty_axes", 0)? != 0;
    let mut axes: Vec<usize> = match given {
        Some(a) if !a.is_empty() => a
            .into_iter()
            .map(|a| norm_axis(a, rank))
            .collect::<Result<_, _>>()?,
        _ if noop => {
            let v = cx.val(0)?.clone();
            cx.set(0, v);
            return Ok(());
        }
        _ => (0..rank).collect(),
    };
    axes.sort_unstable();
    axes.dedup();
    let mut x = cx.ir(0)?;
    // The IR reduces numbers: a bool max (any) runs on 0.0/1.0.
    let boolean = cx.imp.g.value_type(x).dtype == DType::Bool;
    if boolean {
        x = cx.add(Op::Cast { to: DType::F32 }, &[x], "as_number")?;
    }
    let mut y = cx.add(Op::Reduce { f, axes, keepdims }, &[x], "reduce")?;
    if boolean {
        y = cx.add(Op::Cast { to: DType::Bool }, &[y], "as_bool")?;
    }
    cx.set(0, Val::Ir(y));
    Ok(())
}
