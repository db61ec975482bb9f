//! `Dropout { p, seed }`: inverted dropout `x * keep / (1 - p)` with the keep
//! mask from the IR's counter-based `dropout_keep(seed, step, element, p)`.
//! The element key is the *global* element index: this rank's tensor starts
//! at sample `KernelCtx::sample_offset` (axis 0 is the batch), so a sharded
//! run draws exactly the mask an unsharded run draws for the same samples.
//! The op's seed is combined with the run's seed. In evaluation
//! (`KernelCtx::eval`) it is the identity.

use crate::backend::KernelCtx;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};

/// The mask seed for an op seed under a run seed.
fn mask_seed(op_seed: u64, run_seed: u64) -> u64 {
    op_seed ^ crate::rng::mix(run_seed)
}

/// `Dropout { p, seed }`.
pub fn dropout(
    p: f64,
    seed: u64,
    ctx: &KernelCtx,
    x: &TensorRef,
    y: &mut TensorMut,
) -> KResult<()> {
    if !(0.0..1.0).contains(&p) {
        crate::kbail!("dropout probability {p} is not in [0, 1)");
    }
    let (xs, ys) = (x.f32()?, y.f32_mut()?);
    if xs.len() != ys.len() {
        crate::kbail!("dropout of {} elements into {}", xs.len(), ys.len());
    }
    if ctx.eval {
        ys.copy_from_slice(xs);
        return Ok(());
    }
    let per_sample = match x.dims().first() {
        Some(&b) if b > 0 => xs.len() / b,
        _ => xs.len(),
    } as u64;
    let first = ctx.sample_offset * per_sample;
    let s = mask_seed(seed, ctx.seed);
    let scale = (1.0 / (1.0 - p)) as f32;
    for (i, (o, &v)) in ys.iter_mut().zip(xs).enumerate() {
        let keep = crate::irinit::dropout_keep(s, ctx.step, first + i as u64, p);
        *o = if keep { v * scale } else { 0.0 };
    }
    Ok(())
}
