//! The cost model: kernel time by roofline, collective time by the
//! alpha-beta model of ring algorithms. Under `cpu_offload` a host <-> device
//! copy moves its bytes at `Hardware::host_bw`, and the optimizer tail over
//! host shards (optimizer steps, clipping) runs at host memory speed
//! (`Hardware::host_mem_bw`; it is memory-bound).

use crate::cluster::Cluster;
use crate::plan::*;
use fsdpc_ir::Graph;
use serde::Serialize;

/// Floating-point operations of one kernel (forward or backward), by the
/// IR's per-op FLOP rules.
pub fn node_flops(graph: &Graph, node: fsdpc_ir::NodeId) -> f64 {
    let n = graph.node(node);
    let ins: Vec<_> = graph
        .inputs(node)
        .iter()
        .map(|v| graph.value_type(*v))
        .collect();
    fsdpc_ir::ops::flops(&n.op, &ins, &n.outputs)
}

/// Bytes a kernel moves to and from memory (inputs read once, outputs
/// written once).
pub fn node_bytes(graph: &Graph, node: fsdpc_ir::NodeId) -> f64 {
    let n = graph.node(node);
    let out: u64 = n.outputs.iter().map(|t| t.bytes()).sum();
    let ins: u64 = graph
        .inputs(node)
        .iter()
        .map(|v| graph.value_type(*v).bytes())
        .sum();
    (out + ins) as f64
}

/// Roofline time of a kernel: the slower of compute (at the peak times the
/// cluster's achievable efficiency for a kernel of this size) and memory
/// traffic.
pub fn kernel_time(flops: f64, bytes: f64, cluster: &Cluster, dtype: fsdpc_ir::DType) -> f64 {
    let hw = &cluster.hardware;
    let rate = hw.peak_flops(dtype) * hw.efficiency(flops);
    let compute = if rate > 0.0 { flops / rate } else { 0.0 };
    let memory = if hw.mem_bw > 0.0 {
        bytes / hw.mem_bw
    } else {
        0.0
    };
    compute.max(memory)
}

/// Ranks in a collective's group, and whether the group spans nodes.
pub fn group_shape(plan: &Plan, group: Group) -> (u32, bool) {
    let world = plan.cluster.world.max(1);
    let f = plan.config.shard_factor.max(1);
    let rpn = plan.cluster.ranks_per_node.max(1);
    match group {
        Group::Shard => (f, f > rpn),
        // Replicas of one shard are F ranks apart.
        Group::Replicate => (
            world / f,
            world / f > 1 && f.saturating_mul(world / f) > rpn,
        ),
        Group::Reshard => {
            let n = plan.reshard_group().map_or(f, |n| n.clamp(1, f));
            (n, n > rpn)
        }
    }
}

/// Ring all-gather or reduce-scatter of `bytes` (the full, unsharded size)
/// over `n` ranks: `(n-1) alpha + (n-1)/n bytes / beta`.
pub fn ring_time(n: u32, bytes: u64, inter_node: bool, cluster: &Cluster) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let hw = &cluster.hardware;
    let (bw, lat) = if inter_node {
        (hw.inter_bw, hw.inter_latency_s)
    } else {
        (hw.intra_bw, hw.intra_latency_s)
    };
    let steps = f64::from(n - 1);
    let transfer = if bw > 0.0 {
        steps / f64::from(n) * bytes as f64 / bw
    } else {
        0.0
    };
    steps * lat + transfer
}

/// Bytes one rank sends in a ring collective over `n` ranks.
pub fn ring_bytes(n: u32, bytes: u64) -> u64 {
    if n <= 1 {
        return 0;
    }
    bytes / u64::from(n) * u64::from(n - 1)
}

/// Bytes a collective over buffer `b` moves in `dtype` (its elements at
/// that dtype's size: a bf16 flat gradient reduced in f32 moves f32).
fn wire_bytes(plan: &Plan, b: BufferId, dtype: fsdpc_ir::DType) -> u64 {
    plan.buffers.get(b.index()).map_or(0, |buf| {
        buf.bytes / buf.dtype.size().max(1) as u64 * dtype.size() as u64
    })
}

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
        InstrOp::AllGather {
            dst, group, dtype, ..
        }
        | InstrOp::ReduceScatter {
            src: dst,
            group,
            dtype,
            ..
        } => {
            let (n, inter) = group_shape(plan, *group);
            let bytes = wire_bytes(plan, *dst, *dtype);
            (ring_time(n, bytes, inter, cluster), ring_bytes(n, bytes))
        }
        InstrOp::AllReduce {
            buffer,
            group,
            dtype,
            ..
        } => {
            let (n, inter) = group_shape(plan, *group);
            let bytes = wire_bytes(plan, *buffer, *dtype);
            (
                2.0 * ring_time(n, bytes, inter, cluster),
                2 * ring_bytes(n, bytes),
            )
        }
        InstrOp::NormAllReduce { buffer, group } | InstrOp::FoundInfAllReduce { buffer, group } => {
            // A scalar cannot be split into n ring chunks: each of the
            // 2 (n - 1) ring steps sends the whole scalar.
            let (n, inter) = group_shape(plan, *group);
            let bytes = bytes_of(buffer);
            (
                2.0 * ring_time(n, bytes, inter, cluster),
                2 * u64::from(n.saturating_sub(1)) * bytes,
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
        InstrOp::Kernel { node, .. } if plan.training.graph.contains(*node) => {
            let g = &plan.training.graph;
            let t = kernel_time(
                node_flops(g, *node),
                node_bytes(g, *node),
                cluster,
                plan.config.param_dtype,
            );
            (t, 0)
        }
        InstrOp::LoadInput { dst, .. } => (
            bytes_of(&dst.buffer) as f64 / cluster.hardware.mem_bw.max(1.0),
            0,
        ),
        InstrOp::OptimizerStep { params, state, .. } => {
            // Reads params, grads and state, writes params and state.
            let b = bytes_of(params) * (3 + 2 * state.len() as u64);
            (b as f64 / bw_at(params), 0)
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
    /// Bytes each rank sends in them per step (ring algorithms).
    pub bytes_sent: u64,
}

/// The plan's collectives per step, by operation and group, in first-use
/// order: how many bytes a rank sends inside a node and across nodes.
pub fn traffic(plan: &Plan, cluster: &Cluster) -> Vec<Traffic> {
    let mut out: Vec<Traffic> = Vec::new();
    for ins in &plan.instructions {
        let (op, group) = match ins.op {
            InstrOp::AllGather { group, .. } => ("all_gather", group),
            InstrOp::ReduceScatter { group, .. } => ("reduce_scatter", group),
            InstrOp::AllReduce { group, .. }
            | InstrOp::NormAllReduce { group, .. }
            | InstrOp::FoundInfAllReduce { group, .. } => ("all_reduce", group),
            _ => continue,
        };
        let (ranks, inter_node) = group_shape(plan, group);
        let (_, bytes) = instr_cost(plan, cluster, ins);
        match out.iter_mut().find(|t| t.op == op && t.group == group) {
            Some(t) => {
                t.count += 1;
                t.bytes_sent += bytes;
            }
            None => out.push(Traffic {
                op,
                group,
                ranks,
                inter_node,
                count: 1,
                bytes_sent: bytes,
            }),
        }
    }
    out
}
