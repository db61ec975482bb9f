//! What a collective costs, by alpha-beta models: the flat ring over the
//! group, and the hierarchical algorithm (inside each node, then across
//! nodes, knowing how the group's ranks lie on nodes: `group_layout`),
//! whichever is faster for the size, as NCCL chooses; inside a node the
//! measured times (`Hardware::collective_fits`) replace the ring formula.
//! A runtime that converts on the CPU pays for the conversions inside its
//! collectives (`conversion_time`). Bytes of a collective are the full
//! (unsharded) buffer.

use super::kernel::is_half;
use fsdpc_plan::cluster::{ring_wire_bytes, Cluster, CollectiveKind};
use fsdpc_plan::*;
use serde::Serialize;

/// Ranks in a collective's group, and whether the group spans nodes.
pub fn group_shape(plan: &Plan, group: Group) -> (u32, bool) {
    let (k, m) = group_layout(plan, group);
    (k.saturating_mul(m), m > 1)
}

/// How a group's ranks lie on nodes: `(ranks per node, nodes)`
/// (`Geometry::layout` of the plan's geometry).
pub fn group_layout(plan: &Plan, group: Group) -> (u32, u32) {
    plan.geometry().layout(group)
}

/// `group_layout` from the figures it reads: the world, F, the ranks per
/// node and the reshard group's size (if any).
pub fn layout_of(
    group: Group,
    world: u32,
    shard_factor: u32,
    ranks_per_node: u32,
    reshard: Option<u32>,
) -> (u32, u32) {
    Geometry {
        world,
        tensor: 1,
        shard_factor,
        reshard,
        ranks_per_node,
    }
    .layout(group)
}

/// Which algorithm a collective's time is for.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Algorithm {
    /// One ring over the whole group (or a measured fit inside a node).
    Ring,
    /// Inside each node, then across nodes.
    Hierarchical,
}

/// `op` over `n` ranks of one node: the measured fit for that kind and
/// size when the cluster has one, else the ring on the intra-node figures.
fn intra_time(op: CollectiveKind, n: u32, bytes: f64, cluster: &Cluster) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let hw = &cluster.hardware;
    if let Some(f) = hw.collective_fit(op, n) {
        return f.time(ring_wire_bytes(op, n, bytes));
    }
    ring_formula(op, n, bytes, hw.intra_bw, hw.intra_latency_s)
}

/// The ring formula: `(n-1)` latencies (twice for an all-reduce) plus the
/// wire bytes at `bw`.
fn ring_formula(op: CollectiveKind, n: u32, bytes: f64, bw: f64, lat: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let steps = f64::from(n - 1)
        * match op {
            CollectiveKind::AllReduce => 2.0,
            _ => 1.0,
        };
    let transfer = if bw > 0.0 {
        ring_wire_bytes(op, n, bytes) / bw
    } else {
        0.0
    };
    steps * lat + transfer
}

/// Time of collective `op` on a buffer of `bytes` (full size) over a group
/// of `per_node` ranks on each of `nodes` nodes, and the algorithm of the
/// two that is faster: the flat ring (inter-node figures once it spans
/// nodes) and the hierarchical one (`hierarchical_time`). On one node both
/// are the intra-node time. The `rewrite` pass makes this choice per
/// collective; a plan's collectives are charged for the algorithm they
/// name (`algorithm_time`).
pub fn collective_time(
    op: CollectiveKind,
    per_node: u32,
    nodes: u32,
    bytes: f64,
    cluster: &Cluster,
) -> (f64, Algorithm) {
    let ring = ring_collective_time(op, per_node, nodes, bytes, cluster);
    match hierarchical_time(op, per_node, nodes, bytes, cluster) {
        Some(hier) if hier < ring => (hier, Algorithm::Hierarchical),
        _ => (ring, Algorithm::Ring),
    }
}

/// The time of one library call of `op` (`CollectiveAlgorithm::Ring`)
/// over `per_node` ranks on each of `nodes` nodes: inside one node the
/// measured fit when the cluster has one, else the ring; across nodes the
/// flat ring where the library's rings are flat (`flat_collectives`), else
/// the better of the flat ring and a one-call hierarchical algorithm
/// (inside the node on the whole buffer, across on `1/k` of it), as a
/// node-aware library (NCCL) does.
pub fn ring_collective_time(
    op: CollectiveKind,
    per_node: u32,
    nodes: u32,
    bytes: f64,
    cluster: &Cluster,
) -> f64 {
    library_call(op, per_node, nodes, bytes, cluster).0
}

