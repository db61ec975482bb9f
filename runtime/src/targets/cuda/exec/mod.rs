//! One GPU rank's execution of a plan, with the semantics of the CPU
//! executor's `crate::exec::rank`. Before the first step every instruction
//! is lowered to device work (`Work`) with its addresses fixed: the arena
//! is one allocation that never moves. A step is then one host thread
//! walking the instruction list in list order (an order every plan's events
//! allow: `resolve` and the debug executor rely on it too) and enqueueing
//! each instruction on its stream's CUDA stream: `Record` is
//! `cuEventRecord`, `Wait` is `cuStreamWaitEvent`, so the GPU sees exactly
//! the plan's cross-stream order and streams run concurrently where the
//! plan lets them. The step ends when every stream is synchronised.
//!
//! The allocation: the plan's arena (`memory.arena_bytes`, zeroed once),
//! then per stream a private scratch (an error word, then what its kernels
//! need beyond their operands: attention statistics, normalisation and
//! loss partials; sized from the lowered plan), then per stream that runs
//! matrix products the cuBLAS workspace (`BLAS_WORKSPACE`).
//!
//! Not supported, refused before the first step naming the instruction:
//! host buffers (`--cpu-offload`) and their copies, and the fp16 loss
//! scaler's instructions.
//!
//! The files: `rank` (a rank's set-up: streams, events, the allocation,
//! cuBLAS handles, the lowered work; reading results between steps),
//! `replay` (a step: the instructions enqueued in list order, then the
//! streams synchronised and their error words read), `comms` (the NCCL
//! communicators, one per plan stream and group, split from one world
//! communicator per stream), `lower/` (each instruction's device work).

mod comms;
mod lower;
mod rank;
mod replay;

pub use comms::{comm_streams, CommSetup, Id};
pub use rank::GpuRank;
pub(crate) use replay::{fault_text, issue_action};

use super::ops::Action;
use crate::error::RuntimeError;
use crate::exec::resolve::Resolved;
use fsdpc_ir::{DType, TensorType};
use fsdpc_plan::Stream;

/// Bytes of cuBLAS workspace per stream that runs matrix products (what
/// NVIDIA recommends for Hopper), as the plan counts it outside the arena.
pub const BLAS_WORKSPACE: u64 = fsdpc_plan::memory::CUBLAS_WORKSPACE_BYTES;
/// Bytes at the start of each stream's scratch: its error word.
pub(crate) const ERR_BYTES: u64 = 256;

/// When the executor uses NCCL.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum NcclUse {
    /// For groups of more than one rank; a group of one copies locally.
    #[default]
    Auto,
    /// For every group, even of one rank (tests NCCL at world 1).
    Always,
}

/// One collective, or the local work that replaces it.
#[derive(Debug)]
enum Coll {
    AllGather {
        comm: usize,
        send: u64,
        recv: u64,
        count: usize,
        dt: DType,
    },
    ReduceScatter {
        comm: usize,
        send: u64,
        recv: u64,
        count: usize,
        dt: DType,
    },
    AllReduce {
        comm: usize,
        buf: u64,
        count: usize,
        dt: DType,
    },
}

/// One instruction's device work.
#[derive(Debug)]
enum Work {
    Nothing,
    /// Actions and collectives in order.
    Device(Vec<Item>),
    Load {
        name: String,
        ty: TensorType,
        dst: u64,
        micro: u32,
    },
    Optimizer {
        params: u64,
        grads: u64,
        gdt: DType,
        state: Vec<u64>,
        n: u64,
        /// The element ranges of the shard weight decay does not apply to
        /// (`Unit::undecayed`), stepped by launches of their own.
        undecayed: Vec<std::ops::Range<u64>>,
    },
    /// A module buffer's new value, copied in on the compute stream;
    /// skipped by an evaluation (`InstrOp::WriteBuffer`).
    WriteBuffer {
        src: u64,
        dst: u64,
        bytes: u64,
    },
    Record(usize),
    Wait(usize),
}

#[derive(Debug)]
enum Item {
    Act(Action),
    Coll(Coll),
}

/// The per-step timings of `--trace`-like measurements: each instruction's
/// (start, end) in ms after the step's start, by plan stream.
pub type Spans = Vec<(Stream, usize, f32, f32)>;

/// Everything the executor checks before it touches a device, for `plan`
/// at `world`: the plan resolves, nothing unsupported is in it, every
/// instruction lowers; returns the plan streams that need a world
/// communicator.
pub fn check_plan(
    plan: &fsdpc_plan::Plan,
    world: usize,
    nccl: NcclUse,
) -> Result<Vec<Stream>, RuntimeError> {
    let prep = crate::exec::resolve::resolve(plan)?;
    refuse_unsupported(&prep)?;
    // Every rank's lowering (what a rank lowers depends on its position in
    // the mesh); the streams are the same on every rank.
    for rank in 1..world {
        comm_streams(&prep, world, rank, nccl)?;
    }
    comm_streams(&prep, world, 0, nccl)
}

/// Refuses what the cuda target does not run (its capabilities: host
/// buffers, other collective forms, quantized wire formats, the loss
/// scaler), naming the instruction.
pub fn refuse_unsupported(prep: &Resolved) -> Result<(), RuntimeError> {
    crate::targets::cuda_capabilities().check(prep.plan)?;
    Ok(())
}
