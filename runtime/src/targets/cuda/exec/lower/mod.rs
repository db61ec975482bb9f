//! The lowering of a plan's instructions to device work (`Work`), done
//! twice before the first step: at address 0 to size each stream's
//! scratch, then at the allocation's real addresses. `lower_step` is the
//! dispatch: one arm per instruction, each calling its family's file:
//! `collectives` (all-gather, reshard, reduce-scatter, all-reduce),
//! `kernels` (graph kernels, input loads, copies), `optimizer`, and
//! `clipping` (accumulation, the gradient norm, clipping). Frees, events
//! and what the target refuses are answered here.

mod clipping;
mod collectives;
mod kernels;
mod optimizer;

pub(super) use optimizer::optimizer_launch;

use super::comms::CommIndex;
use super::{Item, NcclUse, Work};
use crate::error::RuntimeError;
use crate::exec::resolve::{Region, Resolved, Step};
use crate::targets::cuda::device::{grid_for, Arg, Launch, Ptr, THREADS};
use crate::targets::cuda::error::CudaError;
use crate::targets::cuda::ops::{dt_code, Action};
use fsdpc_ir::DType;
use fsdpc_plan::{BufferId, Group, Stream};

/// Device addresses of buffers.
pub(super) struct Layout {
    pub(super) arena: u64,
}

impl Layout {
    fn buffer(&self, prep: &Resolved, b: BufferId) -> u64 {
        self.arena + prep.plan.buffers[b.index()].offset
    }
    fn region(&self, prep: &Resolved, r: &Region) -> u64 {
        self.buffer(prep, r.buffer) + r.offset as u64
    }
}

/// What lowering instruction `i` needs besides the instruction: the plan,
/// the addresses, this rank's place in the run and its settings.
pub(super) struct Lowering<'a, 'p> {
    prep: &'a Resolved<'p>,
    i: usize,
    stream: Stream,
    l: &'a Layout,
    rank: usize,
    seed: u64,
    nccl: NcclUse,
    /// The plan's mesh on the run's world.
    geometry: fsdpc_plan::Geometry,
}

impl<'a, 'p> Lowering<'a, 'p> {
    /// Instruction `i` of `prep` at the addresses of `l`, on rank `rank`
    /// of `world`.
    fn new(
        prep: &'a Resolved<'p>,
        i: usize,
        l: &'a Layout,
        rank: usize,
        world: usize,
        seed: u64,
        nccl: NcclUse,
    ) -> Self {
        let plan = prep.plan;
        Lowering {
            prep,
            i,
            stream: plan.instructions[i].stream,
            l,
            rank,
            seed,
            nccl,
            geometry: fsdpc_plan::Geometry {
                world: world as u32,
                ..plan.geometry()
            },
        }
    }
}

impl Lowering<'_, '_> {
    fn group_size(&self, g: Group) -> usize {
        g.members(self.rank, &self.geometry).len()
    }
    fn position(&self, g: Group) -> usize {
        g.position(self.rank, &self.geometry)
    }
    fn use_nccl(&self, g: Group) -> bool {
        self.nccl == NcclUse::Always || self.group_size(g) > 1
    }
    fn unsupported(&self, what: &str, reason: String) -> RuntimeError {
        CudaError::Unsupported {
            instr: self.i,
            what: what.into(),
            reason,
        }
        .into()
    }
}

