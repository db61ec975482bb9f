//! The built-in clusters: `a100-80g-roce` (the FSDP paper's cluster),
//! `h100-80g-ib`, `h200-141g-ib`, the PCIe and smaller-memory machines
//! fine-tuning users rent (`a100-40g-efa`, `l40s-48g-eth`,
//! `a10-24g-eth`), and `cpu-local` (nominal figures for this project's
//! 2-core VM; `fsdpc calibrate` measures the real ones). Peaks, memory
//! and links come from datasheets; the Hopper and A100 presets carry
//! measured or published rates of products, attention and memory
//! (`measured`), and the Hopper ones NCCL's times inside a node as XLA
//! measured them (`hopper_nccl`), each with its source. Each preset owns
//! its node size: eight GPUs to a node, or every rank of `cpu-local` on
//! the one machine.

mod hopper_nccl;
mod measured;

use crate::error::PlanError;
use fsdpc_plan::cluster::{check_shape, Cluster, Hardware, HOST_MEM_BW, PCIE4_X16_BW};

/// PCIe 5.0 x16: 64 GB/s raw per direction, about 50 GB/s achieved, the
/// H100 hosts' link.
pub const PCIE5_X16_BW: f64 = 50e9;

const GIB: u64 = 1 << 30;

/// Assumed device memory of a GPU process besides its own allocations
/// (the CUDA context, loaded modules, the driver's reservations): 512 MiB.
/// Guides give 300 MB to 1 GB per process; the cuda target measures it
/// (`MemoryReport::baseline_used`) where a GPU is at hand.
const GPU_CONTEXT_BYTES: u64 = 512 << 20;

/// Assumed NCCL channels per communicator on an 8-GPU NVLink node: what
/// NCCL's log (`NCCL_DEBUG=INFO`, "coll channels") commonly shows there.
const NVLINK_NCCL_CHANNELS: u32 = 32;

/// Assumed NCCL channels per communicator on a PCIe node without NVLink.
const PCIE_NCCL_CHANNELS: u32 = 4;

/// The presets `preset` knows, with a one-line description.
pub const PRESETS: [(&str, &str); 7] = [
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
        "a100-40g-efa",
        "8x A100-SXM4-40GB per node, NVLink3 inside, 400 Gb/s EFA per node between nodes (AWS p4d.24xlarge)",
    ),
    (
        "l40s-48g-eth",
        "8x L40S-48GB per node on PCIe 4.0 (no NVLink), 400 Gb/s Ethernet per node between nodes",
    ),
    (
        "a10-24g-eth",
        "8x A10-24GB per node on PCIe 4.0 (no NVLink), 100 Gb/s Ethernet per node between nodes",
    ),
    (
        "cpu-local",
        "ranks as threads of one 2-core VM sharing 24 GiB (nominal numbers)",
    ),
];

/// The ranks to a node of preset `name` when the user gives none: eight
/// GPUs (fewer when the world is smaller), or for `cpu-local` every rank
/// (threads of one machine; two, its cores, for a file of no size).
pub fn default_ranks_per_node(name: &str, world: Option<u32>) -> u32 {
    match (name, world) {
        ("cpu-local", Some(w)) => w.max(1),
        ("cpu-local", None) => 2,
        (_, Some(w)) => w.clamp(1, 8),
        (_, None) => 8,
    }
}

/// Preset `name` at `world` ranks, `ranks_per_node` to a node (`None`: the
/// preset's own, `default_ranks_per_node`). Plans record it as it is;
/// `described` adds what a cluster file says besides its figures.
pub fn preset(
    name: &str,
    world: u32,
    ranks_per_node: impl Into<Option<u32>>,
) -> Result<Cluster, PlanError> {
    let rpn = ranks_per_node
        .into()
        .unwrap_or_else(|| default_ranks_per_node(name, Some(world)));
    check_shape(world, rpn)?;
    let (memory_bytes, hardware) = figures(name, rpn).ok_or_else(|| PlanError::UnknownPreset {
        name: name.to_string(),
        known: PRESETS.map(|(n, _)| n).join(", "),
    })?;
    Ok(Cluster {
        name: name.to_string(),
        world,
        ranks_per_node: rpn,
        memory_bytes,
        hardware,
        description: String::new(),
        sources: Default::default(),
        kernels: Default::default(),
    })
}

