//! A step of a GPU rank: one host thread walks the instruction list in list
//! order and enqueues each instruction's work on its stream (kernels,
//! cuBLAS products, copies, NCCL calls, event records and waits; with
//! timing, between two events), then synchronises every stream and reads
//! their error words.

use super::lower::optimizer_launch;
use super::{Coll, GpuRank, Item, Spans, Work, ERR_BYTES};
use crate::data::{Batch, DataSource};
use crate::error::RuntimeError;
use crate::exec::rank::{no_eval_pass, Pass};
use crate::targets::cuda::blas::Blas;
use crate::targets::cuda::device::{Device, Ptr};
use crate::targets::cuda::error::CudaError;
use crate::targets::cuda::ops::{self, Action};
use crate::tensor::TensorMut;
use cudarc::driver::{result, CudaStream};
use fsdpc_plan::Stream;
use std::collections::HashMap;
use std::sync::Arc;

impl GpuRank<'_> {
    /// Runs step `step`, reading inputs from `data`; when timed, returns
    /// every instruction's span.
    pub fn step(
        &mut self,
        step: u64,
        data: &dyn DataSource,
    ) -> Result<Option<Spans>, RuntimeError> {
        self.run(Pass::Step(step), data)?;
        self.spans()
    }

    /// Runs evaluation batch `batch` (the plan's evaluation prefix, dropout
    /// off), reading inputs from the held-out `data`; returns this rank's
    /// loss of the batch.
    pub fn eval(&mut self, batch: u64, data: &dyn DataSource) -> Result<f32, RuntimeError> {
        self.run(Pass::Eval(batch), data)?;
        self.read_loss_scalar()
    }

    /// Enqueues a pass's instructions, then waits for every stream and
    /// reads their error words.
    fn run(&mut self, pass: Pass, data: &dyn DataSource) -> Result<(), RuntimeError> {
        self.dev.ctx.bind_to_thread().map_err(CudaError::from)?;
        let end = match pass {
            Pass::Step(_) => self.work.len(),
            Pass::Eval(_) => self.prep.eval_end.ok_or_else(no_eval_pass)?,
        };
        let mut staging = std::mem::take(&mut self.staging);
        let issued = self.issue_all(pass, end, data, &mut staging);
        self.staging = staging;
        issued?;
        for s in self.streams.iter().flatten() {
            s.synchronize().map_err(CudaError::from)?;
        }
        self.check_errors(pass.index())
    }

    /// Enqueues the first `end` instructions in list order (a training
    /// step's, timed when asked).
    fn issue_all(
        &self,
        pass: Pass,
        end: usize,
        data: &dyn DataSource,
        staging: &mut HashMap<usize, Vec<u8>>,
    ) -> Result<(), RuntimeError> {
        let timing = match pass {
            Pass::Step(_) if self.timed => self.timing.as_ref(),
            _ => None,
        };
        if let (Some(start), Some(first), Some(_)) =
            (&self.start, self.streams.iter().flatten().next(), timing)
        {
            start.record(first).map_err(CudaError::from)?;
            for s in self.streams.iter().flatten() {
                s.wait(start).map_err(CudaError::from)?;
            }
        }
        for i in 0..end {
            let stream = self.stream(i)?;
            if let Some(t) = timing {
                t[i].0.record(stream).map_err(CudaError::from)?;
            }
            self.issue(i, pass, stream, data, staging)
                .map_err(|e| at(i, e))?;
            if let Some(t) = timing {
                t[i].1.record(stream).map_err(CudaError::from)?;
            }
        }
        Ok(())
    }

    /// The spans of the last step, when timing.
    fn spans(&self) -> Result<Option<Spans>, RuntimeError> {
        let (Some(t), Some(start), true) = (&self.timing, &self.start, self.timed) else {
            return Ok(None);
        };
        let mut out = Vec::new();
        for (i, (a, b)) in t.iter().enumerate() {
            if matches!(
                self.work[i],
                Work::Nothing | Work::Record(_) | Work::Wait(_)
            ) {
                continue;
            }
            let s = self.prep.plan.instructions[i].stream;
            let (t0, t1) = (
                start.elapsed_ms(a).map_err(CudaError::from)?,
                start.elapsed_ms(b).map_err(CudaError::from)?,
            );
            out.push((s, i, t0, t1));
        }
        Ok(Some(out))
    }

    /// Reads and clears every stream's error word.
    fn check_errors(&self, step: u64) -> Result<(), RuntimeError> {
        for (si, s) in self.streams.iter().enumerate() {
            if s.is_none() {
                continue;
            }
            let mut w = [0u8; 4];
            // SAFETY: the stream's error word; every stream is synchronised.
            unsafe { result::memcpy_dtoh_sync(&mut w, self.scratch[si]) }
                .map_err(CudaError::from)?;
            let code = i32::from_le_bytes(w);
            if code != 0 {
                // SAFETY: as above.
                unsafe { result::memset_d8_sync(self.scratch[si], 0, 4) }
                    .map_err(CudaError::from)?;
                let what = fault_text(code);
                return Err(CudaError::DeviceFault {
                    step,
                    stream: format!("{:?}", Stream::ALL[si]),
                    what: what.into(),
                }
                .into());
            }
        }
        Ok(())
    }

    fn stream(&self, i: usize) -> Result<&Arc<CudaStream>, RuntimeError> {
        let s = self.prep.plan.instructions[i].stream;
        self.streams[s.index()]
            .as_ref()
            .ok_or_else(|| RuntimeError::plan_at(i, format!("stream {s:?} has no CUDA stream")))
    }

    fn issue(
        &self,
        i: usize,
        pass: Pass,
        stream: &Arc<CudaStream>,
        data: &dyn DataSource,
        staging: &mut HashMap<usize, Vec<u8>>,
    ) -> Result<(), RuntimeError> {
        let si = self.prep.plan.instructions[i].stream.index();
        match &self.work[i] {
            Work::Nothing => Ok(()),
            Work::WriteBuffer { .. } if matches!(pass, Pass::Eval(_)) => Ok(()),
            Work::WriteBuffer { src, dst, bytes } => {
                // SAFETY: two checked plan regions of `bytes` (the value and
                // the module buffer, distinct buffers); ordered on the stream.
                unsafe {
                    result::memcpy_dtod_async(*dst, *src, *bytes as usize, stream.cu_stream())
                }
                .map_err(CudaError::from)?;
                Ok(())
            }
            Work::Record(e) => Ok(self.events[*e].record(stream).map_err(CudaError::from)?),
            Work::Wait(e) => Ok(stream.wait(&self.events[*e]).map_err(CudaError::from)?),
            Work::Device(items) => {
                for it in items {
                    match it {
                        Item::Act(a) => self.act(si, stream, a, pass)?,
                        Item::Coll(c) => self.coll(stream, c)?,
                    }
                }
                Ok(())
            }
            Work::Load {
                name,
                ty,
                dst,
                micro,
            } => {
                let g = fsdpc_plan::Geometry {
                    world: self.world as u32,
                    ..self.prep.plan.geometry()
                };
                let data_rank = g.data_rank(self.rank) as u64;
                let first_sample = (u64::from(*micro) * u64::from(g.data_world()) + data_rank)
                    * self.prep.batch as u64;
                let buf = staging
                    .get_mut(&i)
                    .ok_or_else(|| RuntimeError::plan_at(i, "no staging buffer".to_string()))?;
                data.fill(
                    name,
                    Batch {
                        step: pass.index(),
                        first_sample,
                    },
                    TensorMut { ty, bytes: buf },
                )?;
                // SAFETY: the input's region; pageable memory is staged by
                // the driver before the call returns, so `buf` may change
                // afterwards.
                unsafe { result::memcpy_htod_async(*dst, buf.as_slice(), stream.cu_stream()) }
                    .map_err(CudaError::from)?;
                Ok(())
            }
            Work::Optimizer {
                params,
                grads,
                gdt,
                state,
                n,
                undecayed,
            } => {
                // As the CPU executor: the undecayed ranges are stepped
                // without weight decay, the rest with it, launch by launch.
                let step = pass.index();
                let opt = self.prep.plan.optimizer_at(step);
                let plain = opt.without_decay();
                let mut pieces = Vec::new();
                let mut at = 0;
                if opt.weight_decay() != 0.0 {
                    for r in undecayed {
                        let (lo, hi) = (r.start.max(at), r.end.min(*n));
                        if lo < hi {
                            pieces.extend([(at, lo, &opt), (lo, hi, &plain)]);
                            at = hi;
                        }
                    }
                }
                pieces.push((at, *n, &opt));
                let g = gdt.size() as u64;
                for (lo, hi, o) in pieces.into_iter().filter(|(lo, hi, _)| lo < hi) {
                    let st: Vec<u64> = state.iter().map(|s| s + 4 * lo).collect();
                    let l = optimizer_launch(
                        o,
                        step,
                        params + 4 * lo,
                        grads + g * lo,
                        *gdt,
                        &st,
                        hi - lo,
                    )?;
                    self.dev.launch(stream, &l, &|p| self.resolve(si, p))?;
                }
                Ok(())
            }
        }
    }

    fn resolve(&self, si: usize, p: Ptr) -> u64 {
        match p {
            Ptr::Abs(a) => a,
            Ptr::Err => self.scratch[si],
            Ptr::Scratch(off) => self.scratch[si] + ERR_BYTES + off,
        }
    }

    fn act(
        &self,
        si: usize,
        stream: &Arc<CudaStream>,
        a: &Action,
        pass: Pass,
    ) -> Result<(), CudaError> {
        issue_action(&self.dev, self.blas[si].as_ref(), stream, a, pass, &|p| {
            self.resolve(si, p)
        })
    }

    fn coll(&self, stream: &Arc<CudaStream>, c: &Coll) -> Result<(), CudaError> {
        match *c {
            Coll::AllGather {
                comm,
                send,
                recv,
                count,
                dt,
            } => self.comms[comm].all_gather(send, recv, count, dt, stream),
            Coll::ReduceScatter {
                comm,
                send,
                recv,
                count,
                dt,
            } => self.comms[comm].reduce_scatter(send, recv, count, dt, stream),
            Coll::AllReduce {
                comm,
                buf,
                count,
                dt,
            } => self.comms[comm].all_reduce(buf, count, dt, stream),
        }
    }
}

