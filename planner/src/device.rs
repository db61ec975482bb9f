//! What a GPU rank of the cuda target holds on its device besides the
//! plan's arena (`MemorySummary::outside_arena`), on a cluster whose
//! hardware gives the figures (`Hardware::context_bytes`,
//! `Hardware::nccl_channels`; CPU clusters give none):
//!
//! - the process's CUDA context, modules and driver reservations;
//! - a cuBLAS handle (`Hardware::cublas_handle_bytes`) and workspace
//!   (`CUBLAS_WORKSPACE_BYTES`, allocated by the runtime beside the arena)
//!   for each stream that runs matrix products;
//! - NCCL's buffers: the cuda target makes one communicator for each
//!   (stream, group) its collectives run on over more than one rank, and
//!   one for the loss report, and each holds its channels' receive
//!   buffers (`NCCL_CHANNEL_BYTES` a channel, one ring peer). The world
//!   communicators the groups are split from run nothing, and with NCCL's
//!   runtime connection (the default since NCCL 2.22) hold no buffers.

use fsdpc_ir::Op;
use fsdpc_plan::memory::{CUBLAS_WORKSPACE_BYTES, NCCL_CHANNEL_BYTES};
use fsdpc_plan::*;

/// The lines of `plan`'s memory outside the arena on hardware `hw`
/// (none where `hw` gives no GPU figures).
pub fn outside_arena(plan: &Plan, hw: &Hardware) -> Vec<OutsideArena> {
    let mut out = Vec::new();
    if hw.context_bytes == 0 && hw.nccl_channels == 0 {
        // Not a GPU (or a cluster file that says nothing of it).
        return out;
    }
    if hw.context_bytes > 0 {
        out.push(OutsideArena {
            kind: OutsideKind::Context,
            what: "CUDA context, modules and driver".into(),
            bytes: hw.context_bytes,
            source: "the cluster's context_bytes; `fsdpc cluster` gives its source".into(),
        });
    }
    let gemm_streams: std::collections::BTreeSet<usize> = plan
        .instructions
        .iter()
        .filter(|ins| match &ins.op {
            InstrOp::Kernel { node, .. } => plan
                .training
                .graph
                .try_node(*node)
                .is_some_and(|n| matches!(n.op, Op::MatMul { .. })),
            _ => false,
        })
        .map(|ins| ins.stream.index())
        .collect();
    if !gemm_streams.is_empty() {
        let n = gemm_streams.len() as u64;
        let handle = hw.cublas_handle_bytes;
        out.push(OutsideArena {
            kind: OutsideKind::CublasWorkspace,
            what: format!(
                "cuBLAS: a handle ({:.1} MiB) and a {} MiB workspace on each of {n} stream(s) with matrix products",
                handle as f64 / f64::from(1 << 20),
                CUBLAS_WORKSPACE_BYTES >> 20
            ),
            bytes: n * (CUBLAS_WORKSPACE_BYTES + handle),
            source: "the workspace: the cuda target allocates it (NVIDIA's recommended size for \
                     Hopper); the handle: the cluster's cublas_handle_bytes"
                .into(),
        });
    }
    let comms = communicators(plan);
    if hw.nccl_channels > 0 && comms > 0 {
        let channels = u64::from(hw.nccl_channels);
        out.push(OutsideArena {
            kind: OutsideKind::NcclBuffers,
            what: format!(
                "NCCL buffers: {comms} communicator(s) x {channels} channels x {:.2} MiB",
                NCCL_CHANNEL_BYTES as f64 / f64::from(1 << 20)
            ),
            bytes: comms * channels * NCCL_CHANNEL_BYTES,
            source: "NCCL's default LL, LL128 and Simple buffers of a channel (src/init.cc) \
                     times the cluster's nccl_channels"
                .into(),
        });
    }
    out
}

/// The NCCL communicators a rank of the cuda target uses: one per (stream,
/// group) of a collective over more than one rank, and the loss report's
/// over the world (world > 1).
pub fn communicators(plan: &Plan) -> u64 {
    let geometry = plan.geometry();
    let mut keys: Vec<(usize, Group)> = Vec::new();
    for ins in &plan.instructions {
        if let Some(g) = ins.op.group() {
            let key = (ins.stream.index(), g);
            if geometry.size(g) > 1 && !keys.contains(&key) {
                keys.push(key);
            }
        }
    }
    keys.len() as u64 + u64::from(plan.cluster.world > 1)
}
