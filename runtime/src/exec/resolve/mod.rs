//! Resolves a plan's instructions once, before any rank runs: buffer and
//! slot ids become checked byte regions, kernel operands get their types from
//! the graph, and every bound the executor relies on for memory safety is
//! verified here (regions inside their buffers, buffers inside the arena,
//! kernel outputs disjoint from each other and from the inputs): buffer
//! movements in `movement`, kernels in `kernel`, the rest here.

mod kernel;
mod movement;

use crate::error::RuntimeError;
use fsdpc_ir::{Graph, Node, NodeId, TensorType, ValueId};
use fsdpc_plan::{
    hier_gather_staging_bytes, hier_reduce_staging_bytes, hierarchical_shape, BufferId, BufferKind,
    Collective, CollectiveAlgorithm, Group, InstrOp, Location, Plan, Slot, Stream, UnitId, Wire,
};

/// `len` bytes at byte `offset` of a buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Region {
    pub buffer: BufferId,
    pub offset: usize,
    pub len: usize,
}

/// A bucketed gather's `src`, `dst` and parts (see `Step::AllGather`).
pub type Bucketed = (BufferId, BufferId, Vec<(usize, usize, usize)>);

/// One resolved instruction.
#[derive(Debug)]
pub enum Step<'p> {
    /// One all-gather per segment of the unit's flat parameter (see
    /// `Unit::segments`): `(shard element, flat element, elements per
    /// rank)`; the rank's part of the segment goes to flat element
    /// `flat + position * elements`.
    AllGather {
        src: BufferId,
        dst: BufferId,
        parts: Vec<(usize, usize, usize)>,
        group: Group,
        /// `CollectiveAlgorithm::Hierarchical`: its staging buffer (see
        /// `RankEnv::hier_all_gather`).
        hier: Option<BufferId>,
        /// The bucketed gathers whose call this one runs (`src`, `dst`,
        /// `parts` each), before its own parts, in stream order.
        with: Vec<Bucketed>,
    },
    /// A bucketed all-gather: gathered by the call of the next all-gather
    /// of its stream (its `with`); nothing at its own place.
    Bucketed,
    /// Keep this rank's slice of `src` in `dst` (`InstrOp::Reshard`).
    Reshard {
        src: BufferId,
        dst: BufferId,
        group: Group,
    },
    ReduceScatter {
        unit: UnitId,
        src: BufferId,
        dst: BufferId,
        /// `CollectiveAlgorithm::Hierarchical`: its f32 staging buffer.
        hier: Option<BufferId>,
    },
    /// A quantized all-gather over the shard group (`wire`): `parts` as for
    /// `AllGather`, the payloads in `scratch`.
    WireGather {
        src: BufferId,
        dst: BufferId,
        scratch: BufferId,
        parts: Vec<(usize, usize, usize)>,
        wire: Wire,
    },
    /// A quantized reduce-scatter over the shard group (`wire`), the
    /// payloads in `scratch`.
    WireReduceScatter {
        unit: UnitId,
        src: BufferId,
        dst: BufferId,
        scratch: BufferId,
        block: usize,
    },
    AllReduce {
        unit: UnitId,
        buffer: BufferId,
        group: Group,
        divide_by: u32,
        /// `CollectiveAlgorithm::ReduceScatterAllGather`: the staging
        /// buffer of this member's reduced slice.
        staging: Option<BufferId>,
    },
    /// `dst` = the sum of every tensor-group member's `src`
    /// (`InstrOp::TensorAllReduce`).
    TensorAllReduce {
        src: Region,
        dst: Region,
        dtype: fsdpc_ir::DType,
        group: Group,
    },
    /// Between this member's row chunk and the whole over the tensor
    /// group (`InstrOp::TensorChunks`): `src` and `dst` are the chunk and
    /// the whole, or the whole and the chunk, as `kind` says.
    TensorChunks {
        kind: fsdpc_plan::ChunkKind,
        src: Region,
        dst: Region,
        dtype: fsdpc_ir::DType,
        group: Group,
    },
    LoadInput {
        name: &'p str,
        ty: &'p TensorType,
        dst: Region,
        /// The micro-batch whose samples to load.
        micro: u32,
    },
    Kernel {
        id: NodeId,
        node: &'p Node,
        ins: Vec<(Region, &'p TensorType)>,
        outs: Vec<(Region, &'p TensorType)>,
        /// The kernel's scratch: the first `workspace_bytes` of its
        /// stream's `Workspace` buffer.
        ws: Option<Region>,
        /// The micro-batch it computes on.
        micro: u32,
    },
    /// `dst = src`: a module buffer's new value (`InstrOp::WriteBuffer`);
    /// an evaluation skips it.
    WriteBuffer {
        src: Region,
        dst: Region,
    },
    /// `dst = src`, between host and device (`InstrOp::Copy`).
    Copy {
        src: BufferId,
        dst: BufferId,
    },
    /// `dst += src` (`InstrOp::Accumulate`).
    Accumulate {
        src: BufferId,
        dst: BufferId,
    },
    Optimizer {
        /// The unit whose shard it updates (an index into `plan.units`).
        unit: usize,
        params: BufferId,
        grads: BufferId,
        state: &'p [BufferId],
        /// Skip the update when this `FoundInf` flag is nonzero.
        skip_if: Option<BufferId>,
    },
    /// A loss-scaler instruction (`scaler`).
    Scaler(super::scaler::ScalerStep<'p>),
    /// Sum of squares of `grads` (f32 buffers) into the f32 scalar `dst`;
    /// `split_only_off_first`: off tensor position 0, of the elements of
    /// split parameters only (`split_elements`).
    GradNormSq {
        grads: &'p [BufferId],
        dst: BufferId,
        split_only_off_first: bool,
    },
    /// Sum the f32 scalar `buffer` over `group`.
    NormAllReduce {
        buffer: BufferId,
        group: Group,
    },
    /// Scale `grads` by `min(1, max_norm / (sqrt(norm) + 1e-6))`.
    ClipGrads {
        norm: BufferId,
        grads: BufferId,
        max_norm: f64,
    },
    Free(BufferId),
    Record(usize),
    Wait(usize),
}

/// A plan resolved for execution; shared read-only by all ranks.
#[derive(Debug)]
pub struct Resolved<'p> {
    pub plan: &'p Plan,
    pub steps: Vec<Step<'p>>,
    /// Instruction indices of each stream, in list order.
    pub streams: Vec<(Stream, Vec<usize>)>,
    /// Per unit: element ranges of its flat gradient no `requires_grad`
    /// parameter covers (padding).
    pub uncovered: Vec<Vec<(usize, usize)>>,
    /// Per instruction index: non-persistent buffers first written there.
    pub starts: Vec<Vec<BufferId>>,
    /// The loss scalar.
    pub loss: Region,
    /// The evaluation prefix's length (`Plan::eval`), if the plan has one.
    pub eval_end: Option<usize>,
    /// The gradient-clipping norm scalar (`GradNorm`), if the plan clips.
    pub grad_norm: Option<BufferId>,
    /// Samples per rank (axis 0 of the data inputs).
    pub batch: usize,
}

fn err(i: usize, reason: String) -> RuntimeError {
    RuntimeError::plan_at(i, reason)
}

/// Resolves `plan`.
pub fn resolve(plan: &Plan) -> Result<Resolved<'_>, RuntimeError> {
    check_buffers(plan)?;
    let graph = &plan.training.graph;
    let mut steps = Vec::with_capacity(plan.instructions.len());
    for (i, ins) in plan.instructions.iter().enumerate() {
        steps.push(step(plan, graph, i, &ins.op)?);
    }
    movement::join_buckets(plan, &mut steps)?;
    let streams = Stream::ALL
        .iter()
        .map(|&s| {
            (
                s,
                plan.instructions
                    .iter()
                    .enumerate()
                    .filter(|(_, x)| x.stream == s)
                    .map(|(i, _)| i)
                    .collect(),
            )
        })
        .collect();
    let mut starts = vec![Vec::new(); plan.instructions.len()];
    for b in plan.buffers.iter().filter(|b| !b.persistent()) {
        let s = starts.get_mut(b.start as usize).ok_or_else(|| {
            RuntimeError::plan(format!(
                "buffer {} starts at instruction {} past the end",
                b.id, b.start
            ))
        })?;
        s.push(b.id);
    }
    let loss =
        region(plan, plan.loss, 4).map_err(|e| RuntimeError::plan(format!("loss slot: {e}")))?;
    Ok(Resolved {
        plan,
        steps,
        streams,
        uncovered: uncovered(plan),
        starts,
        loss,
        eval_end: match plan.eval.map(|e| e.instructions as usize) {
            Some(end) if end > plan.instructions.len() => {
                return Err(RuntimeError::plan(format!(
                    "the evaluation prefix of {end} instructions is longer than the list"
                )))
            }
            end => end,
        },
        grad_norm: plan
            .buffers
            .iter()
            .find(|b| b.kind == BufferKind::GradNorm)
            .map(|b| b.id),
        batch: batch_size(graph),
    })
}

