//! The reference evaluator: runs a graph node by node with the CPU kernels,
//! without a plan, holding every value. Used for finite-difference gradient
//! checks and conformance tests.

use crate::backend::{Backend, KernelCtx, Workspace};
use crate::cpu::CpuBackend;
use crate::error::RuntimeError;
use crate::tensor::{HostTensor, TensorMut, TensorRef};
use fsdpc_ir::{Graph, NodeId, Op, ParamId, ValueId};
use std::collections::HashMap;

/// Every parameter's initial value, from the IR's counter-based init.
pub fn init_params(graph: &Graph, seed: u64) -> Result<HashMap<ParamId, HostTensor>, RuntimeError> {
    let mut out = HashMap::new();
    for (i, spec) in graph.params.iter().enumerate() {
        let mut vals = vec![0.0f32; spec.ty.numel() as usize];
        crate::irinit::fill_f32(spec, seed, 0, &mut vals)?;
        let t =
            HostTensor::from_f32(&spec.ty.shape.0, &vals).map_err(|e| RuntimeError::Eval(e.0))?;
        out.insert(ParamId(i as u32), cast_to(&t, spec.ty.dtype));
    }
    Ok(out)
}

fn cast_to(t: &HostTensor, dt: fsdpc_ir::DType) -> HostTensor {
    if t.ty.dtype == dt {
        return t.clone();
    }
    let mut out = HostTensor::zeros(fsdpc_ir::TensorType {
        dtype: dt,
        shape: t.ty.shape.clone(),
    });
    // Same element count by construction, so the cast cannot fail.
    let _ = crate::cpu::kernels::cast::cast(&t.view(), &mut out.view_mut());
    out
}

/// Evaluates every node of `graph` in a topological order: `Input` nodes from
/// `feeds` (by name), `Param` nodes from `params`, everything else with the
/// CPU kernels. Returns every value.
pub fn eval_graph(
    graph: &Graph,
    feeds: &HashMap<String, HostTensor>,
    params: &HashMap<ParamId, HostTensor>,
    ctx: &KernelCtx,
) -> Result<HashMap<ValueId, HostTensor>, RuntimeError> {
    let order = graph
        .topo_order()
        .map_err(|c| RuntimeError::Eval(format!("graph has a cycle through {c:?}")))?;
    let backend = CpuBackend::default();
    let mut values: HashMap<ValueId, HostTensor> = HashMap::new();
    for n in order {
        let outs = eval_node(graph, n, feeds, params, &values, &backend, ctx)?;
        for (slot, t) in outs.into_iter().enumerate() {
            values.insert(
                ValueId {
                    node: n,
                    slot: slot as u32,
                },
                t,
            );
        }
    }
    Ok(values)
}

/// The outputs of one node.
fn eval_node(
    graph: &Graph,
    n: NodeId,
    feeds: &HashMap<String, HostTensor>,
    params: &HashMap<ParamId, HostTensor>,
    values: &HashMap<ValueId, HostTensor>,
    backend: &CpuBackend,
    ctx: &KernelCtx,
) -> Result<Vec<HostTensor>, RuntimeError> {
    let node = graph.node(n);
    let source =
        match &node.op {
            Op::Input { name } => Some(
                feeds
                    .get(name)
                    .ok_or_else(|| RuntimeError::Eval(format!("no feed for input `{name}`")))?,
            ),
            Op::Param { param } => Some(params.get(param).ok_or_else(|| {
                RuntimeError::Eval(format!("no value for parameter {}", param.0))
            })?),
            _ => None,
        };
    if let Some(t) = source {
        let want = node.outputs.first();
        if want != Some(&t.ty) {
            return Err(RuntimeError::Eval(format!(
                "node {} ({}) expects {:?}, was given {}",
                n, node.name, want, t.ty
            )));
        }
        return Ok(vec![t.clone()]);
    }
    let mut ins: Vec<TensorRef> = Vec::new();
    for v in graph.inputs(n) {
        let t = values
            .get(&v)
            .ok_or_else(|| RuntimeError::Eval(format!("value {v} used before it is computed")))?;
        ins.push(t.view());
    }
    let mut outs: Vec<HostTensor> = node
        .outputs
        .iter()
        .map(|t| HostTensor::zeros(t.clone()))
        .collect();
    let mut views: Vec<TensorMut> = outs.iter_mut().map(|t| t.view_mut()).collect();
    // The planner's workspace rule sizes the scratch, as in a plan.
    let in_types: Vec<&fsdpc_ir::TensorType> = ins.iter().map(|t| t.ty).collect();
    let ws_bytes = fsdpc_plan::workspace::kernel_workspace(&node.op, &in_types, &node.outputs);
    let mut scratch = vec![0u64; (ws_bytes as usize).div_ceil(8)];
    let mut ws = Workspace::new(bytemuck::cast_slice_mut(&mut scratch));
    backend
        .run(node, &ins, &mut views, ctx, &mut ws)
        .map_err(|e| RuntimeError::Kernel {
            node: format!("{} ({})", n, node.name),
            op: node.op.name(),
            reason: e.0,
        })?;
    Ok(outs)
}
