//! One GPU rank's execution of a plan, with the semantics of
//! `exec/rank.rs`. Before the first step every instruction is lowered to
//! device work (`Work`) with its addresses fixed: the arena is one
//! allocation that never moves. A step is then one host thread walking the
//! instruction list in list order (an order every plan's events allow:
//! `resolve` and the debug executor rely on it too) and enqueueing each
//! instruction on its stream's CUDA stream: `Record` is `cuEventRecord`,
//! `Wait` is `cuStreamWaitEvent`, so the GPU sees exactly the plan's
//! cross-stream order and streams run concurrently where the plan lets
//! them. The step ends when every stream is synchronised.
//!
//! The allocation: the plan's arena (`memory.arena_bytes`, zeroed once),
//! then per stream a private scratch (an error word, then what its kernels
//! need beyond their operands: attention statistics, normalisation and
//! loss partials; sized from the lowered plan), then per stream that runs
//! matrix products the cuBLAS workspace (`BLAS_WORKSPACE`).
//!
//! Not supported, refused before the first step naming the instruction:
//! host buffers (`--cpu-offload`) and their copies, and the fp16 loss
//! scaler's instructions.

use super::blas::Blas;
use super::device::{blocks_for, grid_for, Arg, Device, DeviceAlloc, Launch, Ptr, THREADS};
use super::error::CudaError;
use super::nccl::NcclComm;
use super::ops::{self, dt_code, Action, Operand};
use crate::data::{Batch, DataSource};
use crate::error::RuntimeError;
use crate::exec::resolve::{Region, Resolved, Step};
use crate::tensor::TensorMut;
use cudarc::driver::{result, sys, CudaEvent, CudaStream};
use fsdpc_ir::{DType, Optimizer, TensorType};
use fsdpc_plan::{BufferId, BufferKind, Collective, Group, InstrOp, Stream};
use std::collections::HashMap;
use std::sync::Arc;

/// Bytes of cuBLAS workspace per stream that runs matrix products (what
/// NVIDIA recommends for Hopper).
pub const BLAS_WORKSPACE: u64 = 32 << 20;
/// Bytes at the start of each stream's scratch: its error word.
pub(crate) const ERR_BYTES: u64 = 256;
/// Blocks of the sum-of-squares partials.
const SUMSQ_BLOCKS: u64 = 256;

/// When the executor uses NCCL.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Default)]
pub enum NcclUse {
    /// For groups of more than one rank; a group of one copies locally.
    #[default]
    Auto,
    /// For every group, even of one rank (tests NCCL at world 1).
    Always,
}

/// One collective, or the local work that replaces it.
#[derive(Debug)]
enum Coll {
    AllGather {
        comm: usize,
        send: u64,
        recv: u64,
        count: usize,
        dt: DType,
    },
    ReduceScatter {
        comm: usize,
        send: u64,
        recv: u64,
        count: usize,
        dt: DType,
    },
    AllReduce {
        comm: usize,
        buf: u64,
        count: usize,
        dt: DType,
    },
}

/// One instruction's device work.
#[derive(Debug)]
enum Work {
    Nothing,
    /// Actions and collectives in order.
    Device(Vec<Item>),
    Load {
        name: String,
        ty: TensorType,
        dst: u64,
        micro: u32,
    },
    Optimizer {
        params: u64,
        grads: u64,
        gdt: DType,
        state: Vec<u64>,
        n: u64,
    },
    Record(usize),
    Wait(usize),
}

#[derive(Debug)]
enum Item {
    Act(Action),
    Coll(Coll),
}

/// The per-step timings of `--trace`-like measurements: each instruction's
/// (start, end) in ms after the step's start, by plan stream.
pub type Spans = Vec<(Stream, usize, f32, f32)>;

/// A GPU rank ready to run steps.
//
// Fields drop in order: the communicators, cuBLAS handles and events go
// before the streams, the allocation and the device (whose context they
// need).
pub struct GpuRank<'p> {
    comms: Vec<NcclComm>,
    loss_comm: Option<NcclComm>,
    blas: Vec<Option<Blas>>,
    timing: Option<Vec<(CudaEvent, CudaEvent)>>,
    start: Option<CudaEvent>,
    events: Vec<CudaEvent>,
    /// CUDA stream per plan stream (by `Stream::index`), where it has work.
    streams: Vec<Option<Arc<CudaStream>>>,
    alloc: DeviceAlloc,
    scratch: [u64; 4],
    work: Vec<Work>,
    staging: HashMap<usize, Vec<u8>>,
    /// Whether the next steps are timed (`set_timed`).
    timed: bool,
    prep: &'p Resolved<'p>,
    rank: usize,
    world: usize,
    /// The device.
    pub dev: Device,
}

