//! The memory pass: buffer lifetimes, offsets in the per-rank arenas, the
//! fences that make arena reuse safe across streams, and the exact peaks.
//!
//! Each `Location` has its own arena: the device arena holds every buffer
//! without `cpu_offload`; with it, the host arena holds the shards and
//! optimizer state (all persistent), packed end to end from offset 0, and
//! everything below is about the device arena. `peak_bytes`,
//! `arena_bytes` and `breakdown` count the device only; `host_peak_bytes`
//! and `host_arena_bytes` the host.
//!
//! What "live" and the peak mean is the plan's definition
//! (`fsdpc_plan::memory`), which the verifier and the runtime's debug mode
//! check against.
//!
//! Offsets: persistent buffers are packed at the bottom of the arena; the
//! others are placed largest first, each at the lowest 64-byte-aligned offset
//! where it overlaps no placed buffer with an overlapping lifetime (greedy by
//! size, first fit). The arena is packed twice, mixed and with communication
//! buffers (gathered parameters, flat gradients) in their own region; the
//! segregated packing is kept when it needs fewer fences at no extra arena.
//!
//! Fences: all streams run concurrently, so when buffer B gets bytes that
//! buffer A held earlier, A's `Free` must happen before B's first write. Where
//! the schedule does not already order them, a `Record` is inserted after the
//! free and a `Wait` before the writer. `plan_memory` returns these fences.
//!
//! Apart pairs: a fence whose wait stalls its stream (a backward kernel
//! waiting for the reduce-scatter that frees the bytes it writes) serialises
//! communication with compute. The overlap pass (after simulating) may plan
//! again with such pairs of buffers kept apart: they never share bytes, as
//! if their lifetimes overlapped, so that fence is not needed. That trades
//! arena bytes for overlap; `peak_bytes` (live bytes) does not change.

use crate::schedule::Schedule;
use fsdpc_plan::memory::{set_lifetimes, summarize, ALIGN};
use fsdpc_plan::validate::Clocks;
use fsdpc_plan::*;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Pairs of buffers that must not share arena bytes, each as
/// `(smaller id, larger id)` (see the module header).
pub type Apart = BTreeSet<(BufferId, BufferId)>;

/// A fence the memory pass inserted: `written` reuses bytes of `freed`, so
/// the `Wait` on `event` before `written`'s first write waits for `freed`'s
/// `Free`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub event: EventId,
    pub freed: BufferId,
    pub written: BufferId,
}

/// Plans the schedule's memory in place, keeping the `apart` pairs apart;
/// returns its summary and the fences it inserted.
pub fn plan_memory(s: &mut Schedule, apart: &Apart) -> (MemorySummary, Vec<Fence>) {
    set_lifetimes(&mut s.buffers, &s.instructions);
    let arena_bytes = choose_offsets(s, &Keep::new(apart, s.buffers.len()));
    let host_arena_bytes = host_offsets(&mut s.buffers);
    let fences = insert_fences(s);
    set_lifetimes(&mut s.buffers, &s.instructions);
    let mut summary = summarize(&s.buffers, s.instructions.len(), arena_bytes);
    summary.host_arena_bytes = host_arena_bytes;
    summary.rank_bytes += host_arena_bytes;
    (summary, fences)
}

/// Packs the host buffers end to end (each aligned) from offset 0 of the
/// host arena; returns its size. Host buffers are persistent, so nothing
/// could share their bytes.
fn host_offsets(buffers: &mut [Buffer]) -> u64 {
    let mut end = 0u64;
    for b in buffers.iter_mut().filter(|b| b.location == Location::Host) {
        b.offset = align(end);
        end = b.offset + b.bytes;
    }
    end
}

fn align(x: u64) -> u64 {
    x.div_ceil(ALIGN) * ALIGN
}

/// Buffers written or freed off the compute stream (gathered parameters,
/// flat gradients): reusing activation bytes for them needs fences.
fn is_comm(b: &Buffer) -> bool {
    matches!(b.kind, BufferKind::GatheredParams | BufferKind::FlatGrads)
}

