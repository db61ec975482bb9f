//! The schedule pass: lowers a training program to the rank-generic
//! instruction list (see `plan::InstrOp`), with the buffers it touches (their
//! arena offsets and lifetimes are left to the memory pass).
//!
//! The pass is split by decision; each module states its conventions:
//! - this module: the compute stream's order, kernels and activation buffers;
//! - `facts`: what the lowering looks up about the program (readers, gradient
//!   slots, which units a step reads);
//! - `gather`: gather windows, prefetch and the rate limiter (unshard stream);
//! - `reduce`: gradient reduction and optimizer steps (reduce stream);
//! - `offload`: what lives in host memory under `cpu_offload`, and the
//!   copies between host and device (offload and reduce streams).
//!
//! Conventions of this module (the runtime relies on them):
//! - Every non-source node runs as one `Kernel` on the compute stream, in
//!   `topo_order()`. A data input is loaded (`LoadInput`) and a constant is
//!   materialised (a `Kernel` of the `Constant` node, which copies its
//!   literal into an activation buffer) just before its first reader.
//! - A parameter value is read from its unit's gathered flat parameter (the
//!   `ShardParams` buffer under f32 `no_shard`) at byte offset
//!   `param_dtype size * flat offset`. A parameter gradient is written straight into its
//!   unit's `FlatGrads` buffer at the same offset; the loss into the
//!   persistent `Loss` buffer; every other value into its own `Activation`
//!   buffer, freed on the compute stream right after its last reader (or
//!   right after its kernel, if nothing reads it).
//! - A module buffer (a running statistic) is one persistent
//!   `ModuleBuffer` buffer, read in place by its readers' kernels; its
//!   `WriteBuffer` node becomes a `WriteBuffer` instruction on the compute
//!   stream (after the buffer's readers: they feed it). Every micro-batch
//!   reads and writes the same buffer, in order.
//! - Gradient accumulation (`grad_accum` = K > 1): the steps run K times,
//!   once per micro-batch m, each `LoadInput` and `Kernel` carrying m; every
//!   value of micro-batch m has its own buffer. Micro-batch 0 writes the
//!   loss into the `Loss` buffer, a later one into an activation buffer
//!   then `Accumulate`s it into `Loss` (the runtime divides the sum by K).
//!   Gradients: see `reduce`.
//! - Instruction groups are placed at positions relative to steps (`Pos`).
//! - The runtime synchronises all streams at the end of a step.

mod facts;
mod gather;
mod offload;
mod reduce;
mod shared;

use crate::config::FsdpConfig;
use crate::error::PlanError;
use crate::units::UnitAssignment;
use facts::Facts;
use fsdpc_ir::{DType, Graph, NodeId, Op, TrainingProgram, ValueId};
use fsdpc_plan::*;
use gather::Window;
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

/// The instruction list and its buffers, before memory planning.
#[derive(Clone, Debug, PartialEq)]
pub struct Schedule {
    pub buffers: Vec<Buffer>,
    pub instructions: Vec<Instr>,
    pub events: u32,
    pub loss: Slot,
}

/// What the schedule pass needs to know.
pub struct LowerInput<'a> {
    pub program: &'a TrainingProgram,
    pub assign: &'a UnitAssignment,
    pub units: &'a [Unit],
    pub cfg: &'a FsdpConfig,
    /// The data ranks: the world / T.
    pub world: u32,
    /// F (see `FsdpConfig::shard_factor`).
    pub shard_factor: u32,
    /// What non-root units do after forward (see `FsdpConfig::reshard`).
    pub reshard: ReshardAfterForward,
    /// Which units offload what (`cpu_offload`; see `offload`).
    pub offload: crate::offload::UnitOffload,
}

/// One step of the compute stream.
#[derive(Copy, Clone, Debug, PartialEq)]
enum Step {
    Load(NodeId),
    Kernel(NodeId),
}

impl Step {
    fn node(self) -> NodeId {
        match self {
            Step::Load(n) | Step::Kernel(n) => n,
        }
    }
}

/// Where an instruction group goes relative to step `s`: `3s` before it,
/// `3s + 1` right after its kernel, `3s + 2` after its frees.
type Pos = usize;

