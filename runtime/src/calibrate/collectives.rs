//! The shared-memory communicator: all-gather, reduce-scatter and
//! all-reduce over groups of 2..=R rank threads (at least 2) at four sizes,
//! up to 32 MiB (a unit's gather or reduction streams through memory once
//! it outgrows the caches). The cost model interpolates the median times
//! (`CollectiveFit::points`); the least-squares `latency + ring wire bytes
//! / bw` line per kind and group size is kept beside them.

use super::harness::{fail, lockstep, median, rotation_sets, Aligned, Body};
use super::CalibrateError;
use super::Calibration;
use crate::comm::{Buf, BufMut, Communicator};
use crate::{CommConfig, ShmWorld};
use fsdpc_ir::DType;
use fsdpc_plan::cluster::ring_wire_bytes;
use fsdpc_plan::cluster::{CollectiveFit, CollectiveKind};
use std::fmt::Write;

/// Bytes of the collectives timed (the full buffer).
const SIZES: [usize; 4] = [4 << 10, 256 << 10, 4 << 20, 32 << 20];

/// The group sizes timed for `ranks` ranks per node: 2..=ranks, and 2 on
/// one rank (the figures then describe a node of two).
fn group_sizes(ranks: usize) -> std::ops::RangeInclusive<usize> {
    2..=ranks.max(2)
}

/// Progress steps of `measure`.
pub(super) fn steps(ranks: usize) -> usize {
    group_sizes(ranks).count() * CollectiveKind::ALL.len() * SIZES.len()
}

/// Times every collective kind over every group size at every size and
/// adds their table: one fit per kind and group size.
pub(super) fn measure(cal: &mut Calibration) -> Result<Vec<CollectiveFit>, CalibrateError> {
    let _ = writeln!(
        cal.table,
        "collectives (shared memory, f32), fit latency + ring wire bytes / bw (the cost model interpolates the measured points):"
    );
    let mut fits = Vec::new();
    for n in group_sizes(cal.ranks) {
        for op in CollectiveKind::ALL {
            let mut pts = Vec::new();
            for bytes in SIZES {
                cal.message(format!("{} over {n} ranks, {bytes} B", op.name()));
                let t = collective_time(op, n, bytes)?;
                pts.push((ring_wire_bytes(op, n as u32, bytes as f64), t));
                cal.inc();
            }
            // SIZES ascend, so the fit's points (by wire bytes) keep their order.
            let fit = CollectiveFit::of_points(op, n as u32, pts);
            let _ = writeln!(
                cal.table,
                "  {:<15} {n} ranks: {:>7.1} us + wire / {:>6.2} GB/s   (measured: {})",
                op.name(),
                fit.latency_s * 1e6,
                fit.bw / 1e9,
                fit.points
                    .iter()
                    .zip(&SIZES)
                    .map(|((_, t), b)| format!("{} KiB {:.1} us", b >> 10, t * 1e6))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            fits.push(fit);
        }
    }

    Ok(fits)
}

/// One collective of `op` on a buffer of `bytes` (full size), the body of
/// rank `rank` of a group of `n` on `world`.
pub(super) fn collective_body(
    world: &std::sync::Arc<ShmWorld>,
    op: CollectiveKind,
    n: usize,
    rank: usize,
    bytes: usize,
) -> Result<Body, String> {
    let ranks: Vec<usize> = (0..n).collect();
    let c = world
        .communicator(&ranks, "calibrate", rank)
        .map_err(|e| e.to_string())?;
    let elems = (bytes / 4 / n).max(1);
    let (send_len, recv_len) = match op {
        CollectiveKind::AllGather => (4 * elems, 4 * elems * n),
        CollectiveKind::ReduceScatter => (4 * elems * n, 4 * elems),
        CollectiveKind::AllReduce => (0, 4 * elems * n),
    };
    // Buffer sets rotate over ROTATION_BYTES, as a step's collectives each
    // move another unit's buffers, and hold written values: a buffer never
    // written reads the kernel's shared zero page, always in cache (the
    // 2-rank reduce-scatter of a 12 MiB unit calibrated 2.3x faster than
    // it ran in training). Rotating also keeps these points and the
    // contention measurement's baseline (`contention`, through this body)
    // on the same cold buffers: with one set reused the larger 2-rank
    // plans were predicted 9-11% fast again; the small plans, whose
    // collectives do find their buffers in cache, pay 3-4% for it.
    let sets = rotation_sets(send_len + recv_len);
    let half = 0.5f32.to_le_bytes();
    let mut bufs: Vec<(Aligned, Aligned)> = (0..sets)
        .map(|_| (Aligned::new(send_len, &half), Aligned::new(recv_len, &half)))
        .collect();
    let mut set = 0;
    // Averaged, as gradients are: the values stay 0.5 over repetitions.
    let divide_by = n as u32;
    Ok(Box::new(move || {
        let (send, recv) = &mut bufs[set];
        set = (set + 1) % sets;
        let dtype = DType::F32;
        let send = Buf {
            dtype,
            bytes: send.bytes(),
        };
        let recv = BufMut {
            dtype,
            bytes: recv.bytes_mut(),
        };
        match op {
            CollectiveKind::AllGather => c.all_gather(send, recv),
            CollectiveKind::ReduceScatter => c.reduce_scatter(send, recv, divide_by),
            CollectiveKind::AllReduce => c.all_reduce(recv, divide_by),
        }
        .map_err(|e| e.to_string())
    }))
}

/// Median seconds of one collective over `n` rank threads.
fn collective_time(op: CollectiveKind, n: usize, bytes: usize) -> Result<f64, CalibrateError> {
    let world = ShmWorld::new(n, CommConfig::default());
    let reps = ((32 << 20) / bytes.max(1)).clamp(9, 300);
    let times = lockstep(n, reps, |rank| collective_body(&world, op, n, rank, bytes))
        .map_err(|e| fail(op.name(), e))?;
    Ok(median(&times))
}
