//! The built-in clusters, from public datasheets: `a100-80g-roce` (the
//! FSDP paper's cluster), `h100-80g-ib`, `h200-141g-ib`, and `cpu-local`
//! (nominal figures for this project's 2-core VM; `fsdpc calibrate`
//! measures the real ones).

use super::Hardware;

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

/// Per-rank memory and hardware of preset `name` at `ranks_per_node` ranks
/// per node; `None` for a name not in `PRESETS`.
pub(super) fn preset(name: &str, ranks_per_node: u32) -> Option<(u64, Hardware)> {
    Some(match name {
        "a100-80g-roce" => (80 * GIB, a100_roce()),
        "h100-80g-ib" => (80 * GIB, h100_ib()),
        "h200-141g-ib" => (141 * GIB, h200_ib()),
        "cpu-local" => (
            24 * GIB / u64::from(ranks_per_node),
            cpu_local(ranks_per_node),
        ),
        _ => return None,
    })
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
