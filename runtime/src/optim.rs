//! Optimizers over a flat fp32 shard, element by element exactly as PyTorch's
//! single-tensor (`foreach=False`) `torch.optim.SGD` and `torch.optim.AdamW`:
//! step-dependent scalars in f64, the element updates in f32.

use crate::backend::OptimizerArgs;
use crate::error::KResult;
use fsdpc_ir::Optimizer;

/// Applies `args.optimizer` to `args.params`.
pub fn step(args: OptimizerArgs<'_>) -> KResult<()> {
    let OptimizerArgs {
        optimizer,
        step,
        params,
        grads,
        mut state,
    } = args;
    if grads.len() != params.len() || state.iter().any(|s| s.len() != params.len()) {
        crate::kbail!("optimizer: params, grads and state must have the same length");
    }
    if state.len() != optimizer.state_slots() {
        crate::kbail!(
            "optimizer needs {} state buffers, got {}",
            optimizer.state_slots(),
            state.len()
        );
    }
    match *optimizer {
        Optimizer::Sgd {
            lr,
            momentum,
            weight_decay,
        } => {
            let buf = state.first_mut().map(|s| &mut **s);
            sgd(
                SgdArgs {
                    lr: lr as f32,
                    momentum: momentum as f32,
                    wd: weight_decay as f32,
                },
                params,
                grads,
                buf,
            );
        }
        Optimizer::AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            let [m, v] = state.as_mut_slice() else {
                crate::kbail!("adamw needs two state buffers");
            };
            let h = AdamW {
                lr,
                beta1,
                beta2,
                eps,
                weight_decay,
            };
            adamw(&h, step + 1, params, grads, m, v);
        }
    }
    Ok(())
}

/// SGD hyper-parameters in f32.
struct SgdArgs {
    lr: f32,
    momentum: f32,
    wd: f32,
}

/// `g += wd * p; buf = momentum * buf + g; p -= lr * buf` (dampening 0; the
/// zero-initialised buffer equals PyTorch's first-step `buf = g`).
fn sgd(h: SgdArgs, p: &mut [f32], g: &[f32], buf: Option<&mut [f32]>) {
    match buf {
        Some(b) => {
            for i in 0..p.len() {
                let d = g[i] + h.wd * p[i];
                b[i] = h.momentum * b[i] + d;
                p[i] -= h.lr * b[i];
            }
        }
        None => {
            for i in 0..p.len() {
                let d = g[i] + h.wd * p[i];
                p[i] -= h.lr * d;
            }
        }
    }
}

/// AdamW hyper-parameters as the program states them.
struct AdamW {
    lr: f64,
    beta1: f64,
    beta2: f64,
    eps: f64,
    weight_decay: f64,
}

crate::multiversion! {
    /// One AdamW step at `t` (1-based), following `torch.optim.adamw._single_tensor_adamw`.
    fn adamw(h: &AdamW, t: u64, p: &mut [f32], g: &[f32], m: &mut [f32], v: &mut [f32]) {
        let decay = (1.0 - h.lr * h.weight_decay) as f32;
        let w1 = (1.0 - h.beta1) as f32;
        let (b2, w2) = (h.beta2 as f32, (1.0 - h.beta2) as f32);
        let bc1 = 1.0 - h.beta1.powi(t as i32);
        let bc2_sqrt = (1.0 - h.beta2.powi(t as i32)).sqrt() as f32;
        let step_size = (h.lr / bc1) as f32;
        let eps = h.eps as f32;
        for i in 0..p.len() {
            p[i] *= decay;
            m[i] = lerp(m[i], g[i], w1);
            v[i] = v[i] * b2 + w2 * g[i] * g[i];
            let denom = v[i].sqrt() / bc2_sqrt + eps;
            p[i] += -step_size * (m[i] / denom);
        }
    }
}

/// `torch.lerp(start, end, weight)` as ATen computes it on CPU.
#[inline(always)]
fn lerp(start: f32, end: f32, weight: f32) -> f32 {
    if weight.abs() < 0.5 {
        start + weight * (end - start)
    } else {
        end - (end - start) * (1.0 - weight)
    }
}

