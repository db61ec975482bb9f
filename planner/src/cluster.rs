//! Cluster and hardware descriptions: how many ranks, how much memory each
//! has, and how fast they compute and communicate. The planner only reads
//! these numbers; it never measures anything.

use crate::error::PlanError;
use fsdpc_ir::DType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Per-rank hardware speeds (SI units: FLOP/s, bytes/s, seconds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Hardware {
    /// Dense peak FLOP/s for f32 operands (no TF32).
    pub peak_flops_f32: f64,
    /// Dense peak FLOP/s for bf16/f16 operands.
    pub peak_flops_bf16: f64,
    /// Memory bandwidth, bytes/s.
    pub mem_bw: f64,
    /// Per-rank bandwidth to ranks of the same node, bytes/s, one direction.
    pub intra_bw: f64,
    /// Latency of one intra-node collective step, seconds.
    pub intra_latency_s: f64,
    /// Per-rank bandwidth to other nodes, bytes/s, one direction.
    pub inter_bw: f64,
    /// Latency of one inter-node collective step, seconds.
    pub inter_latency_s: f64,
    /// Per-rank host <-> device copy bandwidth, bytes/s, one direction
    /// (`cpu_offload`'s copies; absent in older plans: `PCIE4_X16_BW`).
    #[serde(default = "pcie4_x16")]
    pub host_bw: f64,
    /// Per-rank host memory bandwidth, bytes/s: what the optimizer step on
    /// host shards runs at (`cpu_offload`; assumed memory-bound, as the
    /// element-wise Adam/SGD update is; absent in older plans:
    /// `HOST_MEM_BW`).
    #[serde(default = "host_mem")]
    pub host_mem_bw: f64,
    /// Achievable fraction of the peak FLOP/s as a function of a kernel's
    /// FLOPs: `(flops, efficiency)` points in increasing `flops`,
    /// interpolated linearly in log(flops) and held flat beyond the ends
    /// (what `fsdpc calibrate` or a user's own measurements give; empty:
    /// the peak, in older plans and presets without measurements).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub matmul_efficiency: Vec<(f64, f64)>,
    /// The same curve for skinny products, whose smallest dimension (rows,
    /// inner or columns) is at most `SKINNY_DIM` (a small batch through a
    /// wide layer); empty: skinny products use `matmul_efficiency` (presets
    /// and older files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skinny_matmul_efficiency: Vec<(f64, f64)>,
    /// Efficiency curves of one matrix-product call (`flops` of the call)
    /// by the call's shape and operand layout (`matmul_shape_key`:
    /// `square:nn`, `rows:nt`, `inner:tn`, ...), which on CPUs differ by
    /// up to 5x at the same FLOPs; a shape not listed uses
    /// `matmul_efficiency_for` (empty in presets and older files).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub matmul_curves: BTreeMap<String, Vec<(f64, f64)>>,
    /// Fixed cost of dispatching one kernel, seconds, added to every
    /// kernel's time (what `fsdpc calibrate` measures on tiny inputs; 0 in
    /// presets and older files: kernels cost their roofline only).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub kernel_overhead_s: f64,
    /// Bandwidth memory-bound kernels achieve, bytes/s (read + written), by
    /// kernel family (`cost::kernel_family`: `binary`, `unary`,
    /// `layer_norm`, `layer_norm_grad`, `softmax`, `softmax_grad`,
    /// `cross_entropy`, ...; a `:bf16` suffix for half-precision operands).
    /// A family not listed runs at `mem_bw` (empty in presets and older
    /// files).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kernel_bw: BTreeMap<String, f64>,
    /// FLOP/s compute-bound kernels other than matrix products achieve,
    /// by family (`attention`, `attention_grad`, `:bf16` as in
    /// `kernel_bw`); a family not listed runs at the matrix-product
    /// roofline (empty in presets and older files).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kernel_flops: BTreeMap<String, f64>,
    /// Bytes of last-level cache per rank: a memory-bound kernel moving
    /// more than this runs at no more than `mem_bw` (its family's
    /// `kernel_bw` is measured on tensors that fit; 0 in presets and
    /// older files: no cache is modelled).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_bytes: f64,
    /// How memory-bound kernels slow as the bytes one call moves outgrow
    /// the caches: points (bytes of one call, its rate over the rate at the
    /// first point), bytes increasing, ratios in (0, 1], interpolated in
    /// log bytes (1 below the first point, the last ratio beyond the last).
    /// `kernel_bw` is measured at about the first point's bytes. When
    /// given it replaces the `cache_bytes` / `mem_bw` cap: a cache size
    /// read from sysfs in a VM is the host's, not the guest's share
    /// (empty in presets and older files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bandwidth_by_size: Vec<(f64, f64)>,
    /// The communicator inside a node as measured per collective and group
    /// size: `latency_s + wire / bw`, where `wire` is what a rank sends in
    /// the ring algorithm (`cost::ring_wire_bytes`). A collective of a kind
    /// and size not listed uses the ring model on `intra_bw` and
    /// `intra_latency_s` (empty in presets and older files).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub collective_fits: Vec<CollectiveFit>,
    /// Whether the collective library runs one flat ring over a group that
    /// spans nodes (MPI over TCP, the CPU ranks' shared-memory
    /// communicator). `false` (the GPU presets): one library call is
    /// node-aware (NCCL keeps most ring hops inside the node, or goes
    /// across on 1/k of the buffer), so a ring collective costs the better
    /// of the flat ring and a one-call hierarchical algorithm, and the
    /// planner's explicit two-level forms (`rewrite`) rarely pay.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub flat_collectives: bool,
    /// Where ranks share cores with their own collectives (CPU ranks): how
    /// much a collective and a kernel slow each other while both run
    /// (`None`: streams do not contend, as on GPUs with copy engines).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm_compute_contention: Option<Contention>,
    /// How the CPU ranks' matrix-product library blocks f32 products, so
    /// the memory plan bounds its packing buffers for this machine
    /// (`workspace::gemm_heap`) instead of for every CPU it supports
    /// (`None`: presets, older files and GPU clusters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_gemm: Option<GemmBlocking>,
}

/// The blocking of `gemm` 0.19's f32 kernels on one machine (what
/// `fsdpc calibrate` detects: the instruction set gemm dispatches to and
/// the L2 size it reads from the CPU).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GemmBlocking {
    /// f32 lanes of one SIMD register (`N`: 8 with AVX2, 16 with AVX-512).
    pub simd_lanes: u32,
    /// Rows of the micro-kernel (`MR`, a multiple of `simd_lanes`).
    pub mr: u32,
    /// Columns of the micro-kernel (`NR`).
    pub nr: u32,
    /// The per-thread slab gemm keeps for packing its left-hand operand:
    /// the L2 cache size it detects.
    pub slab_bytes: u64,
    /// The L2 associativity and the L3 size and associativity gemm detects,
    /// from which it sizes its blocks (`kernel_params`: `mc` from L2, `nc`
    /// from L3). 0: unknown (files written before they were recorded),
    /// the plan then takes `mc` at its cap, `8 MR`.
    #[serde(default)]
    pub l2_assoc: u32,
    #[serde(default)]
    pub l3_bytes: u64,
    #[serde(default)]
    pub l3_assoc: u32,
}

