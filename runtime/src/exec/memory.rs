//! A rank's memory: the plan's arenas (every buffer at its planned offset in
//! the arena of its `Location`: the device arena, and under `cpu_offload` a
//! separate host arena), or in debug mode one allocation per buffer made
//! just before its first write and dropped at its `Free`, with the live
//! device bytes and their peak measured.
//!
//! This is the one place that hands out slices of rank memory.

use super::resolve::Region;
use crate::error::RuntimeError;
use fsdpc_plan::{BufferId, Location, Plan};

/// A rank's arenas, device and host (two allocations): 8-byte aligned,
/// zero-initialised, owned by the caller of the executor so they outlive
/// every rank thread (other ranks' collectives may read them until they
/// have all returned).
pub struct Arena {
    words: Vec<u64>,
    host: Vec<u64>,
}

impl Arena {
    /// The arenas `plan` needs: `memory.arena_bytes` on the device and
    /// `memory.host_arena_bytes` on the host.
    pub fn for_plan(plan: &Plan) -> Arena {
        Arena {
            words: vec![0u64; (plan.memory.arena_bytes as usize).div_ceil(8)],
            host: vec![0u64; (plan.memory.host_arena_bytes as usize).div_ceil(8)],
        }
    }
}

/// Where the buffers of one rank live.
pub struct Memory {
    /// Start of each buffer, null while it is not allocated.
    ptrs: Vec<*mut u8>,
    lens: Vec<usize>,
    /// Debug mode: the separate allocations.
    owned: Vec<Option<Vec<u64>>>,
    /// Debug mode: whether a buffer counts towards `live` (device buffers).
    counted: Vec<bool>,
    live: u64,
    peak: u64,
}

// SAFETY: `Memory` is shared between the stream threads of one rank only
// through `view`/`view_mut`, whose contract (below) makes concurrent accesses
// touch disjoint bytes; the pointers stay valid for the arena's lifetime.
unsafe impl Send for Memory {}
unsafe impl Sync for Memory {}

impl Memory {
    /// Every buffer at its offset in the arena of its location (checked by
    /// `resolve`).
    pub fn arena(plan: &Plan, arena: &mut Arena) -> Memory {
        let device = arena.words.as_mut_ptr() as *mut u8;
        let host = arena.host.as_mut_ptr() as *mut u8;
        let ptrs = plan
            .buffers
            .iter()
            .map(|b| match b.location {
                Location::Device => device.wrapping_add(b.offset as usize),
                Location::Host => host.wrapping_add(b.offset as usize),
            })
            .collect();
        let lens = plan.buffers.iter().map(|b| b.bytes as usize).collect();
        Memory {
            ptrs,
            lens,
            owned: Vec::new(),
            counted: Vec::new(),
            live: plan.memory.arena_bytes,
            peak: plan.memory.arena_bytes,
        }
    }

    /// Debug mode: nothing allocated yet.
    pub fn debug(plan: &Plan) -> Memory {
        let n = plan.buffers.len();
        let lens = plan.buffers.iter().map(|b| b.bytes as usize).collect();
        Memory {
            ptrs: vec![std::ptr::null_mut(); n],
            lens,
            owned: vec![None; n],
            counted: plan
                .buffers
                .iter()
                .map(|b| b.location == Location::Device)
                .collect(),
            live: 0,
            peak: 0,
        }
    }

    /// Debug mode: allocates buffer `b` zeroed (replacing any earlier
    /// allocation) and updates the live device bytes and their peak.
    pub fn alloc(&mut self, b: BufferId) {
        self.free(b);
        let len = self.lens[b.index()];
        let mut v = vec![0u64; len.div_ceil(8)];
        self.ptrs[b.index()] = v.as_mut_ptr() as *mut u8;
        self.owned[b.index()] = Some(v);
        if self.counted[b.index()] {
            self.live += len as u64;
            self.peak = self.peak.max(self.live);
        }
    }

    /// Debug mode: drops buffer `b` (a no-op in arena mode).
    pub fn free(&mut self, b: BufferId) {
        if let Some(slot) = self.owned.get_mut(b.index()) {
            if slot.take().is_some() {
                if self.counted[b.index()] {
                    self.live -= self.lens[b.index()] as u64;
                }
                self.ptrs[b.index()] = std::ptr::null_mut();
            }
        }
    }

    /// The largest live byte count seen (arena mode: the arena size).
    pub fn peak(&self) -> u64 {
        self.peak
    }

    fn ptr(&self, r: Region) -> Result<*mut u8, RuntimeError> {
        let p = self.ptrs[r.buffer.index()];
        if p.is_null() {
            return Err(RuntimeError::plan(format!(
                "buffer {} is used outside its lifetime (not allocated)",
                r.buffer
            )));
        }
        debug_assert!(r.offset + r.len <= self.lens[r.buffer.index()]);
        Ok(p.wrapping_add(r.offset))
    }

    /// The whole of buffer `b` as a region.
    pub fn whole(&self, b: BufferId) -> Region {
        Region {
            buffer: b,
            offset: 0,
            len: self.lens[b.index()],
        }
    }

    /// Reads region `r`.
    ///
    /// # Safety
    /// `r` was checked by `resolve` to lie inside its buffer, and every buffer
    /// inside the arena. The caller guarantees that no other thread writes
    /// these bytes while the slice lives: the planner places buffers that are
    /// live at the same time at disjoint offsets and orders every `Free`
    /// before any reuse of its bytes through events (`Plan::validate`), and
    /// the executor runs each stream's instructions in order and honours
    /// every `Wait`.
    pub unsafe fn view(&self, r: Region) -> Result<&[u8], RuntimeError> {
        Ok(std::slice::from_raw_parts(self.ptr(r)?, r.len))
    }

    /// Writes region `r`.
    ///
    /// # Safety
    /// As for `view`, and additionally no other slice of these bytes (read or
    /// write) lives at the same time; `resolve` rejects kernels whose outputs
    /// overlap their inputs or each other.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn view_mut(&self, r: Region) -> Result<&mut [u8], RuntimeError> {
        Ok(std::slice::from_raw_parts_mut(self.ptr(r)?, r.len))
    }
}