/// `cpu_offload`'s staged shards: each kind always packed in a region of
/// its own. Each kind is written and freed in an order its streams already
/// keep (a parameter copy waits for the previous gather, which frees the
/// last staged parameters; gradient shards are written and freed on the
/// reduce stream), so reusing only their own kind's bytes needs no fence;
/// sharing bytes with the rest would make gathers wait for reductions and
/// compute for both.
fn staged_region(b: &Buffer) -> Option<u8> {
    match b.kind {
        BufferKind::StagedParams => Some(0),
        BufferKind::StagedGrads => Some(1),
        // `--offload-what optimizer`: copied in and out on the offload
        // stream, one unit's at a time.
        BufferKind::StagedState => Some(2),
        _ => None,
    }
}

/// Packs the arena twice: mixed (every transient buffer may reuse any
/// other's bytes) and segregated (communication buffers in their own region,
/// so they never reuse activation bytes or the reverse); keeps the
/// segregated packing when it needs fewer fences at no extra arena.
fn choose_offsets(s: &mut Schedule, keep: &Keep) -> u64 {
    let clocks = Clocks::new(&s.instructions, s.events);
    let mixed_arena = assign_offsets(&mut s.buffers, false, keep);
    let mixed: Vec<u64> = s.buffers.iter().map(|b| b.offset).collect();
    let mixed_fences = fence_count(s, &clocks);
    if mixed_fences == 0 {
        return mixed_arena;
    }
    let seg_arena = assign_offsets(&mut s.buffers, true, keep);
    if seg_arena <= mixed_arena && fence_count(s, &clocks) < mixed_fences {
        return seg_arena;
    }
    for (b, off) in s.buffers.iter_mut().zip(mixed) {
        b.offset = off;
    }
    mixed_arena
}

/// Assigns arena offsets; returns the arena size. With `segregate`,
/// communication buffers are packed first and the others above them.
/// Buffers whose lifetimes overlap get disjoint bytes, and so do those that
/// `keep` keeps apart. Host buffers are left to `host_offsets`.
fn assign_offsets(buffers: &mut [Buffer], segregate: bool, keep: &Keep) -> u64 {
    let mut base = 0u64;
    let device = |b: &Buffer| b.location == Location::Device;
    for b in buffers.iter_mut().filter(|b| b.persistent() && device(b)) {
        b.offset = base;
        base += align(b.bytes);
    }
    let mut order: Vec<usize> = (0..buffers.len())
        .filter(|&i| !buffers[i].persistent() && device(&buffers[i]))
        .collect();
    // Regions bottom up: staged parameters, gradients, state; then
    // everything else, or with `segregate` communication buffers and then
    // the rest.
    let class = |b: &Buffer| -> u8 {
        match staged_region(b) {
            Some(r) => r,
            None if segregate && !is_comm(b) => 4,
            None => 3,
        }
    };
    order.sort_by_key(|&i| {
        (
            class(&buffers[i]),
            std::cmp::Reverse(buffers[i].bytes),
            buffers[i].start,
            i,
        )
    });
    let mut placed = Placed::new(buffers, &order);
    let mut arena = base;
    let mut region = 0u8;
    let mut conflicts: Vec<(u64, u64)> = Vec::new();
    for i in order {
        if class(&buffers[i]) != region {
            region = class(&buffers[i]);
            base = align(arena);
        }
        let size = align(buffers[i].bytes);
        let (s, e) = (buffers[i].start, buffers[i].end.unwrap_or(u32::MAX));
        // First fit: the lowest offset from `base` whose `size` bytes meet
        // no placed buffer that is live at the same time or kept apart.
        placed.conflicts(i, s, e, keep, &mut conflicts);
        conflicts.sort_unstable();
        let mut cand = base;
        for &(off, end_off) in &conflicts {
            if off >= cand + size {
                break;
            }
            cand = cand.max(end_off);
        }
        buffers[i].offset = cand;
        placed.insert(i, cand, cand + size, s, e);
        arena = arena.max(cand + buffers[i].bytes);
    }
    arena
}

/// The buffers `assign_offsets` has placed, indexed by time: each in every
/// bucket of `BUCKET` instruction indices its lifetime touches, so finding
/// the ones live at the same time as a new buffer reads only the buckets
/// of its own lifetime.
struct Placed {
    /// Per bucket: the indices of the placed buffers live in it.
    buckets: Vec<Vec<u32>>,
    /// Per buffer index: `(offset, end offset, start, end)` once placed.
    at: Vec<Option<(u64, u64, u32, u32)>>,
    /// Per buffer index: the query that last reported it (to report each
    /// once).
    seen: Vec<u32>,
    query: u32,
}

