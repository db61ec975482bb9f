//! The plan verifier: checks every invariant of a plan and reports every
//! violation with where it is (instruction index, unit, buffer), like
//! cranelift's verifier. A tampered or hand-edited plan gives errors here,
//! never a panic.
//!
//! Ordering is checked with vector clocks over the plan's streams (`hb`):
//! "A happens before B" means B's stream has seen A complete, through the
//! stream's own order or a chain of `Record`/`Wait`. Since a `Wait` may only
//! name an event recorded earlier in the list, the event graph is acyclic and
//! the list order is one deadlock-free execution. Each stream is one
//! communicator: collectives are matched across ranks by their order on
//! their stream, which is the same on every rank because the list is SPMD.

mod eval;
mod fsdp;
mod hb;
mod layout;
mod offload;
mod precision;
mod rewrite;
mod wire;

use crate::memory;
use crate::*;
use fsdpc_ir::{NodeId, ParamId};
pub use hb::Clocks;
use std::collections::HashMap;
use thiserror::Error;

/// One broken invariant, with where it is.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlanViolation {
    #[error("schema `{found}` is not `{expected}`")]
    Schema { found: String, expected: String },
    #[error("instruction {instr:?}: {what} {id} does not exist")]
    BadId {
        instr: Option<u32>,
        what: &'static str,
        id: u64,
    },
    #[error("instruction {instr}: kernel of node {node} has {found} {what} slots, the node has {expected}")]
    KernelArity {
        instr: u32,
        node: NodeId,
        what: &'static str,
        expected: usize,
        found: usize,
    },
    #[error("instruction {instr}: slot at byte {offset} + {bytes} bytes lies outside buffer {buffer} ({buffer_bytes} bytes)")]
    SlotOutOfBounds {
        instr: u32,
        buffer: BufferId,
        offset: u64,
        bytes: u64,
        buffer_bytes: u64,
    },
    #[error("instruction {instr}: event {event} is recorded a second time")]
    EventRecordedTwice { instr: u32, event: EventId },
    #[error("event {event} is never recorded")]
    EventNeverRecorded { event: EventId },
    #[error("instruction {instr}: waits on event {event} before it is recorded")]
    WaitBeforeRecord { instr: u32, event: EventId },
    #[error("instruction {instr}: buffer {buffer} is freed twice")]
    DoubleFree { instr: u32, buffer: BufferId },
    #[error("instruction {instr}: persistent buffer {buffer} is freed")]
    FreePersistent { instr: u32, buffer: BufferId },
    #[error("buffer {buffer} is never freed")]
    NeverFreed { buffer: BufferId },
    #[error("instruction {instr}: reads buffer {buffer} after its free")]
    UseAfterFree { instr: u32, buffer: BufferId },
    #[error("instruction {instr}: writes buffer {buffer} after its free")]
    WriteAfterFree { instr: u32, buffer: BufferId },
    #[error("instruction {instr}: node {node} reads unit {unit}'s parameters, which no all-gather has gathered")]
    MissingAllGather {
        instr: u32,
        unit: UnitId,
        node: NodeId,
    },
    #[error("instruction {instr}: node {node} reads unit {unit}'s parameters before their all-gather (instruction {gather}) has completed")]
    GatherNotAwaited {
        instr: u32,
        unit: UnitId,
        node: NodeId,
        gather: u32,
    },
    #[error("instruction {instr}: reads buffer {buffer}, which nothing has written")]
    ReadUninitialized { instr: u32, buffer: BufferId },
    #[error("instruction {instr}: reads buffer {buffer} without waiting for its write at instruction {write}")]
    ReadBeforeWrite {
        instr: u32,
        buffer: BufferId,
        write: u32,
    },
    #[error(
        "instruction {instr}: writes buffer {buffer} while instruction {other} may still access it"
    )]
    UnorderedAccess {
        instr: u32,
        buffer: BufferId,
        other: u32,
    },
    #[error(
        "instruction {free}: frees buffer {buffer} while instruction {access} may still access it"
    )]
    UnorderedFree {
        free: u32,
        buffer: BufferId,
        access: u32,
    },
    #[error("buffer {buffer}: planned lifetime [{planned_start}, {planned_end:?}] but the instructions give [{actual_start}, {actual_end:?}]")]
    Lifetime {
        buffer: BufferId,
        planned_start: u32,
        planned_end: Option<u32>,
        actual_start: u32,
        actual_end: Option<u32>,
    },
    #[error("instruction {instr}: buffer {buffer} should be {expected}")]
    WrongBuffer {
        instr: u32,
        buffer: BufferId,
        expected: String,
    },
    #[error("unit {unit}: the gradient of parameter {param:?} is not written into the unit's flat gradient")]
    GradientNotWritten { unit: UnitId, param: ParamId },
    #[error("unit {unit}: gradients are never reduced")]
    GradientNotReduced { unit: UnitId },
    #[error("instruction {instr}: unit {unit}'s gradients are reduced a second time")]
    GradientReducedTwice { instr: u32, unit: UnitId },
    #[error("unit {unit}: no optimizer step")]
    MissingOptimizerStep { unit: UnitId },
    #[error("instruction {instr}: unit {unit}'s optimizer step does not follow the reduction of its gradients")]
    OptimizerReadsUnreduced { instr: u32, unit: UnitId },
    #[error("instruction {instr}: gradient clipping: {reason}")]
    Clipping { instr: u32, reason: String },
    #[error("mixed precision (instruction {instr:?}): {reason}")]
    Precision { instr: Option<u32>, reason: String },
    #[error("instruction {instr}: {reason}")]
    CollectiveOrder {
        instr: u32,
        stream: Stream,
        unit: UnitId,
        reason: String,
    },
    #[error("buffers {a} and {b} are live at the same time and overlap in the arena")]
    ArenaOverlap { a: BufferId, b: BufferId },
    #[error("buffer {b} reuses the arena bytes of buffer {a}, but {a}'s free does not happen before {b}'s first write")]
    ArenaReuseUnordered { a: BufferId, b: BufferId },
    #[error("buffer {buffer} ends at byte {end}, beyond the arena ({arena_bytes} bytes)")]
    OutsideArena {
        buffer: BufferId,
        end: u64,
        arena_bytes: u64,
    },
    #[error("unit {unit}: flat layout: {reason}")]
    Layout { unit: UnitId, reason: String },
    #[error("buffer {buffer} ({kind:?} of unit {unit}) holds {bytes} bytes, the layout gives {expected} (and never 0)")]
    BufferSize {
        buffer: BufferId,
        unit: UnitId,
        kind: BufferKind,
        bytes: u64,
        expected: u64,
    },
    #[error("instruction {instr}: buffer {buffer} is in host memory, which only copies and the optimizer reach (cpu offload)")]
    HostAccess { instr: u32, buffer: BufferId },
    #[error("cpu offload (instruction {instr:?}): {reason}")]
    Offload { instr: Option<u32>, reason: String },
    #[error("wire format (instruction {instr}): {reason}")]
    Wire { instr: u32, reason: String },
    #[error("collective rewrite (instruction {instr}): {reason}")]
    Rewrite { instr: u32, reason: String },
    #[error("evaluation pass (instruction {instr:?}): {reason}")]
    Eval { instr: Option<u32>, reason: String },
    #[error("planned peak {planned} bytes, the buffers' lifetimes give {recomputed}")]
    PeakMismatch { planned: u64, recomputed: u64 },
    #[error(transparent)]
    Optimizer(#[from] fsdpc_ir::BadHyperparameter),
}