/// Lowers instruction `i`; returns its work and the scratch it needs.
#[allow(clippy::too_many_arguments)]
pub(super) fn lower_step(
    prep: &Resolved,
    i: usize,
    s: &Step,
    l: &Layout,
    rank: usize,
    world: usize,
    seed: u64,
    comms: &mut CommIndex,
    nccl: NcclUse,
) -> Result<(Work, u64), RuntimeError> {
    let cx = Lowering::new(prep, i, l, rank, world, seed, nccl);
    let mut items = Vec::new();
    let mut scratch = 0u64;
    match s {
        Step::Free(_) => return Ok((Work::Nothing, 0)),
        // Gathered by the bucket's last member (its `with`).
        Step::Bucketed => return Ok((Work::Nothing, 0)),
        Step::Record(e) => return Ok((Work::Record(*e), 0)),
        Step::Wait(e) => return Ok((Work::Wait(*e), 0)),
        Step::AllGather {
            src,
            dst,
            parts,
            group,
            with,
            ..
        } => {
            let own = (src, dst, parts.as_slice());
            collectives::all_gather(&cx, comms, own, *group, with, &mut items);
        }
        Step::Reshard { src, dst, group } => {
            collectives::reshard(&cx, *src, *dst, *group, &mut items);
        }
        Step::ReduceScatter { unit, src, dst, .. } => {
            collectives::reduce_scatter(&cx, comms, *unit, *src, *dst, &mut items)?;
        }
        Step::AllReduce {
            unit,
            buffer,
            group,
            divide_by,
            ..
        } => collectives::all_reduce(&cx, comms, *unit, *buffer, *group, *divide_by, &mut items),
        Step::TensorAllReduce {
            src,
            dst,
            dtype,
            group,
        } => collectives::tensor_all_reduce(&cx, comms, (src, dst), *dtype, *group, &mut items),
        Step::TensorChunks {
            kind,
            src,
            dst,
            dtype,
            group,
        } => collectives::tensor_chunks(
            &cx,
            comms,
            *kind,
            (src, dst),
            *dtype,
            *group,
            &mut items,
        ),
        Step::NormAllReduce { buffer, group } => {
            collectives::norm_all_reduce(&cx, comms, *buffer, *group, &mut items);
        }
        Step::LoadInput {
            name,
            ty,
            dst,
            micro,
        } => return Ok((kernels::load_input(&cx, name, ty, dst, *micro), 0)),
        Step::Kernel {
            id,
            node,
            ins,
            outs,
            ws,
            micro,
        } => {
            let lowered = kernels::kernel(&cx, *id, node, ins, outs, ws.as_ref(), *micro)?;
            scratch = lowered.scratch;
            items.extend(lowered.actions.into_iter().map(Item::Act));
        }
        Step::Copy { src, dst } => kernels::copy(&cx, *src, *dst, &mut items),
        Step::Accumulate { src, dst } => clipping::accumulate(&cx, *src, *dst, &mut items),
        Step::Optimizer {
            unit,
            params,
            grads,
            state,
            ..
        } => return Ok((optimizer::optimizer(&cx, *unit, *params, *grads, state), 0)),
        Step::GradNormSq {
            grads,
            dst,
            split_only_off_first,
        } => {
            scratch = clipping::grad_norm_sq(&cx, grads, *dst, *split_only_off_first, &mut items);
        }
        Step::ClipGrads {
            norm,
            grads,
            max_norm,
        } => clipping::clip_grads(&cx, *norm, *grads, *max_norm, &mut items),
        Step::Scaler(_) => {
            return Err(cx.unsupported(
                "loss scaler",
                "not implemented on the cuda backend".into(),
            ))
        }
        Step::WriteBuffer { src, dst } => {
            return Ok((
                Work::WriteBuffer {
                    src: cx.l.region(cx.prep, src),
                    dst: cx.l.region(cx.prep, dst),
                    bytes: src.len as u64,
                },
                0,
            ))
        }
        Step::WireGather { .. } | Step::WireReduceScatter { .. } => {
            return Err(cx.unsupported(
                "quantized collective",
                "the fp8 and int8 wire formats are not implemented on the cuda backend; compile with --allgather-wire native --reduce-scatter-wire native".into(),
            ))
        }
    }
    // A launch over nothing (grid 0) is no work.
    items.retain(|it| !matches!(it, Item::Act(Action::Launch(x)) if x.grid.0 == 0));
    Ok((Work::Device(items), scratch))
}

fn elems(prep: &Resolved, b: BufferId) -> (u64, DType) {
    let buf = &prep.plan.buffers[b.index()];
    (buf.bytes / buf.dtype.size() as u64, buf.dtype)
}

/// Zeroes of the padding of unit `u`'s flat gradient buffer `b`.
fn zero_uncovered(prep: &Resolved, u: usize, b: BufferId, l: &Layout, out: &mut Vec<Item>) {
    let buf = &prep.plan.buffers[b.index()];
    let es = buf.dtype.size() as u64;
    for &(s, e) in &prep.uncovered[u] {
        let (s, e) = (
            (s as u64 * es).min(buf.bytes),
            (e as u64 * es).min(buf.bytes),
        );
        if e > s {
            out.push(Item::Act(Action::Zero {
                ptr: Ptr::Abs(l.buffer(prep, b) + s),
                bytes: e - s,
            }));
        }
    }
}

/// `dst = src / div` in the destination's dtype (`convert_div`).
fn convert(src: u64, sdt: DType, dst: u64, ddt: DType, n: u64, div: f32) -> Item {
    Item::Act(Action::Launch(Launch {
        kernel: "convert_div",
        grid: (grid_for(n), 1, 1),
        block: THREADS,
        smem: 0,
        args: vec![
            Arg::Ptr(Ptr::Abs(src)),
            Arg::I32(dt_code(sdt)),
            Arg::Ptr(Ptr::Abs(dst)),
            Arg::I32(dt_code(ddt)),
            Arg::I64(n as i64),
            Arg::F32(div),
        ],
    }))
}
