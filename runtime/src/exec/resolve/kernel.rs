//! Resolving a kernel instruction: its node's operand types from the
//! graph, its slots as checked regions (outputs disjoint from each other
//! and from the inputs), and its workspace, the first bytes of its
//! stream's `Workspace` buffer.

use super::*;

/// The first `bytes` of the `Workspace` buffer of instruction `i`'s stream.
pub(super) fn workspace(plan: &Plan, i: usize, bytes: u64) -> Result<Option<Region>, RuntimeError> {
    if bytes == 0 {
        return Ok(None);
    }
    let stream = plan.instructions[i].stream;
    let b = plan
        .buffers
        .iter()
        .find(|b| b.kind == BufferKind::Workspace && b.stream == Some(stream))
        .ok_or_else(|| {
            err(
                i,
                format!("the kernel needs {bytes} bytes of workspace and stream {stream:?} has no workspace buffer"),
            )
        })?;
    let slot = Slot {
        buffer: b.id,
        offset: 0,
    };
    region(plan, slot, bytes)
        .map(Some)
        .map_err(|e| err(i, format!("workspace: {e}")))
}

pub(super) fn kernel<'p>(
    plan: &'p Plan,
    graph: &'p Graph,
    i: usize,
    id: NodeId,
    inputs: &[Slot],
    outputs: &[Slot],
    ws: Option<Region>,
) -> Result<Step<'p>, RuntimeError> {
    let node = graph
        .try_node(id)
        .ok_or_else(|| err(i, format!("node {id} does not exist")))?;
    let in_vals: Vec<ValueId> = graph.inputs(id);
    if in_vals.len() != inputs.len() || node.outputs.len() != outputs.len() {
        return Err(err(
            i,
            format!(
                "node {id} ({}) has {} inputs and {} outputs, the instruction gives {} and {}",
                node.name,
                in_vals.len(),
                node.outputs.len(),
                inputs.len(),
                outputs.len()
            ),
        ));
    }
    let mut ins = Vec::with_capacity(inputs.len());
    for (slot, v) in inputs.iter().zip(&in_vals) {
        let ty = graph
            .try_value_type(*v)
            .ok_or_else(|| err(i, format!("value {v} does not exist")))?;
        ins.push((region(plan, *slot, ty.bytes()).map_err(|e| err(i, e))?, ty));
    }
    let mut outs = Vec::with_capacity(outputs.len());
    for (slot, ty) in outputs.iter().zip(&node.outputs) {
        outs.push((region(plan, *slot, ty.bytes()).map_err(|e| err(i, e))?, ty));
    }
    for (k, (o, _)) in outs.iter().enumerate() {
        let clash = ins.iter().chain(&outs[..k]).any(|(r, _)| overlaps(r, o));
        if clash {
            return Err(err(i, format!("node {id} ({}): output {k} overlaps another operand (in-place kernels are not supported)", node.name)));
        }
    }
    Ok(Step::Kernel {
        id,
        node,
        ins,
        outs,
        ws,
        micro: 0,
    })
}

fn overlaps(a: &Region, b: &Region) -> bool {
    a.buffer == b.buffer
        && a.offset < b.offset + b.len
        && b.offset < a.offset + a.len
        && a.len > 0
        && b.len > 0
}
