//! `fsdpc calibrate [--ranks-per-node R] [-o cluster.json]`: measures this
//! machine with the runtime's own code and writes a cluster file.
//!
//! What is measured, each the best of a few repetitions:
//! - matrix products through the CPU backend's `gemm_f32` over shapes like
//!   those of the kernels (rows x inner x columns), giving the peak FLOP/s
//!   and the achievable-efficiency curve in FLOPs;
//! - memory bandwidth: a large copy, counted as the bytes read plus the
//!   bytes written (how the cost model counts a kernel's traffic);
//! - the shared-memory communicator: all-gathers between two rank threads
//!   from 64 B to 16 MiB, giving a per-step latency (the smallest) and a
//!   bandwidth (the largest, less that latency).
//!
//! Figures per rank assume the ranks share the cores evenly: with R ranks
//! per node on C cores, compute and memory bandwidth are divided by
//! max(1, R / C).

use super::{print_out, CliError};
use clap::Args;
use fsdpc_ir::DType;
use fsdpc_planner::cluster::ClusterFile;
use fsdpc_runtime::comm::{Buf, BufMut, Communicator};
use fsdpc_runtime::cpu::kernels::matmul::{gemm_f32, Mat};
use fsdpc_runtime::{CommConfig, ShmWorld};
use gemm::Parallelism;
use std::fmt::Write;
use std::path::PathBuf;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Ranks per node the figures are for (they share the cores).
    #[arg(long, default_value_t = 2)]
    pub ranks_per_node: u32,
    /// Where to write the cluster file (default: stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// Best time in seconds of `reps` runs of `f`.