fn check_buffers(plan: &Plan) -> Result<(), RuntimeError> {
    for (i, b) in plan.buffers.iter().enumerate() {
        if b.id.index() != i {
            return Err(RuntimeError::plan(format!(
                "buffer {} is listed at index {i}",
                b.id
            )));
        }
        let arena_bytes = match b.location {
            Location::Device => plan.memory.arena_bytes,
            Location::Host => plan.memory.host_arena_bytes,
        };
        if b.offset
            .checked_add(b.bytes)
            .is_none_or(|end| end > arena_bytes)
        {
            return Err(RuntimeError::plan(format!(
                "buffer {} ({} bytes at {}) does not fit the {:?} arena of {} bytes",
                b.id, b.bytes, b.offset, b.location, arena_bytes
            )));
        }
    }
    Ok(())
}

/// The region of `len` bytes at `slot`, checked against its buffer.
pub(super) fn region(plan: &Plan, slot: Slot, len: u64) -> Result<Region, String> {
    let b = plan
        .buffers
        .get(slot.buffer.index())
        .ok_or_else(|| format!("buffer {} does not exist", slot.buffer))?;
    if slot.offset.checked_add(len).is_none_or(|end| end > b.bytes) {
        return Err(format!(
            "{len} bytes at offset {} overflow buffer {} of {} bytes",
            slot.offset, b.id, b.bytes
        ));
    }
    Ok(Region {
        buffer: slot.buffer,
        offset: slot.offset as usize,
        len: len as usize,
    })
}

