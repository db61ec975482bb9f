//! One rank's execution of a step: what a rank holds (`RankEnv`: its
//! communicators, events and trace) and its buffer helpers here; the
//! semantics of every instruction in `instr`, the collectives' in
//! `collectives`, the stream threads of arena mode and the serial
//! list-order loop of debug mode in `streams`.

mod collectives;
mod instr;
mod streams;

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

/// What a rank's streams run.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Pass {
    /// Training step `s` (0-based): the whole instruction list.
    Step(u64),
    /// Evaluation batch `j` (0-based): the plan's evaluation prefix
    /// (`Plan::eval`) on the evaluation data, dropout off.
    Eval(u64),
}

impl Pass {
    /// The training step, or the evaluation batch.
    pub fn index(self) -> u64 {
        match self {
            Pass::Step(s) | Pass::Eval(s) => s,
        }
    }
}

/// What one rank needs to execute steps.
pub struct RankEnv<'a> {
    pub rank: usize,
    pub world: &'a dyn World,
    pub prep: &'a Resolved<'a>,
    pub backend: &'a dyn Backend,
    pub data: &'a dyn DataSource,
    /// The held-out data of `Pass::Eval` (`with_eval_data`).
    eval_data: Option<&'a dyn DataSource>,
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
        let t = prep.plan.config.tensor_parallel.max(1) as usize;
        if !n.is_multiple_of(t) {
            return Err(RuntimeError::plan(format!(
                "tensor-parallel degree {t} does not divide the world {n}"
            )));
        }
        let f = prep.plan.config.shard_factor as usize;
        if f == 0 || !(n / t).is_multiple_of(f) {
            return Err(RuntimeError::plan(format!(
                "shard factor {f} does not divide the {} data ranks",
                n / t
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
        // The offload stream only copies: it runs no collective. The
        // tensor group's sums of activations run on the compute stream,
        // those of the gradient norm and the found-inf flag on the reduce
        // stream.
        for s in Stream::ALL.into_iter().filter(|&s| s != Stream::Offload) {
            let tensor = (geometry.t() > 1).then_some(Group::Tensor);
            for &g in groups.iter().chain(&tensor) {
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
            eval_data: None,
            seed,
            comms,
            events: Events::new(prep.plan.events as usize),
            trace: None,
        })
    }

    /// Gives the rank the held-out data its evaluation passes load.
    pub fn with_eval_data(mut self, data: &'a dyn DataSource) -> RankEnv<'a> {
        self.eval_data = Some(data);
        self
    }

    /// The instructions a pass runs: the whole list for a step, the
    /// evaluation prefix for an evaluation batch (refused when the plan
    /// has none).
    pub(in crate::exec) fn pass_end(&self, pass: Pass) -> Result<usize, RuntimeError> {
        match pass {
            Pass::Step(_) => Ok(self.prep.steps.len()),
            Pass::Eval(_) => self.prep.eval_end.ok_or_else(no_eval_pass),
        }
    }

    /// The loss scalar as a pass left it: after an evaluation pass, the
    /// loss of its one micro-batch (`Plan::eval`), this rank's mean over
    /// its samples; after a step, the sum over the step's micro-batches.
    pub fn read_loss_scalar(&self, mem: &Memory) -> Result<f32, RuntimeError> {
        // SAFETY: called between passes, when no stream runs.
        let b = unsafe { mem.view(self.prep.loss)? };
        Ok(f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
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

    /// The communicator of `g` on stream `s` (created in `new` for every
    /// pair the plan's collectives use).
    pub(in crate::exec) fn comm(
        &self,
        s: Stream,
        g: Group,
    ) -> Result<&dyn Communicator, RuntimeError> {
        self.comms
            .iter()
            .find(|(k, _)| *k == (s, g))
            .map(|(_, c)| &**c)
            .ok_or_else(|| {
                RuntimeError::plan(format!("a collective over the {g:?} group on the {s:?} stream, which has no communicator"))
            })
    }

    fn dtype(&self, b: BufferId) -> DType {
        self.prep.plan.buffers[b.index()].dtype
    }

    /// Records a failure so every blocked rank and stream stops.
    pub fn fail(&self, e: &RuntimeError) {
        if !matches!(e, RuntimeError::RankFailed { .. }) {
            self.world.poison(self.rank, &e.to_string());
        }
    }

    /// Runs `f` on float buffer `b` as f32 (see `widen::with_f32`).
    ///
    /// # Safety
    /// As for `Memory::view_mut`.
    pub(in crate::exec) unsafe fn with_f32(
        &self,
        mem: &Memory,
        b: BufferId,
        f: impl FnMut(usize, &mut [f32]),
    ) -> Result<(), RuntimeError> {
        widen::with_f32(mem.view_mut(mem.whole(b))?, self.dtype(b), f)
            .map_err(|e| RuntimeError::plan(format!("buffer {b}: {e}")))
    }

    /// The whole of f32 buffer `b`.
    ///
    /// # Safety
    /// As for `Memory::view_mut`.
    #[allow(clippy::mut_from_ref)]
    pub(in crate::exec) unsafe fn f32s<'m>(
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

    /// The first sample of this rank's part of micro-batch `micro`: the
    /// step's global batch is the micro-batches in order, each the ranks'
    /// samples in rank order.
    fn first_sample(&self, micro: u32) -> u64 {
        let g = self.geometry();
        let micro_batch =
            u64::from(micro) * u64::from(g.data_world()) + g.data_rank(self.rank) as u64;
        micro_batch * self.prep.batch as u64
    }

    /// The plan's mesh on this world.
    pub(in crate::exec) fn geometry(&self) -> fsdpc_plan::Geometry {
        fsdpc_plan::Geometry {
            world: self.world.size() as u32,
            ..self.prep.plan.geometry()
        }
    }

    /// What a reduce-scatter divides the sum of the ranks' gradients by:
    /// the data ranks times the micro-batches per step (each rank's
    /// gradient is the mean over its micro-batch; the members of a tensor
    /// group compute on the same samples).
    pub(in crate::exec) fn grad_divisor(&self) -> u32 {
        self.geometry().data_world() * self.prep.plan.config.grad_accum.max(1)
    }

    /// The loss scalar after a step.
    pub fn read_loss(&self, mem: &Memory) -> Result<f32, RuntimeError> {
        // The buffer holds the sum over the step's micro-batches.
        let k = self.prep.plan.config.grad_accum.max(1);
        Ok(self.read_loss_scalar(mem)? / k as f32)
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

/// The error of an evaluation asked of a plan without an evaluation pass.
pub fn no_eval_pass() -> RuntimeError {
    RuntimeError::plan(
        "the plan has no evaluation pass (`eval`): it was written by an older fsdpc; \
         compile it again to evaluate",
    )
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
