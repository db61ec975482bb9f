//! Per-rank heap accounting: a counting global allocator that attributes
//! every live heap byte to the rank whose thread allocated it, and keeps
//! each rank's maximum of live bytes.
//!
//! A library cannot choose the global allocator of the program it is linked
//! into, so this module provides the allocator type and the per-thread tag;
//! the `fsdpc` binary, its benchmarks and its tests install it:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: fsdpc_runtime::account::CountingAlloc = fsdpc_runtime::account::CountingAlloc;
//! ```
//!
//! Where it is not installed, `installed()` is false and the training report
//! carries no measured peak.
//!
//! Attribution: every allocation carries a small header with the tag of the
//! thread that made it (`RankTag::enter`), so a block freed by another thread
//! (a rank's vector dropped by the launcher) is still taken off the rank that
//! allocated it. The cost per allocation is one thread-local read and one
//! atomic add (plus an atomic max when the live bytes reach a new peak); the
//! bytes counted are the sizes requested, not the header.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::Mutex;

/// Tags the accounting distinguishes. A training run claims one per rank
/// (`claim`), round robin, so concurrent runs in one process (tests) count
/// apart; allocations of other tags are not counted.
pub const MAX_TAGS: usize = 4096;

/// The tag of an untagged thread.
const NONE: u32 = u32::MAX;

thread_local! {
    static TAG: Cell<u32> = const { Cell::new(NONE) };
}

#[allow(clippy::declare_interior_mutable_const)]
const ZERO: AtomicI64 = AtomicI64::new(0);
static LIVE: [AtomicI64; MAX_TAGS] = [ZERO; MAX_TAGS];
static PEAK: [AtomicI64; MAX_TAGS] = [ZERO; MAX_TAGS];
static NEXT: Mutex<usize> = Mutex::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

fn current_tag() -> u32 {
    TAG.try_with(|t| t.get()).unwrap_or(NONE)
}

fn add(tag: u32, bytes: i64) {
    let Some(live) = LIVE.get(tag as usize) else {
        return;
    };
    let now = live.fetch_add(bytes, Ordering::Relaxed) + bytes;
    let peak = &PEAK[tag as usize];
    if bytes > 0 && now > peak.load(Ordering::Relaxed) {
        peak.fetch_max(now, Ordering::Relaxed);
    }
}

/// `n` consecutive fresh tags (their counters zeroed); `None` for more
/// than `MAX_TAGS`. A tag is handed out again only after `MAX_TAGS` others.
pub fn claim(n: usize) -> Option<usize> {
    if n > MAX_TAGS {
        return None;
    }
    let mut next = NEXT.lock().unwrap_or_else(|e| e.into_inner());
    if *next + n > MAX_TAGS {
        *next = 0;
    }
    let base = *next;
    *next += n;
    for t in base..base + n {
        LIVE[t].store(0, Ordering::Relaxed);
        PEAK[t].store(0, Ordering::Relaxed);
    }
    Some(base)
}

/// While alive, attributes the current thread's allocations to a tag.
#[derive(Debug)]
pub struct RankTag {
    prev: u32,
}

impl RankTag {
    /// Tags the current thread with `tag` until the guard drops.
    pub fn enter(tag: usize) -> RankTag {
        let tag = u32::try_from(tag).unwrap_or(NONE);
        let prev = TAG.try_with(|t| t.replace(tag)).unwrap_or(NONE);
        RankTag { prev }
    }

    /// Counts the current thread's allocations to no rank until the guard
    /// drops: for state every rank shares (a communicator group's table),
    /// which would otherwise be charged to whichever rank happened to make
    /// it first.
    pub fn none() -> RankTag {
        let prev = TAG.try_with(|t| t.replace(NONE)).unwrap_or(NONE);
        RankTag { prev }
    }
}

impl Drop for RankTag {
    fn drop(&mut self) {
        let _ = TAG.try_with(|t| t.set(self.prev));
    }
}

/// Whether the counting allocator is the program's global allocator (it has
/// served at least one allocation).
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Relaxed)
}

/// Bytes allocated under `tag` and not freed yet.
pub fn live(tag: usize) -> i64 {
    LIVE.get(tag).map_or(0, |l| l.load(Ordering::Relaxed))
}

/// The largest `live(tag)` since the last `reset_peak(tag)`.
pub fn peak(tag: usize) -> i64 {
    PEAK.get(tag).map_or(0, |p| p.load(Ordering::Relaxed))
}

/// Starts a new peak window for `tag` at its current live bytes.
pub fn reset_peak(tag: usize) {
    if let Some(p) = PEAK.get(tag) {
        p.store(live(tag), Ordering::Relaxed);
    }
}

/// The counting allocator: `System` with a header holding the allocating
/// thread's tag in front of every block.
#[derive(Debug, Default, Copy, Clone)]
pub struct CountingAlloc;

/// Bytes in front of a block: a multiple of its alignment, at least 8.
fn header(layout: Layout) -> usize {
    layout.align().max(8)
}

/// The layout actually requested from `System`.
fn padded(layout: Layout) -> Option<Layout> {
    let h = header(layout);
    Layout::from_size_align(layout.size().checked_add(h)?, h).ok()
}

/// Records `tag` in the header in front of the user block at `user`.
///
/// # Safety
/// `user` is a block returned by this allocator (8 writable header bytes
/// precede it, 8-byte aligned).
unsafe fn set_tag(user: *mut u8, tag: u32) {
    (user.sub(8) as *mut u32).write(tag);
}

/// # Safety
/// As for `set_tag`.
unsafe fn get_tag(user: *mut u8) -> u32 {
    (user.sub(8) as *const u32).read()
}

// SAFETY: every block is a `System` block of the padded layout, offset by its
// header (a multiple of the alignment), so the user pointer keeps the
// requested alignment and size; `dealloc`/`realloc` undo the same offset.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.alloc_with(layout, false)
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.alloc_with(layout, true)
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let (h, Some(p)) = (header(layout), padded(layout)) else {
            return;
        };
        add(get_tag(ptr), -(layout.size() as i64));
        System.dealloc(ptr.sub(h), p);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let h = header(layout);
        let (Some(p), Some(total)) = (padded(layout), new_size.checked_add(h)) else {
            return std::ptr::null_mut();
        };
        let old_tag = get_tag(ptr);
        let base = System.realloc(ptr.sub(h), p, total);
        if base.is_null() {
            return base;
        }
        let user = base.add(h);
        let tag = current_tag();
        add(old_tag, -(layout.size() as i64));
        add(tag, new_size as i64);
        set_tag(user, tag);
        user
    }
}

impl CountingAlloc {
    unsafe fn alloc_with(&self, layout: Layout, zeroed: bool) -> *mut u8 {
        let Some(p) = padded(layout) else {
            return std::ptr::null_mut();
        };
        let base = if zeroed {
            System.alloc_zeroed(p)
        } else {
            System.alloc(p)
        };
        if base.is_null() {
            return base;
        }
        if !INSTALLED.load(Ordering::Relaxed) {
            INSTALLED.store(true, Ordering::Relaxed);
        }
        let user = base.add(header(layout));
        let tag = current_tag();
        set_tag(user, tag);
        add(tag, layout.size() as i64);
        user
    }
}