/// A collective kind, as the cost model and calibration name it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveKind {
    AllGather,
    ReduceScatter,
    AllReduce,
}

impl CollectiveKind {
    /// All kinds, in a fixed order.
    pub const ALL: [CollectiveKind; 3] = [
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::AllReduce,
    ];

    /// The snake_case name (`all_gather`).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::AllReduce => "all_reduce",
        }
    }
}

/// An alpha-beta fit of one collective kind over groups of `ranks` ranks
/// inside a node: `time = latency_s + wire_bytes / bw`, or, where the
/// times were measured over sizes that span the caches (`points`), those
/// times interpolated.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CollectiveFit {
    pub op: CollectiveKind,
    /// Ranks in the group.
    pub ranks: u32,
    /// Fixed cost of one collective, seconds (alpha).
    pub latency_s: f64,
    /// Bytes per second of the ring's per-rank traffic (1 / beta).
    pub bw: f64,
    /// Measured `(wire bytes, seconds)`, wire bytes increasing: when
    /// given, a collective's time is these interpolated linearly in wire
    /// bytes (the first point's time below it, the last segment's slope
    /// beyond the last). On CPUs one line cannot hold both a collective
    /// that stays in the caches and one that streams through memory: the
    /// 2-rank shared-memory all-gather of a 64 MiB unit ran 3-5x slower
    /// than the fit to 4 KiB-4 MiB said (empty in presets and older
    /// files: the fit).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub points: Vec<(f64, f64)>,
}

impl CollectiveFit {
    /// Seconds of one collective whose ring traffic is `wire` bytes per
    /// rank.
    pub fn time(&self, wire: f64) -> f64 {
        let p = &self.points;
        if p.len() < 2 {
            return self.latency_s + if self.bw > 0.0 { wire / self.bw } else { 0.0 };
        }
        if wire <= p[0].0 {
            return p[0].1;
        }
        // The segment that holds `wire`, else the last one, extended.
        let w = p
            .windows(2)
            .find(|w| wire <= w[1].0)
            .unwrap_or(&p[p.len() - 2..]);
        let ((x0, t0), (x1, t1)) = (w[0], w[1]);
        let slope = ((t1 - t0) / (x1 - x0).max(f64::MIN_POSITIVE)).max(0.0);
        t0 + (wire - x0) * slope
    }
}

/// How much work on different streams slows while a collective and a
/// kernel run at the same time: each runs at `1 / factor` of its speed
/// alone for the overlap (factors >= 1).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Contention {
    /// A collective's slowdown while a kernel runs beside it.
    pub comm_slowdown: f64,
    /// A kernel's slowdown while a collective runs beside it.
    pub compute_slowdown: f64,
    /// Each collective's slowdown while two collectives (an all-gather
    /// and a reduce-scatter, as backward's prefetch and reduction) run
    /// beside a kernel (0: not measured, `comm_slowdown`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub two_comm_slowdown: f64,
    /// A kernel's slowdown while two collectives run beside it (0: not
    /// measured, `compute_slowdown`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub two_compute_slowdown: f64,
    /// Each collective's slowdown while two run beside each other and no
    /// kernel (0: not measured, none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub comm_pair_slowdown: f64,
}

impl Contention {
    /// The rates (of their speed alone) at which collectives and a kernel
    /// progress while `comms` collectives run and a kernel does or does
    /// not (`compute`).
    pub fn rates(&self, comms: usize, compute: bool) -> (f64, f64) {
        let or = |x: f64, y: f64| if x >= 1.0 { x } else { y };
        let (comm, kernel) = match (comms, compute) {
            (0, _) => (1.0, 1.0),
            (1, false) => (1.0, 1.0),
            (_, false) => (or(self.comm_pair_slowdown, 1.0), 1.0),
            (1, true) => (self.comm_slowdown, self.compute_slowdown),
            (_, true) => (
                or(self.two_comm_slowdown, self.comm_slowdown),
                or(self.two_compute_slowdown, self.compute_slowdown),
            ),
        };
        (1.0 / comm.max(1.0), 1.0 / kernel.max(1.0))
    }

    /// Whether any factor slows anything.
    pub fn slows(&self) -> bool {
        [
            self.comm_slowdown,
            self.compute_slowdown,
            self.two_comm_slowdown,
            self.two_compute_slowdown,
            self.comm_pair_slowdown,
        ]
        .iter()
        .any(|&x| x > 1.0)
    }
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn unmeasured_as_1(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        x
    }
}

