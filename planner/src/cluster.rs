//! Cluster and hardware descriptions: how many ranks, how much memory each
//! has, and how fast they compute and communicate. The planner only reads
//! these numbers; it never measures anything.

use crate::error::PlanError;
use fsdpc_ir::DType;
use serde::{Deserialize, Serialize};

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

impl Hardware {
    /// The fraction of peak a kernel of `flops` FLOPs achieves (see
    /// `matmul_efficiency`), in (0, 1].
    pub fn efficiency(&self, flops: f64) -> f64 {
        let curve = &self.matmul_efficiency;
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
        matmul_efficiency: Vec::new(),
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
        matmul_efficiency: Vec::new(),
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
        matmul_efficiency: Vec::new(),
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
        let mut prev = 0.0;
        for &(flops, e) in &h.matmul_efficiency {
            if !(flops.is_finite() && flops > prev && e > 0.0 && e <= 1.0) {
                return bad(format!(
                    "hardware.matmul_efficiency: point ({flops}, {e}) must have FLOPs above the previous point's and an efficiency in (0, 1]"
                ));
            }
            prev = flops;
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
