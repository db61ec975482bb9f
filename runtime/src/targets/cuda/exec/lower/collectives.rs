//! The collectives: all-gather (a bucket's members, then its own),
//! reshard, reduce-scatter, all-reduce, the tensor group's sums, and the
//! all-reduce of the squared gradient norm. Each is NCCL calls on the communicator of its (stream,
//! group) or, for a group of one rank without `NcclUse::Always`, the local
//! copies and conversions that replace them; mixed precision converts
//! around the call.

use super::{convert, elems, zero_uncovered, Lowering};
use crate::error::RuntimeError;
use crate::exec::resolve::{Bucketed, Region};
use crate::targets::cuda::device::{grid_for, Arg, Launch, Ptr, THREADS};
use crate::targets::cuda::exec::comms::CommIndex;
use crate::targets::cuda::exec::{Coll, Item};
use crate::targets::cuda::ops::{dt_code, Action};
use fsdpc_ir::DType;
use fsdpc_plan::{BufferId, BufferKind, Collective, Group, InstrOp, UnitId};

/// `AllGather`: the bucketed gathers it runs (`with`), then its own
/// (`own`: source, destination, parts).
pub(super) fn all_gather(
    cx: &Lowering,
    comms: &mut CommIndex,
    own: (&BufferId, &BufferId, &[(usize, usize, usize)]),
    group: Group,
    with: &[Bucketed],
    items: &mut Vec<Item>,
) {
    let (prep, l, stream) = (cx.prep, cx.l, cx.stream);
    // A bucket's gathers, then this one's: one NCCL call per part,
    // in order (not grouped into one launch here).
    let members = with
        .iter()
        .map(|(s, d, p)| (s, d, p.as_slice()))
        .chain(std::iter::once(own));
    for (src, dst, parts) in members {
        let ((_, sdt), (_, ddt)) = (elems(prep, *src), elems(prep, *dst));
        let (se, de) = (sdt.size() as u64, ddt.size() as u64);
        let size = cx.group_size(group) as u64;
        for &(shard_at, flat_at, n) in parts {
            let (from, into) = (
                l.buffer(prep, *src) + shard_at as u64 * se,
                l.buffer(prep, *dst) + flat_at as u64 * de,
            );
            if cx.use_nccl(group) {
                let comm = comms.get(stream, group);
                if sdt == ddt {
                    items.push(Item::Coll(Coll::AllGather {
                        comm,
                        send: from,
                        recv: into,
                        count: n,
                        dt: sdt,
                    }));
                } else {
                    // Mixed precision gathers the f32 shard as bf16/f16:
                    // this member's part, converted, goes to its own
                    // slot of the gathered buffer, then NCCL gathers in
                    // place (send = this member's slot).
                    let mine = into + cx.position(group) as u64 * n as u64 * de;
                    items.push(convert(from, sdt, mine, ddt, n as u64, 1.0));
                    items.push(Item::Coll(Coll::AllGather {
                        comm,
                        send: mine,
                        recv: into,
                        count: n,
                        dt: ddt,
                    }));
                }
            } else if sdt == ddt {
                items.push(Item::Act(Action::Copy {
                    src: from,
                    dst: into,
                    bytes: n as u64 * se * size,
                }));
            } else {
                items.push(convert(from, sdt, into, ddt, n as u64, 1.0));
            }
        }
    }
}

/// `Reshard`: this rank's slice of `src` copied into `dst`.
pub(super) fn reshard(
    cx: &Lowering,
    src: BufferId,
    dst: BufferId,
    group: Group,
    items: &mut Vec<Item>,
) {
    let (plan, prep, l) = (cx.prep.plan, cx.prep, cx.l);
    let len = plan.buffers[dst.index()].bytes;
    let pos = cx.position(group) as u64;
    items.push(Item::Act(Action::Copy {
        src: l.buffer(prep, src) + pos * len,
        dst: l.buffer(prep, dst),
        bytes: len,
    }));
}

/// `ReduceScatter` over the shard group, divided by world size times
/// gradient accumulation; an f32 shard reduced in bf16/f16 is rounded to
/// that dtype.
pub(super) fn reduce_scatter(
    cx: &Lowering,
    comms: &mut CommIndex,
    unit: UnitId,
    src: BufferId,
    dst: BufferId,
    items: &mut Vec<Item>,
) -> Result<(), RuntimeError> {
    let (plan, prep, l, i, stream) = (cx.prep.plan, cx.prep, cx.l, cx.i, cx.stream);
    // The members of a tensor group compute on the same samples.
    let world = cx.geometry.data_world();
    zero_uncovered(prep, unit.index(), src, l, items);
    let ((sn, sdt), (dn, ddt)) = (elems(prep, src), elems(prep, dst));
    let size = cx.group_size(Group::Shard) as u64;
    if sn != dn * size {
        return Err(cx.unsupported(
            "reduce_scatter",
            format!("{sn} elements do not scatter into {size} x {dn}"),
        ));
    }
    let div = (world * plan.config.grad_accum.max(1)) as f32;
    let (sp, dp) = (l.buffer(prep, src), l.buffer(prep, dst));
    if cx.use_nccl(Group::Shard) {
        let comm = comms.get(stream, Group::Shard);
        if sdt == ddt {
            items.push(Item::Coll(Coll::ReduceScatter {
                comm,
                send: sp,
                recv: dp,
                count: dn as usize,
                dt: sdt,
            }));
            items.push(convert(dp, ddt, dp, ddt, dn, div));
        } else {
            // NCCL reduces in the gradient's own dtype, in place
            // (into this member's slice), then widens into the shard.
            let slice = sp + cx.position(Group::Shard) as u64 * dn * sdt.size() as u64;
            items.push(Item::Coll(Coll::ReduceScatter {
                comm,
                send: sp,
                recv: slice,
                count: dn as usize,
                dt: sdt,
            }));
            items.push(convert(slice, sdt, dp, ddt, dn, div));
        }
    } else {
        items.push(convert(sp, sdt, dp, ddt, dn, div));
    }
    if let InstrOp::ReduceScatter {
        c: Collective { dtype, .. },
    } = plan.instructions[i].op
    {
        if dtype != ddt && ddt == DType::F32 && matches!(dtype, DType::Bf16 | DType::F16) {
            items.push(Item::Act(Action::Launch(Launch {
                kernel: "round_to",
                grid: (grid_for(dn), 1, 1),
                block: THREADS,
                smem: 0,
                args: vec![
                    Arg::Ptr(Ptr::Abs(dp)),
                    Arg::I32(dt_code(dtype)),
                    Arg::I64(dn as i64),
                ],
            })));
        }
    }
    Ok(())
}