/// Whether parameters are read from gathered flat parameters: always when
/// sharded, and under no_shard when they are read in a half dtype (the
/// `AllGather` over a group of one rank is then the cast of the f32 shard,
/// as PyTorch's no_shard mixed precision keeps a low-precision copy).
fn gathers(cfg: &FsdpConfig) -> bool {
    cfg.strategy != Strategy::NoShard || cfg.param_dtype != DType::F32
}

/// Lowers the program to instructions.
pub fn lower(input: &LowerInput) -> Result<Schedule, PlanError> {
    let graph = &input.program.graph;
    let one = order_steps(graph)?;
    let k = input.cfg.grad_accum.max(1);
    let steps: Vec<Step> = (0..k).flat_map(|_| one.iter().copied()).collect();
    let micro: Vec<u32> = (0..k).flat_map(|m| one.iter().map(move |_| m)).collect();
    let facts = Facts::gather(input, &steps, &micro)?;
    let mut l = Lowering::new(input, steps, micro, facts);
    l.persistent_buffers();
    l.place_gathers();
    l.emit_steps()?;
    l.emit_optimizer();
    l.place_on_host();
    let loss = l.loss_slot.ok_or_else(|| PlanError::Program {
        reason: "the loss is not computed by any kernel".into(),
    })?;
    Ok(Schedule {
        buffers: l.buffers,
        instructions: l.instrs,
        events: l.events,
        loss,
    })
}

/// Non-source nodes in topological order, with each used data input and
/// constant placed just before its first reader (and a constant that is a
/// gradient but has no reader at its own position).
fn order_steps(graph: &Graph) -> Result<Vec<Step>, PlanError> {
    let order = graph.topo_order().map_err(|cycle| PlanError::Program {
        reason: format!("the graph has a cycle through {} nodes", cycle.len()),
    })?;
    let mut placed = std::collections::HashSet::new();
    let mut steps = Vec::with_capacity(order.len());
    for n in order {
        match graph.node(n).op {
            Op::Param { .. } | Op::Input { .. } | Op::ModuleBuffer { .. } => continue,
            Op::Constant { .. } => {
                if graph.users(ValueId { node: n, slot: 0 }).is_empty() && placed.insert(n) {
                    steps.push(Step::Kernel(n));
                }
                continue;
            }
            _ => {}
        }
        for v in graph.inputs(n) {
            let src = graph.node(v.node);
            match src.op {
                Op::Input { .. } if placed.insert(v.node) => steps.push(Step::Load(v.node)),
                Op::Constant { .. } if placed.insert(v.node) => steps.push(Step::Kernel(v.node)),
                _ => {}
            }
        }
        steps.push(Step::Kernel(n));
    }
    Ok(steps)
}

/// The lowering's state: the list being built.
struct Lowering<'a> {
    input: &'a LowerInput<'a>,
    graph: &'a Graph,
    steps: Vec<Step>,
    /// The micro-batch of each step.
    micro: Vec<u32>,
    /// The micro-batch being emitted.
    m: u32,
    facts: Facts,
    windows: Vec<Window>,
    /// Gathers to issue at each position, in issue order.
    hooks: BTreeMap<Pos, Vec<usize>>,
    /// Per window: the limiter event its gather waits on (a window index).
    limiter_wait: Vec<Option<usize>>,
    /// Per window: whether its gather waits for compute to reach its issue
    /// point (false where the limiter's wait is recorded at that point).
    gate: Vec<bool>,
    /// Per window: whether a limiter waits on its free.
    free_waited: Vec<bool>,
    /// Per window: the event recorded after its free.
    free_event: Vec<Option<EventId>>,
    /// Per window: its buffer and ready event, once gathered.
    gathered: Vec<Option<(BufferId, EventId)>>,
    waited: Vec<bool>,
    /// Windows ending at each step.
    window_ends: BTreeMap<usize, Vec<usize>>,
    /// The current window of each unit.
    current: Vec<Option<usize>>,
    /// Per unit: its slice kept after forward (`ReshardedParams`) and the
    /// event recorded after the copy, until backward's gather takes it.
    resharded: Vec<Option<(BufferId, EventId)>>,
    shard_params: Vec<Option<BufferId>>,
    shard_grads: Vec<Option<BufferId>>,
    opt_state: Vec<Vec<BufferId>>,
    /// Per unit: the flat gradient of the micro-batch being emitted.
    flat_grads: Vec<Option<BufferId>>,
    /// Per unit, under gradient accumulation: the buffer the micro-batches'
    /// gradients are added into when that is not `ShardGrads` (the first
    /// micro-batch's flat gradient: no_shard, or `no_sync`).
    grad_target: Vec<Option<BufferId>>,
    reduced: Vec<(UnitId, EventId)>,
    value_slot: HashMap<(u32, ValueId), Slot>,
    /// Per module buffer: its persistent `ModuleBuffer` buffer.
    module_buffers: Vec<BufferId>,
    loss_slot: Option<Slot>,
    buffers: Vec<Buffer>,
    instrs: Vec<Instr>,
    events: u32,
}

