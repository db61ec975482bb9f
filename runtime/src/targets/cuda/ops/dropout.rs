//! `Dropout`: inverted dropout whose mask depends on the step. The launch
//! is made once (`Action::Dropout`); when it is issued its `base` argument
//! is set to `dropout_base` of (mask seed, step), so that the kernel keeps
//! exactly the elements the CPU kernel keeps. In evaluation it is issued
//! with `p` 0 and `scale` 1: every element kept unscaled, the identity.

use super::{ew, n_arg, out1, same_count, Action, Operand, R};
use crate::exec::rank::Pass;
use crate::targets::cuda::device::{Arg, Launch, Ptr};
use fsdpc_ir::DType;

/// Where a dropout's input lies in the whole tensor of its mask.
pub(super) struct At {
    /// This rank's first sample of the micro-batch.
    pub sample_offset: u64,
    /// A chunk's whole sample (`Op::Dropout`): the chunk's offset in the
    /// whole is its second operand, read by the kernel.
    pub whole_sample: Option<u64>,
}

/// `Dropout { p, seed, whole_sample }`; `run_seed` is the run's seed.
pub(super) fn dropout(
    p: f64,
    seed: u64,
    xs: &[Operand],
    ys: &[Operand],
    at: At,
    run_seed: u64,
    a: &mut Vec<Action>,
) -> R<()> {
    let y = out1(ys)?;
    let (x, per_sample, offset) = match (at.whole_sample, xs) {
        (None, [x]) => {
            let n = y.numel();
            let per_sample = match x.dims().first() {
                Some(&b) if b > 0 => n / b as u64,
                _ => n,
            };
            (x, per_sample, None)
        }
        (Some(s), [x, off]) => {
            if !matches!(off.ty.dtype, DType::I64 | DType::I32) || off.numel() != 1 {
                return Err(format!(
                    "a dropout chunk's offset must be one i64 or i32, got {}",
                    off.ty
                ));
            }
            (x, s, Some(off))
        }
        _ => return Err(format!("dropout: {} operands", xs.len())),
    };
    same_count(x, &y)?;
    if !(0.0..1.0).contains(&p) {
        return Err(format!("dropout probability {p} is not in [0, 1)"));
    }
    let (off_p, off_dt) = match offset {
        Some(o) => (o.p(), o.dt()),
        None => (Arg::Ptr(Ptr::Abs(0)), Arg::I32(0)),
    };
    let scale = (1.0 / (1.0 - p)) as f32;
    let n = y.numel();
    let args = vec![
        x.p(),
        x.dt(),
        y.p(),
        y.dt(),
        n_arg(n),
        Arg::U64(0),
        Arg::U64(at.sample_offset * per_sample),
        off_p,
        off_dt,
        Arg::F64(p),
        Arg::F32(scale),
    ];
    let Action::Launch(launch) = ew("dropout", n, args) else {
        unreachable!("ew makes a launch")
    };
    a.push(Action::Dropout {
        launch,
        base_arg: 5,
        p_scale_args: (9, 10),
        seed: seed ^ crate::rng::mix(run_seed),
    });
    Ok(())
}

/// The launch of a lowered dropout (`Action::Dropout`'s parts) in `pass`:
/// in a training step with the mask base of (mask seed, step); in
/// evaluation with `p` 0 and `scale` 1, which keeps every element
/// unscaled.
pub fn issued(
    launch: &Launch,
    base_arg: usize,
    (p, scale): (usize, usize),
    seed: u64,
    pass: Pass,
) -> Launch {
    let mut l = launch.clone();
    match pass {
        Pass::Step(step) => l.args[base_arg] = Arg::U64(dropout_base(seed, step)),
        Pass::Eval(_) => {
            l.args[p] = Arg::F64(0.0);
            l.args[scale] = Arg::F32(1.0);
        }
    }
    l
}

/// The dropout mask base of `fsdpc_ir::init::hash` for (mask seed, step):
/// `mix64(mix64(seed ^ GOLDEN) ^ mix64(step ^ DROPOUT_DOMAIN))`, so that
/// element e's hash is `mix64(base + (e + 1) * GOLDEN)`.
pub fn dropout_base(seed: u64, step: u64) -> u64 {
    use fsdpc_ir::init::mix64;
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    const DROPOUT_DOMAIN: u64 = 0xD50F_D50F_D50F_D50F;
    mix64(mix64(seed ^ GOLDEN) ^ mix64(step ^ DROPOUT_DOMAIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dropout kernel's decision, evaluated on the host.
    fn kernel_keeps(base: u64, e: u64, p: f64) -> bool {
        const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
        let h = fsdpc_ir::init::mix64(base.wrapping_add((e + 1).wrapping_mul(GOLDEN)));
        fsdpc_ir::init::unit_open(h) >= p
    }

    /// Evaluation issues the lowered dropout with `p` 0 and `scale` 1 in
    /// the arguments the lowering put them in; a step sets the base only.
    #[test]
    fn evaluation_issues_dropout_keeping_every_element_unscaled() {
        let ty = fsdpc_ir::TensorType {
            dtype: fsdpc_ir::DType::F32,
            shape: fsdpc_ir::Shape(vec![2, 8]),
        };
        let (x, y) = (
            Operand {
                ptr: 1 << 20,
                ty: &ty,
            },
            Operand {
                ptr: 2 << 20,
                ty: &ty,
            },
        );
        let mut a = Vec::new();
        let at = At {
            sample_offset: 0,
            whole_sample: None,
        };
        dropout(0.3, 5, &[x], &[y], at, 7, &mut a).expect("lowers");
        let Some(Action::Dropout {
            launch,
            base_arg,
            p_scale_args,
            seed,
        }) = a.first()
        else {
            panic!("a dropout action: {a:?}");
        };
        let (p, scale) = *p_scale_args;
        assert!(matches!(launch.args[p], Arg::F64(v) if v == 0.3));
        assert!(matches!(launch.args[scale], Arg::F32(v) if v == (1.0 / 0.7) as f32));
        let eval = issued(launch, *base_arg, *p_scale_args, *seed, Pass::Eval(3));
        assert!(matches!(eval.args[p], Arg::F64(v) if v == 0.0));
        assert!(matches!(eval.args[scale], Arg::F32(v) if v == 1.0));
        let step = issued(launch, *base_arg, *p_scale_args, *seed, Pass::Step(3));
        assert!(matches!(step.args[*base_arg], Arg::U64(b) if b == dropout_base(*seed, 3)));
        assert!(matches!(step.args[p], Arg::F64(v) if v == 0.3));
    }

    #[test]
    fn the_dropout_base_reproduces_the_cpu_mask() {
        for (seed, step) in [(0u64, 0u64), (5, 3), (u64::MAX, 1 << 40)] {
            let base = dropout_base(seed, step);
            for e in (0..5000u64).chain([1 << 33, u64::MAX - 1]) {
                let want = crate::irinit::dropout_keep(seed, step, e, 0.3);
                assert_eq!(
                    kernel_keeps(base, e, 0.3),
                    want,
                    "seed {seed} step {step} e {e}"
                );
            }
        }
    }
}