/// Preset `name` (see `preset`) with its one-line description and the
/// source of each figure: what `fsdpc cluster NAME` writes.
pub fn described(
    name: &str,
    world: u32,
    ranks_per_node: impl Into<Option<u32>>,
) -> Result<Cluster, PlanError> {
    let description = PRESETS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, d)| d.to_string())
        .unwrap_or_default();
    Ok(Cluster {
        description,
        sources: sources(name),
        ..preset(name, world, ranks_per_node)?
    })
}

/// The fused attention kernel a GPU preset's attention rates are those of.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum Attention {
    /// The preset's own figures: on the Hopper presets PyTorch 2.11's
    /// default kernel as measured on an H200 (by its rate cuDNN
    /// attention's), on the A100 presets FlashAttention-2's.
    #[default]
    Preset,
    /// FlashAttention-2, as published: the kernel PyTorch's
    /// `scaled_dot_product_attention` runs on A100s, and on Hopper in
    /// PyTorch up to 2.4 and from 2.5.1 until cuDNN attention became its
    /// default again (2.5.0 put it first; by 2.11 it is first again).
    FlashAttention2,
}

/// `cluster`, a GPU preset by name (`preset`, `described`), with its
/// attention priced as `kernel` runs it and that figure's source in its
/// `sources`; an error names the preset when no published figure for
/// `kernel` on its GPU is held.
pub fn with_attention(cluster: &mut Cluster, kernel: Attention) -> Result<(), PlanError> {
    if kernel == Attention::Preset {
        return Ok(());
    }
    let tables = tables(&cluster.name).ok_or_else(|| PlanError::BadCluster {
        reason: format!(
            "no FlashAttention-2 figures for preset `{}`; the Hopper and A100 presets have them",
            cluster.name
        ),
    })?;
    let ((forward, backward), source) =
        measured::flash_attention_2(tables, cluster.hardware.peak_flops_bf16);
    let rates = &mut cluster.hardware.kernel_flops;
    rates.insert("attention:bf16".to_string(), forward);
    rates.insert("attention_grad:bf16".to_string(), backward);
    cluster
        .sources
        .insert("kernel_flops".to_string(), source.to_string());
    Ok(())
}

/// The measured or published tables preset `name` carries, if any.
fn tables(name: &str) -> Option<measured::Tables> {
    match name {
        "h100-80g-ib" | "h200-141g-ib" => Some(measured::Tables::Hopper),
        "a100-80g-roce" | "a100-40g-efa" => Some(measured::Tables::A100),
        _ => None,
    }
}

/// Where a preset's figures come from, by field name.
fn sources(name: &str) -> std::collections::BTreeMap<String, String> {
    let mut out = datasheet_sources(name);
    let measured = tables(name).map(measured::sources).unwrap_or_default();
    for (k, v) in measured {
        out.insert(k.to_string(), v.to_string());
    }
    out
}

