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
pub const PRESETS: [(&str, &str); 3] = [
    (
        "a100-80g-roce",
        "8x A100-SXM4-80GB per node, NVLink3 inside, 200 Gb/s RoCE per GPU between nodes (the PyTorch FSDP paper's cluster)",
    ),
    (
        "h100-80g-ib",
        "8x H100-SXM5-80GB per node, NVLink4 inside, 400 Gb/s InfiniBand NDR per GPU between nodes",
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
    }
}
