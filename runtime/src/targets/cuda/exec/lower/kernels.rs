//! Kernels and data: a graph node's kernel (`ops::lower` on the addresses
//! of its regions), a micro-batch's input load (filled from the data
//! source when the step runs), and a buffer copy.

use super::Lowering;
use crate::error::RuntimeError;
use crate::exec::resolve::Region;
use crate::targets::cuda::error::CudaError;
use crate::targets::cuda::exec::{Item, Work};
use crate::targets::cuda::ops::{self, Action, Lowered, Operand};
use fsdpc_ir::{Node, NodeId, TensorType};
use fsdpc_plan::BufferId;

/// `LoadInput`: the input's region, filled when the step runs.
pub(super) fn load_input(
    cx: &Lowering,
    name: &str,
    ty: &TensorType,
    dst: &Region,
    micro: u32,
) -> Work {
    let (prep, l) = (cx.prep, cx.l);
    Work::Load {
        name: name.to_string(),
        ty: (*ty).clone(),
        dst: l.region(prep, dst),
        micro,
    }
}

/// `Kernel`: node `id`'s op lowered on its operands' addresses, its
/// workspace and this rank's first sample of micro-batch `micro`.
pub(super) fn kernel(
    cx: &Lowering,
    id: NodeId,
    node: &Node,
    ins: &[(Region, &TensorType)],
    outs: &[(Region, &TensorType)],
    ws: Option<&Region>,
    micro: u32,
) -> Result<Lowered, RuntimeError> {
    let (prep, l, seed) = (cx.prep, cx.l, cx.seed);
    let (rank, world) = (
        cx.geometry.data_rank(cx.rank),
        cx.geometry.data_world() as usize,
    );
    let xs: Vec<Operand> = ins
        .iter()
        .map(|(r, ty)| Operand {
            ptr: l.region(prep, r),
            ty,
        })
        .collect();
    let ys: Vec<Operand> = outs
        .iter()
        .map(|(r, ty)| Operand {
            ptr: l.region(prep, r),
            ty,
        })
        .collect();
    let w = ws.map(|r| (l.region(prep, r), r.len as u64));
    let first = (u64::from(micro) * world as u64 + rank as u64) * prep.batch as u64;
    let lowered =
        ops::lower(&node.op, &xs, &ys, w, first, seed).map_err(|reason| CudaError::Kernel {
            node: format!("{id} ({})", node.name),
            op: node.op.name(),
            reason,
        })?;
    Ok(lowered)
}

/// `Copy`: `dst = src`, the whole buffer.
pub(super) fn copy(cx: &Lowering, src: BufferId, dst: BufferId, items: &mut Vec<Item>) {
    let (plan, prep, l) = (cx.prep.plan, cx.prep, cx.l);
    let bytes = plan.buffers[src.index()].bytes;
    items.push(Item::Act(Action::Copy {
        src: l.buffer(prep, src),
        dst: l.buffer(prep, dst),
        bytes,
    }));
}