fn buffer(plan: &Plan, i: usize, id: BufferId) -> Result<BufferId, RuntimeError> {
    match plan.buffers.get(id.index()) {
        Some(_) => Ok(id),
        None => Err(err(i, format!("buffer {id} does not exist"))),
    }
}

fn event(plan: &Plan, i: usize, e: u32) -> Result<usize, RuntimeError> {
    if e >= plan.events {
        return Err(err(
            i,
            format!("event {e} out of range (the plan has {})", plan.events),
        ));
    }
    Ok(e as usize)
}

/// A `FoundInf` buffer: one f32 scalar.
fn flag(plan: &Plan, i: usize, b: BufferId) -> Result<BufferId, RuntimeError> {
    match plan.buffers.get(b.index()) {
        Some(buf) if buf.kind == BufferKind::FoundInf && buf.bytes == 4 => Ok(b),
        _ => Err(err(i, format!("buffer {b} is not a 4-byte found-inf flag"))),
    }
}

/// A `GradNorm` buffer: one f32 scalar.
fn scalar(plan: &Plan, i: usize, b: BufferId) -> Result<BufferId, RuntimeError> {
    let b = buffer(plan, i, b)?;
    let buf = &plan.buffers[b.index()];
    if buf.kind != BufferKind::GradNorm || buf.dtype != fsdpc_ir::DType::F32 || buf.bytes != 4 {
        return Err(err(
            i,
            format!("buffer {b} is not a 4-byte f32 grad-norm scalar"),
        ));
    }
    Ok(b)
}

