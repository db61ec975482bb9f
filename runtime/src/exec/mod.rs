//! The executor: runs a plan's instruction list on every rank, honouring
//! streams and events (`rank`), in the plan's arena or, in debug mode, with
//! one allocation per buffer (`memory`), after resolving and checking the
//! plan once (`prepare`).
//!
//! Memory: tensors live only in the plan's arena. Besides it, a rank keeps
//! one `Workspace` per stream (kernel scratch: two `seq x seq` attention
//! tiles, two normalisation rows, strided softmax rows; it reaches its size
//! in the first step and is reused after), and per kernel call a few small
//! vectors of views and labels — bookkeeping, not tensor memory. Arithmetic
//! ops on bf16/f16 operands run on promoted f32 copies (a slow path for
//! mixed-precision plans, allocated per call).

pub(crate) mod events;
pub(crate) mod memory;
pub(crate) mod prepare;
pub(crate) mod rank;

/// How a rank executes the plan.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum ExecMode {
    /// One thread per stream, every buffer at its offset in one arena.
    #[default]
    Arena,
    /// The instruction list serially in list order; each buffer allocated
    /// just before its first write and dropped at its `Free`, measuring the
    /// peak of live bytes (which must equal the plan's `peak_bytes`).
    DebugAlloc,
}
