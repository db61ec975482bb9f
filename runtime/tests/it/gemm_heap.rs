//! The memory plan's bound of what the matrix-product library allocates
//! (`fsdpc_plan::workspace::gemm_call_bytes`) against what it really
//! allocates, measured by a counting allocator in this test binary: with
//! this machine's blocking (`cpu::gemm_blocking`, what `fsdpc calibrate`
//! writes) the bound is the allocation to within the alignment slack;
//! without it (presets), an upper bound.

use fsdpc_plan::workspace::{gemm_call_bytes, GemmCall, GEMM_SLAB_BYTES};
use fsdpc_runtime::cpu::gemm_blocking;
use fsdpc_runtime::cpu::kernels::matmul::{gemm_f32, Mat};
use gemm::Parallelism;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// Counts the bytes the current thread allocates while `COUNTING` is set
/// (per thread: the tests run on threads of their own).
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<u64> = const { Cell::new(0) };
    static PEAK: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            let now = LIVE.with(|x| x.get()) + l.size() as u64;
            LIVE.with(|x| x.set(now));
            PEAK.with(|x| x.set(x.get().max(now)));
        }
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        if COUNTING.with(Cell::get) {
            LIVE.with(|x| x.set(x.get().saturating_sub(l.size() as u64)));
        }
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// The most bytes one `gemm_f32` call allocates, its operands made first.
fn measured(c: GemmCall) -> u64 {
    let (m, k, n) = (c.m as usize, c.k as usize, c.n as usize);
    let a = vec![0.5f32; m * k];
    let b = vec![0.25f32; k * n];
    let mut out = vec![0f32; m * n];
    let am = Mat {
        data: &a,
        rows: m,
        cols: k,
        trans: c.trans_a,
    };
    let bm = Mat {
        data: &b,
        rows: k,
        cols: n,
        trans: c.trans_b,
    };
    LIVE.with(|x| x.set(0));
    PEAK.with(|x| x.set(0));
    COUNTING.with(|x| x.set(true));
    let r = gemm_f32(Parallelism::None, &mut out, am, bm, 1.0, false);
    COUNTING.with(|x| x.set(false));
    r.expect("gemm runs");
    PEAK.with(Cell::get)
}

fn calls() -> Vec<GemmCall> {
    let mut v = Vec::new();
    for &(m, k, n) in &[
        (32, 512, 512),
        (512, 32, 512),
        (1024, 128, 384),
        (1024, 128, 128),
        (128, 1024, 384),
        (1024, 512, 1024),
        (8, 512, 4096),
        (4096, 8, 512),
        (32, 512, 10),
        (16, 100, 24),
        (7, 300, 1000),
        (300, 7, 2100),
    ] {
        for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
            v.push(GemmCall {
                m,
                k,
                n,
                trans_a,
                trans_b,
            });
        }
    }
    v
}

/// Slack of the bound over the allocation: two 128-byte alignments and
/// the flag vector's bytes (`gemm_call_bytes`).
const SLACK: u64 = 2 * 128 + 16;

#[test]
fn the_bound_is_the_allocation_with_this_machines_blocking() {
    let Some(blocking) = gemm_blocking() else {
        eprintln!("skipped: no gemm blocking is known for this CPU (not x86-64)");
        return;
    };
    // The thread's packing slab first (allocated once per thread by the
    // first call that packs its left-hand operand on the fly).
    let slab = measured(GemmCall {
        m: 256,
        k: 256,
        n: 256,
        trans_a: false,
        trans_b: false,
    });
    assert!(
        slab <= blocking.slab_bytes + SLACK,
        "the slab is {slab} bytes, {blocking:?} says {}",
        blocking.slab_bytes
    );
    for c in calls() {
        let got = measured(c);
        let bound = gemm_call_bytes(c, Some(&blocking));
        assert!(
            got <= bound && bound - got <= SLACK,
            "{c:?} on {blocking:?}: gemm allocated {got} bytes, the plan says {bound}"
        );
    }
}

#[test]
fn the_bound_over_every_cpu_holds_here() {
    // The thread's packing slab first (the first call that packs its
    // left-hand operand allocates it), against its own bound.
    let slab = measured(GemmCall {
        m: 256,
        k: 256,
        n: 256,
        trans_a: false,
        trans_b: false,
    });
    assert!(
        slab <= GEMM_SLAB_BYTES + SLACK,
        "the slab is {slab} bytes, the bound {GEMM_SLAB_BYTES}"
    );
    for c in calls() {
        let got = measured(c);
        let bound = gemm_call_bytes(c, None);
        assert!(
            got <= bound,
            "{c:?}: gemm allocated {got} bytes, the bound is {bound}"
        );
    }
}
