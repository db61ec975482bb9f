//! How calibration times things: rank threads in lockstep, the median or
//! mean of repetitions, aligned buffers, and operand sets that rotate so a
//! repetition does not find its inputs in the caches.

use super::CalibrateError;
use fsdpc_ir::DType;
use std::sync::Barrier;
use std::time::Instant;

/// What one rank thread repeats.
pub(super) type Body = Box<dyn FnMut() -> Result<(), String>>;

pub(super) fn fail(what: &str, e: impl std::fmt::Display) -> CalibrateError {
    CalibrateError(format!("calibrate: {what}: {e}"))
}

/// Runs `run(rank)` on a thread of its own for each of `ranks` ranks, all
/// at once, and returns each rank's result in rank order (a panic as an
/// error).
pub(super) fn on_rank_threads<T, F>(ranks: usize, run: F) -> Vec<Result<T, String>>
where
    T: Send,
    F: Fn(usize) -> Result<T, String> + Sync,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let run = &run;
                s.spawn(move || run(rank))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a rank thread panicked".into()))
            })
            .collect()
    })
}

/// Runs `setup(rank)`'s body on `ranks` threads at once, `reps` times, each
/// repetition started together; the time of each repetition is its slowest
/// rank's. Returns the repetitions' times.
pub(super) fn lockstep<S>(ranks: usize, reps: usize, setup: S) -> Result<Vec<f64>, String>
where
    S: Fn(usize) -> Result<Body, String> + Sync,
{
    let barrier = Barrier::new(ranks);
    let per_rank = on_rank_threads(ranks, |rank| {
        let (setup, barrier) = (&setup, &barrier);
        // Every rank reaches every barrier, even after a failure,
        // so the others are never left waiting.
        let mut body = setup(rank);
        let mut times = Vec::with_capacity(reps);
        let mut err = None;
        for _ in 0..reps {
            barrier.wait();
            let t = Instant::now();
            if let Ok(b) = &mut body {
                if let Err(e) = b() {
                    err.get_or_insert(e);
                }
            }
            times.push(t.elapsed().as_secs_f64());
        }
        match (body, err) {
            (Err(e), _) | (_, Some(e)) => Err(e),
            _ => Ok(times),
        }
    });
    let mut out = vec![0f64; reps];
    for r in per_rank {
        for (o, t) in out.iter_mut().zip(r?) {
            *o = o.max(t);
        }
    }
    Ok(out)
}

/// The median of `times` (the upper one of an even count).
pub(crate) fn median(times: &[f64]) -> f64 {
    let mut v = times.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

pub(super) fn mean(times: &[f64]) -> f64 {
    times.iter().sum::<f64>() / times.len().max(1) as f64
}

/// A byte buffer aligned to 8 bytes (what the kernels' typed views need).
pub(super) struct Aligned {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    /// `len` bytes holding `fill` repeated.
    pub(super) fn new(len: usize, fill: &[u8]) -> Aligned {
        let mut raw = vec![0u8; len + 8];
        let off = raw.as_ptr().align_offset(8).min(8);
        if !fill.is_empty() {
            for (i, b) in raw[off..off + len].iter_mut().enumerate() {
                *b = fill[i % fill.len()];
            }
        }
        Aligned { raw, off, len }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        &self.raw[self.off..self.off + self.len]
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.off..self.off + self.len]
    }
}

/// Bytes of one element holding 0.5 (0 for integers: a valid label).
pub(super) fn fill_of(dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => 0.5f32.to_le_bytes().to_vec(),
        DType::Bf16 => vec![0x00, 0x3f],
        DType::F16 => vec![0x00, 0x38],
        _ => vec![0u8],
    }
}

/// Bytes the buffer sets of one timed operation span together, so each
/// repetition reads operands another has not left in a core's caches (a
/// training step touches each tensor once between other work).
pub(super) const ROTATION_BYTES: usize = 64 << 20;

/// How many buffer sets of `set_bytes` bytes rotate to span
/// `ROTATION_BYTES` (at least 2, at most 256).
pub(super) fn rotation_sets(set_bytes: usize) -> usize {
    ROTATION_BYTES.div_ceil(set_bytes.max(1)).clamp(2, 256)
}
