//! `fsdpc calibrate --target cuda`: what is measured on a GPU and how the
//! measurements become a cluster file. The measuring itself is the cuda
//! target's (`targets::cuda::calibrate`, feature `cuda`); this module holds
//! what needs no GPU, so its tests run everywhere:
//! - the shapes, families and sizes measured (`PRODUCTS`, `SKINNY`,
//!   `ATTENTION`, `FAMILIES`, `COLLECTIVE_BYTES`);
//! - `GpuMeasurements`, what one run measured;
//! - `cluster_file`: the base preset of that GPU kind with every measured
//!   figure in place and its source, and the table printed beside it.
//!
//! The cluster keeps the base's datasheet peaks; the curves are the
//! measured rates over them, so the cost model's rate (peak times
//! efficiency) is the measured one.

use fsdpc_plan::cluster::{
    matmul_shape_key, ring_wire_bytes, wide_skinny_key, Cluster, CollectiveFit, CollectiveKind,
    SKINNY_BASE_DIM, SKINNY_DIM,
};
use std::collections::BTreeMap;
use std::fmt::Write;

/// A matrix product's rows, inner size and columns.
pub type Shape = (usize, usize, usize);

/// The square products (m, k, n), FLOPs increasing: the curve of every
/// operand layout (`matmul_shape_key` `square:nn` .. `square:tt`) and
/// `matmul_efficiency` (their mean).
pub const PRODUCTS: [Shape; 9] = [
    (256, 256, 256),
    (512, 512, 512),
    (1024, 1024, 1024),
    (2048, 2048, 2048),
    (4096, 2048, 4096),
    (4096, 4096, 4096),
    (8192, 4096, 4096),
    (8192, 4096, 14336),
    (16384, 8192, 8192),
];

/// The large sides of the skinny products: 16 (and 64) rows, inner size or
/// columns against s x s.
pub const SKINNY: [usize; 4] = [1024, 2048, 4096, 8192];

/// Operand layouts (a transposed, b transposed).
pub const LAYOUTS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// Causal attention measured: (sequence, head size, heads, batch), FLOPs
/// increasing; the figure the file keeps is the one at `ATTENTION_AT`.
pub const ATTENTION: [(usize, usize, usize, usize); 4] = [
    (1024, 64, 16, 4),
    (2048, 128, 16, 2),
    (4096, 128, 16, 1),
    (8192, 128, 8, 1),
];

/// The attention case whose rates the file keeps (`kernel_flops` has one
/// rate per family): sequence 2048, head size 128.
pub const ATTENTION_AT: usize = 1;

/// Elements of the memory-bound kernels' main tensor (64 Mi: 128 MiB in
/// bf16, far beyond the L2).
pub const KERNEL_ELEMENTS: usize = 64 << 20;

/// Elements of the tiny kernel whose time is the per-kernel overhead.
pub const TINY_ELEMENTS: usize = 256;

/// Row width of the row-wise kernels (normalisation, softmax), and the
/// vocabulary of the cross entropy.
pub const ROW: usize = 4096;
/// Classes of the cross entropy measured.
pub const VOCAB: usize = 32768;

/// The memory-bound kernel families measured (`cost::kernel_family` names),
/// each in f32 and bf16; the cast f32 to bf16 only, keyed `cast` (a
/// `cast:bf16` figure would say the GPU's products widen half operands
/// first, `PROMOTION_FAMILY`).
pub const FAMILIES: [&str; 10] = [
    "binary",
    "unary",
    "unary_grad",
    "cast",
    "layer_norm",
    "layer_norm_grad",
    "softmax",
    "softmax_grad",
    "cross_entropy",
    "cross_entropy_grad",
];

/// Bytes per rank of the collectives measured over the local GPUs.
pub const COLLECTIVE_BYTES: [usize; 5] = [1 << 20, 4 << 20, 16 << 20, 64 << 20, 256 << 20];

/// One product: its shape, layout and median seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct ProductTime {
    /// Rows, inner size, columns.
    pub shape: Shape,
    /// Whether a and b are stored transposed.
    pub trans: (bool, bool),
    /// Median seconds of one call.
    pub seconds: f64,
}

