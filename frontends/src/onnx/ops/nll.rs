//! The general NegativeLogLikelihoodLoss (ONNX opsets 13–21): reductions
//! `none`, `sum` and `mean`, class weights and `ignore_index`, built from
//! elementwise ops. `loss[n, d...] = -w[t] * log_prob[n, t, d...]` with
//! `t = target[n, d...]`, picked by comparing `t` with the class indices; a
//! weighted mean divides by the sum of the weights of the targets kept.

use super::loss::LossAttrs;
use crate::onnx::context::NodeCx;
use crate::onnx::tensor::HostTensor;
use fsdpc_ir::{BinaryFn, CompareFn, DType, Op, ReduceFn, UnaryFn, ValueId};

/// The loss of `log_prob [N, C, d...]` against the target (input 1), with the
/// class weights of input 2 if given.
pub(super) fn nll(
    cx: &mut NodeCx<'_>,
    log_prob: ValueId,
    a: &LossAttrs,
) -> Result<ValueId, String> {
    let ty = cx.imp.g.value_type(log_prob).clone();
    let dims = ty.shape.dims().to_vec();
    if dims.len() < 2 {
        return Err(format!("input of shape {dims:?}: need [N, C, ...]"));
    }
    let (target, keep) = target(cx, a.ignore_index)?;
    let picked = pick(cx, log_prob, target, &dims)?;
    let mut loss = cx.add(Op::Unary { f: UnaryFn::Neg }, &[picked], "nll")?;
    let zero = cx.constant(&HostTensor::floats(ty.dtype, vec![], vec![0.0]))?;
    let weight = match (a.weighted, keep) {
        (true, _) => {
            let w = cx.ir_like(2, &ty)?;
            let w = cx.add(Op::Gather { axis: 0 }, &[w, target], "weight")?;
            Some(match keep {
                Some(k) => cx.add(Op::Where, &[k, w, zero], "weight_kept")?,
                None => w,
            })
        }
        (false, Some(k)) => Some(cx.add(Op::Cast { to: ty.dtype }, &[k], "kept")?),
        (false, None) => None,
    };
    if let Some(w) = weight {
        loss = cx.add(Op::Binary { f: BinaryFn::Mul }, &[loss, w], "weighted")?;
    }
    reduce(cx, loss, weight, &a.reduction)
}

/// The target as i64 with ignored entries replaced by class 0, and the mask
/// of the entries kept (when there is an `ignore_index`).
fn target(
    cx: &mut NodeCx<'_>,
    ignore_index: Option<i64>,
) -> Result<(ValueId, Option<ValueId>), String> {
    let mut t = cx.ir(1)?;
    if cx.imp.g.value_type(t).dtype != DType::I64 {
        t = cx.add(Op::Cast { to: DType::I64 }, &[t], "target_i64")?;
    }
    let Some(ii) = ignore_index else {
        return Ok((t, None));
    };
    let ii = cx.constant(&HostTensor::ints(DType::I64, vec![], vec![ii]))?;
    let ignored = cx.add(
        Op::Compare {
            f: CompareFn::Equal,
        },
        &[t, ii],
        "ignored",
    )?;
    let keep = cx.add(Op::Not, &[ignored], "kept_mask")?;
    let zero = cx.constant(&HostTensor::ints(DType::I64, vec![], vec![0]))?;
    let t = cx.add(Op::Where, &[keep, t, zero], "target_kept")?;
    Ok((t, Some(keep)))
}

/// `log_prob[n, target[n, d...], d...]`: the class axis compared with the
/// target, the matching entry kept, the axis summed away.
fn pick(
    cx: &mut NodeCx<'_>,
    log_prob: ValueId,
    target: ValueId,
    dims: &[usize],
) -> Result<ValueId, String> {
    let mut t_shape = dims.to_vec();
    t_shape[1] = 1;
    let t = cx.add(Op::Reshape { shape: t_shape }, &[target], "target_col")?;
    let mut c_shape = vec![1; dims.len()];
    c_shape[1] = dims[1];
    let classes = (0..dims[1] as i64).collect();
    let classes = cx.constant(&HostTensor::ints(DType::I64, c_shape, classes))?;
    let hot = cx.add(
        Op::Compare {
            f: CompareFn::Equal,
        },
        &[t, classes],
        "one_hot",
    )?;
    let dtype = cx.imp.g.value_type(log_prob).dtype;
    let zero = cx.constant(&HostTensor::floats(dtype, vec![], vec![0.0]))?;
    let kept = cx.add(Op::Where, &[hot, log_prob, zero], "picked_classes")?;
    let sum = Op::Reduce {
        f: ReduceFn::Sum,
        axes: vec![1],
        keepdims: false,
    };
    cx.add(sum, &[kept], "picked")
}

/// The reduction of the per-element `loss`; a mean divides by the sum of
/// `weight` when there is one.
fn reduce(
    cx: &mut NodeCx<'_>,
    loss: ValueId,
    weight: Option<ValueId>,
    reduction: &str,
) -> Result<ValueId, String> {
    let rank = cx.imp.g.value_type(loss).shape.rank();
    let all = |f| Op::Reduce {
        f,
        axes: (0..rank).collect(),
        keepdims: false,
    };
    match (reduction, weight) {
        ("none", _) => Ok(loss),
        ("sum", _) => cx.add(all(ReduceFn::Sum), &[loss], "sum"),
        (_, None) => cx.add(all(ReduceFn::Mean), &[loss], "mean"),
        (_, Some(w)) => {
            let num = cx.add(all(ReduceFn::Sum), &[loss], "sum")?;
            let den = cx.add(all(ReduceFn::Sum), &[w], "weight_sum")?;
            cx.add(Op::Binary { f: BinaryFn::Div }, &[num, den], "mean")
        }
    }
}
