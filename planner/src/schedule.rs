//! Pass 3, schedule: lowers a training program to the rank-generic
//! instruction list (see `plan::InstrOp`), with the buffers it touches (their
//! arena offsets and lifetimes are left to the memory pass).
//!
//! Conventions (the runtime relies on them):
//! - Every non-source node runs as one `Kernel` on the compute stream, in
//!   `topo_order()`. A data input is loaded (`LoadInput`) and a constant is
//!   materialised (a `Kernel` of the `Constant` node, which copies its
//!   literal into an activation buffer) just before its first reader.
//! - A parameter value is read from its unit's `GatheredParams` buffer
//!   (`ShardParams` under `no_shard`) at byte offset `4 * flat offset`. A
//!   parameter gradient is written straight into its unit's `FlatGrads`
//!   buffer at the same offset; the loss into the persistent `Loss` buffer;
//!   every other value into its own `Activation` buffer, freed on the compute
//!   stream right after its last reader (or right after its kernel, if
//!   nothing reads it).
//! - full_shard: a unit is gathered once per *window*: the run of kernels of
//!   one phase that read its parameters (the root unit has one window for the
//!   whole step: it is not resharded after forward, as in PyTorch). Each
//!   window has its own `GatheredParams` buffer: `AllGather` + `Record` on the
//!   unshard stream, `Wait` on compute before the first reader, `Free` on
//!   compute after the last one.
//! - Prefetch (depth 1): a forward window's gather is issued when the
//!   previous forward window starts (what PyTorch's CPU run-ahead does); a
//!   backward window's gather follows `backward_prefetch`, where the previous
//!   window of the first backward window is the last forward one (`pre`:
//!   when the previous window starts, so the gather overlaps its gradient
//!   computation; `post`: after the previous window's last kernel and the
//!   free of its parameters; `none`: at first use).
//! - Issue points: a gather does not start before the compute stream reaches
//!   the point where it is issued. Compute `Record`s an event there and the
//!   unshard stream `Wait`s on it before the gather (left out where the
//!   limiter's wait already orders it, or before any compute instruction).
//!   Without it the unshard stream would run every gather as early as the
//!   limiter allows, whatever `backward_prefetch` says.
//! - Rate limiter: the j-th resharded window's gather waits (on the unshard
//!   stream) for the `Free` of the (j - limit)-th one, so at most `limit`
//!   resharded windows are alive at once. The root window does not count.
//!   Where a window would have to wait for a free that comes after its own
//!   first use (nested windows), the wait is left out.
//! - Gradients: after the last compute instruction that touches a unit's
//!   `FlatGrads`, compute `Record`s, the reduce stream `Wait`s and runs
//!   `ReduceScatter` (full_shard, then `Free`s the flat gradient) or an
//!   in-place `AllReduce` (no_shard), then `Record`s. After the last kernel,
//!   for each unit in reduction order: compute `Wait`s, `OptimizerStep` (and,
//!   under no_shard, `Free`s the flat gradient).
//! - The runtime synchronises all streams at the end of a step.

use crate::config::FsdpConfig;
use crate::error::PlanError;
use crate::plan::*;
use crate::units::UnitAssignment;
use fsdpc_ir::{DType, Graph, NodeId, Op, Phase, TrainingProgram, ValueId};
use std::collections::{BTreeMap, HashMap};

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
    pub world: u32,
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

/// A run of kernels that read one unit's gathered parameters.
#[derive(Clone, Debug)]
struct Window {
    unit: UnitId,
    first: usize,
    last: usize,
    phase: Phase,
    /// Counted by the rate limiter (everything but the root's window).
    limited: bool,
}

/// Where an instruction group goes relative to step `s`: `3s` before it,
/// `3s + 1` right after its kernel, `3s + 2` after its frees.
type Pos = usize;