/// PCIe 4.0 x16: 32 GB/s raw per direction, about 25 GB/s achieved by
/// pinned-memory copies (`cudaMemcpyAsync`), the A100 hosts' link.
pub const PCIE4_X16_BW: f64 = 25e9;

/// PCIe 5.0 x16: 64 GB/s raw per direction, about 50 GB/s achieved, the
/// H100 hosts' link.
pub const PCIE5_X16_BW: f64 = 50e9;

/// Host memory bandwidth per rank of an 8-GPU node: two sockets of eight
/// DDR4-3200 channels (2 x 204.8 GB/s) shared by 8 ranks is 51 GB/s each at
/// peak; about half of it is what a streaming CPU optimizer achieves.
pub const HOST_MEM_BW: f64 = 25e9;

fn pcie4_x16() -> f64 {
    PCIE4_X16_BW
}

fn host_mem() -> f64 {
    HOST_MEM_BW
}

/// The `kernel_bw` family of the cast between a half-precision dtype and
/// f32: what a backend that multiplies in f32 pays per promoted element
/// (`Hardware::promotion_bandwidth`).
pub const PROMOTION_FAMILY: &str = "cast:bf16";

/// Products whose smallest dimension is at most this many are skinny
/// (`Hardware::skinny_matmul_efficiency`).
pub const SKINNY_DIM: usize = 64;

/// The key of a matrix-product call's curve in `Hardware::matmul_curves`:
/// which of rows `m`, inner size `k` and columns `n` is the smallest, when
/// it is at most `SKINNY_DIM` (`rows`, `inner`, `cols`; else `square`),
/// and whether each operand is stored transposed (`n`/`t` for `a`, then
/// `b`).
pub fn matmul_shape_key(m: u64, k: u64, n: u64, trans_a: bool, trans_b: bool) -> String {
    let small = m.min(k).min(n);
    let shape = if small > SKINNY_DIM as u64 {
        "square"
    } else if small == m {
        "rows"
    } else if small == k {
        "inner"
    } else {
        "cols"
    };
    let t = |x: bool| if x { 't' } else { 'n' };
    format!("{shape}:{}{}", t(trans_a), t(trans_b))
}

/// The smallest dimension of the skinny products whose curves are keyed
/// `rows:nn`, `inner:tn`, ...: `fsdpc calibrate` measures them with 16
/// rows, inner size or columns.
pub const SKINNY_BASE_DIM: usize = 16;

/// The key of the same skinny curve measured `SKINNY_DIM` wide
/// (`rows:nn@64`): a product whose smallest dimension lies between
/// `SKINNY_BASE_DIM` and `SKINNY_DIM` interpolates between the two, as a
/// CPU micro-kernel's tiles fill (a 64-row product ran 3x faster per FLOP
/// than the 16-row curve said on this project's 2-core machine).
pub fn wide_skinny_key(key: &str) -> String {
    format!("{key}@{SKINNY_DIM}")
}

/// An efficiency curve at `flops`: linear in log(flops) between points,
/// flat beyond the ends, 1 when empty; clamped to (0, 1].
fn curve_at(curve: &[(f64, f64)], flops: f64) -> f64 {
    let (Some(first), Some(last)) = (curve.first(), curve.last()) else {
        return 1.0;
    };
    let clamp = |e: f64| e.clamp(1e-6, 1.0);
    if flops <= first.0 {
        return clamp(first.1);
    }
    if flops >= last.0 {
        return clamp(last.1);
    }
    for w in curve.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        if flops <= x1 {
            let t = (flops.ln() - x0.ln()) / (x1.ln() - x0.ln()).max(f64::MIN_POSITIVE);
            return clamp(y0 + t * (y1 - y0));
        }
    }
    clamp(last.1)
}

impl Hardware {
    /// The fraction of peak a kernel of `flops` FLOPs achieves (see
    /// `matmul_efficiency`), in (0, 1].
    pub fn efficiency(&self, flops: f64) -> f64 {
        curve_at(&self.matmul_efficiency, flops)
    }

    /// The fraction of peak a matrix product of `flops` FLOPs whose
    /// smallest dimension is `min_dim` achieves: the skinny curve when
    /// `min_dim <= SKINNY_DIM` and the cluster has one, else `efficiency`.
    pub fn matmul_efficiency_for(&self, flops: f64, min_dim: usize) -> f64 {
        if min_dim <= SKINNY_DIM && !self.skinny_matmul_efficiency.is_empty() {
            curve_at(&self.skinny_matmul_efficiency, flops)
        } else {
            self.efficiency(flops)
        }
    }

    /// The fraction of peak one matrix-product call achieves: its shape's
    /// curve (`matmul_curves`) at the call's FLOPs, else
    /// `matmul_efficiency_for`.
    pub fn matmul_call_efficiency(
        &self,
        flops: f64,
        (m, k, n): (u64, u64, u64),
        trans_a: bool,
        trans_b: bool,
    ) -> f64 {
        let key = matmul_shape_key(m, k, n, trans_a, trans_b);
        let small = m.min(k).min(n) as f64;
        match self.matmul_curves.get(&key) {
            Some(c) if !c.is_empty() => {
                let at_base = curve_at(c, flops);
                let wide = self
                    .matmul_curves
                    .get(&wide_skinny_key(&key))
                    .filter(|w| !w.is_empty());
                match wide {
                    // Between the two measured widths, linear in
                    // log(width); held at the ends.
                    Some(w) if small > SKINNY_BASE_DIM as f64 => {
                        let (lo, hi) = (SKINNY_BASE_DIM as f64, SKINNY_DIM as f64);
                        let t = ((small.ln() - lo.ln()) / (hi.ln() - lo.ln())).min(1.0);
                        at_base + t * (curve_at(w, flops) - at_base)
                    }
                    _ => at_base,
                }
            }
            _ => self.matmul_efficiency_for(flops, small as usize),
        }
    }

