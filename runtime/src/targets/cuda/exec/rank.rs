//! A GPU rank's set-up and what it reads between steps. `GpuRank::new`
//! makes the streams and events, lowers every instruction twice (at
//! address 0 to size each stream's scratch, then at the real addresses),
//! lays out and zeroes the one allocation (arena, scratch per stream,
//! cuBLAS workspaces), makes the cuBLAS handles and the NCCL
//! communicators, and the staging and timing it needs. Between steps it
//! uploads and downloads buffers and reads the loss and gradient norm.

use super::comms::{CommIndex, CommSetup};
use super::lower::{lower_step, Layout};
use super::{refuse_unsupported, Item, NcclUse, Work, BLAS_WORKSPACE, ERR_BYTES};
use crate::error::RuntimeError;
use crate::exec::resolve::Resolved;
use crate::targets::cuda::blas::Blas;
use crate::targets::cuda::device::{Device, DeviceAlloc};
use crate::targets::cuda::error::CudaError;
use crate::targets::cuda::nccl::NcclComm;
use crate::targets::cuda::ops::Action;
use cudarc::driver::{result, sys, CudaContext, CudaEvent, CudaStream};
use fsdpc_ir::DType;
use fsdpc_plan::{BufferId, Stream};
use std::collections::HashMap;
use std::sync::Arc;

/// An instruction's two timing events (before, after).
type Timing = (CudaEvent, CudaEvent);

/// A GPU rank ready to run steps.
//
// Fields drop in order: the communicators, cuBLAS handles and events go
// before the streams, the allocation and the device (whose context they
// need).
pub struct GpuRank<'p> {
    pub(super) comms: Vec<NcclComm>,
    loss_comm: Option<NcclComm>,
    pub(super) blas: Vec<Option<Blas>>,
    pub(super) timing: Option<Vec<Timing>>,
    pub(super) start: Option<CudaEvent>,
    pub(super) events: Vec<CudaEvent>,
    /// CUDA stream per plan stream (by `Stream::index`), where it has work.
    pub(super) streams: Vec<Option<Arc<CudaStream>>>,
    alloc: DeviceAlloc,
    pub(super) scratch: [u64; 4],
    pub(super) work: Vec<Work>,
    pub(super) staging: HashMap<usize, Vec<u8>>,
    /// Whether the next steps are timed (`set_timed`).
    pub(super) timed: bool,
    pub(super) prep: &'p Resolved<'p>,
    pub(super) rank: usize,
    pub(super) world: usize,
    /// The device.
    pub dev: Device,
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
        let streams = new_streams(&ctx, prep)?;
        let events = (0..plan.events)
            .map(|_| ctx.new_event(None))
            .collect::<Result<Vec<_>, _>>()
            .map_err(CudaError::from)?;
        let (need, gemm_streams) = scratch_needs(prep, rank, world, seed, comm.nccl)?;
        let (mut scratch, blas_ws, total) =
            carve(plan.memory.arena_bytes, &need, &streams, &gemm_streams);
        let alloc = DeviceAlloc::new(&ctx, total as usize)?;
        // SAFETY: the whole allocation, before any work uses it.
        unsafe { result::memset_d8_sync(alloc.ptr, 0, total as usize) }.map_err(CudaError::from)?;
        let layout = Layout { arena: alloc.ptr };
        for s in &mut scratch {
            *s += alloc.ptr;
        }
        let blas = blas_handles(&streams, &gemm_streams, alloc.ptr, &blas_ws)?;
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
        let staging = staging_for(&work);
        let (timing, start) = timing_events(&ctx, work.len(), timing)?;
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

    /// The loss after a step (the sum over micro-batches, divided).
    pub fn read_loss(&self) -> Result<f32, RuntimeError> {
        let k = self.prep.plan.config.grad_accum.max(1);
        Ok(self.read_loss_scalar()? / k as f32)
    }

    /// The loss scalar as a pass left it (an evaluation pass: its one
    /// micro-batch's loss).
    pub(super) fn read_loss_scalar(&self) -> Result<f32, RuntimeError> {
        let r = self.prep.loss;
        let b = self.download(r.buffer, r.offset as u64, 4)?;
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
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

/// A CUDA stream for each plan stream that has instructions.
fn new_streams(
    ctx: &Arc<CudaContext>,
    prep: &Resolved,
) -> Result<Vec<Option<Arc<CudaStream>>>, RuntimeError> {
    let mut streams = vec![None; 4];
    for (s, list) in &prep.streams {
        if !list.is_empty() {
            streams[s.index()] = Some(ctx.new_stream().map_err(CudaError::from)?);
        }
    }
    Ok(streams)
}

/// Pass 1 at address 0: the scratch each stream needs (the compute
/// stream's holds the loss report's slots too), and the streams that run
/// matrix products.
fn scratch_needs(
    prep: &Resolved,
    rank: usize,
    world: usize,
    seed: u64,
    nccl: NcclUse,
) -> Result<([u64; 4], [bool; 4]), RuntimeError> {
    let plan = prep.plan;
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
            nccl,
        )?;
        need[si] = need[si].max(scratch);
        gemm_streams[si] |= has_gemm(&items);
    }
    // The loss report's send and receive slots.
    let ci = Stream::Compute.index();
    need[ci] = need[ci].max(256 + 4 * world as u64);
    Ok((need, gemm_streams))
}

/// The allocation's layout after the arena: where each stream's scratch
/// and each cuBLAS workspace start (offsets from its start), and its
/// bytes.
fn carve(
    arena_bytes: u64,
    need: &[u64; 4],
    streams: &[Option<Arc<CudaStream>>],
    gemm_streams: &[bool; 4],
) -> ([u64; 4], [u64; 4], u64) {
    let arena = round(arena_bytes);
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
    (scratch, blas_ws, total)
}

/// A cuBLAS handle for each stream that runs matrix products, its
/// workspace at `base + blas_ws[stream]`.
fn blas_handles(
    streams: &[Option<Arc<CudaStream>>],
    gemm_streams: &[bool; 4],
    base: u64,
    blas_ws: &[u64; 4],
) -> Result<Vec<Option<Blas>>, RuntimeError> {
    let mut blas = Vec::new();
    for si in 0..4 {
        blas.push(match (&streams[si], gemm_streams[si]) {
            (Some(st), true) => Some(Blas::new(
                st,
                (base + blas_ws[si], BLAS_WORKSPACE as usize),
            )?),
            _ => None,
        });
    }
    Ok(blas)
}

/// A host staging buffer for each input load, by instruction.
fn staging_for(work: &[Work]) -> HashMap<usize, Vec<u8>> {
    work.iter()
        .enumerate()
        .filter_map(|(i, w)| match w {
            Work::Load { ty, .. } => Some((i, vec![0u8; ty.bytes() as usize])),
            _ => None,
        })
        .collect()
}

/// With `timing`, two timing events for each of `n` instructions and the
/// step's start event.
fn timing_events(
    ctx: &Arc<CudaContext>,
    n: usize,
    timing: bool,
) -> Result<(Option<Vec<Timing>>, Option<CudaEvent>), RuntimeError> {
    let timing = if timing {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let mut v = Vec::new();
        for _ in 0..n {
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
    Ok((timing, start))
}

fn round(x: u64) -> u64 {
    x.div_ceil(256) * 256
}

fn has_gemm(items: &Work) -> bool {
    matches!(items, Work::Device(v) if v.iter().any(|it| matches!(it, Item::Act(Action::Gemm(_)))))
}
