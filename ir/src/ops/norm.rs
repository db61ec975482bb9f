//! Normalisations over the last axis: `LayerNorm (x, gamma[, beta])` and
//! `RmsNorm (x, gamma)`, with `gamma` and `beta` of shape `[d]` where `d` is
//! the last dimension of `x`. Their gradients are the fused
//! `LayerNormGrad`/`RmsNormGrad` kernels.

use super::check::{arity, float, same_dtype};
use super::{in_numel, misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct Norm;

impl Family for Norm {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        match op {
            Op::LayerNorm { .. } => {
                if !(2..=3).contains(&inputs.len()) {
                    return Err(format!(
                        "expects 2 or 3 inputs (x, gamma[, beta]), got {}",
                        inputs.len()
                    ));
                }
                check_norm(inputs)?;
                Ok(vec![inputs[0].clone()])
            }
            Op::RmsNorm { .. } => {
                arity(inputs, 2, "x, gamma")?;
                check_norm(inputs)?;
                Ok(vec![inputs[0].clone()])
            }
            _ => Err(misrouted(op, "norm")),
        }
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let (x, gamma, dy) = (cx.x(0)?, cx.x(1)?, cx.dy());
        let (kernel, outputs) = match op {
            Op::LayerNorm { eps } => {
                let has_beta = cx.x(2).is_ok();
                let eps = *eps;
                (
                    Op::LayerNormGrad { eps, has_beta },
                    2 + usize::from(has_beta),
                )
            }
            Op::RmsNorm { eps } => (Op::RmsNormGrad { eps: *eps }, 2),
            _ => return Err(misrouted(op, "norm")),
        };
        let node = cx.emit_node(kernel, &[x, gamma, dy])?;
        Ok((0..outputs as u32)
            .map(|slot| Some(ValueId { node, slot }))
            .collect())
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], _outputs: &[TensorType]) -> f64 {
        let per = match op {
            Op::LayerNorm { .. } => 8.0,
            _ => 6.0,
        };
        per * in_numel(inputs, 0)
    }
}

/// `x[..., d]` floating point; every further input (`gamma`, `beta`) is `[d]`
/// of the same dtype.
pub(crate) fn check_norm(inputs: &[&TensorType]) -> Result<(), String> {
    let x = inputs[0];
    float(x, "x")?;
    let Some(&d) = x.shape.dims().last() else {
        return Err(format!("x must have rank >= 1, got {x}"));
    };
    for (t, what) in inputs[1..].iter().zip(["gamma", "beta"]) {
        same_dtype(x, t, &format!("x and {what}"))?;
        if t.shape.dims() != [d] {
            return Err(format!(
                "{what} must have shape [{d}] (the last dimension of x {x}), got {t}"
            ));
        }
    }
    Ok(())
}