    /// The measured fit of `op` over `ranks` ranks inside a node, if any.
    pub fn collective_fit(&self, op: CollectiveKind, ranks: u32) -> Option<&CollectiveFit> {
        self.collective_fits
            .iter()
            .find(|f| f.op == op && f.ranks == ranks)
    }

    /// Bandwidth of a memory-bound kernel of `family` (see `kernel_bw`):
    /// the family's figure, else the family without its `:bf16` suffix,
    /// else `mem_bw`.
    pub fn kernel_bandwidth(&self, family: &str) -> f64 {
        let base = family.split(':').next().unwrap_or(family);
        self.kernel_bw
            .get(family)
            .or_else(|| self.kernel_bw.get(base))
            .copied()
            .unwrap_or(self.mem_bw)
    }

    /// Bytes per second (half-precision bytes plus f32 bytes) at which
    /// this hardware's kernels widen half-precision operands to f32 and
    /// narrow results back, when it multiplies in f32 (`cast:bf16` in
    /// `kernel_bw`, which `fsdpc calibrate` measures on CPUs); `None` where
    /// it multiplies half precision natively (presets, older files).
    pub fn promotion_bandwidth(&self) -> Option<f64> {
        self.kernel_bw
            .get(PROMOTION_FAMILY)
            .copied()
            .filter(|&bw| bw > 0.0)
    }

    /// Seconds to convert `elements` elements between half precision and
    /// f32 where this hardware does so element by element on its cores
    /// (`promotion_bandwidth`: two bytes on the half side, four on the f32
    /// side); 0 where it has no such figure.
    pub fn half_conversion_time(&self, elements: u64) -> f64 {
        self.promotion_bandwidth()
            .map_or(0.0, |bw| (elements * 6) as f64 / bw)
    }

    /// Measured FLOP/s of a compute-bound kernel of `family` (see
    /// `kernel_flops`; the family without its `:bf16` suffix if that is
    /// not listed), if any.
    pub fn kernel_rate(&self, family: &str) -> Option<f64> {
        let base = family.split(':').next().unwrap_or(family);
        self.kernel_flops
            .get(family)
            .or_else(|| self.kernel_flops.get(base))
            .copied()
    }

    /// Bandwidth of a memory-bound kernel of `family` moving `bytes`: its
    /// family's (`kernel_bandwidth`) scaled by the measured slowdown at
    /// that size (`bandwidth_by_size`), else capped at `mem_bw` when the
    /// bytes do not fit in the rank's share of the cache (`cache_bytes` >
    /// 0).
    pub fn kernel_bandwidth_for(&self, family: &str, bytes: f64) -> f64 {
        let bw = self.kernel_bandwidth(family);
        if !self.bandwidth_by_size.is_empty() {
            let first = self.bandwidth_by_size[0].0;
            return if bytes <= first {
                bw
            } else {
                bw * curve_at(&self.bandwidth_by_size, bytes)
            };
        }
        if self.cache_bytes > 0.0 && bytes > self.cache_bytes {
            bw.min(self.mem_bw)
        } else {
            bw
        }
    }

    /// Peak FLOP/s for arithmetic in `dtype`.
    pub fn peak_flops(&self, dtype: DType) -> f64 {
        match dtype {
            DType::Bf16 | DType::F16 => self.peak_flops_bf16,
            _ => self.peak_flops_f32,
        }
    }
}

/// A cluster: `nodes` hosts of `ranks_per_node` ranks each.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// The preset these numbers came from.
    pub preset: String,
    /// Total ranks.
    pub world: u32,
    pub ranks_per_node: u32,
    pub nodes: u32,
    /// Per-rank memory capacity in bytes.
    pub memory_bytes: u64,
    pub hardware: Hardware,
}

const GIB: u64 = 1 << 30;

/// The presets `Cluster::preset` knows, with a one-line description.
pub const PRESETS: [(&str, &str); 4] = [
    (
        "a100-80g-roce",
        "8x A100-SXM4-80GB per node, NVLink3 inside, 200 Gb/s RoCE per GPU between nodes (the PyTorch FSDP paper's cluster)",
    ),
    (
        "h100-80g-ib",
        "8x H100-SXM5-80GB per node, NVLink4 inside, 400 Gb/s InfiniBand NDR per GPU between nodes",
    ),
    (
        "h200-141g-ib",
        "8x H200-SXM-141GB per node, NVLink4 inside, 400 Gb/s InfiniBand NDR per GPU between nodes",
    ),
    (
        "cpu-local",
        "ranks as threads of one 2-core VM sharing 24 GiB (nominal numbers)",
    ),
];

impl Cluster {
    /// The preset `name` at `world` ranks, `ranks_per_node` per node.
    pub fn preset(name: &str, world: u32, ranks_per_node: u32) -> Result<Cluster, PlanError> {
        check_shape(world, ranks_per_node)?;
        let (memory_bytes, hardware) = match name {
            "a100-80g-roce" => (80 * GIB, a100_roce()),
            "h100-80g-ib" => (80 * GIB, h100_ib()),
            "h200-141g-ib" => (141 * GIB, h200_ib()),
            "cpu-local" => (
                24 * GIB / u64::from(ranks_per_node),
                cpu_local(ranks_per_node),
            ),
            _ => {
                return Err(PlanError::UnknownPreset {
                    name: name.to_string(),
                    known: PRESETS.map(|(n, _)| n).join(", "),
                })
            }
        };
        Ok(Cluster {
            preset: name.to_string(),
            world,
            ranks_per_node,
            nodes: world / ranks_per_node,
            memory_bytes,
            hardware,
        })
    }

    /// The same hardware at another world size (same ranks per node).
    pub fn with_world(&self, world: u32) -> Result<Cluster, PlanError> {
        check_shape(world, self.ranks_per_node)?;
        Ok(Cluster {
            world,
            nodes: world / self.ranks_per_node,
            ..self.clone()
        })
    }

