//! Calibration (`fsdpc calibrate`): measures this machine with the
//! runtime's own kernels and communicators and gives the cluster the cost
//! model reads, each figure with its source.
//!
//! Every figure is measured with R rank threads doing the same thing at the
//! same time (as R ranks of a node do), each figure the median repetition
//! (the slowest rank's time within a repetition; the median, not the
//! fastest, because a training step runs its kernels once each, at their
//! typical speed: with the fastest the 2-rank steps here were predicted
//! 10-25% fast). One module per decision of the cost model it feeds:
//! - `products`: matrix products (the peak, the efficiency curves);
//! - `kernels`: the dispatch overhead and every other kernel family's
//!   bandwidth or FLOP/s, the data source, memory bandwidth;
//! - `collectives`: the communicator's collectives by kind, group size and
//!   size;
//! - `contention`: how collectives and products slow each other on shared
//!   cores.
//!
//! `harness` holds how they time; this module runs them in turn and puts
//! their figures into a cluster (the caller's base for what is not
//! measured), each with its source.

mod collectives;
mod contention;
pub mod gpu;
pub(crate) mod harness;
mod kernels;
mod products;

use fsdpc_plan::cluster::{Cluster, CollectiveFit, CollectiveKind, Contention};
use std::fmt::Write;
use thiserror::Error;

/// A measurement that failed (a kernel or a collective that errored).
#[derive(Debug, Error, Clone, PartialEq)]
#[error("{0}")]
pub struct CalibrateError(pub String);

/// Where a calibration is: each step done, and what it measures now.
pub enum Progress {
    /// Now measuring this.
    Measuring(String),
    /// One more of `steps` done.
    Done,
}

/// What every measurement shares: how many rank threads run at once, the
/// progress callback, and the table of what was measured.
struct Calibration<'a> {
    ranks: usize,
    /// The graph of a zoo model spec (the data source's inputs are timed
    /// on two: a classifier's features and a language model's tokens).
    model: &'a dyn Fn(&str) -> Result<fsdpc_ir::Graph, String>,
    progress: &'a mut dyn FnMut(Progress),
    table: String,
}

impl Calibration<'_> {
    fn message(&mut self, what: impl Into<String>) {
        (self.progress)(Progress::Measuring(what.into()));
    }

    fn inc(&mut self) {
        (self.progress)(Progress::Done);
    }
}

/// How many steps `measure` reports for `ranks_per_node` ranks per node.
pub fn steps(ranks_per_node: u32) -> usize {
    let ranks = ranks_per_node.max(1) as usize;
    products::steps() + kernels::steps() + collectives::steps(ranks) + contention::STEPS
}

/// Measures this machine for `ranks_per_node` ranks per node: `base` (the
/// `cpu-local` preset, or any cluster whose figures are wanted where
/// nothing is measured) with every measured figure in place and its
/// source, named `calibrated`; and the table of what was measured.
/// `model` builds a zoo model's graph from its spec (the frontends'
/// `load`); `progress` hears of every step (`steps` of them).
pub fn measure(
    base: Cluster,
    ranks_per_node: u32,
    model: &dyn Fn(&str) -> Result<fsdpc_ir::Graph, String>,
    progress: &mut dyn FnMut(Progress),
) -> Result<(Cluster, String), CalibrateError> {
    let rpn = ranks_per_node.max(1);
    let ranks = rpn as usize;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let mut cal = Calibration {
        ranks,
        model,
        progress,
        table: String::new(),
    };
    let _ = writeln!(
        cal.table,
        "fsdpc calibrate: {ranks} rank thread(s) at once on {cores} core(s); per rank"
    );
    let products = products::measure(&mut cal)?;
    let kernels = kernels::measure(&mut cal)?;
    let fits = collectives::measure(&mut cal)?;
    let contention = contention::measure(&mut cal)?;
    let mut table = cal.table;
    let file = cluster_file(
        base, rpn, cores, products, kernels, fits, contention, &mut table,
    )?;
    Ok((file, table))
}

