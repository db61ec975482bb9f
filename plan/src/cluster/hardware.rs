//! What one rank's hardware does, as the cost model reads it: peak FLOP/s,
//! the matrix products' efficiency curves (by size, by call shape and
//! layout, 16 and 64 wide), memory and kernel bandwidths, the measured
//! collective times and how streams that share cores slow each other.

use super::collectives::{CollectiveFit, CollectiveKind};
use fsdpc_ir::DType;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// PCIe 4.0 x16: 32 GB/s raw per direction, about 25 GB/s achieved by
/// pinned-memory copies (`cudaMemcpyAsync`), the A100 hosts' link: the
/// host link of a file that gives none.
pub const PCIE4_X16_BW: f64 = 25e9;

/// Host memory bandwidth per rank of an 8-GPU node: two sockets of eight
/// DDR4-3200 channels (2 x 204.8 GB/s) shared by 8 ranks is 51 GB/s each at
/// peak; about half of it is what a streaming CPU optimizer achieves. The
/// host memory bandwidth of a file that gives none.
pub const HOST_MEM_BW: f64 = 25e9;

/// Per-rank hardware speeds (SI units: FLOP/s, bytes/s, seconds).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Hardware {
    /// Dense peak FLOP/s for f32 operands (no TF32).
    pub peak_flops_f32: f64,
    /// A GPU process's device memory besides its own allocations: the
    /// CUDA context, loaded modules and the driver's reservations, bytes
    /// (0: not a GPU, or a file that does not say).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub context_bytes: u64,
    /// Channels NCCL opens per communicator, each holding
    /// `memory::NCCL_CHANNEL_BYTES` per receiving connection (0: no NCCL,
    /// or a file that does not say).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub nccl_channels: u32,
    /// Device memory one cuBLAS handle holds besides the workspace the
    /// cuda target gives it, bytes (0: not a GPU, or a file that does not
    /// say).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub cublas_handle_bytes: u64,
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

fn is_zero_u64(x: &u64) -> bool {
    *x == 0
}

fn is_zero_u32(x: &u32) -> bool {
    *x == 0
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

pub(super) fn unmeasured_as_1(x: f64) -> f64 {
    if x == 0.0 {
        1.0
    } else {
        x
    }
}

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

#[cfg(test)]
mod tests {
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
}