/// Lowers the program to instructions.
pub fn lower(input: &LowerInput) -> Result<Schedule, PlanError> {
    let graph = &input.program.graph;
    let steps = order_steps(graph)?;
    let facts = Facts::gather(input, &steps)?;
    let mut l = Lowering::new(input, steps, facts);
    l.persistent_buffers();
    l.place_gathers();
    l.emit_steps()?;
    l.emit_optimizer();
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
            Op::Param { .. } | Op::Input { .. } => continue,
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

/// Facts about the program the lowering looks up.
struct Facts {
    /// Inputs of each step.
    inputs: Vec<Vec<ValueId>>,
    /// The last step reading each value.
    last_read: HashMap<ValueId, usize>,
    /// Where gradient values go: (unit, byte offset in its flat gradient).
    grad_slot: HashMap<ValueId, (UnitId, u64)>,
    /// Byte offset of each parameter in its unit's flat parameter.
    param_offset: Vec<u64>,
    /// Per unit: the last step touching its flat gradient (None: no gradient).
    grad_done: Vec<Option<usize>>,
    /// Per step: the units whose parameters it reads.
    reads_units: Vec<Vec<UnitId>>,
}

impl Facts {
    fn gather(input: &LowerInput, steps: &[Step]) -> Result<Facts, PlanError> {
        let graph = &input.program.graph;
        let inputs: Vec<Vec<ValueId>> = steps
            .iter()
            .map(|s| match s {
                Step::Load(_) => Vec::new(),
                Step::Kernel(n) => graph.inputs(*n),
            })
            .collect();
        let mut last_read = HashMap::new();
        for (i, ins) in inputs.iter().enumerate() {
            for v in ins {
                last_read.insert(*v, i);
            }
        }
        let param_offset = param_offsets(graph, input.units, input.cfg.param_dtype);
        let grad_slot = grad_slots(input, &param_offset)?;
        let grad_done = grad_done(input.units.len(), steps, &inputs, &grad_slot);
        let reads_units = inputs
            .iter()
            .map(|ins| param_units_read(graph, input.assign, ins))
            .collect();
        Ok(Facts {
            inputs,
            last_read,
            grad_slot,
            param_offset,
            grad_done,
            reads_units,
        })
    }
}

fn param_offsets(graph: &Graph, units: &[Unit], dtype: DType) -> Vec<u64> {
    let mut out = vec![0u64; graph.params.len()];
    for u in units {
        for p in &u.params {
            if let Some(o) = out.get_mut(p.param.0 as usize) {
                *o = p.offset * dtype.size() as u64;
            }
        }
    }
    out
}

fn grad_slots(
    input: &LowerInput,
    param_offset: &[u64],
) -> Result<HashMap<ValueId, (UnitId, u64)>, PlanError> {
    let graph = &input.program.graph;
    let mut out = HashMap::new();
    for g in &input.program.grads {
        let p = g.param.0 as usize;
        let bad = |reason: String| Err(PlanError::Program { reason });
        if p >= param_offset.len() || !graph.contains(g.grad.node) {
            return bad(format!(
                "gradient entry for parameter {p} refers to nothing"
            ));
        }
        if graph.node(g.grad.node).op.is_source()
            && !matches!(graph.node(g.grad.node).op, Op::Constant { .. })
        {
            return bad(format!(
                "the gradient of `{}` is not a computed value",
                graph.params[p].name
            ));
        }
        if g.grad == input.program.loss {
            return bad(format!(
                "the gradient of `{}` is the loss",
                graph.params[p].name
            ));
        }
        let slot = (input.assign.param_unit[p], param_offset[p]);
        if out.insert(g.grad, slot).is_some() {
            return bad(format!(
                "value {} is the gradient of two parameters",
                g.grad
            ));
        }
    }
    Ok(out)
}

fn grad_done(
    n_units: usize,
    steps: &[Step],
    inputs: &[Vec<ValueId>],
    grad_slot: &HashMap<ValueId, (UnitId, u64)>,
) -> Vec<Option<usize>> {
    let mut written_by: HashMap<NodeId, Vec<UnitId>> = HashMap::new();
    for (v, &(u, _)) in grad_slot {
        written_by.entry(v.node).or_default().push(u);
    }
    let mut done: Vec<Option<usize>> = vec![None; n_units];
    for (i, s) in steps.iter().enumerate() {
        let read = inputs[i]
            .iter()
            .filter_map(|v| grad_slot.get(v).map(|g| g.0));
        let written = match s {
            Step::Kernel(n) => written_by.get(n).cloned().unwrap_or_default(),
            Step::Load(_) => Vec::new(),
        };
        for u in read.chain(written) {
            if let Some(d) = done.get_mut(u.index()) {
                *d = Some(i);
            }
        }
    }
    done
}

fn param_units_read(graph: &Graph, assign: &UnitAssignment, ins: &[ValueId]) -> Vec<UnitId> {
    let mut units: Vec<UnitId> = ins
        .iter()
        .filter_map(|v| match graph.node(v.node).op {
            Op::Param { param } => assign.param_unit.get(param.0 as usize).copied(),
            _ => None,
        })
        .collect();
    units.sort();
    units.dedup();
    units
}

/// Splits each unit's reading steps into windows (runs of one phase; one
/// window for the root), in issue order (by first use).
fn windows(graph: &Graph, steps: &[Step], reads_units: &[Vec<UnitId>]) -> Vec<Window> {
    let mut open: BTreeMap<UnitId, usize> = BTreeMap::new();
    let mut out: Vec<Window> = Vec::new();
    for (i, units) in reads_units.iter().enumerate() {
        let phase = graph.node(steps[i].node()).phase;
        for &u in units {
            match open.get(&u).copied() {
                Some(w) if out[w].phase == phase || u == UnitId(0) => out[w].last = i,
                _ => {
                    open.insert(u, out.len());
                    out.push(Window {
                        unit: u,
                        first: i,
                        last: i,
                        phase,
                        limited: u != UnitId(0),
                    });
                }
            }
        }
    }
    out
}

/// The lowering's state: the list being built.
struct Lowering<'a> {
    input: &'a LowerInput<'a>,
    graph: &'a Graph,
    steps: Vec<Step>,
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
    shard_params: Vec<Option<BufferId>>,
    shard_grads: Vec<Option<BufferId>>,
    opt_state: Vec<Vec<BufferId>>,
    flat_grads: Vec<Option<BufferId>>,
    reduced: Vec<(UnitId, EventId)>,
    value_slot: HashMap<ValueId, Slot>,
    loss_slot: Option<Slot>,
    buffers: Vec<Buffer>,
    instrs: Vec<Instr>,
    events: u32,
}

