//! Plan checks of CPU offload (see `schedule::offload`): which buffers live
//! in host memory (the offloaded units' shards and state, or their state
//! only: `Plan::offloads_buffer`), that kernels and collectives reach a
//! host buffer only through a `Copy`, and that the copies are well formed
//! and ordered (a parameter shard's copy in before the all-gather that
//! reads it, a gradient shard's copy out after the reduction that wrote
//! it, a state slot's copy in before the optimizer step and out after
//! it); and the host peak.

use super::hb::Clocks;
use super::PlanViolation;
use crate::*;

/// The first `Copy` after instruction `after` that reads `b`, with its
/// destination.
pub(crate) fn copied_to(plan: &Plan, b: BufferId, after: usize) -> Option<(usize, BufferId)> {
    plan.instructions
        .iter()
        .enumerate()
        .skip(after + 1)
        .find_map(|(i, ins)| match ins.op {
            InstrOp::Copy { src, dst, .. } if src == b => Some((i, dst)),
            _ => None,
        })
}

/// Appends a violation for every offload problem of `plan`.
pub(crate) fn check(plan: &Plan, clocks: &Clocks, out: &mut Vec<PlanViolation>) {
    let mut c = Check { plan, clocks, out };
    c.locations();
    for (i, ins) in plan.instructions.iter().enumerate() {
        match ins.op {
            InstrOp::Copy { unit, src, dst } => c.copy(i, ins.stream, unit, src, dst),
            ref op => c.host_access(i, op),
        }
    }
    c.host_peak();
}

struct Check<'a> {
    plan: &'a Plan,
    clocks: &'a Clocks,
    out: &'a mut Vec<PlanViolation>,
}

impl Check<'_> {
    fn push(&mut self, instr: Option<usize>, reason: String) {
        self.out.push(PlanViolation::Offload {
            instr: instr.map(|i| i as u32),
            reason,
        });
    }

    fn buffer(&self, b: BufferId) -> Option<&Buffer> {
        self.plan.buffers.get(b.index())
    }

    /// Shards and optimizer state in host memory exactly when the plan
    /// offloads them; everything else on the device.
    fn locations(&mut self) {
        let offload = self.plan.config.cpu_offload;
        for b in &self.plan.buffers {
            let expected = if self.plan.offloads_buffer(b) {
                Location::Host
            } else {
                Location::Device
            };
            if b.location != expected {
                let reason = format!(
                    "buffer {} ({:?}) is in {:?} memory, expected {:?} (cpu_offload: {offload})",
                    b.id, b.kind, b.location, expected
                );
                self.push(None, reason);
            }
        }
    }

    /// Only the optimizer tail (which runs on the host) and copies touch a
    /// host buffer; a kernel or a collective never does.
    fn host_access(&mut self, i: usize, op: &InstrOp) {
        if matches!(
            op,
            InstrOp::OptimizerStep { .. }
                | InstrOp::GradNormSq { .. }
                | InstrOp::ClipGrads { .. }
                | InstrOp::UnscaleGrads { .. }
                | InstrOp::Free { .. }
        ) {
            return;
        }
        let mut touched = op.reads();
        touched.extend(op.writes());
        for b in touched {
            if self.buffer(b).is_some_and(|x| x.location == Location::Host) {
                self.out.push(PlanViolation::HostAccess {
                    instr: i as u32,
                    buffer: b,
                });
            }
        }
    }

    /// A copy runs between a host shard and its staged device buffer of
    /// the same unit and size, in on the offload stream and out on the
    /// reduce stream (optimizer state: both on the offload stream); a copy
    /// in happens before every read of the staged buffer, a copy out after
    /// every write of it.
    fn copy(&mut self, i: usize, stream: Stream, unit: UnitId, src: BufferId, dst: BufferId) {
        let (Some(s), Some(d)) = (self.buffer(src).cloned(), self.buffer(dst).cloned()) else {
            return;
        };
        let pair = (s.kind, s.location, d.kind, d.location);
        use BufferKind::{
            OptimizerState, ShardGrads, ShardParams, StagedGrads, StagedParams, StagedState,
        };
        use Location::{Device, Host};
        let (inward, expected) = match pair {
            (ShardParams, Host, StagedParams, Device) => (true, Stream::Offload),
            (StagedGrads, Device, ShardGrads, Host) => (false, Stream::Reduce),
            (OptimizerState, Host, StagedState, Device) => (true, Stream::Offload),
            (StagedState, Device, OptimizerState, Host) => (false, Stream::Offload),
            _ => {
                self.push(
                    Some(i),
                    format!(
                        "a copy goes from a host ShardParams to a device StagedParams, from a device StagedGrads to a host ShardGrads, or between a host OptimizerState and a device StagedState, not from {:?} in {:?} memory to {:?} in {:?} memory",
                        pair.0, pair.1, pair.2, pair.3
                    ),
                );
                return;
            }
        };
        if stream != expected {
            self.push(
                Some(i),
                format!("this copy runs on the {stream:?} stream, not {expected:?}"),
            );
        }
        if s.unit != Some(unit) || d.unit != Some(unit) || s.bytes != d.bytes {
            self.push(
                Some(i),
                format!(
                    "a copy of unit {unit} moves {} bytes of unit {:?} into {} bytes of unit {:?}",
                    s.bytes, s.unit, d.bytes, d.unit
                ),
            );
        }
        let staged = if inward { dst } else { src };
        for (j, ins) in self.plan.instructions.iter().enumerate() {
            let (before, after) = if inward { (i, j) } else { (j, i) };
            let uses = if inward {
                ins.op.reads().contains(&staged)
            } else {
                j != i && ins.op.writes().contains(&staged)
            };
            if uses && !(before < after && self.clocks.hb(before, after)) {
                let reason = if inward {
                    format!("instruction {j} reads the staged {:?} of unit {unit} before this copy fills them", d.kind)
                } else {
                    format!("this copy out of unit {unit}'s staged {:?} is not ordered after instruction {j}, which writes them", s.kind)
                };
                self.push(Some(i), reason);
            }
        }
    }

    /// `host_peak_bytes` is the maximum of live host bytes, inside the host
    /// arena.
    fn host_peak(&mut self) {
        let host: Vec<Buffer> = self
            .plan
            .buffers
            .iter()
            .filter(|b| b.location == Location::Host)
            .cloned()
            .collect();
        let n = self.plan.instructions.len();
        let recomputed = crate::memory::live_bytes(&host, n)
            .into_iter()
            .max()
            .unwrap_or(0);
        let m = &self.plan.memory;
        if recomputed != m.host_peak_bytes || m.host_peak_bytes > m.host_arena_bytes {
            let reason = format!(
                "planned host peak {} bytes (host arena {}), the host buffers give {recomputed}",
                m.host_peak_bytes, m.host_arena_bytes
            );
            self.push(None, reason);
        }
    }
}
