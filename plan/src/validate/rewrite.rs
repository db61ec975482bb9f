//! Plan checks of the collective rewrites (see `rewrite`): a collective
//! names a staging buffer exactly when its algorithm needs one; the
//! algorithm is one its kind and group can run (hierarchical: a native
//! all-gather or reduce-scatter over a shard group of whole nodes; an
//! all-reduce as reduce-scatter and all-gather over a group that divides
//! it); the staging is its stream's persistent `Staging` buffer on the
//! device, at least as large as the algorithm needs, touched by no other
//! kind of instruction; no instruction names the groups internal to the
//! hierarchical algorithm; a bucketed gather is a native ring gather of a
//! persistent shard over the shard group, and the next instruction of its
//! stream other than a wait is the all-gather whose call it joins.

use super::PlanViolation;
use crate::*;

/// Appends a violation for every rewrite problem of `plan`.
pub(crate) fn check(plan: &Plan, out: &mut Vec<PlanViolation>) {
    let f = plan.config.shard_factor.max(1);
    let k = plan.cluster.ranks_per_node.max(1);
    let whole_nodes = hierarchical_shape(f, k).is_some();
    let numel = |b: BufferId| {
        plan.buffers
            .get(b.index())
            .map_or(0, |b| b.bytes / b.dtype.size().max(1) as u64)
    };
    let dtype = |b: BufferId| plan.buffers.get(b.index()).map(|b| b.dtype);
    for (i, ins) in plan.instructions.iter().enumerate() {
        let mut push = |reason: String| {
            out.push(PlanViolation::Rewrite {
                instr: i as u32,
                reason,
            })
        };
        let (group, algorithm, staging, want) = match &ins.op {
            InstrOp::AllGather {
                c:
                    Collective {
                        src,
                        dst,
                        group,
                        wire,
                        algorithm,
                        staging,
                        ..
                    },
                ..
            } => {
                if !algorithm.is_ring() && !wire.is_native() {
                    push(format!("a {} all-gather runs as one ring", wire.name()));
                }
                let want = match algorithm {
                    CollectiveAlgorithm::Hierarchical => {
                        dtype(*dst).map(|d| hier_gather_staging_bytes(numel(*src), f / k, d))
                    }
                    _ => None,
                };
                (*group, *algorithm, *staging, want)
            }
            InstrOp::ReduceScatter {
                c:
                    Collective {
                        dst,
                        group,
                        wire,
                        algorithm,
                        staging,
                        ..
                    },
            } => {
                if !algorithm.is_ring() && !wire.is_native() {
                    push(format!("a {} reduce-scatter runs as one ring", wire.name()));
                }
                let want = match algorithm {
                    CollectiveAlgorithm::Hierarchical => {
                        Some(hier_reduce_staging_bytes(numel(*dst), f / k))
                    }
                    _ => None,
                };
                (*group, *algorithm, *staging, want)
            }
            InstrOp::AllReduce {
                buffer,
                group,
                algorithm,
                staging,
                ..
            } => {
                let n = u64::from(match group {
                    Group::Shard => f,
                    _ => plan.geometry().data_world() / f,
                });
                let want = match algorithm {
                    CollectiveAlgorithm::ReduceScatterAllGather => {
                        if n < 2 || !numel(*buffer).is_multiple_of(n) {
                            push(format!(
                                "an all-reduce of {} elements cannot be scattered over {n} ranks",
                                numel(*buffer)
                            ));
                        }
                        plan.buffers.get(buffer.index()).map(|b| b.bytes / n.max(1))
                    }
                    _ => None,
                };
                (*group, *algorithm, *staging, want)
            }
            _ => continue,
        };
        if matches!(group, Group::NodeLocal | Group::CrossNode) {
            push(format!(
                "group {group:?} is internal to hierarchical collectives"
            ));
        }
        let runs = match (&ins.op, algorithm) {
            (_, CollectiveAlgorithm::Ring) => true,
            (InstrOp::AllReduce { .. }, CollectiveAlgorithm::ReduceScatterAllGather) => true,
            (
                InstrOp::AllGather { .. } | InstrOp::ReduceScatter { .. },
                CollectiveAlgorithm::Hierarchical,
            ) => group == Group::Shard && whole_nodes,
            _ => false,
        };
        if !runs {
            push(format!(
                "{algorithm:?} cannot run here (group {group:?}, F = {f}, {k} ranks per node)"
            ));
        }
        match (staging, want) {
            (None, None) => {}
            (Some(b), None) => push(format!("a {algorithm:?} collective names staging {b}")),
            (None, Some(_)) => push(format!("a {algorithm:?} collective has no staging buffer")),
            (Some(b), Some(want)) => match plan.buffers.get(b.index()) {
                Some(buf)
                    if buf.kind == BufferKind::Staging
                        && buf.bytes >= want
                        && buf.persistent()
                        && buf.stream == Some(ins.stream)
                        && buf.location == Location::Device => {}
                _ => push(format!(
                    "staging {b} must be the {:?} stream's persistent device Staging buffer of at least {want} bytes",
                    ins.stream
                )),
            },
        }
    }
    // Staging is touched only by collectives.
    for (i, ins) in plan.instructions.iter().enumerate() {
        if ins.op.is_collective() {
            continue;
        }
        for b in ins.op.reads().into_iter().chain(ins.op.writes()) {
            if plan.buffers.get(b.index()).map(|b| b.kind) == Some(BufferKind::Staging) {
                out.push(PlanViolation::Rewrite {
                    instr: i as u32,
                    reason: format!("staging buffer {b} is used outside its collective"),
                });
            }
        }
    }
    check_buckets(plan, out);
}

fn check_buckets(plan: &Plan, out: &mut Vec<PlanViolation>) {
    let ins = &plan.instructions;
    for (i, x) in ins.iter().enumerate() {
        if !matches!(x.op, InstrOp::AllGather { bucketed: true, .. }) {
            continue;
        }
        let mut push = |reason: String| {
            out.push(PlanViolation::Rewrite {
                instr: i as u32,
                reason,
            })
        };
        if bucketable_gather(&x.op, &plan.buffers).is_none() {
            push("a bucketed all-gather must be a native ring gather of a shard over the shard group".into());
            continue;
        }
        let next = ins[i + 1..]
            .iter()
            .find(|y| y.stream == x.stream && !matches!(y.op, InstrOp::Wait { .. }));
        match next {
            Some(y) if bucketable_gather(&y.op, &plan.buffers).is_some() => {}
            _ => push(format!(
                "a bucketed all-gather must be followed on the {:?} stream (waits aside) by the all-gather whose call it joins",
                x.stream
            )),
        }
    }
}