fn unit(plan: &Plan, i: usize, u: UnitId) -> Result<UnitId, RuntimeError> {
    match plan.units.get(u.index()) {
        Some(_) => Ok(u),
        None => Err(err(i, format!("unit {u} does not exist"))),
    }
}

/// The type of graph node `node`'s first output, for instruction `i`.
fn output_type(graph: &Graph, i: usize, node: NodeId) -> Result<&TensorType, RuntimeError> {
    graph
        .try_node(node)
        .ok_or_else(|| err(i, format!("node {node} does not exist")))?
        .outputs
        .first()
        .ok_or_else(|| err(i, format!("node {node} has no output")))
}

fn step<'p>(
    plan: &'p Plan,
    graph: &'p Graph,
    i: usize,
    op: &'p InstrOp,
) -> Result<Step<'p>, RuntimeError> {
    Ok(match op {
        InstrOp::AllGather { .. }
        | InstrOp::Reshard { .. }
        | InstrOp::Copy { .. }
        | InstrOp::ReduceScatter { .. }
        | InstrOp::AllReduce { .. } => movement::step(plan, i, op)?,
        InstrOp::TensorAllReduce {
            node,
            src,
            dst,
            group,
            ..
        } => {
            let ty = output_type(graph, i, *node)?;
            Step::TensorAllReduce {
                src: region(plan, *src, ty.bytes()).map_err(|e| err(i, e))?,
                dst: region(plan, *dst, ty.bytes()).map_err(|e| err(i, e))?,
                dtype: ty.dtype,
                group: *group,
            }
        }
        InstrOp::TensorChunks {
            kind,
            node,
            src,
            dst,
            group,
            ..
        } => {
            let ty = output_type(graph, i, *node)?;
            let parts = match graph.try_node(*node).map(|n| &n.op) {
                Some(
                    fsdpc_ir::Op::TpGather { parts, .. }
                    | fsdpc_ir::Op::TpReduceScatter { parts, .. }
                    | fsdpc_ir::Op::TpSplit { parts, .. },
                ) => u64::from(*parts),
                _ => {
                    return Err(err(
                        i,
                        format!("node {node} is not a tensor-parallel chunk move"),
                    ))
                }
            };
            // A gather's output is the whole; the others' is a chunk.
            let (src_bytes, dst_bytes) = match kind {
                fsdpc_plan::ChunkKind::Gather => (ty.bytes() / parts.max(1), ty.bytes()),
                _ => (ty.bytes() * parts, ty.bytes()),
            };
            Step::TensorChunks {
                kind: *kind,
                src: region(plan, *src, src_bytes).map_err(|e| err(i, e))?,
                dst: region(plan, *dst, dst_bytes).map_err(|e| err(i, e))?,
                dtype: ty.dtype,
                group: *group,
            }
        }
        InstrOp::LoadInput {
            node,
            name,
            dst,
            micro_batch,
        } => {
            let ty = output_type(graph, i, *node)?;
            Step::LoadInput {
                name,
                ty,
                dst: region(plan, *dst, ty.bytes()).map_err(|e| err(i, e))?,
                micro: *micro_batch,
            }
        }
        InstrOp::Kernel {
            node,
            inputs,
            outputs,
            workspace_bytes,
            micro_batch,
            ..
        } => {
            let ws = kernel::workspace(plan, i, *workspace_bytes)?;
            let mut k = kernel::kernel(plan, graph, i, *node, inputs, outputs, ws)?;
            if let Step::Kernel { micro, .. } = &mut k {
                *micro = *micro_batch;
            }
            k
        }
        InstrOp::WriteBuffer { node, src, dst, .. } => {
            let spec = match graph.try_node(*node).map(|n| &n.op) {
                Some(fsdpc_ir::Op::WriteBuffer { buffer }) => graph.buffers.get(buffer.0 as usize),
                _ => None,
            }
            .ok_or_else(|| err(i, format!("node {node} writes no module buffer")))?;
            let d = buffer(plan, i, *dst)?;
            let b = &plan.buffers[d.index()];
            if b.kind != BufferKind::ModuleBuffer || b.dtype != spec.ty.dtype {
                return Err(err(
                    i,
                    format!("buffer {d} is not module buffer `{}`", spec.name),
                ));
            }
            let bytes = spec.ty.bytes();
            let dst = Slot {
                buffer: d,
                offset: 0,
            };
            Step::WriteBuffer {
                src: region(plan, *src, bytes).map_err(|e| err(i, e))?,
                dst: region(plan, dst, bytes).map_err(|e| err(i, e))?,
            }
        }
        InstrOp::Accumulate { src, dst, .. } => {
            let (s, d) = (buffer(plan, i, *src)?, buffer(plan, i, *dst)?);
            let (sb, db) = (&plan.buffers[s.index()], &plan.buffers[d.index()]);
            if s == d || sb.bytes != db.bytes || sb.dtype != db.dtype {
                return Err(err(
                    i,
                    format!(
                        "accumulate: buffers {s} and {d} must be distinct, of one size and dtype"
                    ),
                ));
            }
            Step::Accumulate { src: s, dst: d }
        }
        InstrOp::OptimizerStep {
            unit,
            params,
            grads,
            state,
            skip_if,
        } => {
            if unit.index() >= plan.units.len() {
                return Err(err(
                    i,
                    format!("optimizer step of unit {unit}, not in the plan"),
                ));
            }
            let all: Vec<BufferId> = [*params, *grads]
                .into_iter()
                .chain(state.iter().copied())
                .collect();
            for (k, b) in all.iter().enumerate() {
                buffer(plan, i, *b)?;
                if all[..k].contains(b) {
                    return Err(err(i, format!("optimizer step names buffer {b} twice")));
                }
            }
            optimizer_sizes(plan, i, *params, *grads, state)?;
            Step::Optimizer {
                unit: unit.index(),
                params: *params,
                grads: *grads,
                state,
                skip_if: match skip_if {
                    Some(b) => Some(flag(plan, i, *b)?),
                    None => None,
                },
            }
        }
        InstrOp::GradNormSq {
            grads,
            dst,
            split_only_off_first,
        } => {
            for b in grads {
                buffer(plan, i, *b)?;
                if *split_only_off_first && unit_of(plan, *b).is_none() {
                    return Err(RuntimeError::Plan {
                        instr: Some(i),
                        reason: format!("gradient buffer {b} of the norm belongs to no unit"),
                    });
                }
            }
            Step::GradNormSq {
                grads,
                dst: scalar(plan, i, *dst)?,
                split_only_off_first: *split_only_off_first,
            }
        }
        InstrOp::NormAllReduce { buffer: b, group } => Step::NormAllReduce {
            buffer: scalar(plan, i, *b)?,
            group: *group,
        },
        InstrOp::ClipGrads {
            norm,
            grads,
            max_norm,
            ..
        } => {
            if !(max_norm.is_finite() && *max_norm > 0.0) {
                return Err(err(
                    i,
                    format!("clip norm {max_norm} is not finite and > 0"),
                ));
            }
            Step::ClipGrads {
                norm: scalar(plan, i, *norm)?,
                grads: buffer(plan, i, *grads)?,
                max_norm: *max_norm,
            }
        }
        InstrOp::ScaleSeed { .. }
        | InstrOp::UnscaleGrads { .. }
        | InstrOp::FoundInfAllReduce { .. }
        | InstrOp::UpdateScale { .. } => match super::scaler::resolve(plan, graph, i, op)? {
            Some(s) => Step::Scaler(s),
            None => return Err(err(i, "not a loss-scaler instruction".into())),
        },
        InstrOp::Free { buffer: b } => Step::Free(buffer(plan, i, *b)?),
        InstrOp::Record { event: e } => Step::Record(event(plan, i, e.0)?),
        InstrOp::Wait { event: e } => Step::Wait(event(plan, i, e.0)?),
    })
}

