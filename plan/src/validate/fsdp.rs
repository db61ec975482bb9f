//! The FSDP-specific half of the verifier: gradient reduction and optimizer
//! steps, collective order, and the arena.

use super::hb::Clocks;
use super::PlanViolation;
use crate::*;
use std::collections::HashMap;

/// Checks gradients, collectives and the arena of `plan`, appending to `out`.
pub(crate) struct FsdpChecks<'a> {
    pub plan: &'a Plan,
    pub out: &'a mut Vec<PlanViolation>,
}

impl FsdpChecks<'_> {
    /// Each unit with gradients: every gradient written into its flat
    /// gradient, reduced exactly once, then one optimizer step after the
    /// reduction.
    pub fn gradients(&mut self, clocks: &Clocks) {
        let p = self.plan;
        let trainable = self.grad_units();
        let mut reductions: HashMap<UnitId, Vec<usize>> = HashMap::new();
        let mut replicas: HashMap<UnitId, Vec<usize>> = HashMap::new();
        let mut steps: HashMap<UnitId, Vec<usize>> = HashMap::new();
        for (i, ins) in p.instructions.iter().enumerate() {
            match ins.op {
                InstrOp::AllReduce { unit, buffer, .. }
                    if self.kind(buffer) == Some(self.grad_shard_kind(unit)) =>
                {
                    replicas.entry(unit).or_default().push(i)
                }
                InstrOp::ReduceScatter {
                    c: Collective { unit, .. },
                }
                | InstrOp::AllReduce { unit, .. } => reductions.entry(unit).or_default().push(i),
                InstrOp::OptimizerStep { unit, .. } => steps.entry(unit).or_default().push(i),
                _ => {}
            }
        }
        let hybrid = p.config.strategy != Strategy::NoShard
            && p.geometry().data_world() > p.config.shard_factor.max(1);
        for (unit, _) in trainable {
            let mut red = reductions.get(&unit).cloned().unwrap_or_default();
            let opt = steps.get(&unit).cloned().unwrap_or_default();
            // Once per step, or once per micro-batch under gradient
            // accumulation without `no_sync`.
            let times = if p.config.no_sync {
                1
            } else {
                p.config.grad_accum.max(1) as usize
            };
            match red.len() {
                0 => self.out.push(PlanViolation::GradientNotReduced { unit }),
                n if n > times => self.out.push(PlanViolation::GradientReducedTwice {
                    instr: red[times] as u32,
                    unit,
                }),
                n if n < times => self.out.push(PlanViolation::GradientNotReduced { unit }),
                _ => {}
            }
            // Hybrid sharding: the shard's replicas then sum it, once.
            let rep = replicas.get(&unit).cloned().unwrap_or_default();
            match (hybrid, red.first(), rep.as_slice()) {
                (true, Some(&r), [a]) if clocks.hb(r, *a) => red = vec![*a],
                (false, _, []) | (true, None, _) => {}
                (_, _, extra) => self.out.push(PlanViolation::CollectiveOrder {
                    instr: extra.first().or(red.first()).copied().unwrap_or(0) as u32,
                    stream: Stream::Reduce,
                    unit,
                    reason: format!(
                        "expected {} all-reduce of the gradient shard across replicas after its reduce-scatter, found {}",
                        if hybrid { "one" } else { "no" },
                        extra.len()
                    ),
                }),
            }
            match (opt.first(), red.first()) {
                (None, _) => self.out.push(PlanViolation::MissingOptimizerStep { unit }),
                (Some(&o), Some(&r))
                    if r < o && clocks.hb(r, o) && self.reads_reduced(o, r, clocks) => {}
                (Some(&o), _) => self.out.push(PlanViolation::OptimizerReadsUnreduced {
                    instr: o as u32,
                    unit,
                }),
            }
        }
        self.grads_written();
    }

    /// Units holding at least one gradient, with those (param, byte offset).
    fn grad_units(&self) -> Vec<(UnitId, Vec<(fsdpc_ir::ParamId, u64)>)> {
        let mut at: HashMap<fsdpc_ir::ParamId, (UnitId, u64)> = HashMap::new();
        // Gradients are in the parameters' dtype (see `precision`).
        let es = self.plan.config.param_dtype.size() as u64;
        for u in &self.plan.units {
            for fp in &u.params {
                at.insert(fp.param, (u.id, fp.offset * es));
            }
        }
        let mut by_unit: std::collections::BTreeMap<UnitId, Vec<_>> = Default::default();
        for g in &self.plan.training.grads {
            if let Some(&(u, off)) = at.get(&g.param) {
                by_unit.entry(u).or_default().push((g.param, off));
            }
        }
        by_unit.into_iter().collect()
    }

    fn kind(&self, b: BufferId) -> Option<BufferKind> {
        self.plan.buffers.get(b.index()).map(|b| b.kind)
    }

    /// The optimizer step at `o` reads the buffer the reduction at `r` wrote
    /// (when its unit offloads its shards: their copy in host memory, made
    /// after `r` and before `o`).
    fn reads_reduced(&self, o: usize, r: usize, clocks: &Clocks) -> bool {
        let (mut reduced, unit) = match self.plan.instructions[r].op {
            InstrOp::ReduceScatter {
                c: Collective { dst, unit, .. },
            } => (dst, unit),
            InstrOp::AllReduce { buffer, unit, .. } => (buffer, unit),
            _ => return false,
        };
        if self.shards_on_host(unit) {
            match super::offload::copied_to(self.plan, reduced, r) {
                Some((c, host)) if clocks.hb(c, o) => reduced = host,
                _ => return false,
            }
        }
        matches!(self.plan.instructions[o].op, InstrOp::OptimizerStep { grads, .. } if grads == reduced)
    }

    /// Whether `unit` keeps its shards in host memory (`cpu_offload`,
    /// offloading `params`).
    fn shards_on_host(&self, unit: UnitId) -> bool {
        self.plan.unit_offload(unit) == Some(crate::offload::OffloadWhat::Params)
    }

    /// The kind of buffer `unit`'s all-gather reads: the shard, or its
    /// staged device copy when the unit's shards are on the host.
    fn param_shard_kind(&self, unit: UnitId) -> BufferKind {
        if self.shards_on_host(unit) {
            BufferKind::StagedParams
        } else {
            BufferKind::ShardParams
        }
    }

    /// The kind of buffer a sharded gradient reduction of `unit` writes:
    /// the gradient shard, or a staged device buffer when the unit's
    /// shards are on the host.
    fn grad_shard_kind(&self, unit: UnitId) -> BufferKind {
        if self.shards_on_host(unit) {
            BufferKind::StagedGrads
        } else {
            BufferKind::ShardGrads
        }
    }

    /// Every gradient value is written by its kernel (or, for a gradient
    /// summed over the tensor group, its tensor collective) into its unit's
    /// flat gradient at the parameter's offset.
    fn grads_written(&mut self) {
        let p = self.plan;
        let mut written: HashMap<fsdpc_ir::ValueId, Slot> = HashMap::new();
        for ins in &p.instructions {
            let (node, outputs) = match &ins.op {
                InstrOp::Kernel { node, outputs, .. } => (node, outputs.as_slice()),
                InstrOp::TensorAllReduce { node, dst, .. }
                | InstrOp::TensorChunks { node, dst, .. } => (node, std::slice::from_ref(dst)),
                _ => continue,
            };
            for (k, s) in outputs.iter().enumerate() {
                written.insert(
                    fsdpc_ir::ValueId {
                        node: *node,
                        slot: k as u32,
                    },
                    *s,
                );
            }
        }
        let grad_of: HashMap<_, _> = p.training.grads.iter().map(|g| (g.param, g.grad)).collect();
        for (unit, params) in self.grad_units() {
            for (param, off) in params {
                let ok = grad_of
                    .get(&param)
                    .and_then(|v| written.get(v))
                    .is_some_and(|s| {
                        let b = &p.buffers[s.buffer.index()];
                        b.kind == BufferKind::FlatGrads && b.unit == Some(unit) && s.offset == off
                    });
                if !ok {
                    self.out
                        .push(PlanViolation::GradientNotWritten { unit, param });
                }
            }
        }
    }

    /// Collectives on their stream, with the right buffers; per unit, no
    /// gather after its reduction; on each stream, collectives in the order
    /// their results are needed (gathers) or their inputs are ready
    /// (reductions).
    pub fn collectives(&mut self) {
        let p = self.plan;
        let first_read = first_reads(p);
        let writes = writes_of(p);
        let mut reduced: Vec<bool> = vec![false; p.units.len()];
        // Under gradient accumulation a unit is gathered again after the
        // reduction of an earlier micro-batch: only its last reduction ends
        // its gathers.
        let mut last_reduction: Vec<Option<usize>> = vec![None; p.units.len()];
        for (i, ins) in p.instructions.iter().enumerate() {
            if let InstrOp::ReduceScatter {
                c: Collective { unit, .. },
            }
            | InstrOp::AllReduce { unit, .. } = ins.op
            {
                if let Some(l) = last_reduction.get_mut(unit.index()) {
                    *l = Some(i);
                }
            }
        }
        let mut prev_gather: Option<(usize, usize)> = None;
        let mut prev_reduce: Option<(usize, usize)> = None;
        for (i, ins) in p.instructions.iter().enumerate() {
            match ins.op {
                InstrOp::AllGather {
                    c:
                        Collective {
                            unit,
                            src,
                            dst,
                            group,
                            ..
                        },
                    ..
                } => {
                    self.on_stream(i, ins.stream, Stream::Unshard, unit);
                    match group {
                        Group::Reshard => {
                            self.buffer_is(i, src, BufferKind::ReshardedParams, unit);
                            self.reshard_group(i, ins.stream, unit);
                        }
                        _ => {
                            self.group_is(i, ins.stream, unit, group, Group::Shard);
                            self.buffer_is(i, src, self.param_shard_kind(unit), unit);
                        }
                    }
                    self.buffer_is(i, dst, BufferKind::GatheredParams, unit);
                    if reduced[unit.index()] {
                        self.order(
                            i,
                            ins.stream,
                            unit,
                            "all-gather of a unit after its gradients were reduced".into(),
                        );
                    }
                    let need = first_read[dst.index()].unwrap_or(usize::MAX);
                    if let Some((g, prev_need)) = prev_gather.filter(|&(_, n)| n > need) {
                        let _ = prev_need;
                        self.order(
                            i,
                            ins.stream,
                            unit,
                            format!("gathered after instruction {g} but needed before it"),
                        );
                    }
                    prev_gather = Some((i, need));
                }
                InstrOp::AllReduce {
                    unit,
                    buffer,
                    group,
                    ..
                } if self.kind(buffer) == Some(self.grad_shard_kind(unit)) => {
                    self.on_stream(i, ins.stream, Stream::Reduce, unit);
                    self.buffer_is(i, buffer, self.grad_shard_kind(unit), unit);
                    self.group_is(i, ins.stream, unit, group, Group::Replicate);
                }
                InstrOp::Reshard {
                    unit,
                    src,
                    dst,
                    group,
                } => {
                    self.buffer_is(i, src, BufferKind::GatheredParams, unit);
                    self.buffer_is(i, dst, BufferKind::ReshardedParams, unit);
                    self.group_is(i, ins.stream, unit, group, Group::Reshard);
                    self.reshard_group(i, ins.stream, unit);
                    let (sb, db) = (self.bytes(src), self.bytes(dst));
                    let n = u64::from(p.reshard_group().unwrap_or(1).max(1));
                    if sb != db.saturating_mul(n) {
                        self.order(
                            i,
                            ins.stream,
                            unit,
                            format!("the kept slice is {db} bytes, not 1/{n} of the {sb} gathered"),
                        );
                    }
                }
                InstrOp::Accumulate { unit, src, dst } => self.accumulation(i, unit, src, dst),
                InstrOp::ReduceScatter {
                    c: Collective { unit, src, .. },
                }
                | InstrOp::AllReduce {
                    unit, buffer: src, ..
                } => {
                    self.on_stream(i, ins.stream, Stream::Reduce, unit);
                    self.buffer_is(i, src, BufferKind::FlatGrads, unit);
                    match ins.op {
                        InstrOp::ReduceScatter {
                            c: Collective { dst, group, .. },
                        } => {
                            if self.kind(dst) != Some(BufferKind::PartialGrads)
                                || p.config.grad_accum <= 1
                            {
                                self.buffer_is(i, dst, self.grad_shard_kind(unit), unit);
                            }
                            self.group_is(i, ins.stream, unit, group, Group::Shard);
                        }
                        InstrOp::AllReduce { group, .. } => {
                            self.group_is(i, ins.stream, unit, group, Group::Replicate);
                        }
                        _ => {}
                    }
                    reduced[unit.index()] |= last_reduction[unit.index()] == Some(i);
                    let ready = last_write_before(&writes[src.index()], i).unwrap_or(0);
                    if let Some((r, _)) = prev_reduce.filter(|&(_, prev_ready)| prev_ready > ready)
                    {
                        self.order(i, ins.stream, unit, format!("reduced after instruction {r} although its gradients are ready earlier"));
                    }
                    prev_reduce = Some((i, ready));
                }
                _ => {}
            }
        }
    }

    /// An `Accumulate` adds a micro-batch's loss into the `Loss` buffer, or
    /// a micro-batch's gradient into what the micro-batches add into: a
    /// flat gradient into a flat gradient, a partial shard into the shard;
    /// both of `unit` and of one size and dtype.
    fn accumulation(&mut self, i: usize, unit: Option<UnitId>, src: BufferId, dst: BufferId) {
        let p = self.plan;
        let (Some(s), Some(d)) = (p.buffers.get(src.index()), p.buffers.get(dst.index())) else {
            return;
        };
        use BufferKind as K;
        let kinds_ok = match unit {
            None => s.kind == K::Activation && d.kind == K::Loss,
            Some(_) => {
                matches!(
                    (s.kind, d.kind),
                    (K::FlatGrads, K::FlatGrads) | (K::PartialGrads, _)
                ) && (s.kind == K::FlatGrads
                    || unit.map(|u| self.grad_shard_kind(u)) == Some(d.kind))
            }
        };
        let units_ok = unit.is_none() || (s.unit == unit && d.unit == unit);
        if p.config.grad_accum <= 1
            || !kinds_ok
            || !units_ok
            || s.bytes != d.bytes
            || s.dtype != d.dtype
            || src == dst
        {
            self.out.push(PlanViolation::WrongBuffer {
                instr: i as u32,
                buffer: src,
                expected: format!(
                    "a micro-batch's loss or gradient of the size and dtype of buffer {dst} it is added into (grad_accum {})",
                    p.config.grad_accum
                ),
            });
        }
    }

    fn bytes(&self, b: BufferId) -> u64 {
        self.plan.buffers.get(b.index()).map_or(0, |b| b.bytes)
    }

    fn group_is(&mut self, i: usize, stream: Stream, unit: UnitId, group: Group, expected: Group) {
        if group != expected {
            let reason =
                format!("this collective must run over the {expected:?} group, not {group:?}");
            self.order(i, stream, unit, reason);
        }
    }

    /// A resharded slice exists only for a unit with `reshard_after_forward
    /// = n` (its own or the plan's).
    fn reshard_group(&mut self, i: usize, stream: Stream, unit: UnitId) {
        if !matches!(self.plan.unit_reshard(unit), ReshardAfterForward::To(_)) {
            let reason = "resharding to a smaller group, but the unit's reshard_after_forward is not a number of ranks".to_string();
            self.order(i, stream, unit, reason);
        }
    }

    fn on_stream(&mut self, i: usize, stream: Stream, expected: Stream, unit: UnitId) {
        if stream != expected {
            let reason =
                format!("this collective must run on the {expected:?} stream, not {stream:?}");
            self.order(i, stream, unit, reason);
        }
    }

    fn order(&mut self, i: usize, stream: Stream, unit: UnitId, reason: String) {
        self.out.push(PlanViolation::CollectiveOrder {
            instr: i as u32,
            stream,
            unit,
            reason,
        });
    }

    fn buffer_is(&mut self, i: usize, b: BufferId, kind: BufferKind, unit: UnitId) {
        let buf = &self.plan.buffers[b.index()];
        if buf.kind != kind || buf.unit != Some(unit) {
            self.out.push(PlanViolation::WrongBuffer {
                instr: i as u32,
                buffer: b,
                expected: format!("{kind:?} of unit {unit}"),
            });
        }
    }

    /// No two buffers live at once overlap in the arena; a buffer that reuses
    /// another's bytes is written only after the other's free; everything
    /// lies inside the arena.
    pub fn arena(&mut self, clocks: &Clocks) {
        for location in [Location::Device, Location::Host] {
            self.arena_of(clocks, location);
        }
    }

    /// `arena` for the buffers of one location, in that location's arena.
    fn arena_of(&mut self, clocks: &Clocks, location: Location) {
        let p = self.plan;
        let n = p.instructions.len();
        let arena_bytes = match location {
            Location::Device => p.memory.arena_bytes,
            Location::Host => p.memory.host_arena_bytes,
        };
        let mut order: Vec<&Buffer> = p
            .buffers
            .iter()
            .filter(|b| b.bytes > 0 && b.location == location)
            .collect();
        for b in &order {
            let end = b.offset.saturating_add(b.bytes);
            if end > arena_bytes {
                self.out.push(PlanViolation::OutsideArena {
                    buffer: b.id,
                    end,
                    arena_bytes,
                });
            }
        }
        order.sort_by_key(|b| (b.offset, b.id));
        for (i, a) in order.iter().enumerate() {
            for b in &order[i + 1..] {
                if b.offset >= a.offset.saturating_add(a.bytes) {
                    break;
                }
                self.arena_pair(clocks, n, a, b);
            }
        }
    }

    fn arena_pair(&mut self, clocks: &Clocks, n: usize, a: &Buffer, b: &Buffer) {
        let last = n.saturating_sub(1) as u32;
        let range = |x: &Buffer| (x.start, x.end.unwrap_or(last));
        let (first, second) = if range(a).1 < range(b).0 {
            (a, b)
        } else if range(b).1 < range(a).0 {
            (b, a)
        } else {
            self.out
                .push(PlanViolation::ArenaOverlap { a: a.id, b: b.id });
            return;
        };
        let Some(free) = first.end else { return };
        let write = second.start as usize;
        if write < n && !clocks.hb(free as usize, write) {
            self.out.push(PlanViolation::ArenaReuseUnordered {
                a: first.id,
                b: second.id,
            });
        }
    }
}

