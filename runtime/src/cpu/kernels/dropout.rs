//! `Dropout { p, seed, whole_sample }`: inverted dropout `x * keep / (1 -
//! p)` with the keep mask from the IR's counter-based `dropout_keep(seed,
//! step, element, p)`. The element key is the *global* element index: this
//! rank's tensor starts at sample `KernelCtx::sample_offset` (axis 0 is the
//! batch), so a sharded run draws exactly the mask an unsharded run draws
//! for the same samples. A chunk of a whole tensor (sequence parallelism)
//! starts `offset` elements into the whole, whose samples hold
//! `whole_sample` elements. The op's seed is combined with the run's seed.
//! In evaluation (`KernelCtx::eval`) it is the identity.

use crate::backend::KernelCtx;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};

/// The mask seed for an op seed under a run seed.
fn mask_seed(op_seed: u64, run_seed: u64) -> u64 {
    op_seed ^ crate::rng::mix(run_seed)
}

/// Where a dropout's input lies in the whole tensor of its mask: the
/// elements per sample of the whole and the input's first element in it
/// (an integer `offset` input, with `whole_sample`).
pub struct Place<'a> {
    /// The whole tensor's elements per sample (`Op::Dropout`'s field).
    pub whole_sample: Option<u64>,
    /// The input's first element in the whole.
    pub offset: Option<&'a TensorRef<'a>>,
}

/// `Dropout { p, seed, whole_sample }`.
pub fn dropout(
    p: f64,
    seed: u64,
    place: Place,
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
    let (per_sample, within) = match (place.whole_sample, place.offset) {
        (None, None) => {
            let per_sample = match x.dims().first() {
                Some(&b) if b > 0 => xs.len() / b,
                _ => xs.len(),
            };
            (per_sample as u64, 0)
        }
        (Some(s), Some(offset)) => {
            let o = offset.ints()?;
            match (o.len(), o.get(0)) {
                (1, at) if at >= 0 => (s, at as u64),
                _ => crate::kbail!(
                    "a dropout chunk's offset must be one integer >= 0, got {}",
                    offset.ty
                ),
            }
        }
        _ => crate::kbail!("a dropout chunk needs both its whole sample and its offset"),
    };
    let first = ctx.sample_offset * per_sample + within;
    let s = mask_seed(seed, ctx.seed);
    let scale = (1.0 / (1.0 - p)) as f32;
    for (i, (o, &v)) in ys.iter_mut().zip(xs).enumerate() {
        let keep = crate::irinit::dropout_keep(s, ctx.step, first + i as u64, p);
        *o = if keep { v * scale } else { 0.0 };
    }
    Ok(())
}