fn best(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// (FLOPs, FLOP/s) of one product `m x k` by `k x n`.
fn matmul_rate(m: usize, k: usize, n: usize) -> Result<(f64, f64), CliError> {
    let a = vec![0.5f32; m * k];
    let b = vec![0.25f32; k * n];
    let mut out = vec![0f32; m * n];
    let flops = 2.0 * (m * k * n) as f64;
    let reps = ((2e8 / flops) as usize).clamp(3, 200);
    let mut err = None;
    let t = best(reps, || {
        let (ma, mb) = (
            Mat {
                data: &a,
                rows: m,
                cols: k,
                trans: false,
            },
            Mat {
                data: &b,
                rows: k,
                cols: n,
                trans: false,
            },
        );
        if let Err(e) = gemm_f32(Parallelism::None, &mut out, ma, mb, 1.0, false) {
            err = Some(e);
        }
    });
    if let Some(e) = err {
        return Err(CliError::Usage(format!(
            "calibrate: matrix product failed: {}",
            e.0
        )));
    }
    Ok((flops, flops / t.max(1e-12)))
}

/// Bytes moved per second by a 64 MiB copy (read plus write).
fn copy_rate() -> f64 {
    let n = 16 << 20;
    let src = vec![1f32; n];
    let mut dst = vec![0f32; n];
    let t = best(5, || dst.copy_from_slice(&src));
    std::hint::black_box(&dst);
    (2 * 4 * n) as f64 / t.max(1e-12)
}

/// Seconds of one all-gather of `bytes` (the whole, gathered size) between
/// two rank threads, best of several.
fn all_gather_time(bytes: usize) -> Result<f64, CliError> {
    let world = ShmWorld::new(2, CommConfig::default());
    let reps = ((64 << 20) / bytes.max(1)).clamp(5, 2000);
    let run = |rank: usize| -> Result<f64, String> {
        let c = world
            .communicator(&[0, 1], "calibrate", rank)
            .map_err(|e| e.to_string())?;
        let send = vec![0u8; bytes / 2];
        let mut recv = vec![0u8; bytes];
        let mut best_t = f64::INFINITY;
        for _ in 0..reps {
            c.barrier().map_err(|e| e.to_string())?;
            let t = Instant::now();
            c.all_gather(
                Buf {
                    dtype: DType::F32,
                    bytes: &send,
                },
                BufMut {
                    dtype: DType::F32,
                    bytes: &mut recv,
                },
            )
            .map_err(|e| e.to_string())?;
            best_t = best_t.min(t.elapsed().as_secs_f64());
        }
        Ok(best_t)
    };
    let (a, b) = std::thread::scope(|s| {
        let h = s.spawn(|| run(1));
        let a = run(0);
        (a, h.join())
    });
    let b = b.map_err(|_| CliError::Usage("calibrate: a rank thread panicked".into()))?;
    match (a, b) {
        (Ok(a), Ok(b)) => Ok(a.max(b)),
        (Err(e), _) | (_, Err(e)) => Err(CliError::Usage(format!("calibrate: all-gather: {e}"))),
    }
}

pub fn run(a: CalibrateArgs) -> Result<(), CliError> {
    let rpn = a.ranks_per_node.max(1);
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as f64;
    let share = (f64::from(rpn) / cores).max(1.0);
    let mut table = String::new();
    let _ = writeln!(table, "matrix products (one thread):");
    let shapes = [
        (16, 32, 32),
        (64, 64, 64),
        (128, 128, 128),
        (256, 128, 384),
        (512, 256, 256),
        (1024, 128, 512),
        (1024, 512, 512),
        (1024, 1024, 1024),
    ];
    let mut points = Vec::new();
    for (m, k, n) in shapes {
        let (flops, rate) = matmul_rate(m, k, n)?;
        let _ = writeln!(
            table,
            "  {m:>5} x {k:>5} x {n:>5}: {:>8.2} GFLOP/s",
            rate / 1e9
        );
        points.push((flops, rate));
    }
    let peak = points.iter().map(|p| p.1).fold(0.0, f64::max);
    let mut curve: Vec<(f64, f64)> = Vec::new();
    for &(flops, rate) in &points {
        // Keep the curve increasing in FLOPs (shapes are in that order).
        if curve.last().is_none_or(|l| flops > l.0) {
            curve.push((flops, (rate / peak).clamp(1e-6, 1.0)));
        }
    }
    let mem = copy_rate();
    let _ = writeln!(table, "memory: {:.2} GB/s (copy, read + write)", mem / 1e9);
    let small = all_gather_time(64)?;
    let large_bytes = 16usize << 20;
    let large = all_gather_time(large_bytes)?;
    // A ring over 2 ranks: one step of latency, half the bytes moved.
    let latency = small;
    let bw = (large_bytes as f64 / 2.0) / (large - latency).max(1e-9);
    let _ = writeln!(
        table,
        "all-gather, 2 rank threads: {:.1} us for 64 B, {:.2} GB/s for 16 MiB",
        latency * 1e6,
        bw / 1e9
    );
    let mut file = ClusterFile::preset("cpu-local", rpn)?;
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "this machine".into());
    file.name = "calibrated".to_string();
    file.description =
        format!("measured by fsdpc calibrate on {host}: {cores} cores, {rpn} ranks per node");
    let h = &mut file.hardware;
    h.peak_flops_f32 = peak / share;
    h.peak_flops_bf16 = peak / share;
    h.matmul_efficiency = curve;
    h.mem_bw = mem / share;
    h.intra_bw = bw;
    h.inter_bw = bw;
    h.intra_latency_s = latency;
    h.inter_latency_s = latency;
    h.host_bw = mem / share;
    h.host_mem_bw = mem / share;
    let src = |what: &str| format!("fsdpc calibrate on {host}: {what}");
    for (k, v) in [
        (
            "peak_flops_f32",
            src("best gemm_f32 rate of one thread, shared by the ranks"),
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
            src("64 MiB copy, read + write, shared by the ranks"),
        ),
        (
            "intra_bw",
            src("16 MiB all-gather between two rank threads"),
        ),
        ("inter_bw", src("as intra_bw: one node")),
        (
            "intra_latency_s",
            src("64 B all-gather between two rank threads"),
        ),
        ("inter_latency_s", src("as intra_latency_s: one node")),
        ("host_bw", src("as mem_bw: host and device are one memory")),
        ("host_mem_bw", src("as mem_bw")),
    ] {
        file.sources.insert(k.to_string(), v);
    }
    eprint!("{table}");
    let text = serde_json::to_string_pretty(&file)
        .map_err(|e| CliError::Usage(format!("cannot write the cluster file: {e}")))?;
    match &a.output {
        None => print_out(&format!("{text}\n")),
        Some(path) => {
            std::fs::write(path, format!("{text}\n")).map_err(|source| CliError::Io {
                path: path.display().to_string(),
                source,
            })?;
            eprintln!("wrote {}", path.display());
            Ok(())
        }
    }
}