    /// The plan's record of this cluster.
    pub fn info(&self) -> crate::plan::ClusterInfo {
        crate::plan::ClusterInfo {
            world: self.world,
            ranks_per_node: self.ranks_per_node,
            preset: self.preset.clone(),
            memory_bytes: self.memory_bytes,
            hardware: self.hardware.clone(),
        }
    }

    /// Rebuilds a cluster from a plan's record.
    pub fn from_info(info: &crate::plan::ClusterInfo) -> Cluster {
        Cluster {
            preset: info.preset.clone(),
            world: info.world,
            ranks_per_node: info.ranks_per_node.max(1),
            nodes: info.world / info.ranks_per_node.max(1),
            memory_bytes: info.memory_bytes,
            hardware: info.hardware.clone(),
        }
    }
}

fn check_shape(world: u32, ranks_per_node: u32) -> Result<(), PlanError> {
    let bad = |reason: String| Err(PlanError::BadCluster { reason });
    if world == 0 {
        return bad("world size must be at least 1".into());
    }
    if ranks_per_node == 0 {
        return bad("ranks per node must be at least 1".into());
    }
    if !world.is_multiple_of(ranks_per_node) {
        return bad(format!(
            "world size {world} is not a multiple of ranks per node {ranks_per_node}"
        ));
    }
    Ok(())
}

/// NVIDIA A100-SXM4-80GB datasheet: 19.5 TFLOP/s FP32, 312 TFLOP/s BF16 dense,
/// 2.039 TB/s HBM2e, NVLink3 600 GB/s bidirectional (300 GB/s each way).
/// Between nodes: 2 Tb/s RoCE per 8-GPU host (the FSDP paper, section 6),
/// i.e. 200 Gb/s = 25 GB/s per GPU.
fn a100_roce() -> Hardware {
    Hardware {
        peak_flops_f32: 19.5e12,
        peak_flops_bf16: 312e12,
        mem_bw: 2.039e12,
        intra_bw: 300e9,
        intra_latency_s: 8e-6,
        inter_bw: 25e9,
        inter_latency_s: 20e-6,
        host_bw: PCIE4_X16_BW,
        host_mem_bw: HOST_MEM_BW,
        ..Hardware::default()
    }
}

/// NVIDIA H100-SXM5-80GB datasheet: 67 TFLOP/s FP32, 989 TFLOP/s BF16 dense,
/// 3.35 TB/s HBM3, NVLink4 900 GB/s bidirectional (450 GB/s each way);
/// ConnectX-7 NDR 400 Gb/s = 50 GB/s per GPU between nodes.
fn h100_ib() -> Hardware {
    Hardware {
        peak_flops_f32: 67e12,
        peak_flops_bf16: 989e12,
        mem_bw: 3.35e12,
        intra_bw: 450e9,
        intra_latency_s: 6e-6,
        inter_bw: 50e9,
        inter_latency_s: 10e-6,
        host_bw: PCIE5_X16_BW,
        host_mem_bw: HOST_MEM_BW,
        ..Hardware::default()
    }
}

/// NVIDIA H200-SXM datasheet: the H100's compute (67 TFLOP/s FP32, 989
/// TFLOP/s BF16 dense) with 141 GB of HBM3e at 4.8 TB/s; NVLink4 and NDR
/// InfiniBand as the H100 preset.
fn h200_ib() -> Hardware {
    Hardware {
        mem_bw: 4.8e12,
        ..h100_ib()
    }
}

/// A 2-core x86 VM: about 100 GFLOP/s f32 (AVX2 FMA) and 10 GB/s of memory
/// bandwidth in all, shared by the rank threads; collectives are memory copies.
fn cpu_local(ranks_per_node: u32) -> Hardware {
    let share = f64::from(ranks_per_node);
    Hardware {
        peak_flops_f32: 100e9 / share,
        peak_flops_bf16: 100e9 / share,
        mem_bw: 10e9 / share,
        intra_bw: 5e9 / share,
        intra_latency_s: 5e-6,
        inter_bw: 5e9 / share,
        inter_latency_s: 5e-6,
        // "Host" and "device" are two arenas in the same memory: a copy
        // and the optimizer run at memory speed.
        host_bw: 10e9 / share,
        host_mem_bw: 10e9 / share,
        // The shared-memory communicator's rings are flat.
        flat_collectives: true,
        ..Hardware::default()
    }
}

/// The schema of cluster files.
pub const CLUSTER_SCHEMA: &str = "fsdpc.cluster/v1";

/// A cluster as a file (`--cluster FILE`): its shape, per-rank memory and
/// speeds, and where each figure came from. `fsdpc cluster PRESET` writes a
/// preset in this form to start from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// Always `CLUSTER_SCHEMA`.
    pub schema: String,
    /// What plans record as the cluster's name.
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub ranks_per_node: u32,
    /// Nodes: with `ranks_per_node`, the world when a command gives none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    pub memory_bytes_per_rank: u64,
    pub hardware: Hardware,
    /// Where each figure came from, by field name (`"mem_bw": "datasheet"`,
    /// `"matmul_efficiency": "fsdpc calibrate on host x"`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub sources: std::collections::BTreeMap<String, String>,
}

impl ClusterFile {
    /// Parses and checks a cluster file.
    pub fn from_json(text: &str) -> Result<ClusterFile, PlanError> {
        let bad = |reason: String| PlanError::BadCluster { reason };
        let f: ClusterFile =
            serde_json::from_str(text).map_err(|e| bad(format!("not a cluster file: {e}")))?;
        if f.schema != CLUSTER_SCHEMA {
            return Err(bad(format!(
                "schema `{}` is not `{CLUSTER_SCHEMA}`",
                f.schema
            )));
        }
        f.check()?;
        Ok(f)
    }

