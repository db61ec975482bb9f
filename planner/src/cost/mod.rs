//! The cost model: seconds and bytes of every instruction of a plan on a
//! cluster. `kernel` costs kernels, `collective` collectives; this module
//! costs the rest of the instructions (copies between host and device at
//! `Hardware::host_bw`, accumulation, resharding, clipping, the optimizer
//! update, loading inputs), and sums a step's traffic by collective kind
//! and group. Under `cpu_offload` the optimizer tail over host shards runs
//! at host memory speed (`Hardware::host_mem_bw`; it is memory-bound). A
//! quantized collective (`wire`) is charged its payloads' bytes (fp8: plus
//! its amax all-gather) and its encode and decode passes at the unary
//! kernels' bandwidth (`wire::codec_bytes`). Seconds and bytes throughout.

mod collective;
pub mod eager;
mod kernel;

pub use collective::*;
pub use kernel::*;

use fsdpc_plan::cluster::{Cluster, CollectiveKind};
use fsdpc_plan::*;
use serde::Serialize;

/// Time of one instruction on its stream (0 for bookkeeping instructions),
/// and the bytes it sends.
pub fn instr_cost(plan: &Plan, cluster: &Cluster, ins: &Instr) -> (f64, u64) {
    let bytes_of = |b: &BufferId| plan.buffers.get(b.index()).map_or(0, |b| b.bytes);
    // Memory bandwidth where buffer `b` lives.
    let bw_at = |b: &BufferId| match plan.buffers.get(b.index()).map(|b| b.location) {
        Some(Location::Host) => cluster.hardware.host_mem_bw.max(1.0),
        _ => cluster.hardware.mem_bw.max(1.0),
    };
    match &ins.op {
        InstrOp::AllGather { .. } | InstrOp::ReduceScatter { .. } => {
            let (t, bytes, _) = collective_cost(plan, cluster, ins);
            let t = t + conversion_time(plan, cluster, ins);
            // A quantized collective's encode and decode: element-wise
            // passes, at the bandwidth of the unary (cast) kernels.
            let codec = crate::quantize::codec_bytes(plan, ins) as f64;
            let hw = &cluster.hardware;
            let codec_t = if codec > 0.0 {
                hw.kernel_overhead_s + codec / hw.kernel_bandwidth_for("unary", codec).max(1.0)
            } else {
                0.0
            };
            (t + codec_t, bytes)
        }
        InstrOp::AllReduce { .. }
        | InstrOp::NormAllReduce { .. }
        | InstrOp::FoundInfAllReduce { .. }
        | InstrOp::TensorAllReduce { .. }
        | InstrOp::TensorChunks {
            kind: ChunkKind::Gather | ChunkKind::ReduceScatter,
            ..
        } => {
            let (t, bytes, _) = collective_cost(plan, cluster, ins);
            (t + conversion_time(plan, cluster, ins), bytes)
        }
        // A member's chunk copied out of the whole: read and written once.
        InstrOp::TensorChunks {
            kind: ChunkKind::Split,
            dst,
            ..
        } => {
            let b = 2 * bytes_of(&dst.buffer);
            (
                cluster.hardware.kernel_overhead_s
                    + b as f64
                        / cluster
                            .hardware
                            .kernel_bandwidth_for("copy", b as f64)
                            .max(1.0),
                0,
            )
        }
        InstrOp::GradNormSq { grads, .. } => {
            let t = grads.iter().map(|g| bytes_of(g) as f64 / bw_at(g)).sum();
            (t, 0)
        }
        InstrOp::Copy { src, .. } => (bytes_of(src) as f64 / cluster.hardware.host_bw.max(1.0), 0),
        InstrOp::Accumulate { dst, .. } => {
            // Reads both operands, writes one.
            let b = 3 * bytes_of(dst);
            (b as f64 / cluster.hardware.mem_bw.max(1.0), 0)
        }
        InstrOp::Reshard { dst, .. } => {
            // Reads and writes the kept slice.
            let b = 2 * bytes_of(dst);
            (b as f64 / cluster.hardware.mem_bw.max(1.0), 0)
        }
        InstrOp::ClipGrads { grads, .. } => {
            // Reads and writes the gradient shard.
            let b = 2 * bytes_of(grads);
            (b as f64 / bw_at(grads), 0)
        }
        InstrOp::Kernel { node, .. } if plan.training.graph.contains(*node) => (
            node_kernel_time(
                &plan.training.graph,
                *node,
                cluster,
                plan.config.param_dtype,
            ),
            0,
        ),
        InstrOp::LoadInput { dst, .. } => {
            // The data source writes the input: at the rate calibration
            // measured for the built-in data of its kind (`load_input`,
            // `load_input_int`), else at memory bandwidth.
            let buf = plan.buffers.get(dst.buffer.index());
            let family = match buf.map(|b| b.dtype.is_float()) {
                Some(false) => "load_input_int",
                _ => "load_input",
            };
            let bw = cluster.hardware.kernel_bandwidth(family).max(1.0);
            (
                cluster.hardware.kernel_overhead_s + bytes_of(&dst.buffer) as f64 / bw,
                0,
            )
        }
        InstrOp::OptimizerStep { params, state, .. } => {
            // Reads params, grads and state, writes params and state.
            let b = bytes_of(params) * (3 + 2 * state.len() as u64);
            let bw = match plan.buffers.get(params.index()).map(|b| b.location) {
                Some(Location::Host) => bw_at(params),
                _ => cluster.hardware.kernel_bandwidth_for("optimizer", b as f64),
            };
            (
                cluster.hardware.kernel_overhead_s + b as f64 / bw.max(1.0),
                0,
            )
        }
        _ => (0.0, 0),
    }
}

