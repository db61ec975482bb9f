//! Measured timelines (`fsdpc train --trace`): when each instruction of the
//! traced steps started and ended on each stream of a rank, and the rank's
//! live heap bytes (the counting allocator, `account`) when it ended.
//!
//! Conventions:
//! - Times are nanoseconds since the run's epoch (one `Instant` shared by
//!   every thread rank, so their timelines line up; each process rank has
//!   its own).
//! - Every instruction of a traced step is recorded, `Free`, `Record` and
//!   `Wait` included (a `Wait`'s span is the time the stream was blocked);
//!   in debug mode the serial loop records each instruction on its own stream.
//! - Cost when tracing is off: one `Option` test per stream per step. When
//!   on: two clock reads and an atomic load per instruction, pushed into a
//!   per-stream vector whose capacity (the stream's instructions times the
//!   traced steps) is reserved before the steps, so recording never
//!   allocates. The recorder is allocated on the rank's untagged thread,
//!   before its accounting window: its buffers are not the rank's memory
//!   and the measured peak (`tests/it/memory.rs`) does not see them.

use super::resolve::Resolved;
use crate::account;
use fsdpc_plan::Stream;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

/// One executed instruction.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// The instruction's index in the plan's list.
    pub instr: u32,
    /// The step it belonged to.
    pub step: u64,
    /// Start, nanoseconds since the run's epoch.
    pub start_ns: u64,
    /// End, nanoseconds since the run's epoch.
    pub end_ns: u64,
    /// The rank's live heap bytes at the end (counting allocator); `None`
    /// where it is not installed.
    pub live_bytes: Option<i64>,
}

/// What one stream of a rank executed, in execution order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamTimeline {
    /// The stream.
    pub stream: Stream,
    /// Its spans.
    pub spans: Vec<Span>,
}

/// One rank's measured timeline of the traced steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankTimeline {
    /// The rank.
    pub rank: usize,
    /// One entry per stream that has instructions.
    pub streams: Vec<StreamTimeline>,
}

/// Records the spans of one rank's traced steps (see the module header).
pub(crate) struct Recorder {
    epoch: Instant,
    from_step: u64,
    tag: Option<usize>,
    /// The stream index (into `Resolved::streams`) of every instruction.
    stream_of: Vec<usize>,
    streams: Vec<(Stream, Mutex<Vec<Span>>)>,
}

impl Recorder {
    /// A recorder for the steps `from_step..from_step + steps`, reserving
    /// room for every instruction of those steps.
    pub(crate) fn new(
        prep: &Resolved,
        epoch: Instant,
        from_step: u64,
        steps: u64,
        tag: Option<usize>,
    ) -> Recorder {
        let mut stream_of = vec![0; prep.steps.len()];
        for (k, (_, instrs)) in prep.streams.iter().enumerate() {
            for &i in instrs {
                if let Some(s) = stream_of.get_mut(i) {
                    *s = k;
                }
            }
        }
        let streams = prep
            .streams
            .iter()
            .map(|(s, instrs)| {
                let cap = instrs.len().saturating_mul(steps as usize);
                (*s, Mutex::new(Vec::with_capacity(cap)))
            })
            .collect();
        Recorder {
            epoch,
            from_step,
            tag,
            stream_of,
            streams,
        }
    }

    /// Whether `step` is traced.
    pub(crate) fn traces(&self, step: u64) -> bool {
        step >= self.from_step
    }

    /// Nanoseconds since the epoch.
    pub(crate) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// The span buffer of stream index `k` (uncontended: one thread per
    /// stream in arena mode, one thread in all in debug mode).
    pub(crate) fn stream(&self, k: usize) -> Option<MutexGuard<'_, Vec<Span>>> {
        self.streams
            .get(k)
            .map(|(_, m)| m.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The stream index of instruction `i`.
    pub(crate) fn stream_of(&self, i: usize) -> usize {
        self.stream_of.get(i).copied().unwrap_or(0)
    }

    /// Appends a span unless the reserved room is full (never reallocates).
    pub(crate) fn push(&self, spans: &mut Vec<Span>, i: usize, step: u64, start_ns: u64) {
        if spans.len() < spans.capacity() {
            spans.push(Span {
                instr: i as u32,
                step,
                start_ns,
                end_ns: self.now_ns(),
                live_bytes: self.tag.map(account::live),
            });
        }
    }

    /// The recorded timeline of `rank`.
    pub(crate) fn finish(self, rank: usize) -> RankTimeline {
        RankTimeline {
            rank,
            streams: self
                .streams
                .into_iter()
                .map(|(stream, m)| StreamTimeline {
                    stream,
                    spans: m.into_inner().unwrap_or_else(|e| e.into_inner()),
                })
                .filter(|s| !s.spans.is_empty())
                .collect(),
        }
    }
}