    /// The preset `name` as a file, `ranks_per_node` per node, with the
    /// sources of its figures.
    pub fn preset(name: &str, ranks_per_node: u32) -> Result<ClusterFile, PlanError> {
        let c = Cluster::preset(name, ranks_per_node, ranks_per_node)?;
        let description = PRESETS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, d)| d.to_string())
            .unwrap_or_default();
        let source = match name {
            "cpu-local" => "nominal figures for a 2-core VM (measure yours with fsdpc calibrate)",
            _ => "vendor datasheet (see the preset's doc comment in planner/src/cluster.rs)",
        };
        let sources = [
            "peak_flops_f32",
            "peak_flops_bf16",
            "mem_bw",
            "intra_bw",
            "inter_bw",
            "host_bw",
        ]
        .into_iter()
        .map(|k| (k.to_string(), source.to_string()))
        .chain([
            (
                "intra_latency_s".to_string(),
                "assumed: one NCCL ring step inside a node".to_string(),
            ),
            (
                "inter_latency_s".to_string(),
                "assumed: one NCCL ring step across nodes".to_string(),
            ),
            (
                "host_mem_bw".to_string(),
                "assumed: half the per-rank share of the host's DRAM bandwidth".to_string(),
            ),
        ])
        .collect();
        Ok(ClusterFile {
            schema: CLUSTER_SCHEMA.to_string(),
            name: name.to_string(),
            description,
            ranks_per_node,
            nodes: None,
            memory_bytes_per_rank: c.memory_bytes,
            hardware: c.hardware,
            sources,
        })
    }

    /// Every figure positive and finite, the efficiency curve increasing in
    /// FLOPs with efficiencies in (0, 1].
    fn check(&self) -> Result<(), PlanError> {
        let bad = |reason: String| Err(PlanError::BadCluster { reason });
        if self.ranks_per_node == 0 || self.memory_bytes_per_rank == 0 {
            return bad("ranks_per_node and memory_bytes_per_rank must be at least 1".into());
        }
        let h = &self.hardware;
        for (name, x) in [
            ("peak_flops_f32", h.peak_flops_f32),
            ("peak_flops_bf16", h.peak_flops_bf16),
            ("mem_bw", h.mem_bw),
            ("intra_bw", h.intra_bw),
            ("inter_bw", h.inter_bw),
            ("host_bw", h.host_bw),
            ("host_mem_bw", h.host_mem_bw),
        ] {
            if !(x.is_finite() && x > 0.0) {
                return bad(format!(
                    "hardware.{name} must be a positive number, it is {x}"
                ));
            }
        }
        for (name, x) in [
            ("intra_latency_s", h.intra_latency_s),
            ("inter_latency_s", h.inter_latency_s),
        ] {
            if !(x.is_finite() && x >= 0.0) {
                return bad(format!("hardware.{name} must be a number >= 0, it is {x}"));
            }
        }
        if !(h.cache_bytes.is_finite() && h.cache_bytes >= 0.0) {
            return bad(format!(
                "hardware.cache_bytes must be a number >= 0, it is {}",
                h.cache_bytes
            ));
        }
        if let Some(g) = &h.cpu_gemm {
            if g.simd_lanes == 0 || g.nr == 0 || g.mr == 0 || g.mr % g.simd_lanes != 0 {
                return bad(format!(
                    "hardware.cpu_gemm: simd_lanes, mr and nr must be at least 1 and mr a multiple of simd_lanes, they are {}, {} and {}",
                    g.simd_lanes, g.mr, g.nr
                ));
            }
        }
        if !(h.kernel_overhead_s.is_finite() && h.kernel_overhead_s >= 0.0) {
            return bad(format!(
                "hardware.kernel_overhead_s must be a number >= 0, it is {}",
                h.kernel_overhead_s
            ));
        }
        for (family, x) in &h.kernel_bw {
            if !(x.is_finite() && *x > 0.0) {
                return bad(format!(
                    "hardware.kernel_bw.{family} must be a positive number, it is {x}"
                ));
            }
        }
        for (family, x) in &h.kernel_flops {
            if !(x.is_finite() && *x > 0.0) {
                return bad(format!(
                    "hardware.kernel_flops.{family} must be a positive number, it is {x}"
                ));
            }
        }
        for f in &h.collective_fits {
            if f.ranks < 2 || !(f.bw.is_finite() && f.bw > 0.0) {
                return bad(format!(
                    "hardware.collective_fits: {} over {} ranks must have at least 2 ranks and a positive bw (it has {})",
                    f.op.name(),
                    f.ranks,
                    f.bw
                ));
            }
            if !(f.latency_s.is_finite() && f.latency_s >= 0.0) {
                return bad(format!(
                    "hardware.collective_fits: {} over {} ranks must have a latency_s >= 0 (it has {})",
                    f.op.name(),
                    f.ranks,
                    f.latency_s
                ));
            }
            let mut prev = 0.0;
            for &(wire, t) in &f.points {
                if !(wire.is_finite() && wire > prev && t.is_finite() && t > 0.0) {
                    return bad(format!(
                        "hardware.collective_fits: {} over {} ranks: point ({wire}, {t}) must have wire bytes above the previous point's and a positive time",
                        f.op.name(),
                        f.ranks
                    ));
                }
                prev = wire;
            }
        }
        if let Some(c) = &h.comm_compute_contention {
            for (name, x) in [
                ("comm_slowdown", c.comm_slowdown),
                ("compute_slowdown", c.compute_slowdown),
                // 0: not measured.
                ("two_comm_slowdown", unmeasured_as_1(c.two_comm_slowdown)),
                (
                    "two_compute_slowdown",
                    unmeasured_as_1(c.two_compute_slowdown),
                ),
                ("comm_pair_slowdown", unmeasured_as_1(c.comm_pair_slowdown)),
            ] {
                if !(x.is_finite() && x >= 1.0) {
                    return bad(format!(
                        "hardware.comm_compute_contention.{name} must be a number >= 1, it is {x}"
                    ));
                }
            }
        }
        let named: Vec<(String, &Vec<(f64, f64)>)> = [
            ("matmul_efficiency".to_string(), &h.matmul_efficiency),
            (
                "skinny_matmul_efficiency".to_string(),
                &h.skinny_matmul_efficiency,
            ),
        ]
        .into_iter()
        .chain(
            h.matmul_curves
                .iter()
                .map(|(k, c)| (format!("matmul_curves.{k}"), c)),
        )
        .collect();
        for (name, curve) in named {
            let mut prev = 0.0;
            for &(flops, e) in curve {
                if !(flops.is_finite() && flops > prev && e > 0.0 && e <= 1.0) {
                    return bad(format!(
                        "hardware.{name}: point ({flops}, {e}) must have FLOPs above the previous point's and an efficiency in (0, 1]"
                    ));
                }
                prev = flops;
            }
        }
        let mut prev = 0.0;
        for &(bytes, r) in &h.bandwidth_by_size {
            if !(bytes.is_finite() && bytes > prev && r > 0.0 && r <= 1.0) {
                return bad(format!(
                    "hardware.bandwidth_by_size: point ({bytes}, {r}) must have bytes above the previous point's and a ratio in (0, 1]"
                ));
            }
            prev = bytes;
        }
        Ok(())
    }

    /// The cluster at `world` ranks (`None`: `nodes` x `ranks_per_node`),
    /// `ranks_per_node` overriding the file's when given.
    pub fn cluster(
        &self,
        world: Option<u32>,
        ranks_per_node: Option<u32>,
    ) -> Result<Cluster, PlanError> {
        let rpn = ranks_per_node.unwrap_or(self.ranks_per_node);
        let world = match (world, self.nodes) {
            (Some(w), _) => w,
            (None, Some(n)) => n.saturating_mul(rpn),
            (None, None) => {
                return Err(PlanError::BadCluster {
                    reason: format!(
                        "cluster `{}` gives no `nodes`: say how many ranks (--world)",
                        self.name
                    ),
                })
            }
        };
        check_shape(world, rpn)?;
        Ok(Cluster {
            preset: self.name.clone(),
            world,
            ranks_per_node: rpn,
            nodes: world / rpn,
            memory_bytes: self.memory_bytes_per_rank,
            hardware: self.hardware.clone(),
        })
    }
}