impl<'a> Lowering<'a> {
    fn new(input: &'a LowerInput<'a>, steps: Vec<Step>, facts: Facts) -> Lowering<'a> {
        let graph = &input.program.graph;
        let sharded = input.cfg.strategy == Strategy::FullShard;
        let windows = if sharded {
            windows(graph, &steps, &facts.reads_units)
        } else {
            Vec::new()
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
            shard_params: vec![None; n_units],
            shard_grads: vec![None; n_units],
            opt_state: vec![Vec::new(); n_units],
            flat_grads: vec![None; n_units],
            reduced: Vec::new(),
            value_slot: HashMap::new(),
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
        let id = BufferId(self.buffers.len() as u32);
        self.buffers.push(Buffer {
            id,
            kind,
            unit,
            value,
            dtype,
            bytes,
            offset: 0,
            start: 0,
            end: None,
            stream: None,
        });
        id
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
        self.input.cfg.strategy == Strategy::FullShard
    }

    /// ShardParams, and for units with gradients ShardGrads (full_shard) and
    /// optimizer state; all persistent.
    fn persistent_buffers(&mut self) {
        let f32 = DType::F32;
        let slots = self.input.program.optimizer.state_slots();
        for u in 0..self.input.units.len() {
            let unit = self.input.units[u].clone();
            let shard_bytes = unit.shard_numel * 4;
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
            if self.facts.grad_done[u].is_none() {
                continue;
            }
            if self.sharded() {
                self.shard_grads[u] = Some(self.new_buffer(
                    BufferKind::ShardGrads,
                    Some(unit.id),
                    None,
                    f32,
                    shard_bytes,
                ));
            }
            for _ in 0..slots {
                let b = self.new_buffer(
                    BufferKind::OptimizerState,
                    Some(unit.id),
                    None,
                    f32,
                    shard_bytes,
                );
                self.opt_state[u].push(b);
            }
        }
        let loss = self.input.program.loss;
        let ty = self.graph.value_type(loss).clone();
        let b = self.new_buffer(BufferKind::Loss, None, Some(loss), ty.dtype, ty.bytes());
        self.loss_slot = Some(Slot {
            buffer: b,
            offset: 0,
        });
    }

