//! The workspace pass: every kernel instruction's `workspace_bytes` and one
//! `Workspace` buffer per stream that runs kernels, from the rules of
//! `fsdpc_plan::workspace` (the kernels' contract), and the bound of what
//! the matrix-product library allocates outside the arena.

use crate::schedule::Schedule;
use fsdpc_ir::{DType, Graph, TensorType};
use fsdpc_plan::cluster::GemmBlocking;
use fsdpc_plan::workspace::{gemm_heap, kernel_workspace, GEMM_SLAB_BYTES};
use fsdpc_plan::{Buffer, BufferKind, InstrOp, Stream};

/// Sets every kernel instruction's `workspace_bytes`, appends one
/// `Workspace` buffer per stream whose kernels need any, and returns the
/// most bytes the matrix-product library allocates at once outside the
/// arena: its slab (`blocking`'s, else `GEMM_SLAB_BYTES`) and the largest
/// kernel's packing (`gemm_heap`), or zero when no kernel multiplies
/// matrices.
pub fn plan_workspaces(s: &mut Schedule, graph: &Graph, blocking: Option<&GemmBlocking>) -> u64 {
    let mut per_stream = [0u64; Stream::ALL.len()];
    let mut pack = 0u64;
    for ins in &mut s.instructions {
        if let InstrOp::Kernel {
            node,
            workspace_bytes,
            ..
        } = &mut ins.op
        {
            if !graph.contains(*node) {
                continue;
            }
            let n = graph.node(*node);
            let in_types: Vec<&TensorType> = graph
                .inputs(*node)
                .into_iter()
                .map(|v| graph.value_type(v))
                .collect();
            *workspace_bytes = kernel_workspace(&n.op, &in_types, &n.outputs);
            pack = pack.max(gemm_heap(&n.op, &in_types, blocking));
            let w = &mut per_stream[ins.stream.index()];
            *w = (*w).max(*workspace_bytes);
        }
    }
    for stream in Stream::ALL {
        let bytes = per_stream[stream.index()];
        if bytes == 0 {
            continue;
        }
        Buffer::add(&mut s.buffers, BufferKind::Workspace, DType::F32, bytes).on_stream(stream);
    }
    if pack == 0 {
        0
    } else {
        blocking.map_or(GEMM_SLAB_BYTES, |g| g.slab_bytes) + pack
    }
}
