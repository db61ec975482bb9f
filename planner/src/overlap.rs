//! The overlap pass: trades arena bytes for overlap where a memory fence
//! stalls a stream.
//!
//! The memory pass packs the arena as tightly as it can, and where a buffer
//! reuses bytes another stream frees it fences the reuse (`memory::Fence`).
//! In backward that is typical: a kernel's first write into a new unit's
//! flat gradients reuses the bytes of the flat gradients the reduce stream
//! frees after its reduce-scatter, so the kernel waits for the collective,
//! and the reduce-scatter is exposed. PyTorch's caching allocator avoids
//! that wait by handing out fresh memory while the old block is still in
//! use by the other stream (`record_stream`); here the same trade is
//! planned.
//!
//! Conventions: the plan is simulated on its cluster; a fence stalls when
//! its `Wait` starts later than its stream became free. The buffer pairs of
//! stalled fences join the memory pass's `Apart` set (they may not share
//! bytes) and the memory is planned again from the schedule before the
//! memory pass. The set only grows: each round relieves the stalls of the
//! previous round's layout. It stops when no new pair stalls, when the
//! arena would outgrow the rank's memory, or after `MAX_ROUNDS`; the layout
//! with the shortest simulated step is kept, where a later layout counts as
//! shorter only when it gains at least `MIN_GAIN` of the step.
//! `peak_bytes` (live bytes) never changes, only `arena_bytes` and the
//! fences.

use crate::memory::{self, Apart, Fence};
use crate::schedule::Schedule;
use crate::simulate;
use fsdpc_plan::cluster::Cluster;
use fsdpc_plan::*;

/// Most re-planning rounds.
pub const MAX_ROUNDS: usize = 4;

/// A stall shorter than this fraction of the step is not worth arena bytes.
const MIN_STALL: f64 = 1e-4;

/// A layout that spends more arena must shorten the simulated step by at
/// least this fraction to be kept.
const MIN_GAIN: f64 = 5e-3;

/// Re-plans `plan`'s memory from `scheduled` (the schedule before the memory
/// pass) as the module header says, keeps the fastest layout and sets the
/// plan's estimates.
/// `fences` are the fences of the plan's current memory plan; `heap_bytes`
/// the matrix library's heap.
pub fn relieve_stalls(
    plan: &mut Plan,
    scheduled: &Schedule,
    mut fences: Vec<Fence>,
    heap_bytes: u64,
    cluster: &Cluster,
) {
    let mut apart = Apart::new();
    let mut tl = simulate::simulate(plan, cluster);
    // The timeline of the best layout so far.
    let mut best_tl = tl.clone();
    // The best layout so far when the plan holds a later, slower one.
    let mut best: Option<Layout> = None;
    for _ in 0..MAX_ROUNDS {
        let before = apart.len();
        apart.extend(stalled_pairs(plan, &tl, &fences));
        if apart.len() == before {
            break;
        }
        let mut s = scheduled.clone();
        let (mut memory, next) = memory::plan_memory(&mut s, &apart);
        if memory.arena_bytes + plan.memory.outside_arena_bytes() > cluster.memory_bytes {
            break;
        }
        memory.outside_arena = plan.memory.outside_arena.clone();
        memory.heap_bytes = heap_bytes;
        memory.rank_bytes = memory.arena_bytes + memory.host_arena_bytes + heap_bytes;
        let previous = Layout {
            buffers: s.buffers,
            instructions: s.instructions,
            events: s.events,
            memory,
        }
        .install(plan);
        tl = simulate::simulate(plan, cluster);
        fences = next;
        if tl.step_time_s < best_tl.step_time_s * (1.0 - MIN_GAIN) {
            best_tl = tl.clone();
            best = None;
        } else if best.is_none() {
            best = Some(previous);
        }
    }
    if let Some(layout) = best {
        layout.install(plan);
    }
    plan.estimates = simulate::estimates(plan, cluster, &best_tl);
}

/// The buffer pairs of `fences` whose `Wait` starts later than its stream
/// became free (by more than `MIN_STALL` of the step).
fn stalled_pairs(plan: &Plan, tl: &simulate::Timeline, fences: &[Fence]) -> Apart {
    let min = MIN_STALL * tl.step_time_s;
    let mut free_at = [0f64; Stream::ALL.len()];
    let mut out = Apart::new();
    let mut of_event: Vec<Vec<&Fence>> = vec![Vec::new(); plan.events as usize];
    for f in fences {
        if let Some(list) = of_event.get_mut(f.event.index()) {
            list.push(f);
        }
    }
    for (i, ins) in plan.instructions.iter().enumerate() {
        let s = ins.stream.index();
        let start = tl.start.get(i).copied().unwrap_or(0.0);
        if let InstrOp::Wait { event } = ins.op {
            if start - free_at[s] > min {
                // A fence's waits sit right before its writer.
                let writes = plan.instructions[i..]
                    .iter()
                    .find(|w| !matches!(w.op, InstrOp::Wait { .. }))
                    .map(|w| w.op.writes())
                    .unwrap_or_default();
                for f in of_event.get(event.index()).into_iter().flatten() {
                    if writes.contains(&f.written) {
                        out.insert((f.freed.min(f.written), f.freed.max(f.written)));
                    }
                }
            }
        }
        free_at[s] = tl.end.get(i).copied().unwrap_or(start);
    }
    out
}

/// What the memory pass decides: buffers with offsets, the instructions with
/// their fences, the event count and the summary.
struct Layout {
    buffers: Vec<Buffer>,
    instructions: Vec<Instr>,
    events: u32,
    memory: MemorySummary,
}

impl Layout {
    /// Puts this layout in `plan`; returns the one it replaces.
    fn install(self, plan: &mut Plan) -> Layout {
        Layout {
            buffers: std::mem::replace(&mut plan.buffers, self.buffers),
            instructions: std::mem::replace(&mut plan.instructions, self.instructions),
            events: std::mem::replace(&mut plan.events, self.events),
            memory: std::mem::replace(&mut plan.memory, self.memory),
        }
    }
}