/// The optimizer updates the first `grads` elements of `params`: the
/// gradient and every state buffer must have the same size, at most the
/// parameter shard's.
fn optimizer_sizes(
    plan: &Plan,
    i: usize,
    params: BufferId,
    grads: BufferId,
    state: &[BufferId],
) -> Result<(), RuntimeError> {
    // In elements: a half-precision gradient (no_shard mixed precision)
    // updates an f32 shard.
    let elems = |b: BufferId| {
        let b = &plan.buffers[b.index()];
        b.bytes / b.dtype.size() as u64
    };
    let g = elems(grads);
    if g > elems(params) || state.iter().any(|&s| elems(s) != g) {
        return Err(err(
            i,
            format!(
                "optimizer step: gradient buffer {grads} ({g} elements) must match every state buffer and not exceed the parameter shard {params} ({} elements)",
                elems(params)
            ),
        ));
    }
    Ok(())
}

/// Element ranges of each unit's flat gradient (its trainable segment) not
/// covered by a parameter that requires a gradient (padding).
fn uncovered(plan: &Plan) -> Vec<Vec<(usize, usize)>> {
    plan.units
        .iter()
        .map(|u| {
            let mut cov: Vec<(u64, u64)> = u
                .params
                .iter()
                .filter(|p| p.requires_grad)
                .map(|p| (p.offset, p.offset + p.numel))
                .collect();
            cov.sort();
            let mut gaps = Vec::new();
            let mut at = 0u64;
            for (s, e) in cov {
                if s > at {
                    gaps.push((at as usize, s as usize));
                }
                at = at.max(e);
            }
            if at < u.trainable_numel() {
                gaps.push((at as usize, u.trainable_numel() as usize));
            }
            gaps
        })
        .collect()
}

