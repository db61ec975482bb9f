//! `Attention`: scaled dot-product attention `softmax(q·kᵀ·scale [+ causal
//! mask])·v` over `q[b, h, s, d]`, `k[b, h, t, d]`, `v[b, h, t, d]`; the output
//! has the shape of `q`. A causal attention needs `s == t` (query `i` sees keys
//! `0..=i`). Its gradient is the fused `AttentionGrad` kernel.
//!
//! FLOPs: the two products `q·kᵀ` and `p·v` are `4·b·h·s·t·d`, halved when
//! causal (kernels skip the masked blocks), plus 5 per score for the softmax;
//! the backward is 2.5× the forward (FlashAttention-2's accounting).

use super::check::{arity, float, rank, same_dtype};
use super::{misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct Attention;

impl Family for Attention {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        let Op::Attention { causal, .. } = op else {
            return Err(misrouted(op, "attention"));
        };
        arity(inputs, 3, "q, k, v")?;
        check_qkv(inputs[0], inputs[1], inputs[2], *causal)?;
        Ok(vec![inputs[0].clone()])
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let Op::Attention { causal, scale } = *op else {
            return Err(misrouted(op, "attention"));
        };
        let ins = [cx.x(0)?, cx.x(1)?, cx.x(2)?, cx.dy()];
        let node = cx.emit_node(Op::AttentionGrad { causal, scale }, &ins)?;
        Ok((0..3).map(|slot| Some(ValueId { node, slot })).collect())
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], _outputs: &[TensorType]) -> f64 {
        match op {
            Op::Attention { causal, .. } => forward_flops(inputs, *causal),
            _ => 0.0,
        }
    }
}

/// FLOPs of the forward attention on `q, k, ...` (0 for malformed inputs).
pub(crate) fn forward_flops(inputs: &[&TensorType], causal: bool) -> f64 {
    let (Some(q), Some(k)) = (inputs.first(), inputs.get(1)) else {
        return 0.0;
    };
    let (&[b, h, s, d], &[_, _, t, _]) = (q.shape.dims(), k.shape.dims()) else {
        return 0.0;
    };
    // In f64: each tensor's size fits, but this product of two tensors' dims
    // need not fit in usize.
    let scores = [b, h, s, t].iter().map(|&x| x as f64).product::<f64>();
    let scores = scores * if causal { 0.5 } else { 1.0 };
    scores * (4.0 * d as f64 + 5.0)
}

/// `q[b, h, s, d]`, `k[b, h, t, d]`, `v[b, h, t, d]` of one float dtype, with
/// `s == t` when causal.
pub(crate) fn check_qkv(
    q: &TensorType,
    k: &TensorType,
    v: &TensorType,
    causal: bool,
) -> Result<(), String> {
    float(q, "q")?;
    for (t, what) in [(q, "q"), (k, "k"), (v, "v")] {
        rank(t, 4, &format!("{what} ([batch, heads, seq, head_dim])"))?;
    }
    same_dtype(q, k, "q and k")?;
    same_dtype(q, v, "q and v")?;
    let (qd, kd, vd) = (q.shape.dims(), k.shape.dims(), v.shape.dims());
    if kd != vd {
        return Err(format!("k and v must have the same shape, got {k} and {v}"));
    }
    if qd[0] != kd[0] || qd[1] != kd[1] || qd[3] != kd[3] {
        return Err(format!(
            "q {q} and k {k} must agree on batch, heads and head_dim"
        ));
    }
    if causal && qd[2] != kd[2] {
        return Err(format!(
            "causal attention needs as many queries as keys, got q {q} and k {k}"
        ));
    }
    Ok(())
}