impl ProductTime {
    /// `2 m k n`.
    pub fn flops(&self) -> f64 {
        let (m, k, n) = self.shape;
        2.0 * m as f64 * k as f64 * n as f64
    }
}

/// One attention case: its shape, FLOPs (the IR's count, causal halved)
/// and median seconds forward and backward.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionTime {
    /// (sequence, head size, heads, batch).
    pub case: (usize, usize, usize, usize),
    /// FLOPs of the forward kernel.
    pub forward_flops: f64,
    /// FLOPs of the backward kernel (2.5 times the forward's).
    pub backward_flops: f64,
    /// Median seconds of the forward kernel.
    pub forward_s: f64,
    /// Median seconds of the backward kernel.
    pub backward_s: f64,
}

/// One memory-bound kernel: its family key (`layer_norm:bf16`), the bytes
/// it reads and writes, its median seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelTime {
    /// `cost::kernel_family`'s key.
    pub family: String,
    /// Bytes read and written.
    pub bytes: f64,
    /// Median seconds.
    pub seconds: f64,
}

/// One collective over the local GPUs: kind, GPUs, bytes per rank of the
/// whole buffer, median seconds (the slowest GPU's).
#[derive(Clone, Debug, PartialEq)]
pub struct CollectiveTime {
    /// The collective.
    pub op: CollectiveKind,
    /// GPUs in the group.
    pub ranks: u32,
    /// Bytes of the whole buffer (gathered, or reduced).
    pub bytes: usize,
    /// Median seconds, the slowest GPU's.
    pub seconds: f64,
}

/// What one `calibrate --target cuda` measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuMeasurements {
    /// The device's name, as the driver gives it.
    pub device: String,
    /// GPUs the driver sees.
    pub gpus: usize,
    /// Device memory, bytes.
    pub total_bytes: u64,
    /// Device memory in use once the context exists and every kernel is
    /// loaded (the context, the modules, the driver's reservations), bytes.
    pub context_bytes: u64,
    /// Device memory a cuBLAS handle takes beyond the workspace fsdpc
    /// gives it, bytes.
    pub cublas_handle_bytes: u64,
    /// Device memory one NCCL communicator over every local GPU takes on a
    /// GPU, bytes (`None`: one GPU).
    pub nccl_comm_bytes: Option<u64>,
    /// The median time of a tiny kernel, seconds.
    pub overhead_s: f64,
    /// The square products (`PRODUCTS` in every layout).
    pub products: Vec<ProductTime>,
    /// The skinny products (nn layout).
    pub skinny: Vec<ProductTime>,
    /// `ATTENTION`'s cases.
    pub attention: Vec<AttentionTime>,
    /// `FAMILIES` in f32 and bf16.
    pub kernels: Vec<KernelTime>,
    /// Over the local GPUs (none with one GPU).
    pub collectives: Vec<CollectiveTime>,
}

/// The shapes of the skinny products of width `w` (16 or 64): rows, inner
/// and columns each `w` against `s x s`, keyed `rows`, `inner`, `cols`.
pub fn skinny_shapes(w: usize) -> Vec<(&'static str, Shape)> {
    SKINNY
        .iter()
        .flat_map(|&s| {
            [
                ("rows", (w, s, s)),
                ("inner", (s, w, s)),
                ("cols", (s, s, w)),
            ]
        })
        .collect()
}

/// `points` (flops, rate) sorted by FLOPs as efficiencies over `peak`,
/// clamped to (0, 1].
fn curve(mut points: Vec<(f64, f64)>, peak: f64) -> Vec<(f64, f64)> {
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    points
        .into_iter()
        .map(|(f, r)| (f, (r / peak).clamp(1e-6, 1.0)))
        .collect()
}

/// `amount` (FLOPs or bytes) over a kernel's time as measured, not less
/// the overhead: on a GPU the host issues ahead of any kernel longer than
/// its issue time, so a step pays the overhead only where kernels are
/// shorter (the cost model, which adds `kernel_overhead_s` to every
/// kernel, errs by at most the overhead a kernel).
fn per_second(amount: f64, seconds: f64) -> f64 {
    amount / seconds.max(1e-12)
}