/// `ring_collective_time`, and whether the library's call goes across
/// nodes on `1/k` of the buffer (its one-call hierarchical algorithm is the
/// faster) rather than as one flat ring.
pub fn library_call(
    op: CollectiveKind,
    per_node: u32,
    nodes: u32,
    bytes: f64,
    cluster: &Cluster,
) -> (f64, bool) {
    let (k, m) = (per_node.max(1), nodes.max(1));
    if m == 1 {
        return (intra_time(op, k, bytes, cluster), false);
    }
    let hw = &cluster.hardware;
    let flat = ring_formula(op, k * m, bytes, hw.inter_bw, hw.inter_latency_s);
    if hw.flat_collectives || k == 1 {
        return (flat, false);
    }
    let slice = bytes / f64::from(k);
    let across = |o| ring_formula(o, m, slice, hw.inter_bw, hw.inter_latency_s);
    let library = match op {
        CollectiveKind::AllGather | CollectiveKind::ReduceScatter => {
            intra_time(op, k, bytes, cluster) + across(op)
        }
        CollectiveKind::AllReduce => {
            intra_time(CollectiveKind::ReduceScatter, k, bytes, cluster)
                + across(CollectiveKind::AllReduce)
                + intra_time(CollectiveKind::AllGather, k, bytes, cluster)
        }
    };
    if library < flat {
        (library, true)
    } else {
        (flat, false)
    }
}

/// The hierarchical algorithm's time, as the runtime runs it
/// (`CollectiveAlgorithm::Hierarchical`), or `None` where it does not
/// apply (one node, or one rank per node). All-gather: across the m nodes
/// on `1/k` of the buffer, then m gathers inside the node of `1/m` of it
/// each; reduce-scatter: m reductions inside the node of `1/m` each, then
/// across on `1/k` of it in f32 (`f32_scale`: f32 bytes over the buffer's;
/// 1 when it is f32); all-reduce: reduce-scatter inside, all-reduce across
/// on `1/k`, all-gather inside (the cost model's figure for a library's
/// hierarchical all-reduce; the runtime has none).
pub fn hierarchical_time(
    op: CollectiveKind,
    per_node: u32,
    nodes: u32,
    bytes: f64,
    cluster: &Cluster,
) -> Option<f64> {
    hierarchical_time_with(op, per_node, nodes, bytes, 1.0, cluster)
}

/// `hierarchical_time` with the cross-node step of a reduce-scatter moving
/// `f32_scale` times the slice's bytes (its f32 staging).
pub fn hierarchical_time_with(
    op: CollectiveKind,
    per_node: u32,
    nodes: u32,
    bytes: f64,
    f32_scale: f64,
    cluster: &Cluster,
) -> Option<f64> {
    let (k, m) = (per_node.max(1), nodes.max(1));
    if m == 1 || k == 1 {
        return None;
    }
    let hw = &cluster.hardware;
    let slice = bytes / f64::from(k);
    let across = |o, b| ring_formula(o, m, b, hw.inter_bw, hw.inter_latency_s);
    let block = bytes / f64::from(m);
    let inside = |o| f64::from(m) * intra_time(o, k, block, cluster);
    Some(match op {
        CollectiveKind::AllGather => across(op, slice) + inside(op),
        CollectiveKind::ReduceScatter => inside(op) + across(op, slice * f32_scale),
        CollectiveKind::AllReduce => {
            intra_time(CollectiveKind::ReduceScatter, k, bytes, cluster)
                + across(CollectiveKind::AllReduce, slice)
                + intra_time(CollectiveKind::AllGather, k, bytes, cluster)
        }
    })
}

/// Time of `op` run as `algorithm` over `per_node` x `nodes` ranks:
/// `Ring`, `Hierarchical` (the ring where it does not apply), or an
/// all-reduce as `ReduceScatterAllGather` (a ring reduce-scatter then a
/// ring all-gather, and the second call's launch).
pub fn algorithm_time(
    op: CollectiveKind,
    algorithm: CollectiveAlgorithm,
    per_node: u32,
    nodes: u32,
    bytes: f64,
    cluster: &Cluster,
) -> f64 {
    let ring = |o| ring_collective_time(o, per_node, nodes, bytes, cluster);
    match (algorithm, op) {
        (CollectiveAlgorithm::Hierarchical, _) => {
            hierarchical_time(op, per_node, nodes, bytes, cluster).unwrap_or_else(|| ring(op))
        }
        (CollectiveAlgorithm::ReduceScatterAllGather, CollectiveKind::AllReduce) => {
            ring(CollectiveKind::ReduceScatter)
                + ring(CollectiveKind::AllGather)
                + cluster.hardware.kernel_overhead_s
        }
        _ => ring(op),
    }
}