/// `AllReduce` of `buffer` over `group`, then divided by `divide_by`.
pub(super) fn all_reduce(
    cx: &Lowering,
    comms: &mut CommIndex,
    unit: UnitId,
    buffer: BufferId,
    group: Group,
    divide_by: u32,
    items: &mut Vec<Item>,
) {
    let (plan, prep, l, stream) = (cx.prep.plan, cx.prep, cx.l, cx.stream);
    if plan.buffers[buffer.index()].kind == BufferKind::FlatGrads {
        zero_uncovered(prep, unit.index(), buffer, l, items);
    }
    let (n, dt) = elems(prep, buffer);
    let p = l.buffer(prep, buffer);
    if cx.use_nccl(group) {
        items.push(Item::Coll(Coll::AllReduce {
            comm: comms.get(stream, group),
            buf: p,
            count: n as usize,
            dt,
        }));
    }
    if divide_by != 1 {
        items.push(convert(p, dt, p, dt, n, divide_by as f32));
    }
}

/// `TensorAllReduce`: `src` copied into `dst`, then summed over `group`
/// (the tensor group) in place by NCCL in the value's dtype, on the
/// compute stream the instruction is on.
pub(super) fn tensor_all_reduce(
    cx: &Lowering,
    comms: &mut CommIndex,
    (src, dst): (&Region, &Region),
    dt: DType,
    group: Group,
    items: &mut Vec<Item>,
) {
    let (prep, l, stream) = (cx.prep, cx.l, cx.stream);
    let to = l.region(prep, dst);
    items.push(Item::Act(Action::Copy {
        src: l.region(prep, src),
        dst: to,
        bytes: dst.len as u64,
    }));
    if cx.use_nccl(group) {
        items.push(Item::Coll(Coll::AllReduce {
            comm: comms.get(stream, group),
            buf: to,
            count: dst.len / dt.size().max(1),
            dt,
        }));
    }
}

/// `TensorChunks`: between this member's row chunk and the whole over
/// `group` (the tensor group) on the compute stream: an NCCL all-gather or
/// reduce-scatter (counted in chunk elements), or a copy of this member's
/// chunk out of the whole.
pub(super) fn tensor_chunks(
    cx: &Lowering,
    comms: &mut CommIndex,
    kind: fsdpc_plan::ChunkKind,
    (src, dst): (&Region, &Region),
    dt: DType,
    group: Group,
    items: &mut Vec<Item>,
) {
    use fsdpc_plan::ChunkKind;
    let (prep, l, stream) = (cx.prep, cx.l, cx.stream);
    let (from, into) = (l.region(prep, src), l.region(prep, dst));
    let chunk = src.len.min(dst.len);
    let count = chunk / dt.size().max(1);
    let position = cx.geometry.tensor_position(cx.rank) as u64;
    match kind {
        ChunkKind::Split => items.push(Item::Act(Action::Copy {
            src: from + position * chunk as u64,
            dst: into,
            bytes: chunk as u64,
        })),
        // One member: the chunk is the whole.
        _ if !cx.use_nccl(group) => items.push(Item::Act(Action::Copy {
            src: from,
            dst: into,
            bytes: chunk as u64,
        })),
        ChunkKind::Gather => items.push(Item::Coll(Coll::AllGather {
            comm: comms.get(stream, group),
            send: from,
            recv: into,
            count,
            dt,
        })),
        ChunkKind::ReduceScatter => items.push(Item::Coll(Coll::ReduceScatter {
            comm: comms.get(stream, group),
            send: from,
            recv: into,
            count,
            dt,
        })),
    }
}

/// `NormAllReduce`: the f32 squared norm summed over `group`.
pub(super) fn norm_all_reduce(
    cx: &Lowering,
    comms: &mut CommIndex,
    buffer: BufferId,
    group: Group,
    items: &mut Vec<Item>,
) {
    let (prep, l, stream) = (cx.prep, cx.l, cx.stream);
    if cx.use_nccl(group) {
        items.push(Item::Coll(Coll::AllReduce {
            comm: comms.get(stream, group),
            buf: l.buffer(prep, buffer),
            count: 1,
            dt: DType::F32,
        }));
    }
}