/// One kind of collective over one kind of group, summed over a step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Traffic {
    /// `all_gather`, `reduce_scatter` or `all_reduce`.
    pub op: &'static str,
    pub group: Group,
    /// Ranks in each such group.
    pub ranks: u32,
    /// Whether the group spans nodes (`group_shape`).
    pub inter_node: bool,
    /// Collectives of this kind per step.
    pub count: usize,
    /// Bytes each rank sends in them per step (ring accounting of the
    /// whole collective).
    pub bytes_sent: u64,
    /// Of those, the bytes that cross nodes: all of them for a ring over a
    /// group that spans nodes, the cross-node step's for a hierarchical
    /// one (`(m-1)/m` of `1/k` of the buffer; f32 for a reduce-scatter).
    pub across_bytes: u64,
    /// How many of them run hierarchically (`CollectiveAlgorithm`, the
    /// `rewrite` pass's choice); the rest run as a ring.
    pub hierarchical: usize,
}

/// The plan's collectives per step, by operation and group, in first-use
/// order: how many bytes a rank sends inside a node and across nodes.
pub fn traffic(plan: &Plan, cluster: &Cluster) -> Vec<Traffic> {
    let mut out: Vec<Traffic> = Vec::new();
    for ins in &plan.instructions {
        let (op, kind, group) = match ins.op {
            InstrOp::AllGather {
                c: Collective { group, .. },
                ..
            } => ("all_gather", CollectiveKind::AllGather, group),
            InstrOp::ReduceScatter {
                c: Collective { group, .. },
            } => ("reduce_scatter", CollectiveKind::ReduceScatter, group),
            InstrOp::AllReduce { group, .. }
            | InstrOp::NormAllReduce { group, .. }
            | InstrOp::FoundInfAllReduce { group, .. }
            | InstrOp::TensorAllReduce { group, .. } => {
                ("all_reduce", CollectiveKind::AllReduce, group)
            }
            InstrOp::TensorChunks {
                kind: ChunkKind::Gather,
                group,
                ..
            } => ("all_gather", CollectiveKind::AllGather, group),
            InstrOp::TensorChunks {
                kind: ChunkKind::ReduceScatter,
                group,
                ..
            } => ("reduce_scatter", CollectiveKind::ReduceScatter, group),
            _ => continue,
        };
        let (ranks, inter_node) = group_shape(plan, group);
        let (_, bytes, algo) = collective_cost(plan, cluster, ins);
        let hier = usize::from(algo == Algorithm::Hierarchical);
        let (k, m) = group_layout(plan, group);
        // A node-aware library's one call goes across on 1/k of the buffer
        // where that is its faster algorithm (`library_call`).
        let library_two_level = library_call(kind, k, m, bytes as f64, cluster).1;
        let across = match (inter_node, algo, &ins.op) {
            (false, _, _) => 0,
            (true, Algorithm::Ring, _) if library_two_level => {
                ring_bytes(m, bytes / u64::from(k.max(1)))
            }
            (true, Algorithm::Ring, _) => bytes,
            (true, Algorithm::Hierarchical, op) => {
                let (full, scale) = match op {
                    InstrOp::AllGather {
                        c: Collective { dst, dtype, .. },
                        ..
                    } => (wire_bytes(plan, *dst, *dtype), 1),
                    InstrOp::ReduceScatter {
                        c: Collective { src, dtype, .. },
                    } => (
                        wire_bytes(plan, *src, *dtype),
                        4 / dtype.size().max(1) as u64,
                    ),
                    _ => (0, 1),
                };
                ring_bytes(m, full / u64::from(k.max(1)) * scale)
            }
        };
        match out.iter_mut().find(|t| t.op == op && t.group == group) {
            Some(t) => {
                t.count += 1;
                t.bytes_sent += bytes;
                t.across_bytes += across;
                t.hierarchical += hier;
            }
            None => out.push(Traffic {
                op,
                group,
                ranks,
                inter_node,
                count: 1,
                bytes_sent: bytes,
                across_bytes: across,
                hierarchical: hier,
            }),
        }
    }
    out
}

/// What a tensor group that spans nodes costs: the bytes a rank's tensor
/// sums send across nodes per step (`traffic`) and the sums' time on the
/// cluster's links. `None` when the plan has no tensor dimension or its
/// groups lie inside a node.
pub fn tensor_across_nodes(plan: &Plan, cluster: &Cluster) -> Option<(u64, f64)> {
    if plan.geometry().t() <= 1 || !group_shape(plan, Group::Tensor).1 {
        return None;
    }
    let across = traffic(plan, cluster)
        .iter()
        .filter(|t| t.group == Group::Tensor)
        .map(|t| t.across_bytes)
        .sum();
    let secs = plan
        .instructions
        .iter()
        .filter(|i| {
            matches!(
                i.op,
                InstrOp::TensorAllReduce { .. } | InstrOp::TensorChunks { .. }
            )
        })
        .map(|i| collective_cost(plan, cluster, i).0)
        .sum();
    Some((across, secs))
}