    /// Decides where each window's gather is issued and what it waits on.
    fn place_gathers(&mut self) {
        let limit = self.input.cfg.limit_all_gathers.max(1) as usize;
        let limited: Vec<usize> = (0..self.windows.len())
            .filter(|&w| self.windows[w].limited)
            .collect();
        let mut prev_pos = 0;
        for w in 0..self.windows.len() {
            let win = &self.windows[w];
            let mut pos = self.desired_pos(w).min(win.first * 3);
            if let Some(j) = limited.iter().position(|&x| x == w).filter(|&j| j >= limit) {
                let older = limited[j - limit];
                let after_free = self.windows[older].last * 3 + 2;
                if after_free <= win.first * 3 {
                    pos = pos.max(after_free);
                    self.limiter_wait[w] = Some(older);
                }
            }
            pos = pos.max(prev_pos);
            if let Some(older) = self.limiter_wait[w] {
                self.gate[w] = pos != self.windows[older].last * 3 + 2;
            }
            prev_pos = pos;
            self.hooks.entry(pos).or_default().push(w);
        }
        for w in 0..self.windows.len() {
            if let Some(older) = self.limiter_wait[w] {
                self.free_waited[older] = true;
            }
        }
    }

    /// The prefetch position of window `w`, before the limiter.
    fn desired_pos(&self, w: usize) -> Pos {
        let win = &self.windows[w];
        let Some(prev) = w.checked_sub(1).map(|p| &self.windows[p]) else {
            return win.first * 3;
        };
        match (win.phase, self.input.cfg.backward_prefetch) {
            (Phase::Forward, _) if prev.phase != Phase::Forward => win.first * 3,
            (Phase::Forward, _) | (Phase::Backward, BackwardPrefetch::Pre) => prev.first * 3,
            (Phase::Backward, BackwardPrefetch::Post) => prev.last * 3 + 2,
            (Phase::Backward, BackwardPrefetch::None) => win.first * 3,
        }
    }

    /// Issues the gathers placed at `pos`, after their issue point on the
    /// compute stream.
    fn emit_hooks(&mut self, pos: Pos) {
        let Some(ws) = self.hooks.remove(&pos) else {
            return;
        };
        let computed = self.instrs.iter().any(|i| i.stream == Stream::Compute);
        if computed && ws.iter().any(|&w| self.gate[w]) {
            let event = self.record(Stream::Compute);
            self.push(Stream::Unshard, InstrOp::Wait { event });
        }
        for w in ws {
            self.emit_gather(w);
        }
    }

    fn emit_gather(&mut self, w: usize) {
        let u = self.windows[w].unit;
        let unit = &self.input.units[u.index()];
        let bytes = unit.padded_numel * 4;
        if let Some(event) = self.limiter_wait[w].and_then(|o| self.free_event[o]) {
            self.push(Stream::Unshard, InstrOp::Wait { event });
        }
        let Some(src) = self.shard_params[u.index()] else {
            return;
        };
        let dst = self.new_buffer(
            BufferKind::GatheredParams,
            Some(u),
            None,
            self.input.cfg.param_dtype,
            bytes,
        );
        let dtype = self.input.cfg.param_dtype;
        self.push(
            Stream::Unshard,
            InstrOp::AllGather {
                unit: u,
                src,
                dst,
                dtype,
            },
        );
        let ready = self.record(Stream::Unshard);
        self.gathered[w] = Some((dst, ready));
    }

