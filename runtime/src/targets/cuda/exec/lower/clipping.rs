//! Gradient accumulation and clipping: `dst += src` over micro-batches,
//! the sum of squares of the gradients (f64 partials per block in scratch,
//! then one thread adds them, in order, to a running total), and the
//! scaling by the clip factor.

use super::{elems, Lowering};
use crate::targets::cuda::device::{grid_for, Arg, Launch, Ptr, THREADS};
use crate::targets::cuda::exec::Item;
use crate::targets::cuda::ops::{dt_code, Action};
use fsdpc_plan::BufferId;

/// Blocks of the sum-of-squares partials.
const SUMSQ_BLOCKS: u64 = 256;

/// `Accumulate`: `dst += src`.
pub(super) fn accumulate(cx: &Lowering, src: BufferId, dst: BufferId, items: &mut Vec<Item>) {
    let (prep, l) = (cx.prep, cx.l);
    let (n, dt) = elems(prep, src);
    items.push(Item::Act(Action::Launch(Launch {
        kernel: "accumulate",
        grid: (grid_for(n), 1, 1),
        block: THREADS,
        smem: 0,
        args: vec![
            Arg::Ptr(Ptr::Abs(l.buffer(prep, src))),
            Arg::Ptr(Ptr::Abs(l.buffer(prep, dst))),
            Arg::I32(dt_code(dt)),
            Arg::I64(n as i64),
        ],
    })));
}

/// `GradNormSq`: the sum of squares of `grads` into `dst` (off tensor
/// position 0 with `split_only_off_first`, of the split parameters'
/// elements only); returns the scratch it needs.
pub(super) fn grad_norm_sq(
    cx: &Lowering,
    grads: &[BufferId],
    dst: BufferId,
    split_only_off_first: bool,
    items: &mut Vec<Item>,
) -> u64 {
    let (prep, l) = (cx.prep, cx.l);
    let parts = 8u64;
    let scratch = parts + 8 * SUMSQ_BLOCKS;
    let skip = split_only_off_first && cx.geometry.tensor_position(cx.rank) != 0;
    let pos = cx.geometry.shard_position(cx.rank);
    // (address, elements, dtype) of every piece summed, in order.
    let mut pieces = Vec::new();
    for g in grads {
        let (n, dt) = elems(prep, *g);
        let base = l.buffer(prep, *g);
        if skip {
            for (a, k) in crate::exec::resolve::split_elements(prep.plan, *g, pos) {
                pieces.push((base + (a * dt.size()) as u64, k as u64, dt));
            }
        } else {
            pieces.push((base, n, dt));
        }
    }
    items.push(Item::Act(Action::Zero {
        ptr: Ptr::Scratch(0),
        bytes: 8,
    }));
    if pieces.is_empty() {
        items.push(Item::Act(Action::Zero {
            ptr: Ptr::Abs(l.buffer(prep, dst)),
            bytes: 4,
        }));
    }
    let last = pieces.len();
    for (k, (at, n, dt)) in pieces.into_iter().enumerate() {
        items.push(Item::Act(Action::Launch(Launch {
            kernel: "sumsq_partial",
            grid: (SUMSQ_BLOCKS as u32, 1, 1),
            block: THREADS,
            smem: 0,
            args: vec![
                Arg::Ptr(Ptr::Abs(at)),
                Arg::I32(dt_code(dt)),
                Arg::I64(n as i64),
                Arg::Ptr(Ptr::Scratch(parts)),
            ],
        })));
        items.push(Item::Act(Action::Launch(Launch {
            kernel: "sumsq_finish",
            grid: (1, 1, 1),
            block: 32,
            smem: 0,
            args: vec![
                Arg::Ptr(Ptr::Scratch(parts)),
                Arg::I32(SUMSQ_BLOCKS as i32),
                Arg::Ptr(Ptr::Scratch(0)),
                Arg::Ptr(Ptr::Abs(l.buffer(prep, dst))),
                Arg::I32((k + 1 == last) as i32),
            ],
        })));
    }
    scratch
}

/// `ClipGrads`: `grads` scaled by the clip factor of `norm`.
pub(super) fn clip_grads(
    cx: &Lowering,
    norm: BufferId,
    grads: BufferId,
    max_norm: f64,
    items: &mut Vec<Item>,
) {
    let (prep, l) = (cx.prep, cx.l);
    let (n, dt) = elems(prep, grads);
    items.push(Item::Act(Action::Launch(Launch {
        kernel: "clip",
        grid: (grid_for(n), 1, 1),
        block: THREADS,
        smem: 0,
        args: vec![
            Arg::Ptr(Ptr::Abs(l.buffer(prep, grads))),
            Arg::I32(dt_code(dt)),
            Arg::I64(n as i64),
            Arg::Ptr(Ptr::Abs(l.buffer(prep, norm))),
            Arg::F64(max_norm),
        ],
    })));
}
