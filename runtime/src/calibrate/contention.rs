//! Contention: every rank runs matrix products on its compute thread and
//! all-gathers on a communication thread at the same time; then
//! all-gathers and reduce-scatters on two communication threads beside the
//! products (backward's prefetch and reduction); then the two collective
//! threads alone. Each one's mean time over its mean time alone is the
//! slowdown (`Contention`).

use super::collectives::collective_body;
use super::harness::{fail, lockstep, mean, on_rank_threads, Body};
use super::CalibrateError;
use super::Calibration;
use crate::cpu::kernels::matmul::{gemm_f32, Mat};
use crate::{CommConfig, ShmWorld};
use fsdpc_plan::cluster::{CollectiveKind, Contention};
use gemm::Parallelism;
use std::fmt::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Progress steps of `measure`.
pub(super) const STEPS: usize = 1;

/// Measures how 8 MiB collectives and 256^3 products slow each other on
/// every rank and adds the table.
pub(super) fn measure(cal: &mut Calibration) -> Result<Contention, CalibrateError> {
    cal.message("contention");
    let cont_ranks = cal.ranks.max(2);
    let times = contention(cont_ranks, 8 << 20, 40)?;
    let factors = times.factors();
    // "alone -> beside" in microseconds.
    let moved = |alone: f64, beside: f64| format!("{:.1} -> {:.1}", alone * 1e6, beside * 1e6);
    let (t, f) = (&times, &factors);
    let _ = writeln!(
        cal.table,
        "contention ({cont_ranks} ranks, 8 MiB collectives, 256^3 products; mean us, alone -> beside):\n  \
         all-gather beside products: {} (x{:.2}), product {} (x{:.2})\n  \
         all-gather and reduce-scatter beside products: {} and {} (x{:.2} each), product {} (x{:.2})\n  \
         all-gather beside reduce-scatter: {} and {} (x{:.2} each)",
        moved(t.ag_alone, t.ag_gemm.0),
        f.comm_slowdown,
        moved(t.gemm_alone, t.ag_gemm.1),
        f.compute_slowdown,
        moved(t.ag_alone, t.ag_rs_gemm.0),
        moved(t.rs_alone, t.ag_rs_gemm.1),
        f.two_comm_slowdown,
        moved(t.gemm_alone, t.ag_rs_gemm.2),
        f.two_compute_slowdown,
        moved(t.ag_alone, t.ag_rs.0),
        moved(t.rs_alone, t.ag_rs.1),
        f.comm_pair_slowdown,
    );
    cal.inc();

    Ok(factors)
}

/// Per-operation seconds of a rank's collectives (one list per kind) and
/// of its products.
type OpTimes = (Vec<Vec<f64>>, Vec<f64>);

/// What the contention measurements give: per rank, mean seconds of an
/// all-gather, a reduce-scatter and a matrix product alone, and, for each
/// mix that runs at once, each one's mean seconds within it.
struct ContentionTimes {
    ag_alone: f64,
    rs_alone: f64,
    gemm_alone: f64,
    /// One all-gather stream beside products: (all-gather, product).
    ag_gemm: (f64, f64),
    /// An all-gather and a reduce-scatter stream beside products:
    /// (all-gather, reduce-scatter, product).
    ag_rs_gemm: (f64, f64, f64),
    /// An all-gather and a reduce-scatter stream, no products.
    ag_rs: (f64, f64),
}

impl ContentionTimes {
    /// The factors, each at least 1: a collective's and a product's beside
    /// one collective, the same beside two, and two collectives' beside
    /// each other.
    fn factors(&self) -> Contention {
        let over = |x: f64, alone: f64| (x / alone.max(1e-12)).max(1.0);
        let (ag, rs, k) = self.ag_rs_gemm;
        Contention {
            comm_slowdown: over(self.ag_gemm.0, self.ag_alone),
            compute_slowdown: over(self.ag_gemm.1, self.gemm_alone),
            two_comm_slowdown: (over(ag, self.ag_alone) + over(rs, self.rs_alone)) / 2.0,
            two_compute_slowdown: over(k, self.gemm_alone),
            comm_pair_slowdown: (over(self.ag_rs.0, self.ag_alone)
                + over(self.ag_rs.1, self.rs_alone))
                / 2.0,
        }
    }
}

/// The 256^3 product the contention measurements run on a compute thread.
fn contention_gemm() -> Body {
    let (m, k, n) = (256, 256, 256);
    let a = vec![0.5f32; m * k];
    let b = vec![0.25f32; k * n];
    let mut out = vec![1f32; m * n];
    Box::new(move || {
        let ma = Mat {
            data: &a,
            rows: m,
            cols: k,
            trans: false,
        };
        let mb = Mat {
            data: &b,
            rows: k,
            cols: n,
            trans: false,
        };
        gemm_f32(Parallelism::None, &mut out, ma, mb, 1.0, false).map_err(|e| e.0)
    })
}