/// The first instruction reading each buffer.
fn first_reads(p: &Plan) -> Vec<Option<usize>> {
    let mut out = vec![None; p.buffers.len()];
    for (i, ins) in p.instructions.iter().enumerate() {
        for b in ins.op.reads() {
            out[b.index()].get_or_insert(i);
        }
    }
    out
}

/// The last instruction writing each buffer.
/// Per buffer, the instructions writing it, in list order.
fn writes_of(p: &Plan) -> Vec<Vec<usize>> {
    let mut out = vec![Vec::new(); p.buffers.len()];
    for (i, ins) in p.instructions.iter().enumerate() {
        for b in ins.op.writes() {
            out[b.index()].push(i);
        }
    }
    out
}

/// The last write of a buffer (its `writes_of` list) before instruction `i`.
fn last_write_before(writes: &[usize], i: usize) -> Option<usize> {
    writes.iter().rev().find(|&&w| w < i).copied()
}

impl FsdpChecks<'_> {
    /// Gradient clipping (see `clip.rs`): with `clip_grad_norm` set, one
    /// `GradNormSq` over every optimizer step's gradients after all
    /// reductions, then `NormAllReduce`s of its scalar over the shard group
    /// (F > 1) and the tensor group (T > 1), then before
    /// each optimizer step a `ClipGrads` of its gradients by that norm;
    /// without it, no clipping instruction.
    pub fn clipping(&mut self, clocks: &Clocks) {
        let p = self.plan;
        let at = |i: usize, reason: String| PlanViolation::Clipping {
            instr: i as u32,
            reason,
        };
        let mut sums = Vec::new();
        let mut alls = Vec::new();
        let mut clips = Vec::new();
        let mut steps = Vec::new();
        let mut reductions = Vec::new();
        for (i, ins) in p.instructions.iter().enumerate() {
            match &ins.op {
                InstrOp::GradNormSq {
                    grads,
                    dst,
                    split_only_off_first,
                } => sums.push((i, grads.clone(), *dst, *split_only_off_first)),
                InstrOp::NormAllReduce { buffer, group } => alls.push((i, *buffer, *group)),
                InstrOp::ClipGrads {
                    norm,
                    grads,
                    max_norm,
                    ..
                } => clips.push((i, *norm, *grads, *max_norm)),
                InstrOp::OptimizerStep { grads, .. } => steps.push((i, *grads)),
                InstrOp::ReduceScatter { .. } | InstrOp::AllReduce { .. } => reductions.push(i),
                _ => {}
            }
        }
        let Some(max_norm) = p.config.clip_grad_norm else {
            if let Some(&i) = sums
                .iter()
                .map(|s| &s.0)
                .chain(alls.iter().map(|a| &a.0))
                .chain(clips.iter().map(|c| &c.0))
                .next()
            {
                self.out.push(at(
                    i,
                    "clipping instruction in a plan without clipping".into(),
                ));
            }
            return;
        };
        if steps.is_empty() {
            return;
        }
        let (n, grads, norm, split_only) = match sums.as_slice() {
            [one] => one.clone(),
            _ => {
                let i = sums.get(1).map_or(0, |s| s.0);
                self.out.push(at(
                    i,
                    format!("{} sum-of-squares instructions, expected one", sums.len()),
                ));
                return;
            }
        };
        let stepped: Vec<BufferId> = steps.iter().map(|s| s.1).collect();
        if grads != stepped {
            self.out.push(at(
                n,
                "the sum of squares does not cover exactly the optimizer steps' gradients".into(),
            ));
        }
        if let Some(&r) = reductions.iter().find(|&&r| !clocks.hb(r, n)) {
            self.out.push(at(
                n,
                format!("the sum of squares does not follow the reduction at {r}"),
            ));
        }
        let tensor = p.geometry().t() > 1;
        if split_only != tensor {
            self.out.push(at(
                n,
                format!(
                    "the sum of squares {} replicated parameters off tensor position 0, \
                     the plan has {} tensor dimension",
                    if split_only { "skips" } else { "counts" },
                    if tensor { "a" } else { "no" }
                ),
            ));
        }
        // The norm is summed over the shard group (F > 1), then over the
        // tensor group (T > 1), each after the one before.
        let want: Vec<Group> = [
            (Group::Shard, p.config.shard_factor > 1),
            (Group::Tensor, tensor),
        ]
        .into_iter()
        .filter_map(|(g, on)| on.then_some(g))
        .collect();
        let got: Vec<Group> = alls.iter().map(|a| a.2).collect();
        let mut norm_ready = n;
        for &(a, b, _) in &alls {
            if b != norm || !clocks.hb(norm_ready, a) {
                self.out.push(at(
                    a,
                    "the norm's all-reduce does not follow the sum of squares and the all-reduce before it".into(),
                ));
                return;
            }
            norm_ready = a;
        }
        if got != want {
            self.out.push(at(
                n,
                format!(
                    "the norm is all-reduced over {got:?} after the sum of squares, expected {want:?}"
                ),
            ));
            return;
        }
        for &(o, g) in &steps {
            let ok = clips.iter().any(|&(c, cn, cg, x)| {
                cg == g
                    && cn == norm
                    && x == max_norm
                    && clocks.hb(norm_ready, c)
                    && clocks.hb(c, o)
            });
            if !ok {
                self.out.push(at(
                    o,
                    "the optimizer step does not follow a clip of its gradients by the all-reduced norm"
                        .into(),
                ));
            }
        }
    }
}