/// The cluster file of the figures measured: `cpu-local`'s, with every
/// measured figure in place and its source; the last-level cache and the
/// gemm blocking read from this machine, added to `table`.
#[allow(clippy::too_many_arguments)]
fn cluster_file(
    base: Cluster,
    rpn: u32,
    cores: usize,
    products: products::Products,
    kernels: kernels::Kernels,
    fits: Vec<CollectiveFit>,
    contention: Contention,
    table: &mut String,
) -> Result<Cluster, CalibrateError> {
    let mut file = base;
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "this machine".into());
    file.name = "calibrated".to_string();
    file.description =
        format!("measured by fsdpc calibrate on {host}: {cores} cores, {rpn} ranks per node");
    let h = &mut file.hardware;
    // Ranks measured at once: the rates are already per rank.
    h.peak_flops_f32 = products.peak;
    h.peak_flops_bf16 = products.peak;
    h.matmul_efficiency = products.curve;
    h.skinny_matmul_efficiency = products.skinny_curve;
    h.matmul_curves = products.matmul_curves;
    h.mem_bw = kernels.mem_bw;
    h.host_bw = kernels.mem_bw;
    h.host_mem_bw = kernels.mem_bw;
    h.kernel_overhead_s = kernels.overhead;
    if let Some(llc) = last_level_cache() {
        h.cache_bytes = llc as f64 / rpn as f64;
        let _ = writeln!(
            table,
            "last-level cache: {} KiB, {} KiB per rank",
            llc >> 10,
            (llc / u64::from(rpn)) >> 10
        );
    }
    h.kernel_bw = kernels.bandwidth;
    h.bandwidth_by_size = kernels.by_size;
    h.kernel_flops = kernels.flops;
    h.cpu_gemm = crate::cpu::gemm_blocking();
    if let Some(g) = &h.cpu_gemm {
        let _ = writeln!(
            table,
            "gemm blocking (f32): {} lanes, {} x {} micro-kernel, {} KiB packing slab per thread",
            g.simd_lanes,
            g.mr,
            g.nr,
            g.slab_bytes >> 10
        );
    }
    if let Some(ag2) = fits
        .iter()
        .find(|f| f.op == CollectiveKind::AllGather && f.ranks == 2)
    {
        h.intra_bw = ag2.bw;
        h.inter_bw = ag2.bw;
        h.intra_latency_s = ag2.latency_s;
        h.inter_latency_s = ag2.latency_s;
    }
    h.collective_fits = fits;
    h.comm_compute_contention = Some(contention);
    let src = |what: &str| format!("fsdpc calibrate on {host}: {what}");
    for (k, v) in [
        (
            "peak_flops_f32",
            src("best gemm_f32 rate per rank, all ranks running"),
        ),
        (
            "peak_flops_bf16",
            src("the f32 rate: the CPU kernels compute half operands in f32"),
        ),
        (
            "matmul_efficiency",
            src("gemm_f32 rate per shape over the best"),
        ),
        (
            "mem_bw",
            src("64 MiB copy per rank, read + write, all ranks running"),
        ),
        (
            "kernel_overhead_s",
            src("median per-call time of Backend::run on 1 x 8 tensors"),
        ),
        (
            "kernel_bw",
            src("Backend::run per kernel family on 1024 x 256 tensors (f32 and bf16) and the AdamW update on 128K elements (buffer sets rotating over 64 MiB), bytes read + written over the time less the overhead; load_input and load_input_int: the synthetic data source writing a classifier's 64 x 1024 f32 features and a language model's 16 x 256 token ids, bytes written over the time less the overhead; cast:bf16: a bf16 tensor cast to f32 and an f32 one to bf16, their bytes over their time (the promotion of a half-precision matrix product's operands)"),
        ),
        (
            "bandwidth_by_size",
            src("the AdamW update on 128K, 1M and 8M elements (buffer sets rotating over at least 64 MiB), each one's bandwidth over the first's"),
        ),
        (
            "matmul_curves",
            src("gemm_f32 rate per rank by shape (square: the matmul_efficiency shapes over 64 in every dimension; rows, inner, cols: 16 x s x s, s x 16 x s, s x s x 16 for s = 512..4096, and the same 64 wide under KEY@64) and operand layout (nn, nt, tn, tt), over the best"),
        ),
        (
            "skinny_matmul_efficiency",
            src("gemm_f32 rate per rank of 16 x s x s, s x 16 x s and s x s x 16 (mean) for s = 512..4096, over the best"),
        ),
        (
            "kernel_flops",
            src("Backend::run of causal attention and its gradient on [4, 4, 128, 32] (f32 and bf16), FLOPs over the time less the overhead"),
        ),
        (
            "collective_fits",
            src("shared-memory all-gather, reduce-scatter, all-reduce over 2..=R rank threads at 4 KiB, 256 KiB, 4 MiB and 32 MiB: the median times as points (interpolated by the cost model), and their least-squares latency + wire / bw"),
        ),
        (
            "comm_compute_contention",
            src("mean 8 MiB all-gather and 256^3 gemm_f32 per rank, beside each other over alone; two_*: an all-gather and a reduce-scatter stream beside the products (each collective's the mean of the two); comm_pair_slowdown: the two collective streams without products"),
        ),
        (
            "cache_bytes",
            src("the largest cache of cpu0 in /sys/devices/system/cpu, shared by the ranks"),
        ),
        (
            "intra_bw",
            src("the 2-rank all-gather fit's bandwidth"),
        ),
        ("inter_bw", src("as intra_bw: one node")),
        (
            "intra_latency_s",
            src("the 2-rank all-gather fit's latency"),
        ),
        ("inter_latency_s", src("as intra_latency_s: one node")),
        ("host_bw", src("as mem_bw: host and device are one memory")),
        ("host_mem_bw", src("as mem_bw")),
        (
            "cpu_gemm",
            src("the f32 micro-kernel gemm 0.19 dispatches to on this CPU (AVX-512F, FMA or scalar) and the L2 size its cache detection reads"),
        ),
    ] {
        file.sources.insert(k.to_string(), v);
    }
    Ok(file)
}

/// Bytes of the largest cache of CPU 0 (Linux sysfs), if known.
fn last_level_cache() -> Option<u64> {
    (0..8)
        .filter_map(|i| {
            let text = std::fs::read_to_string(format!(
                "/sys/devices/system/cpu/cpu0/cache/index{i}/size"
            ))
            .ok()?;
            let t = text.trim();
            let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
            let n: u64 = num.parse().ok()?;
            Some(match unit {
                "K" => n << 10,
                "M" => n << 20,
                "G" => n << 30,
                _ => n,
            })
        })
        .max()
}
