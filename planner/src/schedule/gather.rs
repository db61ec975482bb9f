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

use super::{Lowering, Pos, Step};
use crate::plan::*;
use fsdpc_ir::{Graph, Phase};
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
/// window for the root), in issue order (by first use).
pub(super) fn windows(graph: &Graph, steps: &[Step], reads_units: &[Vec<UnitId>]) -> Vec<Window> {
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

    fn emit_gather(&mut self, w: usize) {
        let u = self.windows[w].unit;
        let unit = &self.input.units[u.index()];
        let bytes = unit.padded_numel * self.input.cfg.param_dtype.size() as u64;
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
    /// (recording an event after a free a limiter waits on).
    pub(super) fn free_windows(&mut self, s: usize) {
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
}
