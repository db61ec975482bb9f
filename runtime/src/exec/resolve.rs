//! Resolves a plan's instructions once, before any rank runs: buffer and
//! slot ids become checked byte regions, kernel operands get their types from
//! the graph, and every bound the executor relies on for memory safety is
//! verified here (regions inside their buffers, buffers inside the arena,
//! kernel outputs disjoint from each other and from the inputs).

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
        params: BufferId,
        grads: BufferId,
        state: &'p [BufferId],
        /// Skip the update when this `FoundInf` flag is nonzero.
        skip_if: Option<BufferId>,
    },
    /// A loss-scaler instruction (`scaler`).
    Scaler(super::scaler::ScalerStep<'p>),
    /// Sum of squares of `grads` (f32 buffers) into the f32 scalar `dst`.
    GradNormSq {
        grads: &'p [BufferId],
        dst: BufferId,
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
    /// The gradient-clipping norm scalar (`GradNorm`), if the plan clips.
    pub grad_norm: Option<BufferId>,
    /// Samples per rank (axis 0 of the data inputs).
    pub batch: usize,
}

fn err(i: usize, reason: String) -> RuntimeError {
    RuntimeError::plan_at(i, reason)
}

/// Moves each bucketed gather into the call of the next all-gather of its
/// stream (waits may come between; nothing else may).
fn join_buckets(plan: &Plan, steps: &mut [Step<'_>]) -> Result<(), RuntimeError> {
    for s in Stream::ALL {
        let mut pending: Vec<(usize, Bucketed)> = Vec::new();
        for (i, ins) in plan.instructions.iter().enumerate() {
            if ins.stream != s {
                continue;
            }
            let bucketed = matches!(ins.op, InstrOp::AllGather { bucketed: true, .. });
            match &mut steps[i] {
                Step::Wait(_) => {}
                step @ Step::AllGather {
                    hier: None,
                    group: Group::Shard,
                    ..
                } if bucketed => {
                    if let Step::AllGather {
                        src, dst, parts, ..
                    } = std::mem::replace(step, Step::Bucketed)
                    {
                        pending.push((i, (src, dst, parts)));
                    }
                }
                _ if bucketed => {
                    return Err(err(
                        i,
                        "a bucketed all-gather must be a ring gather over the shard group".into(),
                    ))
                }
                Step::AllGather {
                    hier: None,
                    group: Group::Shard,
                    with,
                    ..
                } => with.extend(pending.drain(..).map(|(_, b)| b)),
                _ => {
                    if let Some(&(at, _)) = pending.first() {
                        return Err(err(
                            at,
                            format!(
                                "bucketed all-gather joins no call: instruction {i} of its stream comes before any ring all-gather over the shard group"
                            ),
                        ));
                    }
                }
            }
        }
        if let Some(&(at, _)) = pending.first() {
            return Err(err(
                at,
                "bucketed all-gather joins no call: no all-gather follows on its stream".into(),
            ));
        }
    }
    Ok(())
}

/// Resolves `plan`.
pub fn resolve(plan: &Plan) -> Result<Resolved<'_>, RuntimeError> {
    check_buffers(plan)?;
    let graph = &plan.training.graph;
    let mut steps = Vec::with_capacity(plan.instructions.len());
    for (i, ins) in plan.instructions.iter().enumerate() {
        steps.push(step(plan, graph, i, &ins.op)?);
    }
    join_buckets(plan, &mut steps)?;
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

fn step<'p>(
    plan: &'p Plan,
    graph: &'p Graph,
    i: usize,
    op: &'p InstrOp,
) -> Result<Step<'p>, RuntimeError> {
    Ok(match op {
        InstrOp::AllGather {
            c: Collective { src, dst, .. },
            ..
        }
        | InstrOp::ReduceScatter {
            c: Collective { src, dst, .. },
        } if src == dst => {
            return Err(err(
                i,
                format!("collective reads and writes the same buffer {src}"),
            ));
        }
        InstrOp::AllGather {
            c: Collective {
                wire, algorithm, ..
            },
            ..
        }
        | InstrOp::ReduceScatter {
            c: Collective {
                wire, algorithm, ..
            },
        } if !wire.is_native() => {
            if !algorithm.is_ring() {
                return Err(err(
                    i,
                    format!(
                        "a {} collective runs as one ring, not {algorithm:?}",
                        wire.name()
                    ),
                ));
            }
            wire_step(plan, i, op)?
        }
        InstrOp::AllGather {
            c:
                Collective {
                    unit: u,
                    src,
                    dst,
                    group,
                    algorithm,
                    staging,
                    ..
                },
            ..
        } => {
            let u = unit(plan, i, *u)?;
            let (src, dst) = (buffer(plan, i, *src)?, buffer(plan, i, *dst)?);
            let parts = match group {
                // A resharded slice is a contiguous piece of the whole
                // gathered flat parameter.
                Group::Reshard => vec![(0, 0, reshard_slice(plan, i, dst, src)?)],
                Group::Shard => gather_parts(plan, i, u, src, dst)?,
                g => return Err(err(i, format!("an all-gather cannot name group {g:?}"))),
            };
            let hier = match algorithm {
                CollectiveAlgorithm::Ring => None,
                CollectiveAlgorithm::Hierarchical if *group == Group::Shard => {
                    let (_, m) = hier_shape(plan, i)?;
                    let shard = plan.buffers[src.index()].bytes
                        / plan.buffers[src.index()].dtype.size().max(1) as u64;
                    let dt = plan.buffers[dst.index()].dtype;
                    let want = hier_gather_staging_bytes(shard, m as u32, dt);
                    Some(staging_of(plan, i, *staging, want, &[src, dst])?)
                }
                a => {
                    return Err(err(
                        i,
                        format!("an all-gather over {group:?} cannot run as {a:?}"),
                    ))
                }
            };
            Step::AllGather {
                src,
                dst,
                parts,
                group: *group,
                hier,
                with: Vec::new(),
            }
        }
        InstrOp::Reshard {
            unit: u,
            src,
            dst,
            group,
        } => {
            unit(plan, i, *u)?;
            let (src, dst) = (buffer(plan, i, *src)?, buffer(plan, i, *dst)?);
            if src == dst {
                return Err(err(
                    i,
                    format!("reshard reads and writes the same buffer {src}"),
                ));
            }
            reshard_slice(plan, i, src, dst)?;
            Step::Reshard {
                src,
                dst,
                group: *group,
            }
        }
        InstrOp::Copy { unit: u, src, dst } => {
            unit(plan, i, *u)?;
            let (src, dst) = (buffer(plan, i, *src)?, buffer(plan, i, *dst)?);
            let (sb, db) = (&plan.buffers[src.index()], &plan.buffers[dst.index()]);
            if src == dst || sb.bytes != db.bytes {
                return Err(err(
                    i,
                    format!(
                        "copy from buffer {src} ({} bytes) into buffer {dst} ({} bytes): needs two buffers of one size",
                        sb.bytes, db.bytes
                    ),
                ));
            }
            Step::Copy { src, dst }
        }
        InstrOp::ReduceScatter {
            c:
                Collective {
                    unit: u,
                    src,
                    dst,
                    algorithm,
                    staging,
                    ..
                },
        } => {
            let (src, dst) = (buffer(plan, i, *src)?, buffer(plan, i, *dst)?);
            let hier = match algorithm {
                CollectiveAlgorithm::Ring => None,
                CollectiveAlgorithm::Hierarchical => {
                    let (_, m) = hier_shape(plan, i)?;
                    let shard = plan.buffers[dst.index()].bytes
                        / plan.buffers[dst.index()].dtype.size().max(1) as u64;
                    let want = hier_reduce_staging_bytes(shard, m as u32);
                    Some(staging_of(plan, i, *staging, want, &[src, dst])?)
                }
                a => return Err(err(i, format!("a reduce-scatter cannot run as {a:?}"))),
            };
            Step::ReduceScatter {
                unit: unit(plan, i, *u)?,
                src,
                dst,
                hier,
            }
        }
        InstrOp::AllReduce {
            unit: u,
            buffer: b,
            group,
            divide_by,
            algorithm,
            staging,
            ..
        } => {
            if *divide_by == 0 {
                return Err(err(i, "all_reduce divides by zero".into()));
            }
            if matches!(group, Group::NodeLocal | Group::CrossNode) {
                return Err(err(i, format!("an all-reduce cannot name group {group:?}")));
            }
            let b = buffer(plan, i, *b)?;
            let staging = match algorithm {
                CollectiveAlgorithm::Ring => None,
                CollectiveAlgorithm::ReduceScatterAllGather => {
                    let n = group_size(plan, *group) as u64;
                    let bytes = plan.buffers[b.index()].bytes;
                    let esize = plan.buffers[b.index()].dtype.size().max(1) as u64;
                    if n == 0 || !(bytes / esize).is_multiple_of(n) {
                        return Err(err(
                            i,
                            format!(
                                "all-reduce of {} elements as reduce-scatter and all-gather over {n} ranks: {n} does not divide it",
                                bytes / esize
                            ),
                        ));
                    }
                    Some(staging_of(plan, i, *staging, bytes / n, &[b])?)
                }
                a => return Err(err(i, format!("an all-reduce cannot run as {a:?}"))),
            };
            Step::AllReduce {
                unit: unit(plan, i, *u)?,
                buffer: b,
                group: *group,
                divide_by: *divide_by,
                staging,
            }
        }
        InstrOp::LoadInput {
            node,
            name,
            dst,
            micro_batch,
        } => {
            let n = graph
                .try_node(*node)
                .ok_or_else(|| err(i, format!("node {node} does not exist")))?;
            let ty = n
                .outputs
                .first()
                .ok_or_else(|| err(i, format!("input node {node} has no output")))?;
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
            let ws = workspace(plan, i, *workspace_bytes)?;
            let mut k = kernel(plan, graph, i, *node, inputs, outputs, ws)?;
            if let Step::Kernel { micro, .. } = &mut k {
                *micro = *micro_batch;
            }
            k
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
            params,
            grads,
            state,
            skip_if,
            ..
        } => {
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
                params: *params,
                grads: *grads,
                state,
                skip_if: match skip_if {
                    Some(b) => Some(flag(plan, i, *b)?),
                    None => None,
                },
            }
        }
        InstrOp::GradNormSq { grads, dst } => {
            for b in grads {
                buffer(plan, i, *b)?;
            }
            Step::GradNormSq {
                grads,
                dst: scalar(plan, i, *dst)?,
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

/// The first `bytes` of the `Workspace` buffer of instruction `i`'s stream.
fn workspace(plan: &Plan, i: usize, bytes: u64) -> Result<Option<Region>, RuntimeError> {
    if bytes == 0 {
        return Ok(None);
    }
    let stream = plan.instructions[i].stream;
    let b = plan
        .buffers
        .iter()
        .find(|b| b.kind == BufferKind::Workspace && b.stream == Some(stream))
        .ok_or_else(|| {
            err(
                i,
                format!("the kernel needs {bytes} bytes of workspace and stream {stream:?} has no workspace buffer"),
            )
        })?;
    let slot = Slot {
        buffer: b.id,
        offset: 0,
    };
    region(plan, slot, bytes)
        .map(Some)
        .map_err(|e| err(i, format!("workspace: {e}")))
}

fn kernel<'p>(
    plan: &'p Plan,
    graph: &'p Graph,
    i: usize,
    id: NodeId,
    inputs: &[Slot],
    outputs: &[Slot],
    ws: Option<Region>,
) -> Result<Step<'p>, RuntimeError> {
    let node = graph
        .try_node(id)
        .ok_or_else(|| err(i, format!("node {id} does not exist")))?;
    let in_vals: Vec<ValueId> = graph.inputs(id);
    if in_vals.len() != inputs.len() || node.outputs.len() != outputs.len() {
        return Err(err(
            i,
            format!(
                "node {id} ({}) has {} inputs and {} outputs, the instruction gives {} and {}",
                node.name,
                in_vals.len(),
                node.outputs.len(),
                inputs.len(),
                outputs.len()
            ),
        ));
    }
    let mut ins = Vec::with_capacity(inputs.len());
    for (slot, v) in inputs.iter().zip(&in_vals) {
        let ty = graph
            .try_value_type(*v)
            .ok_or_else(|| err(i, format!("value {v} does not exist")))?;
        ins.push((region(plan, *slot, ty.bytes()).map_err(|e| err(i, e))?, ty));
    }
    let mut outs = Vec::with_capacity(outputs.len());
    for (slot, ty) in outputs.iter().zip(&node.outputs) {
        outs.push((region(plan, *slot, ty.bytes()).map_err(|e| err(i, e))?, ty));
    }
    for (k, (o, _)) in outs.iter().enumerate() {
        let clash = ins.iter().chain(&outs[..k]).any(|(r, _)| overlaps(r, o));
        if clash {
            return Err(err(i, format!("node {id} ({}): output {k} overlaps another operand (in-place kernels are not supported)", node.name)));
        }
    }
    Ok(Step::Kernel {
        id,
        node,
        ins,
        outs,
        ws,
        micro: 0,
    })
}

fn overlaps(a: &Region, b: &Region) -> bool {
    a.buffer == b.buffer
        && a.offset < b.offset + b.len
        && b.offset < a.offset + a.len
        && a.len > 0
        && b.len > 0
}

/// The per-segment parts of unit `u`'s all-gather from `src` into `dst`,
/// checked to lie inside both buffers (whose element size is their dtype's).
fn gather_parts(
    plan: &Plan,
    i: usize,
    u: UnitId,
    src: BufferId,
    dst: BufferId,
) -> Result<Vec<(usize, usize, usize)>, RuntimeError> {
    let unit = &plan.units[u.index()];
    let f = unit.factor();
    let elems = |b: BufferId| {
        let b = &plan.buffers[b.index()];
        b.bytes / (b.dtype.size() as u64).max(1)
    };
    let (src_n, dst_n) = (elems(src), elems(dst));
    let mut parts = Vec::new();
    let mut end = 0;
    for s in unit.segments() {
        let n = s.numel / f;
        // In flat order and disjoint: the executor splits the gathered
        // buffer into the parts' places.
        if s.flat_offset < end {
            return Err(err(
                i,
                format!(
                    "unit {u}: segment at flat element {} overlaps or precedes the one before (ending at {end})",
                    s.flat_offset
                ),
            ));
        }
        end = s.flat_offset + s.numel;
        if s.shard_offset + n > src_n || s.flat_offset + s.numel > dst_n {
            return Err(err(
                i,
                format!(
                    "unit {u}: segment at flat element {} ({} elements) does not fit the shard ({src_n}) or the gathered buffer ({dst_n})",
                    s.flat_offset, s.numel
                ),
            ));
        }
        parts.push((s.shard_offset as usize, s.flat_offset as usize, n as usize));
    }
    Ok(parts)
}

/// The shape a hierarchical collective runs on: k ranks of the shard
/// group on each of m nodes (k the ranks per node, k > 1, F = k m, m > 1).
pub fn hier_shape(plan: &Plan, i: usize) -> Result<(usize, usize), RuntimeError> {
    let (f, k) = (plan.config.shard_factor, plan.cluster.ranks_per_node);
    hierarchical_shape(f, k)
        .map(|(k, m)| (k as usize, m as usize))
        .ok_or_else(|| {
            err(
                i,
                format!(
                    "a hierarchical collective needs a shard group of whole nodes with more than one rank each: F = {f}, {k} ranks per node"
                ),
            )
        })
}

/// Members of a group of kind `g` (`Group::members`): what the ranks make
/// their communicators over.
fn group_size(plan: &Plan, g: Group) -> usize {
    g.members(0, &plan.geometry()).len()
}

/// A rewritten collective's staging buffer: named, a `Staging` buffer of
/// its own (none of `operands`) of at least `want` bytes (the collective
/// uses the first `want`).
fn staging_of(
    plan: &Plan,
    i: usize,
    staging: Option<BufferId>,
    want: u64,
    operands: &[BufferId],
) -> Result<BufferId, RuntimeError> {
    let b = staging
        .ok_or_else(|| err(i, "a rewritten collective has no staging buffer".into()))
        .and_then(|b| buffer(plan, i, b))?;
    let buf = &plan.buffers[b.index()];
    if operands.contains(&b) || buf.kind != BufferKind::Staging || buf.bytes < want {
        return Err(err(
            i,
            format!(
                "staging buffer {b} must be a Staging buffer of its own of at least {want} bytes, it is {:?} of {} bytes",
                buf.kind, buf.bytes
            ),
        ));
    }
    Ok(b)
}

/// A quantized all-gather or reduce-scatter (`wire`): over the shard
/// group, with a `Wire` scratch distinct from its operands (its size is
/// checked against the group when it runs), a float source and
/// destination; an int8 block size of at least 1; fp8 for gathers only.
fn wire_step<'p>(plan: &Plan, i: usize, op: &InstrOp) -> Result<Step<'p>, RuntimeError> {
    let (InstrOp::AllGather {
        c:
            Collective {
                unit: u,
                src,
                dst,
                group,
                wire,
                wire_buffer,
                ..
            },
        ..
    }
    | InstrOp::ReduceScatter {
        c:
            Collective {
                unit: u,
                src,
                dst,
                group,
                wire,
                wire_buffer,
                ..
            },
    }) = op
    else {
        return Err(err(i, "not a collective with a wire format".into()));
    };
    let u = unit(plan, i, *u)?;
    let (src, dst) = (buffer(plan, i, *src)?, buffer(plan, i, *dst)?);
    let scratch = wire_buffer
        .ok_or_else(|| {
            err(
                i,
                format!("a {} collective has no scratch buffer", wire.name()),
            )
        })
        .and_then(|w| buffer(plan, i, w))?;
    if *group != Group::Shard {
        return Err(err(
            i,
            format!(
                "a {} collective runs over the shard group, not {group:?}",
                wire.name()
            ),
        ));
    }
    if scratch == src || scratch == dst || kind(plan, scratch) != Some(BufferKind::Wire) {
        return Err(err(
            i,
            format!("wire scratch {scratch} must be a Wire buffer of its own"),
        ));
    }
    let dtypes = [src, dst].map(|b| plan.buffers[b.index()].dtype);
    if dtypes.iter().any(|d| !d.is_float()) {
        return Err(err(
            i,
            format!("a {} collective moves floats, not {dtypes:?}", wire.name()),
        ));
    }
    match (op, *wire) {
        (_, Wire::Int8Block { block: 0 }) => Err(err(i, "int8 block size 0".into())),
        (InstrOp::AllGather { .. }, wire) => Ok(Step::WireGather {
            src,
            dst,
            scratch,
            parts: gather_parts(plan, i, u, src, dst)?,
            wire,
        }),
        (_, Wire::Int8Block { block }) => Ok(Step::WireReduceScatter {
            unit: u,
            src,
            dst,
            scratch,
            block: block as usize,
        }),
        (_, wire) => Err(err(
            i,
            format!("a reduce-scatter cannot travel as {}", wire.name()),
        )),
    }
}

/// The elements of a resharded slice `slice` of the gathered buffer
/// `whole` (same dtype; `whole` holds `reshard_after_forward` slices).
fn reshard_slice(
    plan: &Plan,
    i: usize,
    whole: BufferId,
    slice: BufferId,
) -> Result<usize, RuntimeError> {
    let (w, s) = (&plan.buffers[whole.index()], &plan.buffers[slice.index()]);
    let n = u64::from(plan.reshard_group().unwrap_or(0));
    if n == 0 || w.dtype != s.dtype || s.bytes.checked_mul(n) != Some(w.bytes) {
        return Err(err(
            i,
            format!(
                "buffer {slice} ({} bytes of {}) is not a 1/n slice of buffer {whole} ({} bytes of {}) for the plan's reshard_after_forward",
                s.bytes, s.dtype, w.bytes, w.dtype
            ),
        ));
    }
    Ok((s.bytes / (s.dtype.size() as u64).max(1)) as usize)
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
fn batch_size(graph: &Graph) -> usize {
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
