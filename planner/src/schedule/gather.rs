//! Gather windows, prefetch and the rate limiter: when each unit's
//! parameters are all-gathered (unshard stream) and freed (compute stream).
//!
//! Conventions (the runtime relies on them):
//! - full_shard: a unit is gathered once per *window*: the run of kernels of
//!   one phase that read its parameters (the root unit has one window for the
//!   whole step: it is not resharded after forward, as in PyTorch). Each
//!   window has its own `GatheredParams` buffer: `AllGather` + `Record` on the
//!   unshard stream, `Wait` on compute before the first reader, `Free` on
//!   compute after the last one.
//! - Units not resharded after forward (every unit under shard_grad_op,
//!   hybrid_shard_zero2 or `reshard_after_forward=false`) have one window
//!   per micro-batch, forward and backward; the root one for the whole
//!   step. Neither is counted by the limiter.
//! - `reshard_after_forward=n` (1 < n < F): at the end of a unit's forward
//!   window compute copies this rank's 1/n slice into a `ReshardedParams`
//!   buffer (`Reshard`) before the `Free`; the unit's backward gather reads
//!   that slice over `Group::Reshard` and frees it. A unit whose backward
//!   gather is issued before its forward window ends (prefetched: the last
//!   unit) or whose backward does not read its parameters keeps no slice.
//! - Prefetch (depth d = `prefetch_depth`): with `forward_prefetch`, a
//!   forward window's gather is issued when the forward window d before it
//!   starts (d = 1 is what PyTorch's CPU run-ahead does); without it, at
//!   first use. A backward window's gather follows `backward_prefetch`,
//!   counting windows back through the forward ones (`pre`: when the window
//!   d before starts, so the gather overlaps its gradient computation;
//!   `post`: after that window's last kernel and the free of its
//!   parameters; `none`: at first use).
//! - Issue points: a gather does not start before the compute stream reaches
//!   the point where it is issued. Compute `Record`s an event there and the
//!   unshard stream `Wait`s on it before the gather (left out where the
//!   limiter's wait already orders it, or before any compute instruction).
//!   Without it the unshard stream would run every gather as early as the
//!   limiter allows, whatever `backward_prefetch` says.
//! - `cpu_offload`: a gather from the unit's shard reads a staged device
//!   copy of it instead, made on the offload stream just before and freed
//!   by the unshard stream after the gather (see `offload`).
//! - Rate limiter: the j-th resharded window's gather waits (on the unshard
//!   stream) for the `Free` of the (j - limit)-th one, so at most `limit`
//!   resharded windows are alive at once. The root window does not count.
//!   Where a window would have to wait for a free that comes after its own
//!   first use (nested windows), the wait is left out.

use super::{Lowering, Pos, Step};
use fsdpc_ir::{Graph, Phase};
use fsdpc_plan::*;
use std::collections::BTreeMap;

/// A run of kernels that read one unit's gathered parameters.
#[derive(Clone, Debug)]
pub(super) struct Window {
    pub(super) unit: UnitId,
    pub(super) first: usize,
    pub(super) last: usize,
    pub(super) phase: Phase,
    /// Counted by the rate limiter (everything but the root's window).
    pub(super) limited: bool,
}

/// Splits each unit's reading steps into windows (runs of one phase; one
/// window for the whole step for the root, and one per micro-batch, forward
/// and backward, for a unit whose `keep` is set: not resharded after
/// forward), in issue order (by first use).
pub(super) fn windows(
    graph: &Graph,
    steps: &[Step],
    micro: &[u32],
    reads_units: &[Vec<UnitId>],
    keep: &[bool],
) -> Vec<Window> {
    let mut open: BTreeMap<UnitId, usize> = BTreeMap::new();
    let mut out: Vec<Window> = Vec::new();
    for (i, units) in reads_units.iter().enumerate() {
        let phase = graph.node(steps[i].node()).phase;
        for &u in units {
            match open.get(&u).copied() {
                Some(w)
                    if u == UnitId(0)
                        || (micro[out[w].first] == micro[i]
                            && (out[w].phase == phase || keep[u.index()])) =>
                {
                    out[w].last = i
                }
                _ => {
                    open.insert(u, out.len());
                    out.push(Window {
                        unit: u,
                        first: i,
                        last: i,
                        phase,
                        limited: !keep[u.index()] && u != UnitId(0),
                    });
                }
            }
        }
    }
    out
}

