//! The executor: runs a plan's instruction list on every rank, honouring
//! streams and events (`rank`), in the plan's arena or, in debug mode, with
//! one allocation per buffer (`memory`), after resolving and checking the
//! plan once (`resolve`).
//!
//! Memory: during a step a rank allocates nothing of its own beyond the
//! plan's arena. Kernel scratch (attention tiles, normalisation rows,
//! strided softmax rows, f32 copies of half-precision operands) is the
//! first `workspace_bytes` of the stream's `Workspace` buffer in the arena;
//! operand views live on the stack; collectives and data loading write
//! into preallocated space. The one allocation outside the plan's arena is
//! the matrix-product library's own packing (`gemm`), which the plan bounds
//! as `memory.heap_bytes`. The stream threads are started once per run.
//! `account` measures all of it per rank when the counting allocator is
//! installed. (Known gap: a half-precision operand's widened type clones its
//! shape, a few bytes per call.)

pub(crate) mod events;
pub(crate) mod memory;
pub(crate) mod quantized;
pub(crate) mod rank;
pub(crate) mod resolve;
pub(crate) mod scaler;
pub mod timeline;
pub(crate) mod widen;

/// How a rank executes the plan.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum ExecMode {
    /// One thread per stream, every buffer at its offset in one arena.
    #[default]
    Arena,
    /// The instruction list serially in list order; each buffer allocated
    /// just before its first write and dropped at its `Free`. A check of the
    /// executor against the plan's lifetimes and offsets: its peak of live
    /// buffers re-derives the plan's `peak_bytes`, it does not measure a run.
    DebugAlloc,
}
