//! One rank's execution of a step: the semantics of every instruction, the
//! stream threads of arena mode, and the serial list-order loop of debug mode.

use super::events::Events;
use super::memory::Memory;
use super::resolve::{kind, Resolved, Step};
use super::timeline::{RankTimeline, Recorder};
use super::widen;
use crate::account::RankTag;
use crate::backend::{Backend, KernelCtx, OptimizerArgs, Workspace};
use crate::comm::{Buf, BufMut, Communicator, World};
use crate::data::{Batch, DataSource};
use crate::error::{CommError, RuntimeError};
use crate::tensor::{TensorMut, TensorRef};
use fsdpc_ir::DType;
use fsdpc_plan::{BufferId, BufferKind, Collective, Group, InstrOp, Stream};
use smallvec::SmallVec;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

/// Operand views a kernel call keeps on the stack.
const VIEWS: usize = 8;

/// What one rank needs to execute steps.
pub struct RankEnv<'a> {
    pub rank: usize,
    pub world: &'a dyn World,
    pub prep: &'a Resolved<'a>,
    pub backend: &'a dyn Backend,
    pub data: &'a dyn DataSource,
    pub seed: u64,
    comms: Vec<((Stream, Group), Box<dyn Communicator>)>,
    events: Events,
    /// With `--trace`: records the traced steps' spans (`timeline`).
    trace: Option<Recorder>,
}

/// A panic payload as text.
pub fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".into())
}