/// The cluster file of `m`: `base` (the preset of this GPU kind) named
/// `calibrated`, with every measured figure in place and its source
/// (`date`: the day of the measurement), and the table of what was
/// measured.
pub fn cluster_file(base: Cluster, m: &GpuMeasurements, date: &str) -> (Cluster, String) {
    let mut file = base;
    let mut table = String::new();
    let peak = file.hardware.peak_flops_bf16;
    let _ = writeln!(
        table,
        "fsdpc calibrate --target cuda: {} ({} GPU(s), {:.1} GiB), {date}",
        m.device,
        m.gpus,
        m.total_bytes as f64 / (1u64 << 30) as f64
    );
    file.description = format!(
        "{} measured by fsdpc calibrate --target cuda on {} ({date}); what was not measured is the {} preset's",
        file.description, m.device, file.name
    );
    file.name = "calibrated".into();
    let h = &mut file.hardware;
    let mut sources: Vec<(&str, String)> = Vec::new();
    let rate = |p: &ProductTime| per_second(p.flops(), p.seconds);
    let (fwd, bwd) = (
        |a: &AttentionTime| per_second(a.forward_flops, a.forward_s),
        |a: &AttentionTime| per_second(a.backward_flops, a.backward_s),
    );

    // Matrix products: the square curves by layout, their mean, skinny.
    let _ = writeln!(
        table,
        "matrix products (bf16 operands, f32 accumulation, cuBLAS), TFLOP/s by layout:"
    );
    let mut by_layout: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for p in &m.products {
        let (mm, k, n) = p.shape;
        let key = matmul_shape_key(mm as u64, k as u64, n as u64, p.trans.0, p.trans.1);
        by_layout.entry(key).or_default().push((p.flops(), rate(p)));
    }
    for &(mm, k, n) in &PRODUCTS {
        let rates: Vec<String> = LAYOUTS
            .iter()
            .filter_map(|&t| {
                m.products
                    .iter()
                    .find(|p| p.shape == (mm, k, n) && p.trans == t)
            })
            .map(|p| format!("{:6.1}", rate(p) / 1e12))
            .collect();
        if !rates.is_empty() {
            let _ = writeln!(table, "  {mm:>5} x {k:>5} x {n:>5}  {}", rates.join(" "));
        }
    }
    if !by_layout.is_empty() {
        let mut mean: BTreeMap<u64, (f64, f64, usize)> = BTreeMap::new();
        for pts in by_layout.values() {
            for &(f, r) in pts {
                let e = mean.entry(f as u64).or_insert((f, 0.0, 0));
                e.1 += r;
                e.2 += 1;
            }
        }
        h.matmul_efficiency = curve(
            mean.values().map(|&(f, r, c)| (f, r / c as f64)).collect(),
            peak,
        );
        for (key, pts) in by_layout {
            h.matmul_curves.insert(key, curve(pts, peak));
        }
        sources.push((
            "matmul_efficiency",
            format!("the mean over operand layouts of cuBLAS bf16 products {} (m x k x n), FLOPs over the median time, over peak_flops_bf16", shapes_text(&PRODUCTS)),
        ));
    }
    if !m.skinny.is_empty() {
        let mut skinny: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        let mut base16: BTreeMap<u64, (f64, f64, usize)> = BTreeMap::new();
        for p in &m.skinny {
            let (mm, k, n) = p.shape;
            let small = mm.min(k).min(n);
            let key = matmul_shape_key(mm as u64, k as u64, n as u64, false, false);
            let key = if small > SKINNY_BASE_DIM {
                wide_skinny_key(&key)
            } else {
                let e = base16
                    .entry(p.flops() as u64)
                    .or_insert((p.flops(), 0.0, 0));
                e.1 += rate(p);
                e.2 += 1;
                key
            };
            skinny.entry(key).or_default().push((p.flops(), rate(p)));
        }
        h.skinny_matmul_efficiency = curve(
            base16
                .values()
                .map(|&(f, r, c)| (f, r / c as f64))
                .collect(),
            peak,
        );
        for (key, pts) in skinny {
            h.matmul_curves.insert(key, curve(pts, peak));
        }
        let _ = writeln!(table, "skinny products (nn), TFLOP/s at s = {:?}:", SKINNY);
        for w in [SKINNY_BASE_DIM, SKINNY_DIM] {
            for which in ["rows", "inner", "cols"] {
                let rates: Vec<String> = skinny_shapes(w)
                    .iter()
                    .filter(|(k, _)| *k == which)
                    .filter_map(|(_, s)| m.skinny.iter().find(|p| p.shape == *s))
                    .map(|p| format!("{:6.1}", rate(p) / 1e12))
                    .collect();
                let _ = writeln!(table, "  {which:>5} {w:>2} wide  {}", rates.join(" "));
            }
        }
        sources.push((
            "skinny_matmul_efficiency",
            format!("cuBLAS bf16 products 16 x s x s, s x 16 x s, s x s x 16 (mean) for s in {SKINNY:?}, over peak_flops_bf16; matmul_curves rows/inner/cols (and @64: 64 wide) the same by orientation"),
        ));
        sources.push((
            "matmul_curves",
            "cuBLAS bf16 products by shape and operand layout (see matmul_efficiency and skinny_matmul_efficiency), over peak_flops_bf16".into(),
        ));
    }

    // Attention: the rates at ATTENTION_AT.
    if !m.attention.is_empty() {
        let _ = writeln!(
            table,
            "attention (fsdpc's fused kernel, causal, bf16), TFLOP/s forward / backward:"
        );
        for a in &m.attention {
            let (s, d, heads, b) = a.case;
            let _ = writeln!(
                table,
                "  seq {s:>5}, head {d:>3}, {heads} heads, batch {b}: {:7.2} / {:7.2}",
                fwd(a) / 1e12,
                bwd(a) / 1e12
            );
        }
        if let Some(a) = m
            .attention
            .iter()
            .find(|a| a.case == ATTENTION[ATTENTION_AT])
        {
            h.kernel_flops.insert("attention:bf16".into(), fwd(a));
            h.kernel_flops.insert("attention_grad:bf16".into(), bwd(a));
            let (s, d, heads, b) = a.case;
            sources.push((
                "kernel_flops",
                format!("fsdpc's causal attention kernel and its gradient in bf16 at sequence {s}, head size {d}, {heads} heads, batch {b}: the IR's FLOPs over the median time"),
            ));
        }
    }

    // Memory-bound kernels and the per-kernel overhead.
    if m.overhead_s > 0.0 {
        h.kernel_overhead_s = m.overhead_s;
        let _ = writeln!(
            table,
            "per-kernel overhead: {:.2} us (a {TINY_ELEMENTS}-element add, issued and run)",
            m.overhead_s * 1e6
        );
        sources.push((
            "kernel_overhead_s",
            format!("the median time of a {TINY_ELEMENTS}-element bf16 add between two events on its stream (the host's issue and the launch)"),
        ));
    }
    if !m.kernels.is_empty() {
        let _ = writeln!(table, "memory-bound kernels, GB/s (bytes read + written):");
        for k in &m.kernels {
            let bw = per_second(k.bytes, k.seconds);
            let _ = writeln!(
                table,
                "  {:<22} {:>8.1} MiB  {:>7.1}",
                k.family,
                k.bytes / (1 << 20) as f64,
                bw / 1e9
            );
            h.kernel_bw.insert(k.family.clone(), bw);
        }
        if let Some(add) = m.kernels.iter().find(|k| k.family == "binary") {
            h.mem_bw = per_second(add.bytes, add.seconds);
            sources.push((
                "mem_bw",
                format!("an f32 add of {KERNEL_ELEMENTS} elements, bytes read + written over the median time"),
            ));
        }
        sources.push((
            "kernel_bw",
            format!("fsdpc's kernel per family (f32 and bf16) on {KERNEL_ELEMENTS}-element tensors (rows of {ROW}; cross entropy over {VOCAB} classes), bytes read + written over the median time"),
        ));
    }

    // Memory outside the arena.
    if m.cublas_handle_bytes > 0 {
        h.cublas_handle_bytes = m.cublas_handle_bytes;
        sources.push((
            "cublas_handle_bytes",
            "cuMemGetInfo after making a cuBLAS handle on its stream, less before and less the workspace given it".into(),
        ));
    }
    if m.context_bytes > 0 {
        h.context_bytes = m.context_bytes;
        sources.push((
            "context_bytes",
            "cuMemGetInfo once the context exists and fsdpc's kernels are loaded, less nothing: the device's use by this process before any allocation".into(),
        ));
    }
    let _ = writeln!(
        table,
        "outside the arena: context and modules {:.1} MiB, a cuBLAS handle {:.1} MiB beyond its workspace{}",
        m.context_bytes as f64 / (1 << 20) as f64,
        m.cublas_handle_bytes as f64 / (1 << 20) as f64,
        match m.nccl_comm_bytes {
            Some(b) => format!(
                ", an NCCL communicator over {} GPUs {:.1} MiB",
                m.gpus,
                b as f64 / (1 << 20) as f64
            ),
            None => String::new(),
        }
    );

    // Collectives over the local GPUs.
    let fits = collective_fits(&m.collectives);
    if fits.is_empty() {
        let _ = writeln!(
            table,
            "collectives: {} GPU here, none measured (the preset's intra-node figures stay)",
            m.gpus
        );
    } else {
        let _ = writeln!(
            table,
            "collectives over the local GPUs (NCCL, bf16), bus GB/s:"
        );
        for f in &fits {
            let pts: Vec<String> = m
                .collectives
                .iter()
                .filter(|c| c.op == f.op && c.ranks == f.ranks)
                .map(|c| {
                    let wire = ring_wire_bytes(c.op, c.ranks, c.bytes as f64);
                    format!("{} MiB {:.1}", c.bytes >> 20, wire / c.seconds / 1e9)
                })
                .collect();
            let _ = writeln!(
                table,
                "  {:<14} {} GPUs: {}; fit {:.1} us + wire / {:.1} GB/s",
                f.op.name(),
                f.ranks,
                pts.join(", "),
                f.latency_s * 1e6,
                f.bw / 1e9
            );
        }
        if let Some(ag) = fits
            .iter()
            .filter(|f| f.op == CollectiveKind::AllGather)
            .max_by_key(|f| f.ranks)
        {
            h.intra_bw = ag.bw;
            h.intra_latency_s = ag.latency_s;
            sources.push((
                "intra_bw",
                format!("the {}-GPU NCCL all-gather fit's bandwidth", ag.ranks),
            ));
            sources.push((
                "intra_latency_s",
                format!("the {}-GPU NCCL all-gather fit's latency", ag.ranks),
            ));
        }
        sources.push((
            "collective_fits",
            format!("NCCL all-gather, reduce-scatter, all-reduce over the local GPUs at {} MiB per rank: the median times as points and their least-squares latency + wire / bw", COLLECTIVE_BYTES.iter().map(|b| (b >> 20).to_string()).collect::<Vec<_>>().join(", ")),
        ));
        h.collective_fits = fits;
    }
    let by = format!("fsdpc calibrate --target cuda on {} ({date})", m.device);
    for (k, v) in sources {
        file.sources.insert(k.to_string(), format!("{by}: {v}"));
    }
    (file, table)
}

fn shapes_text(shapes: &[Shape]) -> String {
    shapes
        .iter()
        .map(|(m, k, n)| format!("{m}x{k}x{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// One fit per (kind, GPUs) of the measured collectives: the points by
/// ring wire bytes and their least-squares line.
pub fn collective_fits(times: &[CollectiveTime]) -> Vec<CollectiveFit> {
    let mut groups: BTreeMap<(u8, u32), Vec<(f64, f64)>> = BTreeMap::new();
    for c in times {
        let kind = CollectiveKind::ALL
            .iter()
            .position(|k| *k == c.op)
            .unwrap_or(0) as u8;
        let wire = ring_wire_bytes(c.op, c.ranks, c.bytes as f64);
        groups
            .entry((kind, c.ranks))
            .or_default()
            .push((wire, c.seconds));
    }
    groups
        .into_iter()
        .map(|((kind, ranks), points)| {
            CollectiveFit::of_points(CollectiveKind::ALL[kind as usize], ranks, points)
        })
        .collect()
}

#[cfg(test)]
#[path = "gpu_tests.rs"]
mod tests;
