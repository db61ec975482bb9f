//! `Dropout`: inverted dropout whose mask depends on the step. The launch
//! is made once (`Action::Dropout`); when it is issued its `base` argument
//! is set to `dropout_base` of (mask seed, step), so that the kernel keeps
//! exactly the elements the CPU kernel keeps.

use super::{ew, ins, n_arg, out1, same_count, Action, Operand, R};
use crate::targets::cuda::device::Arg;

/// `Dropout { p, seed }`; `sample_offset` is this rank's first sample of
/// the micro-batch, `run_seed` the run's seed.
pub(super) fn dropout(
    p: f64,
    seed: u64,
    xs: &[Operand],
    ys: &[Operand],
    sample_offset: u64,
    run_seed: u64,
    a: &mut Vec<Action>,
) -> R<()> {
    let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
    same_count(&x, &y)?;
    if !(0.0..1.0).contains(&p) {
        return Err(format!("dropout probability {p} is not in [0, 1)"));
    }
    let n = y.numel();
    let per_sample = match x.dims().first() {
        Some(&b) if b > 0 => n / b as u64,
        _ => n,
    };
    let scale = (1.0 / (1.0 - p)) as f32;
    let args = vec![
        x.p(),
        x.dt(),
        y.p(),
        y.dt(),
        n_arg(n),
        Arg::U64(0),
        Arg::U64(sample_offset * per_sample),
        Arg::F64(p),
        Arg::F32(scale),
    ];
    let Action::Launch(launch) = ew("dropout", n, args) else {
        unreachable!("ew makes a launch")
    };
    a.push(Action::Dropout {
        launch,
        base_arg: 5,
        seed: seed ^ crate::rng::mix(run_seed),
    });
    Ok(())
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