/// The sources of the figures every preset has.
fn datasheet_sources(name: &str) -> std::collections::BTreeMap<String, String> {
    let source = match name {
        "cpu-local" => "nominal figures for a 2-core VM (measure yours with fsdpc calibrate)",
        _ => "vendor datasheet (see the preset's doc comment in planner/src/presets/mod.rs)",
    };
    [
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
    .chain(
        (name != "cpu-local")
            .then(|| {
                [
            (
                "context_bytes".to_string(),
                "assumed: 512 MiB for the CUDA context, modules and driver (guides give 300 MB \
                 to 1 GB per process; the cuda target measures it)"
                    .to_string(),
            ),
            (
                "nccl_channels".to_string(),
                "assumed: what NCCL's log (NCCL_DEBUG=INFO, \"coll channels\") commonly shows \
                 on such a node; set it from yours"
                    .to_string(),
            ),
        ]
            })
            .into_iter()
            .flatten(),
    )
    .collect()
}

/// Per-rank memory and hardware of preset `name` at `ranks_per_node` ranks
/// per node; `None` for a name not in `PRESETS`.
fn figures(name: &str, ranks_per_node: u32) -> Option<(u64, Hardware)> {
    Some(match name {
        "a100-80g-roce" => (80 * GIB, a100_roce()),
        "h100-80g-ib" => (80 * GIB, h100_ib()),
        "h200-141g-ib" => (141 * GIB, h200_ib()),
        "a100-40g-efa" => (40 * GIB, a100_efa()),
        "l40s-48g-eth" => (48 * GIB, l40s_eth()),
        "a10-24g-eth" => (24 * GIB, a10_eth()),
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
    let mut h = Hardware {
        peak_flops_f32: 19.5e12,
        peak_flops_bf16: 312e12,
        mem_bw: 2.039e12,
        intra_bw: 300e9,
        intra_latency_s: 8e-6,
        inter_bw: 25e9,
        inter_latency_s: 20e-6,
        host_bw: PCIE4_X16_BW,
        host_mem_bw: HOST_MEM_BW,
        context_bytes: GPU_CONTEXT_BYTES,
        nccl_channels: NVLINK_NCCL_CHANNELS,
        ..Hardware::default()
    };
    measured::a100(&mut h);
    h
}

/// NVIDIA H100-SXM5-80GB datasheet: 67 TFLOP/s FP32, 989 TFLOP/s BF16 dense,
/// 3.35 TB/s HBM3, NVLink4 900 GB/s bidirectional (450 GB/s each way);
/// ConnectX-7 NDR 400 Gb/s = 50 GB/s per GPU between nodes.
fn h100_ib() -> Hardware {
    let mut h = Hardware {
        peak_flops_f32: 67e12,
        peak_flops_bf16: 989e12,
        mem_bw: 3.35e12,
        intra_bw: 450e9,
        intra_latency_s: 6e-6,
        inter_bw: 50e9,
        inter_latency_s: 10e-6,
        host_bw: PCIE5_X16_BW,
        host_mem_bw: HOST_MEM_BW,
        context_bytes: GPU_CONTEXT_BYTES,
        nccl_channels: NVLINK_NCCL_CHANNELS,
        ..Hardware::default()
    };
    measured::hopper(&mut h);
    h
}

/// NVIDIA H200-SXM datasheet: the H100's compute (67 TFLOP/s FP32, 989
/// TFLOP/s BF16 dense) with 141 GB of HBM3e at 4.8 TB/s (at the fraction
/// the H200 reached, `measured::HOPPER_HBM_FRACTION`); NVLink4 and NDR
/// InfiniBand as the H100 preset.
fn h200_ib() -> Hardware {
    Hardware {
        mem_bw: 4.8e12 * measured::HOPPER_HBM_FRACTION,
        ..h100_ib()
    }
}

/// NVIDIA A100-SXM4-40GB datasheet: the 80 GB part's compute (19.5 TFLOP/s
/// FP32, 312 TFLOP/s BF16 dense) with 40 GB of HBM2 at 1.555 TB/s; NVLink3
/// 600 GB/s bidirectional. Between nodes: AWS p4d.24xlarge's 400 Gb/s EFA
/// per 8-GPU host, i.e. 50 Gb/s = 6.25 GB/s per GPU.
fn a100_efa() -> Hardware {
    Hardware {
        mem_bw: 1.555e12,
        inter_bw: 6.25e9,
        ..a100_roce()
    }
}

/// Assumed per-direction bandwidth between GPUs of one PCIe 4.0 host
/// without NVLink: peer copies through the root complex achieve about
/// what a host copy does (`PCIE4_X16_BW`), less for rings that cross the
/// CPU sockets; 20 GB/s.
const PCIE4_PEER_BW: f64 = 20e9;

/// NVIDIA L40S datasheet: 91.6 TFLOP/s FP32, 362 TFLOP/s BF16 tensor dense
/// (733 with sparsity), 48 GB GDDR6 at 864 GB/s, PCIe 4.0 x16 and no
/// NVLink. Between nodes: 400 Gb/s Ethernet per 8-GPU host (assumed), 6.25
/// GB/s per GPU.
fn l40s_eth() -> Hardware {
    Hardware {
        peak_flops_f32: 91.6e12,
        peak_flops_bf16: 362e12,
        mem_bw: 864e9,
        intra_bw: PCIE4_PEER_BW,
        intra_latency_s: 10e-6,
        inter_bw: 6.25e9,
        inter_latency_s: 25e-6,
        host_bw: PCIE4_X16_BW,
        host_mem_bw: HOST_MEM_BW,
        context_bytes: GPU_CONTEXT_BYTES,
        nccl_channels: PCIE_NCCL_CHANNELS,
        ..Hardware::default()
    }
}

/// NVIDIA A10 datasheet: 31.2 TFLOP/s FP32, 125 TFLOP/s BF16/FP16 tensor
/// dense (250 with sparsity), 24 GB GDDR6 at 600 GB/s, PCIe 4.0 x16 and no
/// NVLink. Between nodes: 100 Gb/s Ethernet per 8-GPU host (assumed; AWS's
/// g5.48xlarge has 100 Gb/s), 1.5625 GB/s per GPU.
fn a10_eth() -> Hardware {
    Hardware {
        peak_flops_f32: 31.2e12,
        peak_flops_bf16: 125e12,
        mem_bw: 600e9,
        intra_bw: PCIE4_PEER_BW,
        intra_latency_s: 10e-6,
        inter_bw: 1.5625e9,
        inter_latency_s: 25e-6,
        host_bw: PCIE4_X16_BW,
        host_mem_bw: HOST_MEM_BW,
        context_bytes: GPU_CONTEXT_BYTES,
        nccl_channels: PCIE_NCCL_CHANNELS,
        ..Hardware::default()
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

#[cfg(test)]
mod tests {
    //! The cluster file (`fsdpc_plan::cluster`) of presets and of
    //! calibrated figures: what it keeps and what it refuses.
    use super::*;
    use fsdpc_plan::cluster::{CollectiveFit, CollectiveKind, Contention};

    /// A cluster file read back at `world` ranks.
    fn read(text: &str, world: u32) -> Result<Cluster, fsdpc_plan::cluster::ClusterError> {
        Cluster::from_file(text, Some(world), None)
    }

    fn calibrated() -> Cluster {
        let mut f = described("cpu-local", 2, 2).unwrap();
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
        let text = f.to_file(false);
        assert!(text.contains("\"comm_compute_contention\""), "{text}");
        let back = read(&text, 2).unwrap();
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
        // A file written before these fields: none of them in the JSON (a
        // preset without measured tables writes none).
        let text = described("l40s-48g-eth", 8, 8).unwrap().to_file(false);
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
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
        let f = read(&v.to_string(), 8).unwrap();
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
        let err = read(&f.to_file(false), 2).unwrap_err().to_string();
        assert!(err.contains("comm_slowdown"), "{err}");
        let mut f = calibrated();
        f.hardware.collective_fits[0].ranks = 1;
        let err = read(&f.to_file(false), 2).unwrap_err().to_string();
        assert!(err.contains("collective_fits"), "{err}");
        let mut f = calibrated();
        f.hardware.kernel_bw.insert("unary".into(), -1.0);
        let err = read(&f.to_file(false), 2).unwrap_err().to_string();
        assert!(err.contains("kernel_bw.unary"), "{err}");
        let mut f = calibrated();
        f.hardware.bandwidth_by_size = vec![(1e6, 1.0), (1e6, 0.5)];
        let err = read(&f.to_file(false), 2).unwrap_err().to_string();
        assert!(err.contains("bandwidth_by_size"), "{err}");
    }

    #[test]
    fn a_world_smaller_than_a_node_uses_part_of_one_as_presets_do() {
        // Measured with 2 ranks per node, planned for 1 rank: one rank of
        // one node, as the preset it was written from gives.
        let text = described("cpu-local", 2, 2).unwrap().to_file(false);
        let one = read(&text, 1).unwrap();
        assert_eq!((one.world, one.ranks_per_node, one.nodes()), (1, 1, 1));
        let p = preset("cpu-local", 1, None).unwrap();
        assert_eq!((p.world, p.ranks_per_node), (one.world, one.ranks_per_node));
        // A whole number of nodes keeps the file's node size.
        let four = read(&text, 4).unwrap();
        assert_eq!((four.ranks_per_node, four.nodes()), (2, 2));
        // Neither a part node beyond the first nor a node size asked for
        // that the world does not fill.
        let err = read(&text, 3).unwrap_err().to_string();
        assert!(
            err.contains("world size 3 is not a multiple of ranks per node 2"),
            "{err}"
        );
        let err = Cluster::from_file(&text, Some(1), Some(2))
            .unwrap_err()
            .to_string();
        assert!(err.contains("world size 1"), "{err}");
    }
}
