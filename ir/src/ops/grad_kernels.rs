//! Gradient kernels, emitted by autodiff: `UnaryGrad`, `LayerNormGrad`,
//! `RmsNormGrad`, `SoftmaxGrad`, `LogSoftmaxGrad`, `AttentionGrad`,
//! `GatherGrad`, `CrossEntropyGrad`, `SliceGrad`, `ReduceMaxGrad`. Each
//! checks its inputs against the forward op's rule; none is differentiable
//! (fsdpc does not take second derivatives).

use super::check::{arity, axis, float, rank, same_type};
use super::elementwise::unary_cost;
use super::vjp::not_differentiable;
use super::{in_numel, misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct GradKernels;

impl Family for GradKernels {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        match op {
            Op::UnaryGrad { .. } => unary_grad(inputs),
            Op::LayerNormGrad { has_beta, .. } => norm_grad(inputs, *has_beta),
            Op::RmsNormGrad { .. } => norm_grad(inputs, false),
            Op::SoftmaxGrad { axis } | Op::LogSoftmaxGrad { axis } => softmax_grad(inputs, *axis),
            Op::AttentionGrad { causal, .. } => attention_grad(inputs, *causal),
            Op::GatherGrad { axis, data_shape } => gather_grad(inputs, *axis, data_shape),
            Op::CrossEntropyGrad { .. } => cross_entropy_grad(inputs),
            Op::SliceGrad {
                axis,
                start,
                end,
                step,
                input_shape,
            } => slice_grad(inputs, (*axis, *start, *end, *step), input_shape),
            Op::ReduceMaxGrad { axes, keepdims } => reduce_max_grad(inputs, axes, *keepdims),
            _ => Err(misrouted(op, "gradient kernel")),
        }
    }

    fn vjp(&self, op: &Op, _cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        Err(not_differentiable(op))
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], _outputs: &[TensorType]) -> f64 {
        let x = in_numel(inputs, 0);
        match op {
            Op::UnaryGrad { f } => (unary_cost(*f) + 1.0) * x,
            Op::LayerNormGrad { .. } => 16.0 * x,
            Op::RmsNormGrad { .. } => 12.0 * x,
            Op::SoftmaxGrad { .. } => 4.0 * x,
            Op::LogSoftmaxGrad { .. } => 3.0 * x,
            Op::AttentionGrad { causal, .. } => {
                2.5 * super::attention::forward_flops(inputs, *causal)
            }
            Op::GatherGrad { .. } => in_numel(inputs, 1),
            Op::CrossEntropyGrad { .. } => 4.0 * x,
            Op::ReduceMaxGrad { .. } => x,
            _ => 0.0,
        }
    }
}

/// `(x, dy) -> dx`.
fn unary_grad(inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    arity(inputs, 2, "x, dy")?;
    float(inputs[0], "x")?;
    same_type(inputs[0], inputs[1], "x and dy")?;
    Ok(vec![inputs[0].clone()])
}

/// `(x, gamma, dy) -> (dx, dgamma[, dbeta])`.
fn norm_grad(inputs: &[&TensorType], has_beta: bool) -> Result<Vec<TensorType>, String> {
    arity(inputs, 3, "x, gamma, dy")?;
    super::norm::check_norm(&inputs[..2])?;
    same_type(inputs[0], inputs[2], "x and dy")?;
    let mut out = vec![inputs[0].clone(), inputs[1].clone()];
    if has_beta {
        out.push(inputs[1].clone());
    }
    Ok(out)
}

/// `(y, dy) -> dx`.
fn softmax_grad(inputs: &[&TensorType], ax: usize) -> Result<Vec<TensorType>, String> {
    arity(inputs, 2, "y, dy")?;
    float(inputs[0], "y")?;
    axis(inputs[0], ax, "y")?;
    same_type(inputs[0], inputs[1], "y and dy")?;
    Ok(vec![inputs[0].clone()])
}

/// `(q, k, v, dy) -> (dq, dk, dv)`.
fn attention_grad(inputs: &[&TensorType], causal: bool) -> Result<Vec<TensorType>, String> {
    arity(inputs, 4, "q, k, v, dy")?;
    super::attention::check_qkv(inputs[0], inputs[1], inputs[2], causal)?;
    same_type(inputs[0], inputs[3], "q and dy")?;
    Ok(inputs[..3].iter().map(|t| (*t).clone()).collect())
}

/// `(indices, dy) -> d data` of shape `data_shape`.
fn gather_grad(
    inputs: &[&TensorType],
    ax: usize,
    data_shape: &[usize],
) -> Result<Vec<TensorType>, String> {
    arity(inputs, 2, "indices, dy")?;
    let (indices, dy) = (inputs[0], inputs[1]);
    float(dy, "dy")?;
    let data = TensorType::new(dy.dtype, data_shape.to_vec());
    let expected = super::gather::gather_type(&data, indices, ax)?;
    same_type(&expected, dy, "the gather output and dy")?;
    Ok(vec![data])
}

/// `(logits, labels, dloss) -> dlogits`.
fn cross_entropy_grad(inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    arity(inputs, 3, "logits, labels, dloss")?;
    super::loss::check_logits_labels(inputs[0], inputs[1])?;
    float(inputs[2], "dloss")?;
    rank(inputs[2], 0, "dloss")?;
    Ok(vec![inputs[0].clone()])
}

/// `dy -> dx` of shape `input_shape`.
fn slice_grad(
    inputs: &[&TensorType],
    (ax, start, end, step): (usize, usize, usize, usize),
    input_shape: &[usize],
) -> Result<Vec<TensorType>, String> {
    arity(inputs, 1, "dy")?;
    let x = TensorType::new(inputs[0].dtype, input_shape.to_vec());
    let expected = super::shape::slice(&x, ax, start, end, step)?;
    same_type(&expected, inputs[0], "the slice output and dy")?;
    Ok(vec![x])
}

/// `(x, y, dy) -> dx`.
fn reduce_max_grad(
    inputs: &[&TensorType],
    axes: &[usize],
    keepdims: bool,
) -> Result<Vec<TensorType>, String> {
    arity(inputs, 3, "x, y, dy")?;
    let x = inputs[0];
    float(x, "x")?;
    let shape = super::reduce::reduced_shape(x.shape.dims(), axes, keepdims)?;
    let y = TensorType::new(x.dtype, shape);
    same_type(&y, inputs[1], "the reduced x and y")?;
    same_type(&y, inputs[2], "the reduced x and dy")?;
    Ok(vec![x.clone()])
}