/// Ring all-gather or reduce-scatter of `bytes` (the full, unsharded size)
/// over `n` ranks: `(n-1) alpha + (n-1)/n bytes / beta`.
pub fn ring_time(n: u32, bytes: u64, inter_node: bool, cluster: &Cluster) -> f64 {
    let hw = &cluster.hardware;
    let (bw, lat) = if inter_node {
        (hw.inter_bw, hw.inter_latency_s)
    } else {
        (hw.intra_bw, hw.intra_latency_s)
    };
    ring_formula(CollectiveKind::AllGather, n, bytes as f64, bw, lat)
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
pub(super) fn wire_bytes(plan: &Plan, b: BufferId, dtype: fsdpc_ir::DType) -> u64 {
    plan.buffers.get(b.index()).map_or(0, |buf| {
        buf.bytes / buf.dtype.size().max(1) as u64 * dtype.size() as u64
    })
}

/// Time, bytes a rank sends (ring accounting) and the algorithm of a
/// collective instruction (the one it names: `CollectiveAlgorithm`);
/// `(0, 0, Ring)` for any other. A `bucketed` gather is charged its bytes'
/// transfer without the call's latency: the call of its bucket's last
/// member pays that once (the alpha-beta time of the bucket is the sum).
pub fn collective_cost(plan: &Plan, cluster: &Cluster, ins: &Instr) -> (f64, u64, Algorithm) {
    let bytes_of = |b: &BufferId| plan.buffers.get(b.index()).map_or(0, |b| b.bytes);
    let bucketed = matches!(ins.op, InstrOp::AllGather { bucketed: true, .. });
    let (op, group, bytes, scalar, algorithm, dtype) = match &ins.op {
        InstrOp::AllGather {
            c:
                Collective {
                    dst,
                    group,
                    dtype,
                    algorithm,
                    ..
                },
            ..
        } => (
            CollectiveKind::AllGather,
            *group,
            wire_bytes(plan, *dst, *dtype),
            false,
            *algorithm,
            *dtype,
        ),
        InstrOp::ReduceScatter {
            c:
                Collective {
                    src,
                    group,
                    dtype,
                    algorithm,
                    ..
                },
        } => (
            CollectiveKind::ReduceScatter,
            *group,
            wire_bytes(plan, *src, *dtype),
            false,
            *algorithm,
            *dtype,
        ),
        InstrOp::AllReduce {
            buffer,
            group,
            dtype,
            algorithm,
            ..
        } => (
            CollectiveKind::AllReduce,
            *group,
            wire_bytes(plan, *buffer, *dtype),
            false,
            *algorithm,
            *dtype,
        ),
        InstrOp::TensorAllReduce { node, group, .. } => {
            let ty = plan
                .training
                .graph
                .try_node(*node)
                .and_then(|n| n.outputs.first());
            let (bytes, dtype) = ty.map_or((0, fsdpc_ir::DType::F32), |t| (t.bytes(), t.dtype));
            (
                CollectiveKind::AllReduce,
                *group,
                bytes,
                false,
                CollectiveAlgorithm::Ring,
                dtype,
            )
        }
        InstrOp::TensorChunks {
            kind: kind @ (ChunkKind::Gather | ChunkKind::ReduceScatter),
            node,
            group,
            ..
        } => {
            // The whole tensor: a gather's output, a reduce-scatter's input
            // (its output, a chunk, times the parts).
            let n = plan.training.graph.try_node(*node);
            let parts = match n.map(|n| &n.op) {
                Some(fsdpc_ir::Op::TpReduceScatter { parts, .. }) => u64::from(*parts),
                _ => 1,
            };
            let ty = n.and_then(|n| n.outputs.first());
            let (bytes, dtype) =
                ty.map_or((0, fsdpc_ir::DType::F32), |t| (t.bytes() * parts, t.dtype));
            (
                match kind {
                    ChunkKind::Gather => CollectiveKind::AllGather,
                    _ => CollectiveKind::ReduceScatter,
                },
                *group,
                bytes,
                false,
                CollectiveAlgorithm::Ring,
                dtype,
            )
        }
        InstrOp::NormAllReduce { buffer, group } | InstrOp::FoundInfAllReduce { buffer, group } => {
            (
                CollectiveKind::AllReduce,
                *group,
                bytes_of(buffer),
                true,
                CollectiveAlgorithm::Ring,
                fsdpc_ir::DType::F32,
            )
        }
        _ => return (0.0, 0, Algorithm::Ring),
    };
    // A quantized collective moves its payloads (and fp8 its amaxes).
    let (bytes, amax) = crate::quantize::charged_bytes(plan, ins).unwrap_or((bytes, 0));
    let (k, m) = group_layout(plan, group);
    let n = k.saturating_mul(m);
    if amax > 0 {
        let (t0, sent0) = ring_cost_of(op, k, m, bytes, cluster);
        let (t1, sent1) = ring_cost_of(CollectiveKind::AllGather, k, m, amax, cluster);
        return (t0 + t1, sent0 + sent1, Algorithm::Ring);
    }
    if scalar {
        // A scalar cannot be split into n ring chunks: each of the
        // 2 (n - 1) ring steps sends the whole scalar (the time is the
        // latency-bound formula's).
        let t = ring_collective_time(op, k, m, bytes as f64, cluster);
        return (
            t,
            2 * u64::from(n.saturating_sub(1)) * bytes,
            Algorithm::Ring,
        );
    }
    let sent = match op {
        CollectiveKind::AllReduce => 2 * ring_bytes(n, bytes),
        _ => ring_bytes(n, bytes),
    };
    let hier = algorithm == CollectiveAlgorithm::Hierarchical && k > 1 && m > 1;
    let t = if hier && op == CollectiveKind::ReduceScatter {
        // The cross-node step moves the f32 staging.
        let scale = 4.0 / dtype.size().max(1) as f64;
        hierarchical_time_with(op, k, m, bytes as f64, scale, cluster)
            .unwrap_or_else(|| ring_collective_time(op, k, m, bytes as f64, cluster))
    } else if bucketed {
        let t = algorithm_time(op, algorithm, k, m, bytes as f64, cluster);
        (t - algorithm_time(op, algorithm, k, m, 0.0, cluster)).max(0.0)
    } else {
        algorithm_time(op, algorithm, k, m, bytes as f64, cluster)
    };
    let algo = if hier {
        Algorithm::Hierarchical
    } else {
        Algorithm::Ring
    };
    (t, sent, algo)
}

/// Time and bytes one rank sends (ring accounting) of a ring collective of
/// `bytes` over a group of `k` ranks on each of `m` nodes.
fn ring_cost_of(op: CollectiveKind, k: u32, m: u32, bytes: u64, cluster: &Cluster) -> (f64, u64) {
    let n = k.saturating_mul(m);
    let t = ring_collective_time(op, k, m, bytes as f64, cluster);
    let sent = match op {
        CollectiveKind::AllReduce => 2 * ring_bytes(n, bytes),
        _ => ring_bytes(n, bytes),
    };
    (t, sent)
}

/// Seconds a runtime that reduces and converts on the CPU
/// (`Hardware::promotion_bandwidth`; 0 elsewhere: GPUs convert at memory
/// speed inside the collective) spends converting between half precision
/// and f32 inside a native collective, at the cast rate per element: a
/// gather whose shard and gathered buffer differ in dtype converts the
/// whole gathered buffer on receipt; a reduce-scatter over n ranks widens
/// the n half-precision slices of its shard and narrows a half-precision
/// result; an all-reduce in half precision widens the n slices of its
/// part (the whole buffer) and narrows its part. Identical dtypes in f32
/// convert nothing.
pub(super) fn conversion_time(plan: &Plan, cluster: &Cluster, ins: &Instr) -> f64 {
    if cluster.hardware.promotion_bandwidth().is_none() {
        return 0.0;
    }
    let buf = |b: &BufferId| plan.buffers.get(b.index());
    let half = |d: fsdpc_ir::DType| u64::from(is_half(d));
    let numel = |b: &Buffer| b.bytes / b.dtype.size().max(1) as u64;
    let elements = match &ins.op {
        InstrOp::AllGather {
            c: Collective { src, dst, wire, .. },
            ..
        } if wire.is_native() => match (buf(src), buf(dst)) {
            (Some(s), Some(d)) if s.dtype != d.dtype && half(s.dtype) + half(d.dtype) > 0 => {
                numel(d)
            }
            _ => 0,
        },
        InstrOp::ReduceScatter {
            c:
                Collective {
                    src,
                    dst,
                    wire,
                    group,
                    ..
                },
        } if wire.is_native() => match (buf(src), buf(dst)) {
            (Some(s), Some(d)) => {
                let n = u64::from(group_shape(plan, *group).0.max(1));
                numel(d) * (n * half(s.dtype) + half(d.dtype))
            }
            _ => 0,
        },
        InstrOp::AllReduce { buffer, group, .. } => match buf(buffer) {
            Some(b) if half(b.dtype) > 0 => {
                let n = u64::from(group_shape(plan, *group).0.max(1));
                numel(b) + numel(b) / n
            }
            _ => 0,
        },
        _ => 0,
    };
    cluster.hardware.half_conversion_time(elements)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fsdpc_plan::cluster::CollectiveFit;

    /// Round figures so the formulas can be checked by hand: inside a node
    /// 100 B/s and 1 s per step, across nodes 10 B/s and 5 s per step.
    fn cluster() -> Cluster {
        let mut c = crate::preset("a100-80g-roce", 16, 8).unwrap();
        c.hardware.intra_bw = 100.0;
        c.hardware.intra_latency_s = 1.0;
        c.hardware.inter_bw = 10.0;
        c.hardware.inter_latency_s = 5.0;
        c
    }

    #[test]
    fn hierarchical_beats_the_ring_across_nodes() {
        let mut c = cluster();
        // A node-aware library's one call: inside on the whole buffer,
        // 7 x 1 + 7/8 x 800 / 100 = 14, then across on 800 / 8, 10.
        for op in [CollectiveKind::AllGather, CollectiveKind::ReduceScatter] {
            let t = ring_collective_time(op, 8, 2, 800.0, &c);
            assert!((t - 24.0).abs() < 1e-9, "{op:?}: {t}");
        }
        // A library whose rings are flat (MPI over TCP, say).
        c.hardware.flat_collectives = true;
        // Ring over 16 ranks at the inter-node figures:
        // 15 x 5 + 15/16 x 800 / 10 = 75 + 75.
        // Hierarchical, as the runtime runs it: inside (8 ranks) once per
        // node's block of 800 / 2, 2 x (7 x 1 + 7/8 x 400 / 100) = 21, and
        // across (2 nodes) on 800 / 8: 1 x 5 + 1/2 x 100 / 10 = 10.
        for op in [CollectiveKind::AllGather, CollectiveKind::ReduceScatter] {
            let (t, algo) = collective_time(op, 8, 2, 800.0, &c);
            assert_eq!(algo, Algorithm::Hierarchical);
            assert!((t - 31.0).abs() < 1e-9, "{op:?}: {t}");
            let ring = ring_formula(op, 16, 800.0, 10.0, 5.0);
            assert!((ring - 150.0).abs() < 1e-9);
        }
        // All-reduce: ring 2 x 15 x 5 + 2 x 15/16 x 800 / 10 = 300;
        // hierarchical 14 (reduce-scatter inside) + 2 x 5 + 2 x 1/2 x 100 / 10
        // (all-reduce across) + 14 (all-gather inside) = 48.
        let (t, algo) = collective_time(CollectiveKind::AllReduce, 8, 2, 800.0, &c);
        assert_eq!(algo, Algorithm::Hierarchical);
        assert!((t - 48.0).abs() < 1e-9, "{t}");
    }

    #[test]
    fn one_node_is_the_intra_ring_and_one_rank_per_node_the_flat_ring() {
        let c = cluster();
        let (t, algo) = collective_time(CollectiveKind::AllGather, 8, 1, 800.0, &c);
        assert_eq!(algo, Algorithm::Ring);
        assert!((t - 14.0).abs() < 1e-9, "{t}");
        assert_eq!(t, ring_time(8, 800, false, &c));
        // One rank per node: the hierarchical algorithm is the ring across.
        let (t, algo) = collective_time(CollectiveKind::AllGather, 1, 4, 800.0, &c);
        assert_eq!(algo, Algorithm::Ring);
        assert!((t - (3.0 * 5.0 + 0.75 * 80.0)).abs() < 1e-9, "{t}");
        // Small buffers across nodes, with a flat library: latency decides,
        // still the two levels (2 x (8 - 1) + 2 - 1 steps of latency
        // against 15 x 5).
        let mut c = c;
        c.hardware.flat_collectives = true;
        let (_, algo) = collective_time(CollectiveKind::AllGather, 8, 2, 8.0, &c);
        assert_eq!(algo, Algorithm::Hierarchical);
    }

    #[test]
    fn a_measured_fit_replaces_the_intra_ring() {
        let mut c = cluster();
        c.hardware.collective_fits.push(CollectiveFit {
            op: CollectiveKind::AllGather,
            ranks: 8,
            latency_s: 2.0,
            bw: 50.0,
            points: Vec::new(),
        });
        // 2 + 7/8 x 800 / 50.
        let (t, _) = collective_time(CollectiveKind::AllGather, 8, 1, 800.0, &c);
        assert!((t - 16.0).abs() < 1e-9, "{t}");
        // Other kinds and sizes keep the ring.
        let (t, _) = collective_time(CollectiveKind::ReduceScatter, 8, 1, 800.0, &c);
        assert!((t - 14.0).abs() < 1e-9, "{t}");
    }
}