/// Issues one lowered action on `stream` in pass `pass` (a training step,
/// or an evaluation batch: dropout off), its pointers resolved by `ptr`
/// (shared with `single`).
pub(crate) fn issue_action(
    dev: &Device,
    blas: Option<&Blas>,
    stream: &CudaStream,
    a: &Action,
    pass: Pass,
    ptr: &dyn Fn(Ptr) -> u64,
) -> Result<(), CudaError> {
    let cs = stream.cu_stream();
    match a {
        Action::Launch(l) => dev.launch(stream, l, ptr),
        Action::Dropout {
            launch,
            base_arg,
            p_scale_args,
            seed,
        } => dev.launch(
            stream,
            &ops::dropout_issued(launch, *base_arg, *p_scale_args, *seed, pass),
            ptr,
        ),
        Action::Gemm(g) => match blas {
            Some(b) => b.run(g),
            None => Err(CudaError::Kernel {
                node: "-".into(),
                op: "matmul".into(),
                reason: "no cuBLAS handle on this stream".into(),
            }),
        },
        // SAFETY (the three below): regions lowered from checked plan
        // regions; ordered on the stream.
        Action::Zero { ptr: p, bytes } => {
            Ok(unsafe { result::memset_d8_async(ptr(*p), 0, *bytes as usize, cs) }?)
        }
        Action::Copy { src, dst, bytes } => {
            Ok(unsafe { result::memcpy_dtod_async(*dst, *src, *bytes as usize, cs) }?)
        }
        Action::Upload { dst, bytes } => {
            Ok(unsafe { result::memcpy_htod_async(*dst, bytes.as_slice(), cs) }?)
        }
    }
}

/// The code a kernel left in an error word, as text (`ERR_*` of
/// `kernels/common.cuh`).
pub(crate) fn fault_text(code: i32) -> &'static str {
    match code {
        1 => "a gather index out of range",
        2 => "a cross-entropy label out of range",
        3 => "an integer division by zero",
        _ => "an unknown error",
    }
}

fn at(i: usize, e: RuntimeError) -> RuntimeError {
    match e {
        RuntimeError::Plan {
            instr: None,
            reason,
        } => RuntimeError::Plan {
            instr: Some(i),
            reason,
        },
        other => other,
    }
}
