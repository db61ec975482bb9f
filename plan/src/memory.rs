//! What a rank's memory is, as the plan states it: the summary a runtime
//! is held to (`MemorySummary`), the estimates, and what "live" means.
//!
//! A buffer is live at instruction index `i` when `start <= i <= end`,
//! where `start` is the index of its first writing instruction and `end`
//! the index of its `Free` (persistent buffers: `start = 0`, live to the
//! last instruction). `peak_bytes` is the maximum over `i` of the bytes of
//! live device buffers; the runtime's debug mode measures the same thing.

use crate::buffer::{Buffer, BufferKind, Location};
use crate::instr::{Instr, InstrOp};
use crate::serde_default::is_zero;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Arena alignment of every buffer, bytes.
pub const ALIGN: u64 = 64;

/// Per-rank memory: the arena (every buffer, kernel workspaces included) and
/// the bounded transient heap of the matrix-product library; `rank_bytes` is
/// what a rank holds at most during a step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct MemorySummary {
    /// Maximum over the schedule of the bytes of live buffers.
    pub peak_bytes: u64,
    /// Instruction index at which the peak is reached.
    pub peak_at: u32,
    /// Size of the arena the runtime allocates (>= peak_bytes; the difference
    /// is fragmentation left by offset assignment).
    pub arena_bytes: u64,
    /// Live bytes at the peak, by buffer kind.
    pub breakdown: Vec<(BufferKind, u64)>,
    /// Bytes of the streams' `Workspace` buffers (inside the arena).
    #[serde(default)]
    pub workspace_bytes: u64,
    /// Most bytes the matrix-product library (`gemm`) allocates on its own
    /// at once, outside the arena: its packing buffers for the largest
    /// product panel plus its per-thread L2 slab (`workspace::gemm_heap`).
    #[serde(default)]
    pub heap_bytes: u64,
    /// `arena_bytes + host_arena_bytes + heap_bytes`: the most a rank holds
    /// during a step, the figure the runtime's measured peak is compared
    /// with.
    #[serde(default)]
    pub rank_bytes: u64,
    /// `cpu_offload`: the maximum of live host bytes (parameter and
    /// gradient shards, optimizer state; all persistent). `peak_bytes`,
    /// `arena_bytes` and `breakdown` count the device only. 0 without
    /// offload.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_peak_bytes: u64,
    /// `cpu_offload`: size of the host arena (>= `host_peak_bytes`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_arena_bytes: u64,
    /// On a cluster of GPUs: the device memory a rank of the cuda target
    /// holds besides the arena, one line each (the CUDA context, the
    /// cuBLAS workspaces, NCCL's buffers); empty on CPU clusters, where a
    /// rank's heap is all in `rank_bytes`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outside_arena: Vec<OutsideArena>,
}

/// What an `OutsideArena` line counts.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutsideKind {
    /// The CUDA context, loaded modules and the driver's reservations.
    Context,
    /// The cuBLAS workspaces of the streams with matrix products.
    CublasWorkspace,
    /// NCCL's channel buffers of every communicator.
    NcclBuffers,
}

/// One kind of device memory a GPU rank holds outside the plan's arena.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutsideArena {
    pub kind: OutsideKind,
    /// What it is, in words (`NCCL buffers: 3 communicators x 32 channels`).
    pub what: String,
    pub bytes: u64,
    /// Where the figure comes from: the runtime's own allocation, a
    /// library's documented default, or a stated assumption.
    pub source: String,
}

/// The cuBLAS workspace the cuda target gives each stream that runs
/// matrix products (NVIDIA's recommended size for Hopper; the runtime
/// allocates it beside the arena).
pub const CUBLAS_WORKSPACE_BYTES: u64 = 32 << 20;

/// What one NCCL channel's connection to one peer holds on the receiving
/// GPU with NCCL's default buffer sizes (`src/init.cc`): the LL protocol's
/// `8 x 512 x 8 x 16` = 524,288 B, LL128's `120 x 640 x 8 x 8` = 4,915,200
/// B and Simple's 4 MiB (`NCCL_BUFFSIZE`).
pub const NCCL_CHANNEL_BYTES: u64 = 524_288 + 4_915_200 + (4 << 20);

impl MemorySummary {
    /// The bytes of `outside_arena`.
    pub fn outside_arena_bytes(&self) -> u64 {
        self.outside_arena.iter().map(|o| o.bytes).sum()
    }

    /// The bytes of `outside_arena`'s lines of `kind`.
    pub fn outside_bytes(&self, kind: OutsideKind) -> u64 {
        self.outside_arena
            .iter()
            .filter(|o| o.kind == kind)
            .map(|o| o.bytes)
            .sum()
    }