/// Samples per rank: axis 0 of the first data input (1 if none).
pub(crate) fn batch_size(graph: &Graph) -> usize {
    graph
        .node_ids()
        .find_map(|n| match graph.node(n).op {
            fsdpc_ir::Op::Input { .. } => graph
                .node(n)
                .outputs
                .first()
                .and_then(|t| t.shape.0.first().copied()),
            _ => None,
        })
        .unwrap_or(1)
}

/// The kind of buffer `id` (for zeroing flat gradients).
pub fn kind(plan: &Plan, id: BufferId) -> Option<BufferKind> {
    plan.buffers.get(id.index()).map(|b| b.kind)
}

/// The unit whose gradient (or parameter) buffer `b` is.
fn unit_of(plan: &Plan, b: BufferId) -> Option<&fsdpc_plan::Unit> {
    let u = plan.buffers.get(b.index())?.unit?;
    plan.units.iter().find(|x| x.id == u)
}

/// The elements of unit gradient buffer `grads`, at shard position `pos`,
/// that belong to parameters split over the tensor group, as `(first,
/// elements)` runs inside the buffer: what a rank off tensor position 0
/// counts in the gradient norm (`GradNormSq::split_only_off_first`).
pub(crate) fn split_elements(plan: &Plan, grads: BufferId, pos: usize) -> Vec<(usize, usize)> {
    let Some(unit) = unit_of(plan, grads) else {
        return Vec::new();
    };
    let len = plan
        .buffers
        .get(grads.index())
        .map_or(0, |b| (b.bytes / b.dtype.size().max(1) as u64) as usize);
    let split = |p: &fsdpc_plan::FlatParam| {
        plan.training
            .graph
            .params
            .get(p.param.0 as usize)
            .is_some_and(|s| s.tp.is_some())
    };
    unit.shard_elements_of(pos as u64, split)
        .into_iter()
        .filter_map(|(at, n)| {
            let (a, b) = (at as usize, ((at + n) as usize).min(len));
            (a < b).then_some((a, b - a))
        })
        .collect()
}