/// Instruction indices per time bucket of `Placed`.
const BUCKET: u32 = 64;

impl Placed {
    fn new(buffers: &[Buffer], order: &[usize]) -> Placed {
        let last = order
            .iter()
            .map(|&i| {
                buffers[i]
                    .end
                    .unwrap_or(buffers[i].start)
                    .max(buffers[i].start)
            })
            .max()
            .unwrap_or(0);
        Placed {
            buckets: vec![Vec::new(); (last / BUCKET) as usize + 1],
            at: vec![None; buffers.len()],
            seen: vec![0; buffers.len()],
            query: 0,
        }
    }

    /// The buckets a lifetime `[s, e]` touches (`e` capped at the last).
    fn span(&self, s: u32, e: u32) -> std::ops::RangeInclusive<usize> {
        let last = self.buckets.len().saturating_sub(1);
        ((s / BUCKET) as usize).min(last)..=((e / BUCKET) as usize).min(last)
    }

    fn insert(&mut self, i: usize, off: u64, end_off: u64, s: u32, e: u32) {
        self.at[i] = Some((off, end_off, s, e));
        for b in self.span(s, e) {
            self.buckets[b].push(i as u32);
        }
    }

    /// Into `out`, the byte ranges of the placed buffers that buffer `i`
    /// (live `[s, e]`) may not share bytes with, unsorted.
    fn conflicts(&mut self, i: usize, s: u32, e: u32, keep: &Keep, out: &mut Vec<(u64, u64)>) {
        out.clear();
        self.query += 1;
        for b in self.span(s, e) {
            for &j in &self.buckets[b] {
                let j = j as usize;
                if self.seen[j] == self.query {
                    continue;
                }
                // Marked only when reported: a buffer live at another time
                // may still be a partner kept apart (below).
                if let Some((off, end_off, ps, pe)) = self.at[j] {
                    if !(ps > e || s > pe) {
                        self.seen[j] = self.query;
                        out.push((off, end_off));
                    }
                }
            }
        }
        for &j in keep.partners(i) {
            let j = j as usize;
            if self.seen.get(j) == Some(&self.query) {
                continue;
            }
            if let Some((off, end_off, _, _)) = self.at.get(j).copied().flatten() {
                self.seen[j] = self.query;
                out.push((off, end_off));
            }
        }
    }
}

/// `Apart` as a sorted list of partners per buffer index.
struct Keep(Vec<Vec<u32>>);

impl Keep {
    fn new(apart: &Apart, n: usize) -> Keep {
        let mut of = vec![Vec::new(); if apart.is_empty() { 0 } else { n }];
        for &(a, b) in apart {
            if a.index() < n && b.index() < n {
                of[a.index()].push(b.0);
                of[b.index()].push(a.0);
            }
        }
        for v in &mut of {
            v.sort_unstable();
        }
        Keep(of)
    }

    /// The buffers `a` must not share bytes with even when their
    /// lifetimes are disjoint.
    fn partners(&self, a: usize) -> &[u32] {
        self.0.get(a).map_or(&[], |v| v.as_slice())
    }
}

/// How many (free, write) pairs `needed_fences` would fence.
fn fence_count(s: &Schedule, clocks: &Clocks) -> usize {
    let mut pairs: Vec<(usize, usize)> = needed_fences(s, clocks)
        .into_iter()
        .map(|(f, w, _, _)| (f, w))
        .collect();
    pairs.dedup();
    pairs.len()
}