impl<'a> Lowering<'a> {
    fn new(
        input: &'a LowerInput<'a>,
        steps: Vec<Step>,
        micro: Vec<u32>,
        facts: Facts,
    ) -> Lowering<'a> {
        let graph = &input.program.graph;
        let sharded = gathers(input.cfg);
        let keep: Vec<bool> = (0..input.units.len())
            .map(|u| {
                unit_reshard(input.units, UnitId(u as u32), input.reshard)
                    == ReshardAfterForward::Keep
            })
            .collect();
        let windows = if sharded {
            gather::windows(graph, &steps, &micro, &facts.reads_units, &keep)
        } else {
            Vec::new()
        };
        let windows = if input.cfg.shared_params == SharedParams::Owner {
            let parent: Vec<Option<UnitId>> = input.assign.units.iter().map(|d| d.parent).collect();
            shared::split_windows(windows, &facts.reads_units, &parent)
        } else {
            windows
        };
        let n_units = input.units.len();
        let n_windows = windows.len();
        let mut window_ends: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (w, win) in windows.iter().enumerate() {
            window_ends.entry(win.last).or_default().push(w);
        }
        Lowering {
            input,
            graph,
            steps,
            micro,
            m: 0,
            facts,
            windows,
            hooks: BTreeMap::new(),
            limiter_wait: vec![None; n_windows],
            gate: vec![true; n_windows],
            free_waited: vec![false; n_windows],
            free_event: vec![None; n_windows],
            gathered: vec![None; n_windows],
            waited: vec![false; n_windows],
            window_ends,
            current: vec![None; n_units],
            resharded: vec![None; n_units],
            shard_params: vec![None; n_units],
            shard_grads: vec![None; n_units],
            opt_state: vec![Vec::new(); n_units],
            flat_grads: vec![None; n_units],
            grad_target: vec![None; n_units],
            reduced: Vec::new(),
            value_slot: HashMap::default(),
            module_buffers: Vec::new(),
            loss_slot: None,
            buffers: Vec::new(),
            instrs: Vec::new(),
            events: 0,
        }
    }

    fn new_buffer(
        &mut self,
        kind: BufferKind,
        unit: Option<UnitId>,
        value: Option<ValueId>,
        dtype: DType,
        bytes: u64,
    ) -> BufferId {
        Buffer::add(&mut self.buffers, kind, dtype, bytes)
            .of_unit(unit)
            .holding(value)
            .id
    }

    fn new_event(&mut self) -> EventId {
        self.events += 1;
        EventId(self.events - 1)
    }

    fn push(&mut self, stream: Stream, op: InstrOp) {
        self.instrs.push(Instr { stream, op });
    }

    fn record(&mut self, stream: Stream) -> EventId {
        let event = self.new_event();
        self.push(stream, InstrOp::Record { event });
        event
    }

    fn sharded(&self) -> bool {
        self.input.cfg.strategy != Strategy::NoShard
    }

    /// ShardParams, and for units with gradients ShardGrads (full_shard) and
    /// optimizer state, both over the trainable part of the shard only
    /// (`Unit::trainable_shard_numel`, see `flat`); all persistent.
    fn persistent_buffers(&mut self) {
        let f32 = DType::F32;
        let slots = self.input.program.optimizer.state_slots();
        for u in 0..self.input.units.len() {
            let unit = self.input.units[u].clone();
            let shard_bytes = unit.shard_numel * 4;
            let grad_shard_bytes = unit.trainable_shard_numel() * 4;
            if unit.flat_numel == 0 {
                continue;
            }
            self.shard_params[u] = Some(self.new_buffer(
                BufferKind::ShardParams,
                Some(unit.id),
                None,
                f32,
                shard_bytes,
            ));
            if self.facts.grad_done[u].is_empty() {
                continue;
            }
            if self.sharded() {
                self.shard_grads[u] = Some(self.new_buffer(
                    BufferKind::ShardGrads,
                    Some(unit.id),
                    None,
                    f32,
                    grad_shard_bytes,
                ));
            }
            for _ in 0..slots {
                let b = self.new_buffer(
                    BufferKind::OptimizerState,
                    Some(unit.id),
                    None,
                    f32,
                    grad_shard_bytes,
                );
                self.opt_state[u].push(b);
            }
        }
        for (i, spec) in self.graph.buffers.iter().enumerate() {
            let b = Buffer::add(
                &mut self.buffers,
                BufferKind::ModuleBuffer,
                spec.ty.dtype,
                spec.ty.bytes(),
            );
            b.module_buffer = Some(fsdpc_ir::ModuleBufferId(i as u32));
            let id = b.id;
            self.module_buffers.push(id);
        }
        let loss = self.input.program.loss;
        let ty = self.graph.value_type(loss).clone();
        let b = self.new_buffer(BufferKind::Loss, None, Some(loss), ty.dtype, ty.bytes());
        self.loss_slot = Some(Slot {
            buffer: b,
            offset: 0,
        });
    }

    fn emit_steps(&mut self) -> Result<(), PlanError> {
        for s in 0..self.steps.len() {
            self.m = self.micro[s];
            self.emit_hooks(s * 3);
            self.enter_windows(s);
            match self.steps[s] {
                Step::Load(n) => self.emit_load(n),
                Step::Kernel(n) => self.emit_kernel(s, n)?,
            }
            self.emit_hooks(s * 3 + 1);
            self.emit_frees(s);
            self.emit_reductions(s);
            self.emit_hooks(s * 3 + 2);
        }
        Ok(())
    }

    fn emit_load(&mut self, n: NodeId) {
        let node = self.graph.node(n);
        let Op::Input { name } = &node.op else { return };
        let v = ValueId { node: n, slot: 0 };
        let ty = self.graph.value_type(v).clone();
        let b = self.new_buffer(BufferKind::Input, None, Some(v), ty.dtype, ty.bytes());
        let dst = Slot {
            buffer: b,
            offset: 0,
        };
        self.value_slot.insert((self.m, v), dst);
        let name = name.clone();
        let micro_batch = self.m;
        self.push(
            Stream::Compute,
            InstrOp::LoadInput {
                node: n,
                name,
                dst,
                micro_batch,
            },
        );
    }

    fn emit_kernel(&mut self, s: usize, n: NodeId) -> Result<(), PlanError> {
        let inputs = self.facts.inputs[s]
            .clone()
            .into_iter()
            .map(|v| self.input_slot(v))
            .collect::<Result<Vec<Slot>, PlanError>>()?;
        let n_out = self.graph.node(n).outputs.len();
        let outputs = (0..n_out)
            .map(|slot| {
                self.output_slot(ValueId {
                    node: n,
                    slot: slot as u32,
                })
            })
            .collect::<Vec<Slot>>();
        let op = &self.graph.node(n).op;
        let instr = match (op, inputs.as_slice(), outputs.as_slice()) {
            // A tensor-parallel sum is a collective on the compute stream.
            (Op::TpReduce, [src], [dst]) => InstrOp::TensorAllReduce {
                node: n,
                src: *src,
                dst: *dst,
                group: Group::Tensor,
                micro_batch: self.m,
            },
            // Sequence parallelism's chunk moves: collectives (or a copy)
            // on the compute stream.
            (
                Op::TpGather { .. } | Op::TpReduceScatter { .. } | Op::TpSplit { .. },
                [src],
                [dst],
            ) => InstrOp::TensorChunks {
                kind: match op {
                    Op::TpGather { .. } => ChunkKind::Gather,
                    Op::TpReduceScatter { .. } => ChunkKind::ReduceScatter,
                    _ => ChunkKind::Split,
                },
                node: n,
                src: *src,
                dst: *dst,
                group: Group::Tensor,
                micro_batch: self.m,
            },
            (Op::WriteBuffer { buffer }, [src], []) => InstrOp::WriteBuffer {
                node: n,
                src: *src,
                dst: self.module_buffer(*buffer)?,
                micro_batch: self.m,
            },
            _ => InstrOp::Kernel {
                node: n,
                kernel: op.name(),
                inputs,
                outputs,
                workspace_bytes: 0,
                micro_batch: self.m,
            },
        };
        self.push(Stream::Compute, instr);
        self.accumulate_loss(n);
        Ok(())
    }

    /// After micro-batch m > 0 computed the loss (node `n`) into its own
    /// buffer: add it into the `Loss` buffer.
    fn accumulate_loss(&mut self, n: NodeId) {
        let loss = self.input.program.loss;
        if self.m == 0 || loss.node != n {
            return;
        }
        let (Some(src), Some(dst)) = (self.value_slot.get(&(self.m, loss)), self.loss_slot) else {
            return;
        };
        let src = src.buffer;
        self.push(
            Stream::Compute,
            InstrOp::Accumulate {
                unit: None,
                src,
                dst: dst.buffer,
            },
        );
    }

    fn input_slot(&self, v: ValueId) -> Result<Slot, PlanError> {
        match self.graph.node(v.node).op {
            Op::Param { param } => return self.param_slot(param.0 as usize),
            Op::ModuleBuffer { buffer } => {
                return Ok(Slot {
                    buffer: self.module_buffer(buffer)?,
                    offset: 0,
                })
            }
            _ => {}
        }
        self.value_slot
            .get(&(self.m, v))
            .copied()
            .ok_or_else(|| PlanError::Program {
                reason: format!("value {v} is read before it is computed"),
            })
    }

    fn module_buffer(&self, b: fsdpc_ir::ModuleBufferId) -> Result<BufferId, PlanError> {
        self.module_buffers
            .get(b.0 as usize)
            .copied()
            .ok_or_else(|| PlanError::Program {
                reason: format!("module buffer {} does not exist", b.0),
            })
    }

    fn param_slot(&self, p: usize) -> Result<Slot, PlanError> {
        let missing = || PlanError::Program {
            reason: format!("parameter {p} has no buffer to read from"),
        };
        let u = *self.input.assign.param_unit.get(p).ok_or_else(missing)?;
        let offset = self.facts.param_offset[p];
        let buffer = if gathers(self.input.cfg) {
            let w = self.current[u.index()].ok_or_else(missing)?;
            self.gathered[w].ok_or_else(missing)?.0
        } else {
            self.shard_params[u.index()].ok_or_else(missing)?
        };
        Ok(Slot { buffer, offset })
    }

    fn output_slot(&mut self, v: ValueId) -> Slot {
        let slot = if v == self.input.program.loss && self.m == 0 {
            self.loss_slot
        } else {
            None
        };
        let slot = slot.unwrap_or_else(|| match self.facts.grad_slot.get(&v).copied() {
            Some((u, offset)) => Slot {
                buffer: self.flat_grad(u),
                offset,
            },
            None => {
                let ty = self.graph.value_type(v).clone();
                let b =
                    self.new_buffer(BufferKind::Activation, None, Some(v), ty.dtype, ty.bytes());
                Slot {
                    buffer: b,
                    offset: 0,
                }
            }
        });
        self.value_slot.insert((self.m, v), slot);
        slot
    }

    /// Frees values last read at step `s` (and unread outputs of it), then the
    /// windows that end at `s` (`free_windows`).
    fn emit_frees(&mut self, s: usize) {
        let mut dead: Vec<ValueId> = self.facts.inputs[s]
            .iter()
            .copied()
            .filter(|v| self.facts.last_read.get(&(self.m, *v)) == Some(&s))
            .collect();
        let n = self.steps[s].node();
        let n_out = self.graph.node(n).outputs.len() as u32;
        dead.extend(
            (0..n_out)
                .map(|slot| ValueId { node: n, slot })
                .filter(|v| !self.facts.last_read.contains_key(&(self.m, *v))),
        );
        dead.sort();
        dead.dedup();
        for v in dead {
            let Some(slot) = self.value_slot.get(&(self.m, v)).copied() else {
                continue;
            };
            let kind = self.buffers[slot.buffer.index()].kind;
            if matches!(kind, BufferKind::Activation | BufferKind::Input) {
                self.push(
                    Stream::Compute,
                    InstrOp::Free {
                        buffer: slot.buffer,
                    },
                );
            }
        }
        self.free_windows(s);
    }
}