impl Lowering<'_> {
    /// Decides where each window's gather is issued and what it waits on.
    pub(super) fn place_gathers(&mut self) {
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

    /// The prefetch position of window `w`, before the limiter: `depth`
    /// windows ahead (forward: only among forward windows, and only with
    /// `forward_prefetch`; backward: as `backward_prefetch` says).
    fn desired_pos(&self, w: usize) -> Pos {
        let win = &self.windows[w];
        let depth = self.input.cfg.prefetch_depth.max(1) as usize;
        let at_first_use = win.first * 3;
        let Some(back) = w.checked_sub(1) else {
            return at_first_use;
        };
        match (win.phase, self.input.cfg.backward_prefetch) {
            (Phase::Forward, _) if !self.input.cfg.forward_prefetch => at_first_use,
            (Phase::Forward, _) => {
                // The earliest of the `depth` forward windows before `w`.
                let mut p = w;
                while p > 0 && w - p < depth && self.windows[p - 1].phase == Phase::Forward {
                    p -= 1;
                }
                if p == w {
                    at_first_use
                } else {
                    self.windows[p].first * 3
                }
            }
            (Phase::Backward, BackwardPrefetch::Pre) => {
                self.windows[w.saturating_sub(depth).min(back)].first * 3
            }
            (Phase::Backward, BackwardPrefetch::Post) => {
                self.windows[w.saturating_sub(depth).min(back)].last * 3 + 2
            }
            (Phase::Backward, BackwardPrefetch::None) => at_first_use,
        }
    }

    /// Issues the gathers placed at `pos`, after their issue point on the
    /// compute stream.
    pub(super) fn emit_hooks(&mut self, pos: Pos) {
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

    /// The all-gather of window `w`: from the unit's shard over the shard
    /// group, or, for the backward window of a unit resharded to n ranks
    /// after forward, from its slice over `Group::Reshard` (the slice is
    /// freed after the gather).
    fn emit_gather(&mut self, w: usize) {
        let u = self.windows[w].unit;
        let unit = &self.input.units[u.index()];
        let dtype = self.input.cfg.param_dtype;
        let bytes = unit.padded_numel * dtype.size() as u64;
        if let Some(event) = self.limiter_wait[w].and_then(|o| self.free_event[o]) {
            self.push(Stream::Unshard, InstrOp::Wait { event });
        }
        let resharded = match self.windows[w].phase {
            Phase::Forward => None,
            _ => self.resharded[u.index()].take(),
        };
        let (src, group) = match resharded {
            Some((slice, event)) => {
                self.push(Stream::Unshard, InstrOp::Wait { event });
                (slice, Group::Reshard)
            }
            None => match self.shard_params[u.index()] {
                Some(shard) => (self.staged_shard(u, shard), Group::Shard),
                None => return,
            },
        };
        let dst = self.new_buffer(BufferKind::GatheredParams, Some(u), None, dtype, bytes);
        self.push(
            Stream::Unshard,
            InstrOp::AllGather {
                c: Collective {
                    unit: u,
                    src,
                    dst,
                    dtype,
                    group,
                    wire: Wire::Native,
                    wire_buffer: None,
                    algorithm: CollectiveAlgorithm::Ring,
                    staging: None,
                },
                bucketed: false,
            },
        );
        // A resharded slice or a staged copy (`offload`) is used once.
        if self.buffers[src.index()].kind != BufferKind::ShardParams {
            self.push(Stream::Unshard, InstrOp::Free { buffer: src });
        }
        let ready = self.record(Stream::Unshard);
        self.gathered[w] = Some((dst, ready));
    }

    /// Makes the windows step `s` reads current, waiting for their gathers.
    pub(super) fn enter_windows(&mut self, s: usize) {
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

    /// Frees the gathered parameters of the windows that end at step `s`
    /// (recording an event after a free a limiter waits on). Under
    /// `ReshardAfterForward::To(n)`, a forward window first keeps this
    /// rank's 1/n slice (`Reshard` on compute, then `Record`: backward's
    /// gather waits for it).
    pub(super) fn free_windows(&mut self, s: usize) {
        for w in self.window_ends.remove(&s).unwrap_or_default() {
            let Some((buffer, _)) = self.gathered[w] else {
                continue;
            };
            let unit = self.windows[w].unit;
            // Only a unit whose backward window reads it again, and whose
            // backward gather is not issued yet (prefetched inside this
            // forward window: the last unit), keeps a slice.
            let read_again = (w + 1..self.windows.len())
                .find(|&later| {
                    self.windows[later].unit == unit && self.windows[later].phase != Phase::Forward
                })
                .is_some_and(|later| self.gathered[later].is_none());
            if let (ReshardAfterForward::To(n), Phase::Forward, true) = (
                unit_reshard(self.input.units, unit, self.input.reshard),
                self.windows[w].phase,
                unit != UnitId(0) && read_again,
            ) {
                self.keep_slice(unit, buffer, n);
            }
            self.push(Stream::Compute, InstrOp::Free { buffer });
            if self.free_waited[w] {
                self.free_event[w] = Some(self.record(Stream::Compute));
            }
        }
    }

    /// Copies this rank's 1/n slice of `gathered` (unit `unit`'s flat
    /// parameter) into a `ReshardedParams` buffer kept until backward.
    fn keep_slice(&mut self, unit: UnitId, gathered: BufferId, n: u32) {
        let bytes = self.buffers[gathered.index()].bytes / u64::from(n.max(1));
        let dtype = self.buffers[gathered.index()].dtype;
        let dst = self.new_buffer(BufferKind::ReshardedParams, Some(unit), None, dtype, bytes);
        self.push(
            Stream::Compute,
            InstrOp::Reshard {
                unit,
                src: gathered,
                dst,
                group: Group::Reshard,
            },
        );
        let kept = self.record(Stream::Compute);
        self.resharded[unit.index()] = Some((dst, kept));
    }
}
