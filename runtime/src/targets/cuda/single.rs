//! One graph node's kernel outside a plan, on host tensors: inputs copied
//! in, the node's lowered work issued on one stream, outputs copied back.
//! What the CPU-vs-GPU kernel tests (`tests/it/cuda.rs`) compare with
//! `CpuBackend::run` on the same inputs.

use super::blas::Blas;
use super::device::{Device, DeviceAlloc, Ptr};
use super::error::CudaError;
use super::exec::{fault_text, issue_action, BLAS_WORKSPACE, ERR_BYTES};
use super::ops::{self, Operand};
use crate::backend::KernelCtx;
use crate::exec::rank::Pass;
use crate::tensor::HostTensor;
use cudarc::driver::result;
use fsdpc_ir::{Node, TensorType};

fn round(x: u64) -> u64 {
    x.div_ceil(256) * 256
}

/// Runs `node` on `inputs` with `ws_bytes` of workspace (as a plan would
/// give it), returning its outputs.
pub fn run_node(
    dev: &Device,
    node: &Node,
    inputs: &[HostTensor],
    ctx: &KernelCtx,
    ws_bytes: u64,
) -> Result<Vec<HostTensor>, CudaError> {
    let kernel_err = |reason: String| CudaError::Kernel {
        node: node.name.clone(),
        op: node.op.name(),
        reason,
    };
    // Operands, workspace, then the scratch (error word first), then the
    // cuBLAS workspace, each 256-aligned.
    let mut at = 0u64;
    let mut place = |bytes: u64| {
        let p = at;
        at += round(bytes.max(1));
        p
    };
    let in_off: Vec<u64> = inputs.iter().map(|t| place(t.ty.bytes())).collect();
    let out_off: Vec<u64> = node.outputs.iter().map(|t| place(t.bytes())).collect();
    let ws_off = place(ws_bytes);
    let operands = |base: u64, offs: &[u64], tys: &[&TensorType]| -> Vec<(u64, TensorType)> {
        offs.iter()
            .zip(tys)
            .map(|(o, t)| (base + o, (*t).clone()))
            .collect()
    };
    let in_tys: Vec<&TensorType> = inputs.iter().map(|t| &t.ty).collect();
    let out_tys: Vec<&TensorType> = node.outputs.iter().collect();
    let lower = |base: u64| {
        let xs = operands(base, &in_off, &in_tys);
        let ys = operands(base, &out_off, &out_tys);
        let xo: Vec<Operand> = xs.iter().map(|(p, ty)| Operand { ptr: *p, ty }).collect();
        let yo: Vec<Operand> = ys.iter().map(|(p, ty)| Operand { ptr: *p, ty }).collect();
        let ws = (ws_bytes > 0).then_some((base + ws_off, ws_bytes));
        ops::lower(&node.op, &xo, &yo, ws, ctx.sample_offset, ctx.seed).map_err(kernel_err)
    };
    let scratch = lower(0)?.scratch;
    let err_off = place(ERR_BYTES + scratch);
    let blas_off = place(BLAS_WORKSPACE);
    let alloc = DeviceAlloc::new(&dev.ctx, at as usize)?;
    let base = alloc.ptr;
    let lowered = lower(base)?;
    let stream = dev.ctx.new_stream()?;
    let blas = Blas::new(&stream, (base + blas_off, BLAS_WORKSPACE as usize))?;
    // SAFETY: every copy lies inside the allocation made above.
    unsafe {
        result::memset_d8_sync(base, 0, at as usize)?;
        for (t, o) in inputs.iter().zip(&in_off) {
            result::memcpy_htod_sync(base + o, t.bytes())?;
        }
    }
    let resolve = |p: Ptr| match p {
        Ptr::Abs(a) => a,
        Ptr::Err => base + err_off,
        Ptr::Scratch(off) => base + err_off + ERR_BYTES + off,
    };
    for a in &lowered.actions {
        let pass = match ctx.eval {
            true => Pass::Eval(ctx.step),
            false => Pass::Step(ctx.step),
        };
        issue_action(dev, Some(&blas), &stream, a, pass, &resolve)?;
    }
    stream.synchronize()?;
    let mut code = [0u8; 4];
    // SAFETY: the error word, after the stream finished.
    unsafe { result::memcpy_dtoh_sync(&mut code, base + err_off)? };
    let code = i32::from_le_bytes(code);
    if code != 0 {
        return Err(CudaError::DeviceFault {
            step: ctx.step,
            stream: "test".into(),
            what: fault_text(code).into(),
        });
    }
    let mut outs = Vec::new();
    for (t, o) in node.outputs.iter().zip(&out_off) {
        let mut h = HostTensor::zeros(t.clone());
        // SAFETY: the output's region, after the stream finished.
        unsafe { result::memcpy_dtoh_sync(h.bytes_mut(), base + o)? };
        outs.push(h);
    }
    Ok(outs)
}
