//! One graph node's kernel outside a plan, on host tensors: inputs copied
//! in, the node's lowered work issued on one stream, outputs copied back.
//! What the CPU-vs-GPU kernel tests (`tests/it/cuda.rs`) compare with
//! `CpuBackend::run` on the same inputs, and what `fsdpc calibrate
//! --target cuda` times (`time_node`).

use super::blas::Blas;
use super::device::{Device, DeviceAlloc, Ptr};
use super::error::CudaError;
use super::exec::{fault_text, issue_action, BLAS_WORKSPACE, ERR_BYTES};
use super::ops::{self, Operand};
use crate::backend::KernelCtx;
use crate::exec::rank::Pass;
use crate::tensor::HostTensor;
use cudarc::driver::{result, sys, CudaEvent, CudaStream};
use fsdpc_ir::{Node, TensorType};
use std::sync::Arc;

fn round(x: u64) -> u64 {
    x.div_ceil(256) * 256
}

/// `node`'s lowered work in one allocation of its own (operands,
/// workspace, scratch, cuBLAS workspace), with its stream and cuBLAS
/// handle: what `run_node` runs once and `time_node` repeats.
struct Prepared<'a> {
    dev: &'a Device,
    node: &'a Node,
    alloc: DeviceAlloc,
    actions: Vec<ops::Action>,
    in_off: Vec<u64>,
    out_off: Vec<u64>,
    err_off: u64,
    stream: Arc<CudaStream>,
    blas: Blas,
}

impl<'a> Prepared<'a> {
    /// Places and lowers `node` over inputs of types `in_tys` with
    /// `ws_bytes` of workspace, the allocation zeroed.
    fn new(
        dev: &'a Device,
        node: &'a Node,
        in_tys: &[&TensorType],
        ctx: &KernelCtx,
        ws_bytes: u64,
    ) -> Result<Prepared<'a>, CudaError> {
        let kernel_err = |reason: String| CudaError::Kernel {
            node: node.name.clone(),
            op: node.op.name(),
            reason,
        };
        // Operands, workspace, then the scratch (error word first), then
        // the cuBLAS workspace, each 256-aligned.
        let mut at = 0u64;
        let mut place = |bytes: u64| {
            let p = at;
            at += round(bytes.max(1));
            p
        };
        let in_off: Vec<u64> = in_tys.iter().map(|t| place(t.bytes())).collect();
        let out_off: Vec<u64> = node.outputs.iter().map(|t| place(t.bytes())).collect();
        let ws_off = place(ws_bytes);
        let operands = |base: u64, offs: &[u64], tys: &[&TensorType]| -> Vec<(u64, TensorType)> {
            offs.iter()
                .zip(tys)
                .map(|(o, t)| (base + o, (*t).clone()))
                .collect()
        };
        let out_tys: Vec<&TensorType> = node.outputs.iter().collect();
        let lower = |base: u64| {
            let xs = operands(base, &in_off, in_tys);
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
        let actions = lower(base)?.actions;
        let stream = dev.ctx.new_stream()?;
        let blas = Blas::new(&stream, (base + blas_off, BLAS_WORKSPACE as usize))?;
        // SAFETY: the allocation made above, whole.
        unsafe { result::memset_d8_sync(base, 0, at as usize)? };
        Ok(Prepared {
            dev,
            node,
            alloc,
            actions,
            in_off,
            out_off,
            err_off,
            stream,
            blas,
        })
    }

    /// Copies `inputs` (of the types the work was lowered for) in.
    fn load(&self, inputs: &[HostTensor]) -> Result<(), CudaError> {
        for (t, o) in inputs.iter().zip(&self.in_off) {
            // SAFETY: the input's region of the allocation, of its size.
            unsafe { result::memcpy_htod_sync(self.alloc.ptr + o, t.bytes())? };
        }
        Ok(())
    }

    /// Enqueues the node's work once on its stream.
    fn issue(&self, ctx: &KernelCtx) -> Result<(), CudaError> {
        let base = self.alloc.ptr;
        let err = base + self.err_off;
        let resolve = |p: Ptr| match p {
            Ptr::Abs(a) => a,
            Ptr::Err => err,
            Ptr::Scratch(off) => err + ERR_BYTES + off,
        };
        let pass = match ctx.eval {
            true => Pass::Eval(ctx.step),
            false => Pass::Step(ctx.step),
        };
        for a in &self.actions {
            issue_action(self.dev, Some(&self.blas), &self.stream, a, pass, &resolve)?;
        }
        Ok(())
    }

    /// Waits for the stream and reads (and clears) its error word.
    fn finish(&self, step: u64) -> Result<(), CudaError> {
        self.stream.synchronize()?;
        let mut code = [0u8; 4];
        let at = self.alloc.ptr + self.err_off;
        // SAFETY: the error word, after the stream finished.
        unsafe { result::memcpy_dtoh_sync(&mut code, at)? };
        let code = i32::from_le_bytes(code);
        if code != 0 {
            return Err(CudaError::DeviceFault {
                step,
                stream: format!("{} ({})", self.node.name, self.node.op.name()),
                what: fault_text(code).into(),
            });
        }
        Ok(())
    }
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
    let in_tys: Vec<&TensorType> = inputs.iter().map(|t| &t.ty).collect();
    let p = Prepared::new(dev, node, &in_tys, ctx, ws_bytes)?;
    p.load(inputs)?;
    p.issue(ctx)?;
    p.finish(ctx.step)?;
    let mut outs = Vec::new();
    for (t, o) in node.outputs.iter().zip(&p.out_off) {
        let mut h = HostTensor::zeros(t.clone());
        // SAFETY: the output's region, after the stream finished.
        unsafe { result::memcpy_dtoh_sync(h.bytes_mut(), p.alloc.ptr + o)? };
        outs.push(h);
    }
    Ok(outs)
}

/// Seconds of each of `reps` runs of `node` on `inputs` (after `warmup`
/// untimed ones), each between two CUDA events on its stream: the
/// kernel's time on the device, without the host's issue time.
pub fn time_node(
    dev: &Device,
    node: &Node,
    inputs: &[HostTensor],
    ws_bytes: u64,
    (warmup, reps): (usize, usize),
) -> Result<Vec<f64>, CudaError> {
    let ctx = KernelCtx::default();
    let in_tys: Vec<&TensorType> = inputs.iter().map(|t| &t.ty).collect();
    let p = Prepared::new(dev, node, &in_tys, &ctx, ws_bytes)?;
    p.load(inputs)?;
    let times = timed_runs(dev, &p.stream, (warmup, reps), &mut || p.issue(&ctx))?;
    p.finish(0)?;
    Ok(times)
}

/// Seconds of each of `reps` runs of `issue` (after `warmup` untimed
/// ones), each between two CUDA events on `stream`; waits for the stream.
pub(crate) fn timed_runs(
    dev: &Device,
    stream: &CudaStream,
    (warmup, reps): (usize, usize),
    issue: &mut dyn FnMut() -> Result<(), CudaError>,
) -> Result<Vec<f64>, CudaError> {
    for _ in 0..warmup {
        issue()?;
    }
    let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
    let events: Vec<(CudaEvent, CudaEvent)> = (0..reps)
        .map(|_| Ok((dev.ctx.new_event(flags)?, dev.ctx.new_event(flags)?)))
        .collect::<Result<_, CudaError>>()?;
    for (a, b) in &events {
        a.record(stream)?;
        issue()?;
        b.record(stream)?;
    }
    stream.synchronize()?;
    events
        .iter()
        .map(|(a, b)| Ok(f64::from(a.elapsed_ms(b)?) * 1e-3))
        .collect()
}