/// `(free index of A, first-write index of B, A, B)` where B reuses A's
/// bytes after A's lifetime and nothing orders A's free before B's write.
fn needed_fences(s: &Schedule, clocks: &Clocks) -> Vec<(usize, usize, BufferId, BufferId)> {
    /// A buffer as the pair loop reads it: offset, end offset, first write,
    /// free (`u32::MAX`: none), id.
    type Span = (u64, u64, u32, u32, BufferId);
    let mut order: Vec<Span> = s
        .buffers
        .iter()
        .filter(|b| !b.persistent() && b.bytes > 0 && b.location == Location::Device)
        .map(|b| {
            let end = b.end.unwrap_or(u32::MAX);
            (b.offset, b.offset + b.bytes, b.start, end, b.id)
        })
        .collect();
    order.sort_unstable_by_key(|b| (b.0, b.4));
    let mut out = Vec::new();
    for (i, a) in order.iter().enumerate() {
        for b in &order[i + 1..] {
            if b.0 >= a.1 {
                break;
            }
            for (x, y) in [(a, b), (b, a)] {
                let f = x.3;
                if f != u32::MAX && f < y.2 && !clocks.hb(f as usize, y.2 as usize) {
                    out.push((f as usize, y.2 as usize, x.4, y.4));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Inserts a `Record` after each free and a `Wait` before each writer that
/// `needed_fences` found; returns them.
fn insert_fences(s: &mut Schedule) -> Vec<Fence> {
    let clocks = Clocks::new(&s.instructions, s.events);
    let needed = needed_fences(s, &clocks);
    let mut fences = Vec::with_capacity(needed.len());
    if needed.is_empty() {
        return fences;
    }
    let mut record_after: BTreeMap<usize, EventId> = BTreeMap::new();
    let mut wait_before: BTreeMap<usize, Vec<EventId>> = BTreeMap::new();
    for (free, write, freed, written) in needed {
        let event = *record_after.entry(free).or_insert_with(|| {
            s.events += 1;
            EventId(s.events - 1)
        });
        fences.push(Fence {
            event,
            freed,
            written,
        });
        let waits = wait_before.entry(write).or_default();
        if !waits.contains(&event) {
            waits.push(event);
        }
    }
    // A stream that has waited for the record after a free on another
    // stream is past every earlier instruction of that stream: a later
    // wait for an earlier free there adds nothing and is left out.
    let free_of: HashMap<EventId, usize> = record_after.iter().map(|(&f, &e)| (e, f)).collect();
    let mut waited: HashMap<(Stream, Stream), usize> = HashMap::new();
    let old = std::mem::take(&mut s.instructions);
    let streams: Vec<Stream> = old.iter().map(|x| x.stream).collect();
    for (i, ins) in old.into_iter().enumerate() {
        for &event in wait_before.get(&i).into_iter().flatten() {
            let free = free_of[&event];
            let key = (ins.stream, streams[free]);
            if waited.get(&key).is_some_and(|&w| w >= free) {
                continue;
            }
            waited.insert(key, free);
            s.instructions.push(Instr {
                stream: ins.stream,
                op: InstrOp::Wait { event },
            });
        }
        let stream = ins.stream;
        s.instructions.push(ins);
        if let Some(&event) = record_after.get(&i) {
            s.instructions.push(Instr {
                stream,
                op: InstrOp::Record { event },
            });
        }
    }
    fences
}

#[cfg(test)]
mod tests {
    use super::*;
    use fsdpc_ir::DType;

    fn activation(id: u32, bytes: u64, start: u32, end: u32) -> Buffer {
        Buffer {
            id: BufferId(id),
            kind: BufferKind::Activation,
            unit: None,
            value: None,
            dtype: DType::F32,
            bytes,
            offset: 0,
            start,
            end: Some(end),
            stream: None,
            location: Location::Device,
        }
    }

    fn disjoint(a: &Buffer, b: &Buffer) -> bool {
        a.offset + a.bytes <= b.offset || b.offset + b.bytes <= a.offset
    }

    /// Buffers live at different times share bytes unless kept apart; a
    /// pair kept apart gets disjoint bytes even when both lie in one time
    /// bucket of `Placed` (a regression: the bucket scan marked a
    /// time-disjoint partner as reported without reporting it).
    #[test]
    fn kept_apart_pairs_get_disjoint_bytes() {
        let buffers = || {
            vec![
                activation(0, 1024, 0, 3),
                activation(1, 1024, 5, 8),
                activation(2, 1024, 10, 12),
            ]
        };
        let mut free = buffers();
        let arena = assign_offsets(&mut free, false, &Keep::new(&Apart::new(), 3));
        assert_eq!(arena, 1024, "time-disjoint buffers reuse one region");
        let mut apart = Apart::new();
        apart.insert((BufferId(0), BufferId(1)));
        let mut kept = buffers();
        assign_offsets(&mut kept, false, &Keep::new(&apart, 3));
        assert!(disjoint(&kept[0], &kept[1]), "{kept:?}");
        // Far apart in time (different buckets), too.
        let mut far = buffers();
        far[1].start = 5 * BUCKET;
        far[1].end = Some(5 * BUCKET + 2);
        assign_offsets(&mut far, false, &Keep::new(&apart, 3));
        assert!(disjoint(&far[0], &far[1]), "{far:?}");
    }
}