    /// What a rank holds on its device at the peak: the arena's live peak
    /// and everything outside the arena; the figure the capacity is
    /// checked against.
    pub fn device_peak_bytes(&self) -> u64 {
        self.peak_bytes + self.outside_arena_bytes()
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Estimates {
    pub peak_bytes_per_rank: u64,
    /// Bytes each rank sends per step over all collectives.
    pub comm_bytes_per_step: u64,
    /// Executed FLOPs: what one rank computes per step, activation
    /// recomputation included (the FLOPs of HFU).
    pub flops_per_rank_step: f64,
    /// Model FLOPs: one rank's share of the model's forward and backward
    /// per step, recomputation not counted (the FLOPs of MFU).
    #[serde(default)]
    pub model_flops_per_rank_step: f64,
    /// Simulated step time in seconds.
    pub step_time_s: f64,
    /// Simulated time the compute stream waits on communication.
    pub exposed_comm_s: f64,
    /// Model FLOP/s per rank, in TFLOP/s: recomputation does not count.
    pub tflops_per_rank: f64,
    /// Model FLOPs utilisation against the preset's peak (recomputation
    /// does not count).
    pub mfu: f64,
    /// Hardware FLOPs utilisation: executed FLOPs (recomputation counted)
    /// per second against the preset's peak.
    #[serde(default)]
    pub hfu: f64,
    /// Simulated time of one evaluation batch (`Plan::eval`): when the
    /// evaluation prefix's last instruction ends in the simulated step.
    #[serde(default)]
    pub eval_s: f64,
}

/// Sets each buffer's `start` (first write; 0 for persistent buffers) and
/// `end` (its first `Free`; `None` for persistent or never-freed buffers).
pub fn set_lifetimes(buffers: &mut [Buffer], instrs: &[Instr]) {
    let mut start: Vec<Option<u32>> = vec![None; buffers.len()];
    let mut end: Vec<Option<u32>> = vec![None; buffers.len()];
    for (i, ins) in instrs.iter().enumerate() {
        for b in ins.op.writes() {
            if let Some(s) = start.get_mut(b.index()) {
                s.get_or_insert(i as u32);
            }
        }
        if let InstrOp::Free { buffer } = ins.op {
            if let Some(e) = end.get_mut(buffer.index()) {
                e.get_or_insert(i as u32);
            }
        }
    }
    for (i, b) in buffers.iter_mut().enumerate() {
        if b.kind.is_persistent() {
            b.start = 0;
            b.end = None;
        } else {
            b.start = start[i].or(end[i]).unwrap_or(0);
            b.end = end[i];
        }
    }
}

/// Live range of a buffer as `[start, end]` instruction indices.
fn live_range(b: &Buffer, n_instrs: usize) -> (u32, u32) {
    let last = n_instrs.saturating_sub(1) as u32;
    (b.start, b.end.unwrap_or(last).max(b.start))
}

/// Live bytes at every instruction index.
pub fn live_bytes(buffers: &[Buffer], n_instrs: usize) -> Vec<u64> {
    let n = n_instrs.max(1);
    let mut diff = vec![0i128; n + 1];
    for b in buffers {
        let (s, e) = live_range(b, n);
        let (s, e) = ((s as usize).min(n - 1), (e as usize).min(n - 1));
        diff[s] += i128::from(b.bytes);
        diff[e + 1] -= i128::from(b.bytes);
    }
    let mut live = Vec::with_capacity(n);
    let mut acc = 0i128;
    for d in &diff[..n] {
        acc += d;
        live.push(acc.max(0) as u64);
    }
    live
}

/// The device peak and its breakdown by buffer kind, and the host peak
/// (`host_arena_bytes` is left 0, `rank_bytes` is `arena_bytes`: the
/// memory pass adds the host arena and the caller the heap).
pub fn summarize(all: &[Buffer], n_instrs: usize, arena_bytes: u64) -> MemorySummary {
    let (buffers, host): (Vec<Buffer>, Vec<Buffer>) = all
        .iter()
        .cloned()
        .partition(|b| b.location == Location::Device);
    let host_peak_bytes = live_bytes(&host, n_instrs).into_iter().max().unwrap_or(0);
    let buffers = &buffers[..];
    let live = live_bytes(buffers, n_instrs);
    let (peak_at, peak_bytes) =
        live.iter().copied().enumerate().fold(
            (0, 0),
            |best, (i, b)| if b > best.1 { (i, b) } else { best },
        );
    let mut by_kind: BTreeMap<BufferKind, u64> = BTreeMap::new();
    for b in buffers {
        let (s, e) = live_range(b, n_instrs.max(1));
        if s as usize <= peak_at && peak_at <= e as usize {
            *by_kind.entry(b.kind).or_default() += b.bytes;
        }
    }
    let workspace_bytes = buffers
        .iter()
        .filter(|b| b.kind == BufferKind::Workspace)
        .map(|b| b.bytes)
        .sum();
    MemorySummary {
        peak_bytes,
        peak_at: peak_at as u32,
        arena_bytes,
        breakdown: by_kind.into_iter().collect(),
        workspace_bytes,
        heap_bytes: 0,
        rank_bytes: arena_bytes,
        host_peak_bytes,
        host_arena_bytes: 0,
        outside_arena: Vec::new(),
    }
}