/// An NCCL unique id.
pub type Id = [u8; super::nccl::ID_BYTES];

/// What a rank needs from outside to make its communicators: the ids rank
/// 0 made and handed out (`train::train_cuda`).
pub struct CommSetup<'a> {
    /// When to use NCCL.
    pub nccl: NcclUse,
    /// The id of each plan stream's world communicator, by stream index
    /// (`None`: the stream runs no collective).
    pub ids: &'a [Option<Id>; 4],
    /// The id of the loss report's world communicator (world > 1).
    pub loss: Option<Id>,
}

impl<'p> GpuRank<'p> {
    /// Sets up rank `rank` of `world` on `dev`: streams, events, the
    /// allocation, cuBLAS handles, NCCL communicators, and every
    /// instruction's lowered work (with `timing`, two timing events per
    /// instruction for `set_timed`). Refuses what it does not support.
    pub fn new(
        dev: Device,
        prep: &'p Resolved<'p>,
        rank: usize,
        world: usize,
        seed: u64,
        comm: &CommSetup,
        timing: bool,
    ) -> Result<GpuRank<'p>, RuntimeError> {
        let plan = prep.plan;
        refuse_unsupported(prep)?;
        let ctx = dev.ctx.clone();
        let mut streams = vec![None; 4];
        for (s, list) in &prep.streams {
            if !list.is_empty() {
                streams[s.index()] = Some(ctx.new_stream().map_err(CudaError::from)?);
            }
        }
        let events = (0..plan.events)
            .map(|_| ctx.new_event(None))
            .collect::<Result<Vec<_>, _>>()
            .map_err(CudaError::from)?;
        // Pass 1 at address 0: the scratch each stream needs.
        let zero = Layout { arena: 0 };
        let mut need = [0u64; 4];
        let mut gemm_streams = [false; 4];
        for (i, s) in prep.steps.iter().enumerate() {
            let si = plan.instructions[i].stream.index();
            let (items, scratch) = lower_step(
                prep,
                i,
                s,
                &zero,
                rank,
                world,
                seed,
                &mut CommIndex::default(),
                comm.nccl,
            )?;
            need[si] = need[si].max(scratch);
            gemm_streams[si] |= has_gemm(&items);
        }
        // The loss report's send and receive slots.
        let ci = Stream::Compute.index();
        need[ci] = need[ci].max(256 + 4 * world as u64);
        let arena = round(plan.memory.arena_bytes);
        let mut total = arena;
        let mut scratch = [0u64; 4];
        for si in 0..4 {
            scratch[si] = total;
            if streams[si].is_some() {
                total += ERR_BYTES + round(need[si]);
            }
        }
        let mut blas_ws = [0u64; 4];
        for si in 0..4 {
            if gemm_streams[si] {
                blas_ws[si] = total;
                total += BLAS_WORKSPACE;
            }
        }
        let alloc = DeviceAlloc::new(&ctx, total as usize)?;
        // SAFETY: the whole allocation, before any work uses it.
        unsafe { result::memset_d8_sync(alloc.ptr, 0, total as usize) }.map_err(CudaError::from)?;
        let layout = Layout { arena: alloc.ptr };
        for s in &mut scratch {
            *s += alloc.ptr;
        }
        let mut blas = Vec::new();
        for si in 0..4 {
            blas.push(match (&streams[si], gemm_streams[si]) {
                (Some(st), true) => Some(Blas::new(
                    st,
                    (alloc.ptr + blas_ws[si], BLAS_WORKSPACE as usize),
                )?),
                _ => None,
            });
        }
        // Pass 2: the real addresses, and the communicators.
        let mut index = CommIndex::default();
        let mut work = Vec::with_capacity(prep.steps.len());
        for (i, s) in prep.steps.iter().enumerate() {
            work.push(
                lower_step(
                    prep, i, s, &layout, rank, world, seed, &mut index, comm.nccl,
                )?
                .0,
            );
        }
        let comms = index.make(prep, rank, world, comm.ids)?;
        let loss_comm = match &comm.loss {
            Some(id) if world > 1 => Some(NcclComm::init(id, world, rank)?),
            _ => None,
        };
        let staging = work
            .iter()
            .enumerate()
            .filter_map(|(i, w)| match w {
                Work::Load { ty, .. } => Some((i, vec![0u8; ty.bytes() as usize])),
                _ => None,
            })
            .collect();
        let timing = if timing {
            let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
            let mut v = Vec::new();
            for _ in 0..work.len() {
                v.push((
                    ctx.new_event(flags).map_err(CudaError::from)?,
                    ctx.new_event(flags).map_err(CudaError::from)?,
                ));
            }
            Some(v)
        } else {
            None
        };
        let start = if timing.is_some() {
            Some(
                ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                    .map_err(CudaError::from)?,
            )
        } else {
            None
        };
        Ok(GpuRank {
            dev,
            prep,
            rank,
            world,
            streams,
            events,
            alloc,
            scratch,
            blas,
            comms,
            work,
            staging,
            timing,
            start,
            timed: false,
            loss_comm,
        })
    }

    /// Bytes of the one device allocation (arena, scratch, cuBLAS
    /// workspaces).
    pub fn allocated_bytes(&self) -> u64 {
        self.alloc.bytes as u64
    }

    /// The device address of buffer `b`.
    pub fn buffer_ptr(&self, b: BufferId) -> u64 {
        self.alloc.ptr + self.prep.plan.buffers[b.index()].offset
    }

    fn stream(&self, i: usize) -> Result<&Arc<CudaStream>, RuntimeError> {
        let s = self.prep.plan.instructions[i].stream;
        self.streams[s.index()]
            .as_ref()
            .ok_or_else(|| RuntimeError::plan_at(i, format!("stream {s:?} has no CUDA stream")))
    }

    /// Copies host bytes into buffer `b` at byte `offset` (set-up: shards).
    pub fn upload(&self, b: BufferId, offset: u64, bytes: &[u8]) -> Result<(), RuntimeError> {
        let buf = &self.prep.plan.buffers[b.index()];
        if offset + bytes.len() as u64 > buf.bytes {
            return Err(RuntimeError::plan(format!(
                "upload past the end of buffer {b}"
            )));
        }
        self.dev.ctx.bind_to_thread().map_err(CudaError::from)?;
        // SAFETY: inside buffer `b` of the allocation; synchronous.
        unsafe { result::memcpy_htod_sync(self.buffer_ptr(b) + offset, bytes) }
            .map_err(CudaError::from)?;
        Ok(())
    }

    /// Reads `len` bytes of buffer `b` at `offset` (between steps).
    pub fn download(&self, b: BufferId, offset: u64, len: usize) -> Result<Vec<u8>, RuntimeError> {
        let buf = &self.prep.plan.buffers[b.index()];
        if offset + len as u64 > buf.bytes {
            return Err(RuntimeError::plan(format!(
                "download past the end of buffer {b}"
            )));
        }
        self.dev.ctx.bind_to_thread().map_err(CudaError::from)?;
        let mut out = vec![0u8; len];
        // SAFETY: inside buffer `b`; no stream runs between steps.
        unsafe { result::memcpy_dtoh_sync(&mut out, self.buffer_ptr(b) + offset) }
            .map_err(CudaError::from)?;
        Ok(out)
    }

    /// Times the following steps (each instruction between two CUDA
    /// events), when made with `timing`.
    pub fn set_timed(&mut self, on: bool) {
        self.timed = on && self.timing.is_some();
    }

    /// Runs step `step`, reading inputs from `data`; when timed, returns
    /// every instruction's span.
    pub fn step(
        &mut self,
        step: u64,
        data: &dyn DataSource,
    ) -> Result<Option<Spans>, RuntimeError> {
        self.dev.ctx.bind_to_thread().map_err(CudaError::from)?;
        let mut staging = std::mem::take(&mut self.staging);
        let issued = self.issue_all(step, data, &mut staging);
        self.staging = staging;
        issued?;
        for s in self.streams.iter().flatten() {
            s.synchronize().map_err(CudaError::from)?;
        }
        self.check_errors(step)?;
        self.spans()
    }

    /// Enqueues every instruction of step `step` in list order.
    fn issue_all(
        &self,
        step: u64,
        data: &dyn DataSource,
        staging: &mut HashMap<usize, Vec<u8>>,
    ) -> Result<(), RuntimeError> {
        let timing = if self.timed {
            self.timing.as_ref()
        } else {
            None
        };
        if let (Some(start), Some(first), Some(_)) =
            (&self.start, self.streams.iter().flatten().next(), timing)
        {
            start.record(first).map_err(CudaError::from)?;
            for s in self.streams.iter().flatten() {
                s.wait(start).map_err(CudaError::from)?;
            }
        }
        for i in 0..self.work.len() {
            let stream = self.stream(i)?;
            if let Some(t) = timing {
                t[i].0.record(stream).map_err(CudaError::from)?;
            }
            self.issue(i, step, stream, data, staging)
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

    fn issue(
        &self,
        i: usize,
        step: u64,
        stream: &Arc<CudaStream>,
        data: &dyn DataSource,
        staging: &mut HashMap<usize, Vec<u8>>,
    ) -> Result<(), RuntimeError> {
        let si = self.prep.plan.instructions[i].stream.index();
        match &self.work[i] {
            Work::Nothing => Ok(()),
            Work::Record(e) => Ok(self.events[*e].record(stream).map_err(CudaError::from)?),
            Work::Wait(e) => Ok(stream.wait(&self.events[*e]).map_err(CudaError::from)?),
            Work::Device(items) => {
                for it in items {
                    match it {
                        Item::Act(a) => self.act(si, stream, a, step)?,
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
                let first_sample = (u64::from(*micro) * self.world as u64 + self.rank as u64)
                    * self.prep.batch as u64;
                let buf = staging
                    .get_mut(&i)
                    .ok_or_else(|| RuntimeError::plan_at(i, "no staging buffer".to_string()))?;
                data.fill(
                    name,
                    Batch { step, first_sample },
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
            } => {
                let l = optimizer_launch(
                    &self.prep.plan.training.optimizer,
                    step,
                    *params,
                    *grads,
                    *gdt,
                    state,
                    *n,
                )?;
                self.dev.launch(stream, &l, &|p| self.resolve(si, p))?;
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
        step: u64,
    ) -> Result<(), CudaError> {
        issue_action(&self.dev, self.blas[si].as_ref(), stream, a, step, &|p| {
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

    /// The loss after a step (the sum over micro-batches, divided).
    pub fn read_loss(&self) -> Result<f32, RuntimeError> {
        let r = self.prep.loss;
        let b = self.download(r.buffer, r.offset as u64, 4)?;
        let k = self.prep.plan.config.grad_accum.max(1);
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]) / k as f32)
    }

    /// With clipping, the pre-clip gradient norm after a step.
    pub fn read_grad_norm(&self) -> Result<Option<f32>, RuntimeError> {
        let Some(b) = self.prep.grad_norm else {
            return Ok(None);
        };
        let v = self.download(b, 0, 4)?;
        Ok(Some(f32::from_le_bytes([v[0], v[1], v[2], v[3]]).sqrt()))
    }

    /// The loss of every rank, in rank order: all-gathered over the loss
    /// communicator (on the compute stream) at world > 1.
    pub fn gather_losses(&self, loss: f32) -> Result<Vec<f32>, RuntimeError> {
        let Some(c) = &self.loss_comm else {
            return Ok(vec![loss]);
        };
        let si = Stream::Compute.index();
        let stream = self.streams[si]
            .as_ref()
            .ok_or_else(|| RuntimeError::plan("the plan has no compute stream"))?;
        let (send, recv) = (
            self.scratch[si] + ERR_BYTES,
            self.scratch[si] + ERR_BYTES + 256,
        );
        self.dev.ctx.bind_to_thread().map_err(CudaError::from)?;
        let mut out = vec![0u8; 4 * self.world];
        // SAFETY: the compute stream's scratch holds 256 + 4 * world bytes
        // (`new`); between steps nothing else uses it.
        unsafe {
            result::memcpy_htod_sync(send, &loss.to_le_bytes()).map_err(CudaError::from)?;
            c.all_gather(send, recv, 1, DType::F32, stream)?;
            stream.synchronize().map_err(CudaError::from)?;
            result::memcpy_dtoh_sync(&mut out, recv).map_err(CudaError::from)?;
        }
        Ok(out
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

/// Issues one lowered action on `stream` at training step `step`, its
/// pointers resolved by `ptr` (shared with `single`).
pub(crate) fn issue_action(
    dev: &Device,
    blas: Option<&Blas>,
    stream: &CudaStream,
    a: &Action,
    step: u64,
    ptr: &dyn Fn(Ptr) -> u64,
) -> Result<(), CudaError> {
    let cs = stream.cu_stream();
    match a {
        Action::Launch(l) => dev.launch(stream, l, ptr),
        Action::Dropout {
            launch,
            base_arg,
            seed,
        } => {
            let mut l = launch.clone();
            l.args[*base_arg] = Arg::U64(ops::dropout_base(*seed, step));
            dev.launch(stream, &l, ptr)
        }
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

fn round(x: u64) -> u64 {
    x.div_ceil(256) * 256
}

fn has_gemm(items: &Work) -> bool {
    matches!(items, Work::Device(v) if v.iter().any(|it| matches!(it, Item::Act(Action::Gemm(_)))))
}

/// Device addresses of buffers.
struct Layout {
    arena: u64,
}

impl Layout {
    fn buffer(&self, prep: &Resolved, b: BufferId) -> u64 {
        self.arena + prep.plan.buffers[b.index()].offset
    }
    fn region(&self, prep: &Resolved, r: &Region) -> u64 {
        self.buffer(prep, r.buffer) + r.offset as u64
    }
}

/// The communicators the lowered work refers to, by (stream, group).
#[derive(Default)]
struct CommIndex {
    keys: Vec<(Stream, Group)>,
}

impl CommIndex {
    fn get(&mut self, s: Stream, g: Group) -> usize {
        match self.keys.iter().position(|k| *k == (s, g)) {
            Some(i) => i,
            None => {
                self.keys.push((s, g));
                self.keys.len() - 1
            }
        }
    }

    /// Every communicator, in first-use order (the same on every rank).
    fn make(
        &self,
        prep: &Resolved,
        rank: usize,
        world: usize,
        ids: &[Option<Id>; 4],
    ) -> Result<Vec<NcclComm>, RuntimeError> {
        if self.keys.is_empty() {
            return Ok(Vec::new());
        }
        let geometry = fsdpc_plan::Geometry {
            world: world as u32,
            ..prep.plan.geometry()
        };
        // One world communicator per stream, then the splits.
        let mut worlds: HashMap<Stream, NcclComm> = HashMap::new();
        for &(s, _) in &self.keys {
            if worlds.contains_key(&s) {
                continue;
            }
            let id = ids[s.index()]
                .as_ref()
                .ok_or_else(|| RuntimeError::plan(format!("no NCCL id for stream {s:?}")))?;
            worlds.insert(s, NcclComm::init(id, world, rank)?);
        }
        let mut out = Vec::new();
        for &(s, g) in &self.keys {
            let ranks = g.members(rank, &geometry);
            let pos = ranks.iter().position(|&r| r == rank).unwrap_or(0);
            let w = &worlds[&s];
            out.push(w.split(ranks[0], rank, ranks.len(), pos)?);
        }
        Ok(out)
    }
}

/// The plan streams whose collectives need a world communicator (ids to
/// hand out), given `nccl`.
pub fn comm_streams(
    prep: &Resolved,
    world: usize,
    nccl: NcclUse,
) -> Result<Vec<Stream>, RuntimeError> {
    let mut index = CommIndex::default();
    let zero = Layout { arena: 0 };
    for (i, s) in prep.steps.iter().enumerate() {
        lower_step(prep, i, s, &zero, 0, world, 0, &mut index, nccl)?;
    }
    let mut out: Vec<Stream> = Vec::new();
    for (s, _) in index.keys {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(out)
}

/// Everything the executor checks before it touches a device, for `plan`
/// at `world`: the plan resolves, nothing unsupported is in it, every
/// instruction lowers; returns the plan streams that need a world
/// communicator.
pub fn check_plan(
    plan: &fsdpc_plan::Plan,
    world: usize,
    nccl: NcclUse,
) -> Result<Vec<Stream>, RuntimeError> {
    let prep = crate::exec::resolve::resolve(plan)?;
    refuse_unsupported(&prep)?;
    comm_streams(&prep, world, nccl)
}

/// Refuses what the cuda target does not run (its capabilities: host
/// buffers, other collective forms, quantized wire formats, the loss
/// scaler), naming the instruction.
pub fn refuse_unsupported(prep: &Resolved) -> Result<(), RuntimeError> {
    crate::targets::cuda_capabilities().check(prep.plan)?;
    Ok(())
}

fn elems(prep: &Resolved, b: BufferId) -> (u64, DType) {
    let buf = &prep.plan.buffers[b.index()];
    (buf.bytes / buf.dtype.size() as u64, buf.dtype)
}

/// Zeroes of the padding of unit `u`'s flat gradient buffer `b`.
fn zero_uncovered(prep: &Resolved, u: usize, b: BufferId, l: &Layout, out: &mut Vec<Item>) {
    let buf = &prep.plan.buffers[b.index()];
    let es = buf.dtype.size() as u64;
    for &(s, e) in &prep.uncovered[u] {
        let (s, e) = (
            (s as u64 * es).min(buf.bytes),
            (e as u64 * es).min(buf.bytes),
        );
        if e > s {
            out.push(Item::Act(Action::Zero {
                ptr: Ptr::Abs(l.buffer(prep, b) + s),
                bytes: e - s,
            }));
        }
    }
}

/// `dst = src / div` in the destination's dtype (`convert_div`).
fn convert(src: u64, sdt: DType, dst: u64, ddt: DType, n: u64, div: f32) -> Item {
    Item::Act(Action::Launch(Launch {
        kernel: "convert_div",
        grid: (grid_for(n), 1, 1),
        block: THREADS,
        smem: 0,
        args: vec![
            Arg::Ptr(Ptr::Abs(src)),
            Arg::I32(dt_code(sdt)),
            Arg::Ptr(Ptr::Abs(dst)),
            Arg::I32(dt_code(ddt)),
            Arg::I64(n as i64),
            Arg::F32(div),
        ],
    }))
}

/// Lowers instruction `i`; returns its work and the scratch it needs.
#[allow(clippy::too_many_arguments)]
fn lower_step(
    prep: &Resolved,
    i: usize,
    s: &Step,
    l: &Layout,
    rank: usize,
    world: usize,
    seed: u64,
    comms: &mut CommIndex,
    nccl: NcclUse,
) -> Result<(Work, u64), RuntimeError> {
    let plan = prep.plan;
    let stream = plan.instructions[i].stream;
    let geometry = fsdpc_plan::Geometry {
        world: world as u32,
        ..plan.geometry()
    };
    let group_size = |g: Group| g.members(rank, &geometry).len();
    let position = |g: Group| g.position(rank, &geometry);
    let use_nccl = |g: Group| nccl == NcclUse::Always || group_size(g) > 1;
    let unsupported = |what: &str, reason: String| -> RuntimeError {
        CudaError::Unsupported {
            instr: i,
            what: what.into(),
            reason,
        }
        .into()
    };
    let mut items = Vec::new();
    let mut scratch = 0u64;
    match s {
        Step::Free(_) => return Ok((Work::Nothing, 0)),
        // Gathered by the bucket's last member (its `with`).
        Step::Bucketed => return Ok((Work::Nothing, 0)),
        Step::Record(e) => return Ok((Work::Record(*e), 0)),
        Step::Wait(e) => return Ok((Work::Wait(*e), 0)),
        Step::AllGather {
            src,
            dst,
            parts,
            group,
            with,
            ..
        } => {
            // A bucket's gathers, then this one's: one NCCL call per part,
            // in order (not grouped into one launch here).
            let members = with
                .iter()
                .map(|(s, d, p)| (s, d, p.as_slice()))
                .chain(std::iter::once((src, dst, parts.as_slice())));
            for (src, dst, parts) in members {
                let ((_, sdt), (_, ddt)) = (elems(prep, *src), elems(prep, *dst));
                let (se, de) = (sdt.size() as u64, ddt.size() as u64);
                let size = group_size(*group) as u64;
                for &(shard_at, flat_at, n) in parts {
                    let (from, into) = (
                        l.buffer(prep, *src) + shard_at as u64 * se,
                        l.buffer(prep, *dst) + flat_at as u64 * de,
                    );
                    if use_nccl(*group) {
                        let comm = comms.get(stream, *group);
                        if sdt == ddt {
                            items.push(Item::Coll(Coll::AllGather {
                                comm,
                                send: from,
                                recv: into,
                                count: n,
                                dt: sdt,
                            }));
                        } else {
                            // Mixed precision gathers the f32 shard as bf16/f16:
                            // this member's part, converted, goes to its own
                            // slot of the gathered buffer, then NCCL gathers in
                            // place (send = this member's slot).
                            let mine = into + position(*group) as u64 * n as u64 * de;
                            items.push(convert(from, sdt, mine, ddt, n as u64, 1.0));
                            items.push(Item::Coll(Coll::AllGather {
                                comm,
                                send: mine,
                                recv: into,
                                count: n,
                                dt: ddt,
                            }));
                        }
                    } else if sdt == ddt {
                        items.push(Item::Act(Action::Copy {
                            src: from,
                            dst: into,
                            bytes: n as u64 * se * size,
                        }));
                    } else {
                        items.push(convert(from, sdt, into, ddt, n as u64, 1.0));
                    }
                }
            }
        }
        Step::Reshard { src, dst, group } => {
            let len = plan.buffers[dst.index()].bytes;
            let pos = position(*group) as u64;
            items.push(Item::Act(Action::Copy {
                src: l.buffer(prep, *src) + pos * len,
                dst: l.buffer(prep, *dst),
                bytes: len,
            }));
        }
        Step::ReduceScatter { unit, src, dst, .. } => {
            zero_uncovered(prep, unit.index(), *src, l, &mut items);
            let ((sn, sdt), (dn, ddt)) = (elems(prep, *src), elems(prep, *dst));
            let size = group_size(Group::Shard) as u64;
            if sn != dn * size {
                return Err(unsupported(
                    "reduce_scatter",
                    format!("{sn} elements do not scatter into {size} x {dn}"),
                ));
            }
            let div = (world as u32 * plan.config.grad_accum.max(1)) as f32;
            let (sp, dp) = (l.buffer(prep, *src), l.buffer(prep, *dst));
            if use_nccl(Group::Shard) {
                let comm = comms.get(stream, Group::Shard);
                if sdt == ddt {
                    items.push(Item::Coll(Coll::ReduceScatter {
                        comm,
                        send: sp,
                        recv: dp,
                        count: dn as usize,
                        dt: sdt,
                    }));
                    items.push(convert(dp, ddt, dp, ddt, dn, div));
                } else {
                    // NCCL reduces in the gradient's own dtype, in place
                    // (into this member's slice), then widens into the shard.
                    let slice = sp + position(Group::Shard) as u64 * dn * sdt.size() as u64;
                    items.push(Item::Coll(Coll::ReduceScatter {
                        comm,
                        send: sp,
                        recv: slice,
                        count: dn as usize,
                        dt: sdt,
                    }));
                    items.push(convert(slice, sdt, dp, ddt, dn, div));
                }
            } else {
                items.push(convert(sp, sdt, dp, ddt, dn, div));
            }
            if let InstrOp::ReduceScatter { c: Collective { dtype, .. } } = plan.instructions[i].op {
                if dtype != ddt && ddt == DType::F32 && matches!(dtype, DType::Bf16 | DType::F16) {
                    items.push(Item::Act(Action::Launch(Launch {
                        kernel: "round_to",
                        grid: (grid_for(dn), 1, 1),
                        block: THREADS,
                        smem: 0,
                        args: vec![
                            Arg::Ptr(Ptr::Abs(dp)),
                            Arg::I32(dt_code(dtype)),
                            Arg::I64(dn as i64),
                        ],
                    })));
                }
            }
        }
        Step::AllReduce {
            unit,
            buffer,
            group,
            divide_by,
            ..
        } => {
            if plan.buffers[buffer.index()].kind == BufferKind::FlatGrads {
                zero_uncovered(prep, unit.index(), *buffer, l, &mut items);
            }
            let (n, dt) = elems(prep, *buffer);
            let p = l.buffer(prep, *buffer);
            if use_nccl(*group) {
                items.push(Item::Coll(Coll::AllReduce {
                    comm: comms.get(stream, *group),
                    buf: p,
                    count: n as usize,
                    dt,
                }));
            }
            if *divide_by != 1 {
                items.push(convert(p, dt, p, dt, n, *divide_by as f32));
            }
        }
        Step::NormAllReduce { buffer, group } => {
            if use_nccl(*group) {
                items.push(Item::Coll(Coll::AllReduce {
                    comm: comms.get(stream, *group),
                    buf: l.buffer(prep, *buffer),
                    count: 1,
                    dt: DType::F32,
                }));
            }
        }
        Step::LoadInput {
            name,
            ty,
            dst,
            micro,
        } => {
            return Ok((
                Work::Load {
                    name: name.to_string(),
                    ty: (*ty).clone(),
                    dst: l.region(prep, dst),
                    micro: *micro,
                },
                0,
            ));
        }
        Step::Kernel {
            id,
            node,
            ins,
            outs,
            ws,
            micro,
        } => {
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
            let w = ws.as_ref().map(|r| (l.region(prep, r), r.len as u64));
            let first = (u64::from(*micro) * world as u64 + rank as u64) * prep.batch as u64;
            let lowered = ops::lower(&node.op, &xs, &ys, w, first, seed).map_err(|reason| {
                CudaError::Kernel {
                    node: format!("{id} ({})", node.name),
                    op: node.op.name(),
                    reason,
                }
            })?;
            scratch = lowered.scratch;
            items.extend(lowered.actions.into_iter().map(Item::Act));
        }
        Step::Copy { src, dst } => {
            let bytes = plan.buffers[src.index()].bytes;
            items.push(Item::Act(Action::Copy {
                src: l.buffer(prep, *src),
                dst: l.buffer(prep, *dst),
                bytes,
            }));
        }
        Step::Accumulate { src, dst } => {
            let (n, dt) = elems(prep, *src);
            items.push(Item::Act(Action::Launch(Launch {
                kernel: "accumulate",
                grid: (grid_for(n), 1, 1),
                block: THREADS,
                smem: 0,
                args: vec![
                    Arg::Ptr(Ptr::Abs(l.buffer(prep, *src))),
                    Arg::Ptr(Ptr::Abs(l.buffer(prep, *dst))),
                    Arg::I32(dt_code(dt)),
                    Arg::I64(n as i64),
                ],
            })));
        }
        Step::Optimizer {
            params,
            grads,
            state,
            ..
        } => {
            let ((pn, _), (gn, gdt)) = (elems(prep, *params), elems(prep, *grads));
            let state = state.iter().map(|b| l.buffer(prep, *b)).collect();
            return Ok((
                Work::Optimizer {
                    params: l.buffer(prep, *params),
                    grads: l.buffer(prep, *grads),
                    gdt,
                    state,
                    n: gn.min(pn),
                },
                0,
            ));
        }
        Step::GradNormSq { grads, dst } => {
            let parts = 8u64;
            scratch = parts + 8 * SUMSQ_BLOCKS;
            items.push(Item::Act(Action::Zero {
                ptr: Ptr::Scratch(0),
                bytes: 8,
            }));
            if grads.is_empty() {
                items.push(Item::Act(Action::Zero {
                    ptr: Ptr::Abs(l.buffer(prep, *dst)),
                    bytes: 4,
                }));
            }
            for (k, g) in grads.iter().enumerate() {
                let (n, dt) = elems(prep, *g);
                items.push(Item::Act(Action::Launch(Launch {
                    kernel: "sumsq_partial",
                    grid: (SUMSQ_BLOCKS as u32, 1, 1),
                    block: THREADS,
                    smem: 0,
                    args: vec![
                        Arg::Ptr(Ptr::Abs(l.buffer(prep, *g))),
                        Arg::I32(dt_code(dt)),
                        Arg::I64(n as i64),
                        Arg::Ptr(Ptr::Scratch(parts)),
                    ],
                })));
                items.push(Item::Act(Action::Launch(Launch {
                    kernel: "sumsq_finish",
                    grid: (1, 1, 1),
                    block: 32,
                    smem: 0,
                    args: vec![
                        Arg::Ptr(Ptr::Scratch(parts)),
                        Arg::I32(SUMSQ_BLOCKS as i32),
                        Arg::Ptr(Ptr::Scratch(0)),
                        Arg::Ptr(Ptr::Abs(l.buffer(prep, *dst))),
                        Arg::I32((k + 1 == grads.len()) as i32),
                    ],
                })));
            }
        }
        Step::ClipGrads {
            norm,
            grads,
            max_norm,
        } => {
            let (n, dt) = elems(prep, *grads);
            items.push(Item::Act(Action::Launch(Launch {
                kernel: "clip",
                grid: (grid_for(n), 1, 1),
                block: THREADS,
                smem: 0,
                args: vec![
                    Arg::Ptr(Ptr::Abs(l.buffer(prep, *grads))),
                    Arg::I32(dt_code(dt)),
                    Arg::I64(n as i64),
                    Arg::Ptr(Ptr::Abs(l.buffer(prep, *norm))),
                    Arg::F64(*max_norm),
                ],
            })));
        }
        Step::Scaler(_) => {
            return Err(unsupported(
                "loss scaler",
                "not implemented on the cuda backend".into(),
            ))
        }
        Step::WireGather { .. } | Step::WireReduceScatter { .. } => {
            return Err(unsupported(
                "quantized collective",
                "the fp8 and int8 wire formats are not implemented on the cuda backend; compile with --allgather-wire native --reduce-scatter-wire native".into(),
            ))
        }
    }
    // A launch over nothing (grid 0) is no work.
    items.retain(|it| !matches!(it, Item::Act(Action::Launch(x)) if x.grid.0 == 0));
    Ok((Work::Device(items), scratch))
}

/// The optimizer launch of a step (AdamW's constants depend on it).
fn optimizer_launch(
    opt: &Optimizer,
    step: u64,
    params: u64,
    grads: u64,
    gdt: DType,
    state: &[u64],
    n: u64,
) -> Result<Launch, CudaError> {
    let p = |a: u64| Arg::Ptr(Ptr::Abs(a));
    let args = match *opt {
        Optimizer::AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            let [m, v] = state else {
                return Err(CudaError::Kernel {
                    node: "optimizer".into(),
                    op: "adamw".into(),
                    reason: format!("needs two state buffers, got {}", state.len()),
                });
            };
            // As optim.rs: t = step + 1.
            let t = (step + 1) as i32;
            let decay = (1.0 - lr * weight_decay) as f32;
            let w1 = (1.0 - beta1) as f32;
            let (b2, w2) = (beta2 as f32, (1.0 - beta2) as f32);
            let bc1 = 1.0 - beta1.powi(t);
            let bc2_sqrt = (1.0 - beta2.powi(t)).sqrt() as f32;
            let step_size = (lr / bc1) as f32;
            vec![
                p(params),
                p(grads),
                Arg::I32(dt_code(gdt)),
                p(*m),
                p(*v),
                Arg::I64(n as i64),
                Arg::F32(decay),
                Arg::F32(w1),
                Arg::F32(b2),
                Arg::F32(w2),
                Arg::F32(bc2_sqrt),
                Arg::F32(step_size),
                Arg::F32(eps as f32),
            ]
        }
        Optimizer::Sgd {
            lr,
            momentum,
            weight_decay,
        } => {
            let buf = state.first().copied().unwrap_or(0);
            vec![
                p(params),
                p(grads),
                Arg::I32(dt_code(gdt)),
                p(buf),
                Arg::I64(n as i64),
                Arg::F32(lr as f32),
                Arg::F32(momentum as f32),
                Arg::F32(weight_decay as f32),
            ]
        }
    };
    let kernel = if matches!(opt, Optimizer::AdamW { .. }) {
        "adamw"
    } else {
        "sgd"
    };
    Ok(Launch {
        kernel,
        grid: (blocks_for(n.max(1)), 1, 1),
        block: THREADS,
        smem: 0,
        args,
    })
}