impl<'a> RankEnv<'a> {
    /// Sets up rank `rank`: one communicator per (stream, group).
    pub fn new(
        rank: usize,
        world: &'a dyn World,
        prep: &'a Resolved<'a>,
        backend: &'a dyn Backend,
        data: &'a dyn DataSource,
        seed: u64,
    ) -> Result<RankEnv<'a>, RuntimeError> {
        let n = world.size();
        let f = prep.plan.config.shard_factor as usize;
        if f == 0 || !n.is_multiple_of(f) {
            return Err(RuntimeError::plan(format!(
                "shard factor {f} does not divide the world {n}"
            )));
        }
        let resharded = match prep.plan.reshard_group() {
            Some(k) if k >= 1 && (f as u32).is_multiple_of(k) => Some(k as usize),
            Some(k) => {
                return Err(RuntimeError::plan(format!(
                    "reshard_after_forward {k} does not divide the shard factor {f}"
                )))
            }
            None => None,
        };
        let mut groups = vec![Group::Shard, Group::Replicate];
        groups.extend(resharded.map(|_| Group::Reshard));
        // Hierarchical collectives run inside the node, then across.
        let hier = prep.steps.iter().any(|s| {
            matches!(
                s,
                Step::AllGather { hier: Some(_), .. } | Step::ReduceScatter { hier: Some(_), .. }
            )
        });
        if hier {
            groups.extend([Group::NodeLocal, Group::CrossNode]);
        }
        // The members of each group on this world.
        let geometry = fsdpc_plan::Geometry {
            world: n as u32,
            ..prep.plan.geometry()
        };
        let mut comms = Vec::new();
        // The offload stream only copies: it runs no collective.
        for s in Stream::ALL.into_iter().filter(|&s| s != Stream::Offload) {
            for &g in &groups {
                let ranks = g.members(rank, &geometry);
                let c = world
                    .communicator(&ranks, &format!("{s:?}/{g:?}"), rank)
                    .map_err(|e| comm_err(rank, e))?;
                comms.push(((s, g), c));
            }
        }
        Ok(RankEnv {
            rank,
            world,
            prep,
            backend,
            data,
            seed,
            comms,
            events: Events::new(prep.plan.events as usize),
            trace: None,
        })
    }

    /// Records the spans of the steps from `from_step` on (`steps` of them)
    /// into buffers reserved now: call it outside the rank's accounting
    /// window (see `timeline`). `epoch` is the run's time origin and `tag`
    /// the rank's accounting tag, read for the live-memory counter.
    pub fn start_trace(&mut self, epoch: Instant, from_step: u64, steps: u64, tag: Option<usize>) {
        self.trace = Some(Recorder::new(self.prep, epoch, from_step, steps, tag));
    }

    /// The recorded timeline, if `start_trace` was called.
    pub fn take_trace(&mut self) -> Option<RankTimeline> {
        self.trace.take().map(|t| t.finish(self.rank))
    }

    pub(super) fn comm(&self, s: Stream, g: Group) -> &dyn Communicator {
        // Every (stream, group) pair was created in `new`.
        self.comms
            .iter()
            .find(|(k, _)| *k == (s, g))
            .map(|(_, c)| &**c)
            .unwrap_or(&*self.comms[0].1)
    }

    fn dtype(&self, b: BufferId) -> DType {
        self.prep.plan.buffers[b.index()].dtype
    }

    /// The whole of `src` to send and the whole of `dst` to receive into, for
    /// a collective.
    ///
    /// # Safety
    /// As for `Memory::view_mut`; `resolve` rejects collectives whose `src`
    /// and `dst` are the same buffer.
    unsafe fn send_recv<'m>(
        &self,
        mem: &'m Memory,
        src: BufferId,
        dst: BufferId,
    ) -> Result<(Buf<'m>, BufMut<'m>), RuntimeError> {
        let send = Buf {
            dtype: self.dtype(src),
            bytes: mem.view(mem.whole(src))?,
        };
        let recv = BufMut {
            dtype: self.dtype(dst),
            bytes: mem.view_mut(mem.whole(dst))?,
        };
        Ok((send, recv))
    }

    /// Gathers each segment of a unit's flat parameter into its place (see
    /// `Step::AllGather`), and those of the bucketed gathers `with` before
    /// it: one grouped call (`Communicator::all_gather_group`) of a gather
    /// per segment, in bucket and segment order on every rank.
    ///
    /// # Safety
    /// As for `Memory::view_mut`; `resolve` checked the parts' bounds, and
    /// the members' buffers are distinct live buffers.
    unsafe fn all_gather(
        &self,
        mem: &Memory,
        stream: Stream,
        with: &[super::resolve::Bucketed],
        own: (BufferId, BufferId, &[(usize, usize, usize)]),
        group: Group,
    ) -> Result<(), RuntimeError> {
        let comm = self.comm(stream, group);
        let f = comm.size();
        let members = with
            .iter()
            .map(|(s, d, p)| (*s, *d, p.as_slice()))
            .chain(std::iter::once(own));
        let mut calls = crate::comm::GatherCalls::new();
        for (src, dst, parts) in members {
            let (send, recv) = self.send_recv(mem, src, dst)?;
            let (se, re) = (send.dtype.size(), recv.dtype.size());
            let mut rest = recv.bytes;
            let mut taken = 0;
            for &(shard_at, flat_at, n) in parts {
                let part = Buf {
                    dtype: send.dtype,
                    bytes: &send.bytes[shard_at * se..(shard_at + n) * se],
                };
                // Parts are in flat order and disjoint: split them off.
                let tail = std::mem::take(&mut rest);
                let (_, from) = tail.split_at_mut(flat_at * re - taken);
                let (into, after) = from.split_at_mut(n * f * re);
                taken = (flat_at + n * f) * re;
                rest = after;
                calls.push((
                    part,
                    BufMut {
                        dtype: recv.dtype,
                        bytes: into,
                    },
                ));
            }
        }
        comm.all_gather_group(calls)
            .map_err(|e| comm_err(self.rank, e))
    }

    /// The cross-node and node-local communicators of `stream` (the two
    /// levels of a hierarchical collective).
    fn levels(&self, stream: Stream) -> (&dyn Communicator, &dyn Communicator) {
        (
            self.comm(stream, Group::CrossNode),
            self.comm(stream, Group::NodeLocal),
        )
    }

    /// A hierarchical all-gather (`CollectiveAlgorithm::Hierarchical`), per
    /// part of n elements: across nodes first, the m shards at this rank's
    /// place on each node into `staging` (m n elements, the gathered
    /// dtype), then inside the node once per node b, block b of every
    /// member into the gathered flat elements `flat + b k n ..`: shard
    /// positions b k .. b k + k, in order.
    ///
    /// # Safety
    /// As for `all_gather`; `resolve` sized `staging`.
    unsafe fn hier_all_gather(
        &self,
        mem: &Memory,
        stream: Stream,
        src: BufferId,
        dst: BufferId,
        parts: &[(usize, usize, usize)],
        staging: BufferId,
    ) -> Result<(), RuntimeError> {
        let ce = |e: CommError| comm_err(self.rank, e);
        let (send, recv) = self.send_recv(mem, src, dst)?;
        let st = mem.view_mut(mem.whole(staging))?;
        let (inter, intra) = self.levels(stream);
        let (m, k) = (inter.size(), intra.size());
        let (se, re) = (send.dtype.size(), recv.dtype.size());
        for &(shard_at, flat_at, n) in parts {
            let part = Buf {
                dtype: send.dtype,
                bytes: &send.bytes[shard_at * se..(shard_at + n) * se],
            };
            let gathered = BufMut {
                dtype: recv.dtype,
                bytes: &mut st[..m * n * re],
            };
            inter.all_gather(part, gathered).map_err(ce)?;
            for b in 0..m {
                let piece = Buf {
                    dtype: recv.dtype,
                    bytes: &st[b * n * re..(b + 1) * n * re],
                };
                let at = flat_at + b * k * n;
                let into = BufMut {
                    dtype: recv.dtype,
                    bytes: &mut recv.bytes[at * re..(at + k * n) * re],
                };
                intra.all_gather(piece, into).map_err(ce)?;
            }
        }
        Ok(())
    }

    /// A hierarchical reduce-scatter: inside the node first, once per node
    /// b, block b of the flat gradient (k chunks) summed over the node
    /// into chunk b of `staging` (f32, not divided), then across nodes,
    /// `staging`'s m chunks summed and divided into this rank's shard
    /// (chunk b k + j for this rank at place j of node b).
    ///
    /// # Safety
    /// As for `all_gather`; `resolve` sized `staging`.
    unsafe fn hier_reduce_scatter(
        &self,
        mem: &Memory,
        i: usize,
        stream: Stream,
        src: BufferId,
        dst: BufferId,
        staging: BufferId,
    ) -> Result<(), RuntimeError> {
        let ce = |e: CommError| comm_err(self.rank, e);
        let (send, recv) = self.send_recv(mem, src, dst)?;
        let st = mem.view_mut(mem.whole(staging))?;
        let (inter, intra) = self.levels(stream);
        let (m, k) = (inter.size(), intra.size());
        let c = recv.len();
        let (se, fe) = (send.dtype.size(), DType::F32.size());
        if send.len() != c * m * k || st.len() < c * m * fe {
            return Err(RuntimeError::plan_at(
                i,
                format!(
                    "hierarchical reduce-scatter of {} elements into {m} x {k} shards of {c}",
                    send.len()
                ),
            ));
        }
        for b in 0..m {
            let block = Buf {
                dtype: send.dtype,
                bytes: &send.bytes[b * k * c * se..(b + 1) * k * c * se],
            };
            let into = BufMut {
                dtype: DType::F32,
                bytes: &mut st[b * c * fe..(b + 1) * c * fe],
            };
            intra.reduce_scatter(block, into, 1).map_err(ce)?;
        }
        let sums = Buf {
            dtype: DType::F32,
            bytes: &st[..c * m * fe],
        };
        inter
            .reduce_scatter(sums, recv, self.grad_divisor())
            .map_err(ce)
    }

    /// Records a failure so every blocked rank and stream stops.
    pub fn fail(&self, e: &RuntimeError) {
        if !matches!(e, RuntimeError::RankFailed { .. }) {
            self.world.poison(self.rank, &e.to_string());
        }
    }

    /// Runs one instruction (all but `Free`, which only debug mode acts on).
    fn exec(&self, mem: &Memory, i: usize, step: u64) -> Result<(), RuntimeError> {
        let stream = self.prep.plan.instructions[i].stream;
        let ce = |e: CommError| comm_err(self.rank, e);
        // SAFETY (all `view`/`view_mut` below): regions come from `resolve`;
        // the plan orders conflicting accesses (see `Memory::view`).
        unsafe {
            match &self.prep.steps[i] {
                Step::AllGather {
                    src,
                    dst,
                    parts,
                    group,
                    hier: None,
                    with,
                } => self.all_gather(mem, stream, with, (*src, *dst, parts), *group),
                Step::Bucketed => Ok(()),
                Step::AllGather {
                    src,
                    dst,
                    parts,
                    hier: Some(staging),
                    ..
                } => self.hier_all_gather(mem, stream, *src, *dst, parts, *staging),
                Step::WireGather {
                    src,
                    dst,
                    scratch,
                    parts,
                    wire,
                } => {
                    let g = super::quantized::WireGather {
                        src: *src,
                        dst: *dst,
                        scratch: *scratch,
                        parts,
                        wire: *wire,
                    };
                    self.wire_gather(mem, stream, &g)
                }
                Step::WireReduceScatter {
                    unit,
                    src,
                    dst,
                    scratch,
                    block,
                } => {
                    let r = super::quantized::WireReduce {
                        unit: *unit,
                        src: *src,
                        dst: *dst,
                        scratch: *scratch,
                        block: *block,
                    };
                    self.wire_reduce_scatter(mem, i, stream, &r)
                }
                Step::Reshard { src, dst, group } => {
                    // This rank's slice: its position in the group.
                    let pos = self.comm(stream, *group).position();
                    let (whole, slice) = self.send_recv(mem, *src, *dst)?;
                    let len = slice.bytes.len();
                    let from = whole.bytes.get(pos * len..(pos + 1) * len).ok_or_else(|| {
                        RuntimeError::plan_at(
                            i,
                            format!("reshard slice {pos} lies outside buffer {src}"),
                        )
                    })?;
                    slice.bytes.copy_from_slice(from);
                    Ok(())
                }
                Step::ReduceScatter {
                    unit,
                    src,
                    dst,
                    hier,
                } => {
                    // Every plan reduce-scatters over the shard group (the
                    // verifier checks the plan's `group`).
                    self.zero_uncovered(mem, unit.index(), *src)?;
                    match hier {
                        None => {
                            let (send, recv) = self.send_recv(mem, *src, *dst)?;
                            self.comm(stream, Group::Shard)
                                .reduce_scatter(send, recv, self.grad_divisor())
                                .map_err(ce)?;
                        }
                        Some(staging) => {
                            self.hier_reduce_scatter(mem, i, stream, *src, *dst, *staging)?
                        }
                    }
                    self.round_reduced(mem, i, *dst)
                }
                Step::AllReduce {
                    unit,
                    buffer,
                    group,
                    divide_by,
                    staging,
                } => {
                    if kind(self.prep.plan, *buffer) == Some(BufferKind::FlatGrads) {
                        self.zero_uncovered(mem, unit.index(), *buffer)?;
                    }
                    let dtype = self.dtype(*buffer);
                    let bytes = mem.view_mut(mem.whole(*buffer))?;
                    let comm = self.comm(stream, *group);
                    match staging {
                        None => comm.all_reduce(BufMut { dtype, bytes }, *divide_by),
                        // This member's slice reduced into the staging
                        // buffer, then gathered back: the all-reduce's
                        // values (one rounding, the same order).
                        Some(st) => {
                            let len = bytes.len() / comm.size().max(1);
                            let slice = &mut mem.view_mut(mem.whole(*st))?[..len];
                            comm.reduce_scatter(
                                Buf {
                                    dtype,
                                    bytes: &*bytes,
                                },
                                BufMut {
                                    dtype,
                                    bytes: &mut *slice,
                                },
                                *divide_by,
                            )
                            .and_then(|()| {
                                comm.all_gather(
                                    Buf {
                                        dtype,
                                        bytes: slice,
                                    },
                                    BufMut { dtype, bytes },
                                )
                            })
                        }
                    }
                    .map_err(ce)
                }
                Step::LoadInput {
                    name,
                    ty,
                    dst,
                    micro,
                } => {
                    let out = TensorMut {
                        ty,
                        bytes: mem.view_mut(*dst)?,
                    };
                    let first_sample = self.first_sample(*micro);
                    self.data.fill(name, Batch { step, first_sample }, out)
                }
                Step::Kernel { .. } => self.kernel(mem, i, step),
                Step::Copy { src, dst } => {
                    let (from, into) = self.send_recv(mem, *src, *dst)?;
                    into.bytes.copy_from_slice(from.bytes);
                    Ok(())
                }
                Step::Accumulate { src, dst } => {
                    let (from, into) = self.send_recv(mem, *src, *dst)?;
                    crate::optim::accumulate(from.dtype, from.bytes, into.bytes)
                        .map_err(|reason| RuntimeError::plan_at(i, reason))
                }
                Step::Optimizer {
                    skip_if: Some(flag),
                    ..
                } if self.f32s(mem, *flag)?[0] != 0.0 => Ok(()),
                Step::Optimizer {
                    params,
                    grads,
                    state,
                    ..
                } => self.optimizer(mem, step, *params, *grads, state),
                Step::Scaler(s) => self.scaler(mem, stream, s),
                Step::GradNormSq { grads, dst } => {
                    let mut sum = 0f64;
                    for g in grads.iter() {
                        self.with_f32(mem, *g, |_, xs| sum += crate::optim::sum_squares(xs))?;
                    }
                    self.f32s(mem, *dst)?[0] = sum as f32;
                    Ok(())
                }
                Step::NormAllReduce { buffer, group } => {
                    let buf = BufMut {
                        dtype: DType::F32,
                        bytes: mem.view_mut(mem.whole(*buffer))?,
                    };
                    self.comm(stream, *group).all_reduce(buf, 1).map_err(ce)
                }
                Step::ClipGrads {
                    norm,
                    grads,
                    max_norm,
                } => {
                    let sq = self.f32s(mem, *norm)?[0];
                    self.with_f32(mem, *grads, |_, xs| {
                        crate::optim::clip_by_norm(xs, sq, *max_norm)
                    })
                }
                Step::Free(_) => Ok(()),
                Step::Record(e) => {
                    self.events.record(*e);
                    Ok(())
                }
                Step::Wait(e) => self.events.wait(*e, self.rank, self.world),
            }
        }
    }

    /// After a reduce-scatter into a wider buffer (f32 gradient shard), rounds
    /// the result to the instruction's reduction dtype: the value a reduction
    /// in that dtype delivers (the sum itself runs in f32, in rank order,
    /// and is rounded once; see `comm`).
    pub(super) unsafe fn round_reduced(
        &self,
        mem: &Memory,
        i: usize,
        dst: BufferId,
    ) -> Result<(), RuntimeError> {
        let InstrOp::ReduceScatter {
            c: Collective { dtype, .. },
        } = self.prep.plan.instructions[i].op
        else {
            return Ok(());
        };
        if dtype == self.dtype(dst) {
            return Ok(());
        }
        self.with_f32(mem, dst, |_, xs| widen::round_to(xs, dtype))
    }

    /// Runs `f` on float buffer `b` as f32 (see `widen::with_f32`).
    ///
    /// # Safety
    /// As for `Memory::view_mut`.
    pub(super) unsafe fn with_f32(
        &self,
        mem: &Memory,
        b: BufferId,
        f: impl FnMut(usize, &mut [f32]),
    ) -> Result<(), RuntimeError> {
        widen::with_f32(mem.view_mut(mem.whole(b))?, self.dtype(b), f)
            .map_err(|e| RuntimeError::plan(format!("buffer {b}: {e}")))
    }

    /// Zeroes the regions of a flat gradient no trainable parameter covers.
    pub(super) unsafe fn zero_uncovered(
        &self,
        mem: &Memory,
        unit: usize,
        b: BufferId,
    ) -> Result<(), RuntimeError> {
        let es = self.dtype(b).size();
        let bytes = mem.view_mut(mem.whole(b))?;
        for &(s, e) in &self.prep.uncovered[unit] {
            let (s, e) = ((s * es).min(bytes.len()), (e * es).min(bytes.len()));
            bytes[s..e].fill(0);
        }
        Ok(())
    }

    unsafe fn kernel(&self, mem: &Memory, i: usize, step: u64) -> Result<(), RuntimeError> {
        let Step::Kernel {
            id,
            node,
            ins,
            outs,
            ws,
            micro,
        } = &self.prep.steps[i]
        else {
            return Ok(());
        };
        // Operand views on the stack (heap only past `VIEWS` operands).
        let mut xs: SmallVec<[TensorRef; VIEWS]> = SmallVec::new();
        for (r, ty) in ins {
            xs.push(TensorRef {
                ty,
                bytes: mem.view(*r)?,
            });
        }
        let mut ys: SmallVec<[TensorMut; VIEWS]> = SmallVec::new();
        for (r, ty) in outs {
            ys.push(TensorMut {
                ty,
                bytes: mem.view_mut(*r)?,
            });
        }
        // The stream's workspace buffer is used by this stream's kernels
        // only, one at a time.
        let mut ws = match ws {
            Some(r) => Workspace::new(mem.view_mut(*r)?),
            None => Workspace::empty(),
        };
        let ctx = KernelCtx {
            step,
            sample_offset: self.first_sample(*micro),
            seed: self.seed,
        };
        self.backend
            .run(node, &xs, &mut ys, &ctx, &mut ws)
            .map_err(|e| RuntimeError::Kernel {
                node: format!("{id} ({})", node.name),
                op: node.op.name(),
                reason: e.0,
            })
    }

    /// The whole of f32 buffer `b`.
    ///
    /// # Safety
    /// As for `Memory::view_mut`.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn f32s<'m>(
        &self,
        mem: &'m Memory,
        b: BufferId,
    ) -> Result<&'m mut [f32], RuntimeError> {
        if self.dtype(b) != DType::F32 {
            return Err(RuntimeError::plan(format!(
                "buffer {b} must be f32, it is {}",
                self.dtype(b)
            )));
        }
        bytemuck::try_cast_slice_mut(mem.view_mut(mem.whole(b))?)
            .map_err(|_| RuntimeError::plan(format!("buffer {b} is not 4-byte aligned")))
    }

    unsafe fn optimizer(
        &self,
        mem: &Memory,
        step: u64,
        params: BufferId,
        grads: BufferId,
        state: &[BufferId],
    ) -> Result<(), RuntimeError> {
        let f32s = |b: BufferId| -> Result<&mut [f32], RuntimeError> {
            if self.dtype(b) != DType::F32 {
                return Err(RuntimeError::plan(format!(
                    "optimizer buffer {b} must be f32, it is {}",
                    self.dtype(b)
                )));
            }
            bytemuck::try_cast_slice_mut(mem.view_mut(mem.whole(b))?)
                .map_err(|_| RuntimeError::plan(format!("buffer {b} is not 4-byte aligned")))
        };
        let mut st = Vec::with_capacity(state.len());
        for b in state {
            st.push(f32s(*b)?);
        }
        if self.dtype(grads) != DType::F32 {
            return self.optimizer_half(mem, step, f32s(params)?, grads, st);
        }
        // The gradient covers the trainable part of the shard, its first
        // elements (`Unit::trainable_shard_numel`; sizes checked by `resolve`).
        let g = f32s(grads)?;
        let p = f32s(params)?;
        let n = g.len().min(p.len());
        let args = OptimizerArgs {
            optimizer: &self.prep.plan.training.optimizer,
            step,
            params: &mut p[..n],
            grads: g,
            state: st,
        };
        self.backend
            .optimizer_step(args)
            .map_err(|e| RuntimeError::Kernel {
                node: format!("optimizer step of buffer {params}"),
                op: "optimizer".into(),
                reason: e.0,
            })
    }

    /// The optimizer step on a half-precision gradient (no_shard mixed
    /// precision updates its f32 parameters from the all-reduced bf16/f16
    /// flat gradient): the gradient is widened chunk by chunk and each chunk
    /// updates the same elements of the parameters and state. The update is
    /// element by element, so this equals one call on the widened gradient.
    unsafe fn optimizer_half(
        &self,
        mem: &Memory,
        step: u64,
        params: &mut [f32],
        grads: BufferId,
        mut state: Vec<&mut [f32]>,
    ) -> Result<(), RuntimeError> {
        let mut result = Ok(());
        let n = params.len();
        self.with_f32(mem, grads, |off, g| {
            let end = (off + g.len()).min(n);
            if result.is_err() || off >= end {
                return;
            }
            let args = OptimizerArgs {
                optimizer: &self.prep.plan.training.optimizer,
                step,
                params: &mut params[off..end],
                grads: &g[..end - off],
                state: state.iter_mut().map(|s| &mut s[off..end]).collect(),
            };
            result = self.backend.optimizer_step(args);
        })?;
        result.map_err(|e| RuntimeError::Kernel {
            node: format!("optimizer step of gradient buffer {grads}"),
            op: "optimizer".into(),
            reason: e.0,
        })
    }

    /// Runs one stream's instructions of a step, in list order.
    fn run_stream(&self, mem: &Memory, k: usize, step: u64) -> Result<(), RuntimeError> {
        let res = catch_unwind(AssertUnwindSafe(|| {
            let rec = self.trace.as_ref().filter(|t| t.traces(step));
            let (Some(rec), Some(mut spans)) = (rec, rec.and_then(|t| t.stream(k))) else {
                for &i in &self.prep.streams[k].1 {
                    self.exec(mem, i, step)?;
                }
                return Ok(());
            };
            for &i in &self.prep.streams[k].1 {
                let start = rec.now_ns();
                self.exec(mem, i, step)?;
                rec.push(&mut spans, i, step, start);
            }
            Ok(())
        }))
        .unwrap_or_else(|p| {
            Err(RuntimeError::RankFailed {
                rank: self.rank,
                reason: format!("panic: {}", panic_text(&*p)),
            })
        });
        if let Err(e) = &res {
            if let RuntimeError::RankFailed { rank, reason } = e {
                if *rank == self.rank {
                    self.world.poison(*rank, reason);
                }
            }
            self.fail(e);
        }
        res
    }

    /// Arena mode: runs the steps of the range `steps` with one thread per stream, created
    /// once; every step the streams start together and join at its end,
    /// then `after_step(step, time)` runs while no stream does, `time` being
    /// the step's wall time on this rank (its streams' start to their join). The stream threads
    /// and, once they are started, the calling rank thread carry the
    /// accounting tag `tag` (`account::RankTag`): starting the threads (their
    /// handles, made once per run) is the one allocation of the run that is
    /// not the rank's.
    pub fn run_arena(
        &self,
        mem: &Memory,
        steps: std::ops::Range<u64>,
        tag: Option<usize>,
        after_step: &mut dyn FnMut(u64, Duration) -> Result<(), RuntimeError>,
    ) -> Result<(), RuntimeError> {
        let live = |k: &usize| !self.prep.streams[*k].1.is_empty();
        let is_compute = |k: &usize| self.prep.streams[*k].0 == Stream::Compute;
        let compute = (0..self.prep.streams.len()).find(|k| live(k) && is_compute(k));
        let helpers: SmallVec<[usize; 4]> = (0..self.prep.streams.len())
            .filter(|k| live(k) && !is_compute(k))
            .collect();
        let start = Barrier::new(helpers.len() + 1);
        let end = Barrier::new(helpers.len() + 1);
        let stop = AtomicBool::new(false);
        let current = AtomicU64::new(0);
        let errors: SmallVec<[Mutex<Option<RuntimeError>>; 4]> =
            helpers.iter().map(|_| Mutex::new(None)).collect();
        std::thread::scope(|s| {
            for (&k, slot) in helpers.iter().zip(&errors) {
                let (start, end, stop, current) = (&start, &end, &stop, &current);
                s.spawn(move || {
                    let _tag = tag.map(RankTag::enter);
                    loop {
                        start.wait();
                        if stop.load(Ordering::Acquire) {
                            return;
                        }
                        if let Err(e) = self.run_stream(mem, k, current.load(Ordering::Acquire)) {
                            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                        }
                        end.wait();
                    }
                });
            }
            let _tag = tag.map(RankTag::enter);
            let mut out = Ok(());
            for step in steps {
                self.events.reset();
                current.store(step, Ordering::Release);
                let began = Instant::now();
                start.wait();
                let mine = compute.map_or(Ok(()), |k| self.run_stream(mem, k, step));
                end.wait();
                let time = began.elapsed();
                out = self
                    .step_result(mine, &errors)
                    .and_then(|()| after_step(step, time));
                if out.is_err() {
                    break;
                }
            }
            stop.store(true, Ordering::Release);
            start.wait();
            out
        })
    }

    /// The result of a step from the compute stream's and the helper
    /// streams' outcomes (allocating only when one failed).
    fn step_result(
        &self,
        mine: Result<(), RuntimeError>,
        errors: &[Mutex<Option<RuntimeError>>],
    ) -> Result<(), RuntimeError> {
        let mut helper_errs = errors
            .iter()
            .filter_map(|m| m.lock().unwrap_or_else(|e| e.into_inner()).take())
            .peekable();
        if mine.is_ok() && helper_errs.peek().is_none() {
            return Ok(());
        }
        let all: Vec<Result<(), RuntimeError>> =
            std::iter::once(mine).chain(helper_errs.map(Err)).collect();
        first_error(all)
    }

    /// Debug mode: every instruction serially in list order, each buffer
    /// allocated just before its first write and dropped at its `Free`.
    pub fn step_debug(&self, mem: &mut Memory, step: u64) -> Result<(), RuntimeError> {
        self.events.reset();
        let rec = self.trace.as_ref().filter(|t| t.traces(step));
        let res = catch_unwind(AssertUnwindSafe(|| {
            for i in 0..self.prep.steps.len() {
                let start = rec.map(|t| t.now_ns());
                for &b in &self.prep.starts[i] {
                    mem.alloc(b);
                }
                match &self.prep.steps[i] {
                    Step::Free(b) => mem.free(*b),
                    Step::Wait(e) if !self.events.is_recorded(*e) => {
                        return Err(RuntimeError::plan_at(
                            i,
                            format!("waits on event {e}, which is recorded later in list order"),
                        ));
                    }
                    _ => self.exec(mem, i, step)?,
                }
                if let (Some(t), Some(start)) = (rec, start) {
                    if let Some(mut spans) = t.stream(t.stream_of(i)) {
                        t.push(&mut spans, i, step, start);
                    }
                }
            }
            Ok(())
        }))
        .unwrap_or_else(|p| {
            Err(RuntimeError::RankFailed {
                rank: self.rank,
                reason: format!("panic: {}", panic_text(&*p)),
            })
        });
        if let Err(e) = &res {
            self.fail(e);
        }
        res
    }

    /// The first sample of this rank's part of micro-batch `micro`: the
    /// step's global batch is the micro-batches in order, each the ranks'
    /// samples in rank order.
    fn first_sample(&self, micro: u32) -> u64 {
        let micro_batch = u64::from(micro) * self.world.size() as u64 + self.rank as u64;
        micro_batch * self.prep.batch as u64
    }

    /// What a reduce-scatter divides the sum of the ranks' gradients by:
    /// the world times the micro-batches per step (each rank's gradient is
    /// the mean over its micro-batch).
    pub(super) fn grad_divisor(&self) -> u32 {
        self.world.size() as u32 * self.prep.plan.config.grad_accum.max(1)
    }

    /// The loss scalar after a step.
    pub fn read_loss(&self, mem: &Memory) -> Result<f32, RuntimeError> {
        // SAFETY: called between steps, when no stream runs.
        let b = unsafe { mem.view(self.prep.loss)? };
        // The buffer holds the sum over the step's micro-batches.
        let k = self.prep.plan.config.grad_accum.max(1);
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]) / k as f32)
    }

    /// With gradient clipping, the total gradient norm before clipping (the
    /// square root of the all-reduced `GradNorm` scalar) after a step.
    pub fn read_grad_norm(&self, mem: &Memory) -> Result<Option<f32>, RuntimeError> {
        let Some(b) = self.prep.grad_norm else {
            return Ok(None);
        };
        // SAFETY: called between steps, when no stream runs.
        let bytes = unsafe { mem.view(mem.whole(b))? };
        let sq: [u8; 4] = bytes
            .get(..4)
            .and_then(|x| x.try_into().ok())
            .ok_or_else(|| RuntimeError::plan(format!("grad-norm buffer {b} is not 4 bytes")))?;
        let sq = f32::from_le_bytes(sq);
        Ok(Some(sq.sqrt()))
    }
}

/// The first error of a set of stream results, preferring a rank's own
/// error over a report that another rank failed.
pub fn first_error(results: Vec<Result<(), RuntimeError>>) -> Result<(), RuntimeError> {
    let errs: Vec<RuntimeError> = results.into_iter().filter_map(|r| r.err()).collect();
    match errs
        .iter()
        .position(|e| !matches!(e, RuntimeError::RankFailed { .. }))
    {
        Some(i) => Err(errs[i].clone()),
        None => errs.into_iter().next().map_or(Ok(()), Err),
    }
}

/// A collective error as a runtime error of `rank`.
pub fn comm_err(rank: usize, e: CommError) -> RuntimeError {
    match e {
        CommError::RankFailed { rank, reason } => RuntimeError::RankFailed { rank, reason },
        CommError::Timeout {
            op,
            waited,
            missing,
        } => RuntimeError::Timeout {
            rank,
            what: format!(
                "collective `{op}` with no answer from rank(s) {}",
                missing
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            waited,
        },
        source => RuntimeError::Comm { rank, source },
    }
}