/// Every rank runs `collectives` operations of each kind in `ops` on a
/// communication thread of its own (one shared-memory world per kind, as
/// the runtime's streams have their own communicators) and, with
/// `compute`, products on a compute thread until they are done: the mean
/// seconds of each kind and of the product.
fn run_beside(
    ranks: usize,
    bytes: usize,
    collectives: usize,
    ops: &[CollectiveKind],
    compute: bool,
) -> Result<(Vec<f64>, f64), CalibrateError> {
    let worlds: Vec<_> = ops
        .iter()
        .map(|_| ShmWorld::new(ranks, CommConfig::default()))
        .collect();
    let results: Vec<Result<OpTimes, String>> = on_rank_threads(ranks, |rank| {
        let worlds = &worlds;
        let stop = AtomicBool::new(false);
        std::thread::scope(|inner| {
            let stop = &stop;
            let gemm = compute.then(|| {
                inner.spawn(move || {
                    let mut body = contention_gemm();
                    let mut times = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let t = Instant::now();
                        body()?;
                        if !stop.load(Ordering::Relaxed) {
                            times.push(t.elapsed().as_secs_f64());
                        }
                    }
                    Ok::<_, String>(times)
                })
            });
            let comms: Vec<_> = ops
                .iter()
                .zip(worlds)
                .map(|(&op, world)| {
                    inner.spawn(move || {
                        let mut body = collective_body(world, op, ranks, rank, bytes)?;
                        let mut times = Vec::with_capacity(collectives);
                        for _ in 0..collectives {
                            let t = Instant::now();
                            body()?;
                            times.push(t.elapsed().as_secs_f64());
                        }
                        Ok::<_, String>(times)
                    })
                })
                .collect();
            let comm: Result<Vec<Vec<f64>>, String> = comms
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a communication thread panicked".into()))
                })
                .collect();
            stop.store(true, Ordering::Relaxed);
            let gemm = match gemm {
                Some(h) => h
                    .join()
                    .unwrap_or_else(|_| Err("a compute thread panicked".into()))?,
                None => Vec::new(),
            };
            Ok((comm?, gemm))
        })
    });
    let mut comm = vec![Vec::new(); ops.len()];
    let mut gemm = Vec::new();
    for r in results {
        let (c, k) = r.map_err(|e| fail("contention", e))?;
        for (all, mine) in comm.iter_mut().zip(c) {
            all.extend(mine);
        }
        gemm.extend(k);
    }
    if compute && gemm.is_empty() {
        return Err(fail(
            "contention",
            "no matrix product finished beside the collectives",
        ));
    }
    // Means, not medians: beside the other threads an operation is either
    // untouched or preempted for a scheduler slice, and the slowdown is in
    // the mean (a median of 1.00 hid a 5x slower all-gather in training).
    Ok((comm.iter().map(|t| mean(t)).collect(), mean(&gemm)))
}

/// How collectives of `bytes` and 256^3 products slow each other on
/// `ranks` rank threads: alone, one all-gather stream beside products,
/// an all-gather and a reduce-scatter stream beside products (backward:
/// the next unit's gather and the last one's reduction), and the two
/// collective streams without products.
fn contention(
    ranks: usize,
    bytes: usize,
    collectives: usize,
) -> Result<ContentionTimes, CalibrateError> {
    use CollectiveKind::{AllGather, ReduceScatter};
    let ag_alone = run_beside(ranks, bytes, collectives, &[AllGather], false)?.0[0];
    let rs_alone = run_beside(ranks, bytes, collectives, &[ReduceScatter], false)?.0[0];
    let gemm_alone = mean(
        &lockstep(ranks, collectives, |_| Ok(contention_gemm()))
            .map_err(|e| fail("contention", e))?,
    );
    let (c, k) = run_beside(ranks, bytes, collectives, &[AllGather], true)?;
    let ag_gemm = (c[0], k);
    let (c, k) = run_beside(ranks, bytes, collectives, &[AllGather, ReduceScatter], true)?;
    let ag_rs_gemm = (c[0], c[1], k);
    let (c, _) = run_beside(
        ranks,
        bytes,
        collectives,
        &[AllGather, ReduceScatter],
        false,
    )?;
    Ok(ContentionTimes {
        ag_alone,
        rs_alone,
        gemm_alone,
        ag_gemm,
        ag_rs_gemm,
        ag_rs: (c[0], c[1]),
    })
}