impl Plan {
    /// Checks every invariant; returns every violation found.
    pub fn validate(&self) -> Result<(), Vec<PlanViolation>> {
        let mut c = Checker {
            plan: self,
            out: Vec::new(),
        };
        c.schema();
        if let Err(e) = self.training.optimizer.check() {
            c.push(e.into());
        }
        if c.ids() {
            let clocks = Clocks::new(&self.instructions, self.events);
            c.events();
            c.slots();
            c.accesses(&clocks);
            c.lifetimes_and_peak();
            let mut f = fsdp::FsdpChecks {
                plan: self,
                out: &mut c.out,
            };
            f.gradients(&clocks);
            f.clipping(&clocks);
            f.collectives();
            f.arena(&clocks);
            precision::check(self, &clocks, &mut c.out);
            layout::check(self, &mut c.out);
            self::offload::check(self, &clocks, &mut c.out);
            wire::check(self, &mut c.out);
            eval::check(self, &mut c.out);
        }
        rewrite::check(self, &mut c.out);
        if c.out.is_empty() {
            Ok(())
        } else {
            Err(c.out)
        }
    }
}

struct Checker<'a> {
    plan: &'a Plan,
    out: Vec<PlanViolation>,
}

/// Per buffer and stream: the last instruction that read / wrote it.
#[derive(Clone, Default)]
struct Seen {
    read: [Option<usize>; Stream::ALL.len()],
    write: [Option<usize>; Stream::ALL.len()],
    last_write: Option<usize>,
    freed: Option<usize>,
}