    fn emit_steps(&mut self) -> Result<(), PlanError> {
        for s in 0..self.steps.len() {
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

    /// Makes the windows step `s` reads current, waiting for their gathers.
    fn enter_windows(&mut self, s: usize) {
        let units = self.facts.reads_units[s].clone();
        for u in units {
            let Some(w) = (0..self.windows.len()).rev().find(|&w| {
                let win = &self.windows[w];
                win.unit == u && win.first <= s && s <= win.last
            }) else {
                continue;
            };
            self.current[u.index()] = Some(w);
            if !self.waited[w] {
                self.waited[w] = true;
                if let Some((_, event)) = self.gathered[w] {
                    self.push(Stream::Compute, InstrOp::Wait { event });
                }
            }
        }
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
        self.value_slot.insert(v, dst);
        let name = name.clone();
        self.push(Stream::Compute, InstrOp::LoadInput { node: n, name, dst });
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
            .collect();
        let kernel = self.graph.node(n).op.name();
        self.push(
            Stream::Compute,
            InstrOp::Kernel {
                node: n,
                kernel,
                inputs,
                outputs,
                workspace_bytes: 0,
            },
        );
        Ok(())
    }

    fn input_slot(&self, v: ValueId) -> Result<Slot, PlanError> {
        if let Op::Param { param } = self.graph.node(v.node).op {
            return self.param_slot(param.0 as usize);
        }
        self.value_slot
            .get(&v)
            .copied()
            .ok_or_else(|| PlanError::Program {
                reason: format!("value {v} is read before it is computed"),
            })
    }

    fn param_slot(&self, p: usize) -> Result<Slot, PlanError> {
        let missing = || PlanError::Program {
            reason: format!("parameter {p} has no buffer to read from"),
        };
        let u = *self.input.assign.param_unit.get(p).ok_or_else(missing)?;
        let offset = self.facts.param_offset[p];
        let buffer = if self.sharded() {
            let w = self.current[u.index()].ok_or_else(missing)?;
            self.gathered[w].ok_or_else(missing)?.0
        } else {
            self.shard_params[u.index()].ok_or_else(missing)?
        };
        Ok(Slot { buffer, offset })
    }

    fn output_slot(&mut self, v: ValueId) -> Slot {
        let slot = if v == self.input.program.loss {
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
        self.value_slot.insert(v, slot);
        slot
    }

    fn flat_grad(&mut self, u: UnitId) -> BufferId {
        if let Some(b) = self.flat_grads[u.index()] {
            return b;
        }
        let bytes = self.input.units[u.index()].padded_numel * 4;
        let b = self.new_buffer(
            BufferKind::FlatGrads,
            Some(u),
            None,
            self.input.cfg.reduce_dtype,
            bytes,
        );
        self.flat_grads[u.index()] = Some(b);
        b
    }

    /// Frees values last read at step `s` (and unread outputs of it), then the
    /// windows that end at `s`.
    fn emit_frees(&mut self, s: usize) {
        let mut dead: Vec<ValueId> = self.facts.inputs[s]
            .iter()
            .copied()
            .filter(|v| self.facts.last_read.get(v) == Some(&s))
            .collect();
        let n = self.steps[s].node();
        let n_out = self.graph.node(n).outputs.len() as u32;
        dead.extend(
            (0..n_out)
                .map(|slot| ValueId { node: n, slot })
                .filter(|v| !self.facts.last_read.contains_key(v)),
        );
        dead.sort();
        dead.dedup();
        for v in dead {
            let Some(slot) = self.value_slot.get(&v).copied() else {
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
        for w in self.window_ends.remove(&s).unwrap_or_default() {
            let Some((buffer, _)) = self.gathered[w] else {
                continue;
            };
            self.push(Stream::Compute, InstrOp::Free { buffer });
            if self.free_waited[w] {
                self.free_event[w] = Some(self.record(Stream::Compute));
            }
        }
    }

    /// Reduces the gradients of units whose flat gradient is complete at `s`.
    fn emit_reductions(&mut self, s: usize) {
        for u in 0..self.input.units.len() {
            if self.facts.grad_done[u] != Some(s) {
                continue;
            }
            let Some(src) = self.flat_grads[u] else {
                continue;
            };
            let unit = UnitId(u as u32);
            let ready = self.record(Stream::Compute);
            self.push(Stream::Reduce, InstrOp::Wait { event: ready });
            let dtype = self.input.cfg.reduce_dtype;
            match self.shard_grads[u] {
                Some(dst) if self.sharded() => {
                    self.push(
                        Stream::Reduce,
                        InstrOp::ReduceScatter {
                            unit,
                            src,
                            dst,
                            dtype,
                        },
                    );
                    self.push(Stream::Reduce, InstrOp::Free { buffer: src });
                }
                _ => {
                    let divide_by = self.input.world;
                    let group = Group::Replicate;
                    self.push(
                        Stream::Reduce,
                        InstrOp::AllReduce {
                            unit,
                            buffer: src,
                            group,
                            divide_by,
                            dtype,
                        },
                    );
                }
            }
            let done = self.record(Stream::Reduce);
            self.reduced.push((unit, done));
        }
    }

    fn emit_optimizer(&mut self) {
        for (unit, event) in std::mem::take(&mut self.reduced) {
            let u = unit.index();
            let (Some(params), Some(flat)) = (self.shard_params[u], self.flat_grads[u]) else {
                continue;
            };
            self.push(Stream::Compute, InstrOp::Wait { event });
            let grads = if self.sharded() {
                self.shard_grads[u].unwrap_or(flat)
            } else {
                flat
            };
            let state = self.opt_state[u].clone();
            self.push(
                Stream::Compute,
                InstrOp::OptimizerStep {
                    unit,
                    params,
                    grads,
                    state,
                },
            );
            if !self.sharded() {
                self.push(Stream::Compute, InstrOp::Free { buffer: flat });
            }
        }
    }
}