/// The sum of squares of `xs`, accumulated in f64 in element order (the
/// local half of the gradient norm; zero padding contributes nothing).
pub fn sum_squares(xs: &[f32]) -> f64 {
    xs.iter().map(|&x| f64::from(x) * f64::from(x)).sum()
}

/// The factor PyTorch's `clip_grad_norm_(max_norm)` scales gradients by,
/// given the squared total norm: `min(1, max_norm / (norm + 1e-6))`. A
/// non-finite norm gives NaN, as PyTorch's `clamp(max=1)` of a NaN
/// coefficient does (`error_if_nonfinite=False`): the step is poisoned, not
/// silently left unclipped.
pub fn clip_coef(norm_sq: f32, max_norm: f64) -> f32 {
    let norm = f64::from(norm_sq).sqrt();
    if !norm.is_finite() {
        return f32::NAN;
    }
    (max_norm / (norm + 1e-6)).min(1.0) as f32
}

/// Scales `grads` in place by `clip_coef(norm_sq, max_norm)` (left alone
/// when the factor is 1, as PyTorch's clamped coefficient changes nothing).
pub fn clip_by_norm(grads: &mut [f32], norm_sq: f32, max_norm: f64) {
    let c = clip_coef(norm_sq, max_norm);
    // `!=`, not `<`: a NaN factor (non-finite norm) must reach the gradients.
    if c != 1.0 {
        for g in grads {
            *g *= c;
        }
    }
}

/// Gradient accumulation: `dst += src`, element by element, both of
/// `dtype` (f32, bf16 or f16; half precision summed in f32 and rounded
/// once). The caller checked the sizes match.
pub fn accumulate(dtype: fsdpc_ir::DType, src: &[u8], dst: &mut [u8]) -> Result<(), String> {
    use fsdpc_ir::DType;
    use half::{bf16, f16};
    if src.len() != dst.len() {
        return Err(format!(
            "accumulate: {} bytes into {}",
            src.len(),
            dst.len()
        ));
    }
    match dtype {
        DType::F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(4)) {
                let x = f32::from_le_bytes([d[0], d[1], d[2], d[3]])
                    + f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                d.copy_from_slice(&x.to_le_bytes());
            }
        }
        DType::Bf16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(2)) {
                let x = bf16::from_le_bytes([d[0], d[1]]).to_f32()
                    + bf16::from_le_bytes([s[0], s[1]]).to_f32();
                d.copy_from_slice(&bf16::from_f32(x).to_le_bytes());
            }
        }
        DType::F16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(2)) {
                let x = f16::from_le_bytes([d[0], d[1]]).to_f32()
                    + f16::from_le_bytes([s[0], s[1]]).to_f32();
                d.copy_from_slice(&f16::from_f32(x).to_le_bytes());
            }
        }
        other => return Err(format!("accumulate: {other} is not a floating-point dtype")),
    }
    Ok(())
}

#[cfg(test)]
mod clip_tests {
    use super::*;

    #[test]
    fn clipping_scales_by_pytorchs_coefficient_and_propagates_a_non_finite_norm() {
        // Norm 5 against max 1: scaled by 1 / (5 + 1e-6).
        let mut g = [3.0f32, 4.0];
        clip_by_norm(&mut g, 25.0, 1.0);
        let c = (1.0 / (5.0 + 1e-6)) as f32;
        assert_eq!(g, [3.0 * c, 4.0 * c]);
        // Under the limit: untouched.
        let mut g = [0.3f32, 0.4];
        clip_by_norm(&mut g, 0.25, 1.0);
        assert_eq!(g, [0.3, 0.4]);
        // An infinite or NaN norm poisons the step, as in PyTorch.
        for bad in [f32::INFINITY, f32::NAN] {
            let mut g = [1.0f32, 2.0];
            clip_by_norm(&mut g, bad, 1.0);
            assert!(g.iter().all(|x| x.is_nan()), "{g:?}");
        }
    }
}