#[cfg(test)]
mod calibrated_fields {
    use super::*;

    /// A call's curve is chosen by which dimension is small and by the
    /// operands' layout; without a curve for the shape, the older curves.
    #[test]
    fn matmul_calls_use_their_shapes_curve() {
        assert_eq!(matmul_shape_key(128, 256, 512, false, false), "square:nn");
        assert_eq!(matmul_shape_key(16, 4096, 4096, false, true), "rows:nt");
        assert_eq!(matmul_shape_key(4096, 16, 4096, true, false), "inner:tn");
        assert_eq!(matmul_shape_key(4096, 4096, 10, true, true), "cols:tt");
        let mut h = Hardware {
            skinny_matmul_efficiency: vec![(1e6, 0.3)],
            matmul_efficiency: vec![(1e6, 0.8)],
            ..Hardware::default()
        };
        h.matmul_curves
            .insert("rows:nt".into(), vec![(1e6, 0.1), (1e8, 0.2)]);
        let e = |h: &Hardware, m, k, n, tb| h.matmul_call_efficiency(1e7, (m, k, n), false, tb);
        assert!((e(&h, 16, 4096, 4096, true) - 0.15).abs() < 1e-12);
        assert_eq!(
            e(&h, 16, 4096, 4096, false),
            0.3,
            "no rows:nn curve: the skinny one"
        );
        assert_eq!(
            e(&h, 512, 512, 512, true),
            0.8,
            "no square:nt curve: the general one"
        );
        // A curve measured 64 wide: products between 16 and 64 rows
        // interpolate in log(rows); 16 and below keep the 16-row curve.
        h.matmul_curves
            .insert(wide_skinny_key("rows:nt"), vec![(1e6, 0.5), (1e8, 0.6)]);
        assert_eq!(wide_skinny_key("rows:nt"), "rows:nt@64");
        assert!((e(&h, 64, 4096, 4096, true) - 0.55).abs() < 1e-12);
        assert!((e(&h, 32, 4096, 4096, true) - 0.35).abs() < 1e-12);
        assert!((e(&h, 8, 4096, 4096, true) - 0.15).abs() < 1e-12);
    }

    #[test]
    fn measured_collective_points_are_interpolated() {
        let mut f = CollectiveFit {
            op: CollectiveKind::AllGather,
            ranks: 2,
            latency_s: 1.0,
            bw: 10.0,
            points: Vec::new(),
        };
        assert_eq!(f.time(100.0), 11.0, "no points: the fit");
        f.points = vec![(10.0, 2.0), (110.0, 4.0), (210.0, 10.0)];
        assert_eq!(f.time(1.0), 2.0, "below the first point: its time");
        assert!((f.time(60.0) - 3.0).abs() < 1e-12);
        assert!((f.time(160.0) - 7.0).abs() < 1e-12);
        // Beyond the last: the last segment's slope (6 s per 100 bytes).
        assert!((f.time(310.0) - 16.0).abs() < 1e-12);
    }

    #[test]
    fn casts_have_their_own_family_and_conversion_needs_a_measured_rate() {
        let mut h = Hardware {
            mem_bw: 1e10,
            ..Hardware::default()
        };
        assert_eq!(h.promotion_bandwidth(), None, "presets: native half");
        assert_eq!(h.half_conversion_time(1000), 0.0);
        h.kernel_bw.insert("unary:bf16".into(), 2e9);
        assert_eq!(
            h.kernel_bandwidth("cast:bf16"),
            1e10,
            "a cast is not a unary kernel: unmeasured, at memory bandwidth"
        );
        h.kernel_bw.insert(PROMOTION_FAMILY.into(), 6e9);
        assert_eq!(h.kernel_bandwidth("cast:bf16"), 6e9);
        assert_eq!(h.promotion_bandwidth(), Some(6e9));
        assert_eq!(h.half_conversion_time(1000), 1e-6);
    }

