//! Helpers shared by the integration tests.

#![allow(dead_code)]

pub mod grad;

use fsdpc_ir::{ModuleId, Node, Op, Phase, TensorType};
use fsdpc_runtime::{Backend, CpuBackend, HostTensor, KernelCtx, TensorMut, TensorRef, Workspace};

/// Runs `op` on the CPU backend with as much scratch as the planner's rule
/// gives the kernel in a plan: its outputs, or the kernel's error.
pub fn run_cpu(op: Op, ins: &[HostTensor], outs: &[TensorType]) -> Result<Vec<HostTensor>, String> {
    let node = Node {
        op,
        name: "t".into(),
        module: ModuleId::ROOT,
        phase: Phase::Forward,
        outputs: outs.to_vec(),
    };
    let mut out: Vec<HostTensor> = outs.iter().map(|t| HostTensor::zeros(t.clone())).collect();
    let views: Vec<TensorRef> = ins.iter().map(|t| t.view()).collect();
    let mut ov: Vec<TensorMut> = out.iter_mut().map(|t| t.view_mut()).collect();
    // As much scratch as the planner's rule gives this kernel in a plan.
    let in_types: Vec<&TensorType> = ins.iter().map(|t| &t.ty).collect();
    let ws = fsdpc_plan::workspace::kernel_workspace(&node.op, &in_types, outs);
    let mut scratch = vec![0u64; (ws as usize).div_ceil(8)];
    CpuBackend::default()
        .run(
            &node,
            &views,
            &mut ov,
            &KernelCtx::default(),
            &mut Workspace::new(bytemuck::cast_slice_mut(&mut scratch)),
        )
        .map_err(|e| e.0)?;
    Ok(out)
}