impl Checker<'_> {
    fn push(&mut self, v: PlanViolation) {
        self.out.push(v);
    }

    fn schema(&mut self) {
        if self.plan.schema != SCHEMA {
            self.push(PlanViolation::Schema {
                found: self.plan.schema.clone(),
                expected: SCHEMA.to_string(),
            });
        }
    }

    /// Every id in range; later checks index with them, so they run only if
    /// this passes.
    fn ids(&mut self) -> bool {
        let before = self.out.len();
        let p = self.plan;
        let nb = p.buffers.len();
        for (i, b) in p.buffers.iter().enumerate() {
            if b.id.index() != i {
                self.bad(None, "buffer id", u64::from(b.id.0));
            }
            if b.unit.is_some_and(|u| u.index() >= p.units.len()) {
                self.bad(None, "unit", u64::from(b.unit.map_or(0, |u| u.0)));
            }
        }
        for (i, u) in p.units.iter().enumerate() {
            if u.id.index() != i {
                self.bad(None, "unit id", u64::from(u.id.0));
            }
        }
        if p.loss.buffer.index() >= nb {
            self.bad(None, "loss buffer", u64::from(p.loss.buffer.0));
        }
        for (i, ins) in p.instructions.iter().enumerate() {
            self.instr_ids(i, &ins.op);
        }
        self.out.len() == before
    }

    fn bad(&mut self, instr: Option<usize>, what: &'static str, id: u64) {
        self.push(PlanViolation::BadId {
            instr: instr.map(|i| i as u32),
            what,
            id,
        });
    }

    fn instr_ids(&mut self, i: usize, op: &InstrOp) {
        let p = self.plan;
        let mut bufs = op.reads();
        bufs.extend(op.writes());
        if let InstrOp::Free { buffer } = op {
            bufs.push(*buffer);
        }
        for b in bufs.into_iter().filter(|b| b.index() >= p.buffers.len()) {
            self.bad(Some(i), "buffer", u64::from(b.0));
        }
        match op {
            InstrOp::AllGather {
                c: Collective { unit, .. },
                ..
            }
            | InstrOp::ReduceScatter {
                c: Collective { unit, .. },
            }
            | InstrOp::AllReduce { unit, .. }
            | InstrOp::Reshard { unit, .. }
            | InstrOp::OptimizerStep { unit, .. }
            | InstrOp::Accumulate {
                unit: Some(unit), ..
            } if unit.index() >= p.units.len() => {
                self.bad(Some(i), "unit", u64::from(unit.0));
            }
            InstrOp::Kernel { micro_batch, .. }
            | InstrOp::LoadInput { micro_batch, .. }
            | InstrOp::WriteBuffer { micro_batch, .. }
                if *micro_batch >= p.config.grad_accum.max(1) =>
            {
                self.bad(Some(i), "micro-batch", u64::from(*micro_batch));
            }
            InstrOp::Record { event } | InstrOp::Wait { event } if event.0 >= p.events => {
                self.bad(Some(i), "event", u64::from(event.0));
            }
            InstrOp::Kernel { node, .. }
            | InstrOp::LoadInput { node, .. }
            | InstrOp::WriteBuffer { node, .. }
                if !p.training.graph.contains(*node) =>
            {
                self.bad(Some(i), "node", u64::from(node.0));
            }
            _ => {}
        }
    }

    fn events(&mut self) {
        let mut recorded = vec![false; self.plan.events as usize];
        for (i, ins) in self.plan.instructions.iter().enumerate() {
            match ins.op {
                InstrOp::Record { event } if recorded[event.index()] => {
                    self.push(PlanViolation::EventRecordedTwice {
                        instr: i as u32,
                        event,
                    });
                }
                InstrOp::Record { event } => recorded[event.index()] = true,
                InstrOp::Wait { event } if !recorded[event.index()] => {
                    self.push(PlanViolation::WaitBeforeRecord {
                        instr: i as u32,
                        event,
                    });
                }
                _ => {}
            }
        }
        for (e, r) in recorded.iter().enumerate() {
            if !r {
                self.push(PlanViolation::EventNeverRecorded {
                    event: EventId(e as u32),
                });
            }
        }
    }

    /// Kernel and input slots: the right number, inside their buffers.
    fn slots(&mut self) {
        let g = &self.plan.training.graph;
        for (i, ins) in self.plan.instructions.iter().enumerate() {
            match &ins.op {
                InstrOp::Kernel {
                    node,
                    inputs,
                    outputs,
                    ..
                } => {
                    let ins_ty: Vec<u64> = g
                        .inputs(*node)
                        .iter()
                        .map(|v| g.value_type(*v).bytes())
                        .collect();
                    let outs_ty: Vec<u64> =
                        g.node(*node).outputs.iter().map(|t| t.bytes()).collect();
                    self.slot_list(i, *node, "input", inputs, &ins_ty);
                    self.slot_list(i, *node, "output", outputs, &outs_ty);
                }
                InstrOp::LoadInput { node, dst, .. } => {
                    let bytes = g.node(*node).outputs.first().map_or(0, |t| t.bytes());
                    self.slot_in_bounds(i, *dst, bytes);
                }
                InstrOp::WriteBuffer { node, src, dst, .. } => {
                    let (bytes, target) = match g.node(*node).op {
                        fsdpc_ir::Op::WriteBuffer { buffer } => (
                            g.buffers.get(buffer.0 as usize).map_or(0, |b| b.ty.bytes()),
                            Some(buffer),
                        ),
                        _ => (0, None),
                    };
                    self.slot_in_bounds(i, *src, bytes);
                    let b = self.plan.buffers.get(dst.index());
                    if target.is_none()
                        || b.is_none_or(|b| {
                            b.kind != BufferKind::ModuleBuffer
                                || b.module_buffer != target
                                || b.bytes != bytes
                        })
                    {
                        self.push(PlanViolation::WrongBuffer {
                            instr: i as u32,
                            buffer: *dst,
                            expected: format!("the module buffer node {node} writes"),
                        });
                    }
                }
                _ => {}
            }
        }
        let loss_bytes = if g.contains(self.plan.training.loss.node) {
            g.value_type(self.plan.training.loss).bytes()
        } else {
            0
        };
        self.slot_in_bounds(0, self.plan.loss, loss_bytes);
    }

    fn slot_list(
        &mut self,
        i: usize,
        node: NodeId,
        what: &'static str,
        slots: &[Slot],
        bytes: &[u64],
    ) {
        if slots.len() != bytes.len() {
            self.push(PlanViolation::KernelArity {
                instr: i as u32,
                node,
                what,
                expected: bytes.len(),
                found: slots.len(),
            });
            return;
        }
        for (s, &b) in slots.iter().zip(bytes) {
            self.slot_in_bounds(i, *s, b);
        }
    }

    fn slot_in_bounds(&mut self, i: usize, s: Slot, bytes: u64) {
        let buffer_bytes = self.plan.buffers[s.buffer.index()].bytes;
        if s.offset
            .checked_add(bytes)
            .is_none_or(|end| end > buffer_bytes)
        {
            self.push(PlanViolation::SlotOutOfBounds {
                instr: i as u32,
                buffer: s.buffer,
                offset: s.offset,
                bytes,
                buffer_bytes,
            });
        }
    }

    /// Frees, uses after free, and the order of every read, write and free.
    fn accesses(&mut self, clocks: &Clocks) {
        let mut seen = vec![Seen::default(); self.plan.buffers.len()];
        let mut slot_write: HashMap<(BufferId, u64), usize> = HashMap::new();
        for (i, ins) in self.plan.instructions.iter().enumerate() {
            let s = ins.stream.index();
            for (b, offset) in read_slots(&ins.op) {
                self.check_read(clocks, &seen, &slot_write, i, b, offset);
                seen[b.index()].read[s] = Some(i);
            }
            for b in ins.op.writes() {
                self.check_write(clocks, &seen[b.index()], i, b);
            }
            for b in ins.op.writes() {
                let st = &mut seen[b.index()];
                st.write[s] = Some(i);
                st.last_write = Some(i);
            }
            for (b, offset) in slot_writes(&ins.op) {
                slot_write.insert((b, offset), i);
            }
            if let InstrOp::Free { buffer } = ins.op {
                self.check_free(clocks, &mut seen[buffer.index()], i, buffer);
            }
        }
        for (b, st) in seen.iter().enumerate() {
            if st.freed.is_none() && !self.plan.buffers[b].kind.is_persistent() {
                self.push(PlanViolation::NeverFreed {
                    buffer: BufferId(b as u32),
                });
            }
        }
    }

    fn check_read(
        &mut self,
        clocks: &Clocks,
        seen: &[Seen],
        slot_write: &HashMap<(BufferId, u64), usize>,
        i: usize,
        b: BufferId,
        offset: Option<u64>,
    ) {
        let st = &seen[b.index()];
        let buf = &self.plan.buffers[b.index()];
        if st.freed.is_some() {
            self.push(PlanViolation::UseAfterFree {
                instr: i as u32,
                buffer: b,
            });
            return;
        }
        let writes: Vec<usize> = match offset.and_then(|o| slot_write.get(&(b, o))) {
            Some(&w) if buf.kind != BufferKind::GatheredParams => vec![w],
            _ => st.write.iter().flatten().copied().collect(),
        };
        if writes.is_empty() && !buf.kind.is_persistent() {
            self.unwritten_read(i, b);
            return;
        }
        for w in writes {
            if !clocks.hb(w, i) {
                self.unordered_read(i, b, w);
            }
        }
    }

    fn unwritten_read(&mut self, i: usize, b: BufferId) {
        let buf = &self.plan.buffers[b.index()];
        match (&self.plan.instructions[i].op, buf.kind, buf.unit) {
            (InstrOp::Kernel { node, .. }, BufferKind::GatheredParams, Some(unit)) => {
                self.push(PlanViolation::MissingAllGather {
                    instr: i as u32,
                    unit,
                    node: *node,
                });
            }
            // Regions of a flat gradient no kernel wrote count as zero.
            (
                InstrOp::ReduceScatter { .. } | InstrOp::AllReduce { .. },
                BufferKind::FlatGrads,
                _,
            ) => {}
            _ => self.push(PlanViolation::ReadUninitialized {
                instr: i as u32,
                buffer: b,
            }),
        }
    }

    fn unordered_read(&mut self, i: usize, b: BufferId, w: usize) {
        let buf = &self.plan.buffers[b.index()];
        match (&self.plan.instructions[i].op, buf.kind, buf.unit) {
            (InstrOp::Kernel { node, .. }, BufferKind::GatheredParams, Some(unit)) => {
                self.push(PlanViolation::GatherNotAwaited {
                    instr: i as u32,
                    unit,
                    node: *node,
                    gather: w as u32,
                });
            }
            _ => self.push(PlanViolation::ReadBeforeWrite {
                instr: i as u32,
                buffer: b,
                write: w as u32,
            }),
        }
    }

    fn check_write(&mut self, clocks: &Clocks, st: &Seen, i: usize, b: BufferId) {
        if st.freed.is_some() {
            self.push(PlanViolation::WriteAfterFree {
                instr: i as u32,
                buffer: b,
            });
            return;
        }
        for other in st.read.iter().chain(&st.write).flatten() {
            if !clocks.hb(*other, i) {
                self.push(PlanViolation::UnorderedAccess {
                    instr: i as u32,
                    buffer: b,
                    other: *other as u32,
                });
            }
        }
    }

    fn check_free(&mut self, clocks: &Clocks, st: &mut Seen, i: usize, b: BufferId) {
        if st.freed.is_some() {
            self.push(PlanViolation::DoubleFree {
                instr: i as u32,
                buffer: b,
            });
            return;
        }
        st.freed = Some(i);
        if self.plan.buffers[b.index()].kind.is_persistent() {
            self.push(PlanViolation::FreePersistent {
                instr: i as u32,
                buffer: b,
            });
        }
        for a in st.read.iter().chain(&st.write).flatten() {
            if !clocks.hb(*a, i) {
                self.push(PlanViolation::UnorderedFree {
                    free: i as u32,
                    buffer: b,
                    access: *a as u32,
                });
            }
        }
    }

    /// Planned lifetimes match the instructions; the planned peak is the
    /// maximum of live bytes.
    fn lifetimes_and_peak(&mut self) {
        let mut actual = self.plan.buffers.clone();
        memory::set_lifetimes(&mut actual, &self.plan.instructions);
        for (p, a) in self.plan.buffers.iter().zip(&actual) {
            if (p.start, p.end) != (a.start, a.end) {
                self.push(PlanViolation::Lifetime {
                    buffer: p.id,
                    planned_start: p.start,
                    planned_end: p.end,
                    actual_start: a.start,
                    actual_end: a.end,
                });
            }
        }
        let n = self.plan.instructions.len();
        let recomputed = memory::summarize(&actual, n, self.plan.memory.arena_bytes).peak_bytes;
        if recomputed != self.plan.memory.peak_bytes {
            self.push(PlanViolation::PeakMismatch {
                planned: self.plan.memory.peak_bytes,
                recomputed,
            });
        }
    }
}

/// Slots read by an instruction: `(buffer, Some(byte offset))` for a
/// kernel's input slot, `(buffer, None)` for a whole-buffer read.
fn read_slots(op: &InstrOp) -> Vec<(BufferId, Option<u64>)> {
    match op {
        InstrOp::Kernel { inputs, .. } => {
            inputs.iter().map(|s| (s.buffer, Some(s.offset))).collect()
        }
        InstrOp::WriteBuffer { src, .. } => vec![(src.buffer, Some(src.offset))],
        _ => op.reads().into_iter().map(|b| (b, None)).collect(),
    }
}

/// Slots written by a kernel or load (whole-buffer writes are tracked per
/// stream instead).
fn slot_writes(op: &InstrOp) -> Vec<(BufferId, u64)> {
    match op {
        InstrOp::Kernel { outputs, .. } => outputs.iter().map(|s| (s.buffer, s.offset)).collect(),
        InstrOp::LoadInput { dst, .. } => vec![(dst.buffer, dst.offset)],
        _ => Vec::new(),
    }
}