    fn calibrated() -> ClusterFile {
        let mut f = ClusterFile::preset("cpu-local", 2).unwrap();
        let h = &mut f.hardware;
        h.kernel_overhead_s = 2e-6;
        h.kernel_bw.insert("softmax".into(), 3e9);
        h.kernel_bw.insert("softmax:bf16".into(), 1e9);
        h.kernel_flops.insert("attention".into(), 5e10);
        h.matmul_efficiency = vec![(1e6, 0.5), (1e9, 0.9)];
        h.skinny_matmul_efficiency = vec![(1e6, 0.1), (1e9, 0.2)];
        h.collective_fits.push(CollectiveFit {
            op: CollectiveKind::ReduceScatter,
            ranks: 2,
            latency_s: 1e-5,
            bw: 4e9,
            points: Vec::new(),
        });
        h.comm_compute_contention = Some(Contention {
            comm_slowdown: 1.5,
            compute_slowdown: 1.2,
            ..Contention::default()
        });
        f
    }

    #[test]
    fn new_fields_round_trip() {
        let f = calibrated();
        let text = serde_json::to_string_pretty(&f).unwrap();
        assert!(text.contains("\"comm_compute_contention\""), "{text}");
        let back = ClusterFile::from_json(&text).unwrap();
        assert_eq!(back, f);
        let h = &back.hardware;
        assert_eq!(h.kernel_bandwidth("softmax:bf16"), 1e9);
        // A half family not measured falls back to its f32 figure, an
        // unknown family to mem_bw.
        let mut h2 = h.clone();
        h2.kernel_bw.remove("softmax:bf16");
        assert_eq!(h2.kernel_bandwidth("softmax:bf16"), 3e9);
        assert_eq!(h.kernel_bandwidth("binary"), h.mem_bw);
        // Beyond the cache a kernel runs at no more than mem_bw.
        let mut h3 = h.clone();
        h3.cache_bytes = 1e6;
        h3.mem_bw = 2e9;
        assert_eq!(h3.kernel_bandwidth_for("softmax", 1e6), 3e9);
        assert_eq!(h3.kernel_bandwidth_for("softmax", 2e6), 2e9);
        // A measured curve replaces the cap: the family's rate up to its
        // first point, scaled beyond it (log-interpolated).
        let mut h5 = h3.clone();
        h5.bandwidth_by_size = vec![(1e6, 1.0), (1e8, 0.5)];
        assert_eq!(h5.kernel_bandwidth_for("softmax", 5e5), 3e9);
        assert!((h5.kernel_bandwidth_for("softmax", 1e7) - 2.25e9).abs() < 1.0);
        assert_eq!(h5.kernel_bandwidth_for("softmax", 1e9), 1.5e9);
        assert_eq!(
            h.collective_fit(CollectiveKind::ReduceScatter, 2)
                .map(|f| f.bw),
            Some(4e9)
        );
        assert!(h.collective_fit(CollectiveKind::AllGather, 2).is_none());
        assert_eq!(h.kernel_rate("attention:bf16"), Some(5e10));
        assert_eq!(h.kernel_rate("attention_grad"), None);
        // Skinny products use their own curve, others the main one.
        assert_eq!(h.matmul_efficiency_for(1e9, 16), 0.2);
        assert_eq!(h.matmul_efficiency_for(1e9, 65), 0.9);
        let mut h4 = h.clone();
        h4.skinny_matmul_efficiency.clear();
        assert_eq!(h4.matmul_efficiency_for(1e9, 16), 0.9);
    }

    #[test]
    fn older_files_load_without_them() {
        // A file written before these fields: none of them in the JSON.
        let mut v = serde_json::to_value(ClusterFile::preset("a100-80g-roce", 8).unwrap()).unwrap();
        for k in [
            "kernel_overhead_s",
            "kernel_bw",
            "kernel_flops",
            "skinny_matmul_efficiency",
            "cache_bytes",
            "bandwidth_by_size",
            "collective_fits",
            "comm_compute_contention",
        ] {
            assert!(v["hardware"].get(k).is_none(), "{k} written for a preset");
        }
        v["hardware"]
            .as_object_mut()
            .unwrap()
            .remove("matmul_efficiency");
        let f = ClusterFile::from_json(&v.to_string()).unwrap();
        assert_eq!(f.hardware.kernel_overhead_s, 0.0);
        assert!(f.hardware.kernel_bw.is_empty());
        assert!(f.hardware.collective_fits.is_empty());
        assert!(f.hardware.comm_compute_contention.is_none());
    }

    #[test]
    fn bad_calibrated_figures_are_refused() {
        let mut f = calibrated();
        f.hardware.comm_compute_contention = Some(Contention {
            comm_slowdown: 0.5,
            compute_slowdown: 1.0,
            ..Contention::default()
        });
        let text = serde_json::to_string(&f).unwrap();
        let err = ClusterFile::from_json(&text).unwrap_err().to_string();
        assert!(err.contains("comm_slowdown"), "{err}");
        let mut f = calibrated();
        f.hardware.collective_fits[0].ranks = 1;
        let err = ClusterFile::from_json(&serde_json::to_string(&f).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("collective_fits"), "{err}");
        let mut f = calibrated();
        f.hardware.kernel_bw.insert("unary".into(), -1.0);
        let err = ClusterFile::from_json(&serde_json::to_string(&f).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("kernel_bw.unary"), "{err}");
        let mut f = calibrated();
        f.hardware.bandwidth_by_size = vec![(1e6, 1.0), (1e6, 0.5)];
        let err = ClusterFile::from_json(&serde_json::to_string(&f).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("bandwidth_by_size"), "{err}");
    }
}
