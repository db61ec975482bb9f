//! The training API: runs a plan for a number of steps on `world` thread
//! ranks and reports the loss of every step, the final parameters (assembled
//! from the shards by original name) and the measured memory.

use crate::account::{self, RankTag};
use crate::checkpoint::{self, write::UnitBytes, Checkpoint, CheckpointError, FileEntry};
use crate::comm::shm::{CommConfig, ShmWorld};
use crate::comm::{BufMut, World};
use crate::cpu::{CpuBackend, CpuConfig};
use crate::data::{self, DataSource, DataSpec};
use crate::error::RuntimeError;
use crate::exec::memory::{Arena, Memory};
use crate::exec::prepare::Step;
use crate::exec::prepare::{prepare, Prepared};
use crate::exec::rank::{panic_text, RankEnv};
use crate::exec::timeline::RankTimeline;
use crate::exec::ExecMode;
use crate::fault::Fault;
use fsdpc_planner::plan::{BufferId, BufferKind, Plan};
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How to train.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainOptions {
    /// Optimizer steps to run.
    pub steps: u64,
    /// Seeds parameter init, data and dropout.
    pub seed: u64,
    /// Where the data comes from.
    pub data: DataSpec,
    /// Arena (streams) or debug (serial, per-buffer allocations).
    pub mode: ExecMode,
    /// Threads each rank's matrix products may use.
    pub threads_per_rank: usize,
    /// How long a rank waits for the others (collectives, events).
    pub comm_timeout: Duration,
    /// Hand the trained parameters back in `TrainReport::final_params`.
    /// That copies every rank's shards out of its arena after the last step
    /// and assembles the full parameters: host memory the plan does not
    /// count (it is not part of a step). Off, `final_params` is empty and
    /// the process holds no more than the plan after the steps either.
    pub keep_params: bool,
    /// Write a checkpoint every `every` steps (`checkpoint` module).
    pub checkpoint: Option<CheckpointConfig>,
    /// Continue from the latest checkpoint in this directory: from its step
    /// to `steps`, with its seed; re-sharded when the plan differs.
    pub resume: Option<PathBuf>,
    /// A fault to inject (failure tests).
    pub fault: Option<Fault>,
    /// Record the measured timeline of the last `trace_steps` steps
    /// (`TrainReport::timelines`; 0: none).
    pub trace_steps: u64,
}

/// Where and how often to checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// The checkpoint directory (step directories and `latest`).
    pub dir: PathBuf,
    /// Steps between checkpoints (at least 1).
    pub every: u64,
}

impl Default for TrainOptions {
    fn default() -> TrainOptions {
        TrainOptions {
            steps: 10,
            seed: 0,
            data: DataSpec::Synthetic,
            mode: ExecMode::Arena,
            threads_per_rank: 1,
            comm_timeout: Duration::from_secs(60),
            keep_params: true,
            checkpoint: None,
            resume: None,
            fault: None,
            trace_steps: 0,
        }
    }
}

/// One finished step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    /// The step (0-based).
    pub step: u64,
    /// The global mean loss: the mean of every rank's local-mean loss.
    pub loss: f32,
    /// Tokens (all ranks) per second of this step.
    pub tokens_per_s: f64,
    /// The largest heap a rank held during the steps so far (max over
    /// ranks), measured by the counting allocator (`account`); `None` where
    /// it is not the global allocator.
    pub measured_peak_bytes: Option<u64>,
    /// What the plan says a rank holds at most (`memory.rank_bytes`).
    pub planned_peak_bytes: u64,
    /// Wall time since the previous report (for the first step, since the
    /// ranks started: it includes their setup).
    pub elapsed: Duration,
    /// The step's measured execution time: from its streams' start to their
    /// join, the slowest rank's (process ranks: this rank's); without the
    /// loss report and checkpoint writes that follow it.
    pub step_time: Duration,
    /// With gradient clipping: the total gradient norm before clipping
    /// (what PyTorch's `clip_grad_norm_` returns), equal on every rank.
    pub grad_norm: Option<f32>,
    /// With the fp16 loss scaler: the scale after this step's update.
    pub loss_scale: Option<f32>,
    /// With the fp16 loss scaler: whether this step was skipped (a
    /// gradient was inf or NaN on some rank; the parameters did not move).
    pub skipped: bool,
}

/// What a rank reports after a step besides its loss (equal on every
/// rank): the pre-clip gradient norm, and the loss scale after the step
/// with whether the step was skipped.
#[derive(Copy, Clone, Debug, Default, PartialEq)]
pub struct StepScalars {
    /// With gradient clipping: the total gradient norm before clipping.
    pub grad_norm: Option<f32>,
    /// With the fp16 loss scaler: the scale after the step's update, and
    /// whether the step was skipped.
    pub loss_scale: Option<(f32, bool)>,
}

/// A finished training run.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainReport {
    /// The global mean loss of every step.
    pub losses: Vec<f32>,
    /// With gradient clipping: every step's total gradient norm before
    /// clipping (rank 0's; every rank holds the same). Empty otherwise.
    pub grad_norms: Vec<f32>,
    /// With the fp16 loss scaler: every step's loss scale after its update
    /// (rank 0's; every rank holds the same). Empty otherwise.
    pub loss_scales: Vec<f32>,
    /// With the fp16 loss scaler: the steps that were skipped.
    pub skipped_steps: Vec<u64>,
    /// Full parameters by original name, in unit and layout order (empty
    /// unless `TrainOptions::keep_params`).
    pub final_params: Vec<(String, Vec<f32>)>,
    /// The largest heap a rank held during the steps (max over ranks),
    /// measured by the counting allocator (`account`): the arena, kernel
    /// workspaces and anything else a rank's threads allocated. `None`
    /// where the counting allocator is not the global allocator.
    pub measured_peak_bytes: Option<u64>,
    /// What the plan says a rank holds at most (`memory.rank_bytes`).
    pub planned_peak_bytes: u64,
    /// Debug mode only: the debug allocator's peak of live plan buffers (a
    /// check of the plan's lifetimes, not a measurement of the run).
    pub debug_peak_bytes: Option<u64>,
    /// Tokens (all ranks) per second over the whole run.
    pub tokens_per_s: f64,
    /// Wall time of the whole run.
    pub elapsed: Duration,
    /// Number of ranks.
    pub world: usize,
    /// With `TrainOptions::trace_steps`: each rank's measured timeline (thread
    /// ranks: all of them in rank order; a process rank: its own).
    pub timelines: Vec<RankTimeline>,
}

enum Msg {
    Step {
        rank: usize,
        step: u64,
        loss: f32,
        scalars: StepScalars,
        measured: Option<u64>,
        time: Duration,
    },
    Done {
        rank: usize,
        out: Result<RankOut, RuntimeError>,
    },
    /// A rank wrote its checkpoint file for the checkpoint after `step`
    /// completed steps.
    Saved {
        step: u64,
        file: Result<FileEntry, CheckpointError>,
    },
}

/// What a rank hands back at the end: its fp32 shard of every unit and its
/// peaks.
struct RankOut {
    shards: Vec<Vec<f32>>,
    measured: Option<u64>,
    debug_peak: Option<u64>,
    timeline: Option<RankTimeline>,
}

/// Trains `plan` on `plan.cluster.world` thread ranks, with the data source
/// `opts.data` describes. An invalid plan is `RuntimeError::InvalidPlan`
/// (see `train_with_data`), checked before the data is opened.
pub fn train(
    plan: &Plan,
    opts: &TrainOptions,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<TrainReport, RuntimeError> {
    validate(plan)?;
    let (opts, resume) = open_resume(plan, opts, true)?;
    let data = data::open(&opts.data, &plan.training.graph, opts.seed)?;
    execute_detached(plan, opts, resume, data, on_step)
}

/// `train` with a caller-supplied data source (`opts.data` is ignored).
///
/// The plan is validated first (`Plan::validate`, in every build): the
/// executor's unchecked arena views are sound only for a valid plan.
pub fn train_with_data(
    plan: &Plan,
    opts: &TrainOptions,
    data: Arc<dyn DataSource>,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<TrainReport, RuntimeError> {
    validate(plan)?;
    let (opts, resume) = open_resume(plan, opts, true)?;
    execute_detached(plan, opts, resume, data, on_step)
}

/// The verified checkpoint `opts.resume` names, checked against `plan`, and
/// the options with its seed. With `prepare_dir`, the checkpoint directory is
/// readied for writing (`write::prepare_dir`); of several processes only one
/// does that.
fn open_resume(
    plan: &Plan,
    opts: &TrainOptions,
    prepare_dir: bool,
) -> Result<(TrainOptions, Option<Checkpoint>), RuntimeError> {
    if opts.checkpoint.as_ref().is_some_and(|c| c.every == 0) {
        return Err(RuntimeError::plan("checkpoint every 0 steps"));
    }
    let resume = match &opts.resume {
        Some(dir) => Some(Checkpoint::open(dir)?),
        None => None,
    };
    // Only once the checkpoint is known to fit: a refusal removes nothing.
    let prepare = |from: Option<&Checkpoint>| match &opts.checkpoint {
        Some(c) if prepare_dir => checkpoint::write::prepare_dir(&c.dir, from),
        _ => Ok(()),
    };
    let Some(ckpt) = resume else {
        prepare(None)?;
        return Ok((opts.clone(), None));
    };
    ckpt.check_compatible(plan)?;
    let step = ckpt.manifest.step;
    if step >= opts.steps {
        return Err(CheckpointError::Incompatible {
            path: ckpt.dir.display().to_string(),
            reason: format!(
                "it is at step {step}; ask for more steps than that to continue (asked for {})",
                opts.steps
            ),
        }
        .into());
    }
    prepare(Some(&ckpt))?;
    let opts = TrainOptions {
        seed: ckpt.manifest.seed,
        ..opts.clone()
    };
    Ok((opts, Some(ckpt)))
}

/// Every invariant of `plan`, or all its violations.
pub(crate) fn validate(plan: &Plan) -> Result<(), RuntimeError> {
    plan.validate()
        .map_err(|violations| RuntimeError::InvalidPlan { violations })
}

/// What the training thread hands the caller of `train`.
enum Event {
    /// A step finished (for `on_step`).
    Step(StepReport),
    /// The run's result; after a failure, possibly while a rank that does
    /// not stop is still running (it is abandoned).
    Done(Result<TrainReport, RuntimeError>),
}

/// Runs a validated plan on a training thread that owns a copy of the plan
/// and everything the rank threads use, and waits for its result, calling
/// `on_step` here for each step. After a failure the training thread gives
/// the ranks one more collective timeout to stop; one that does not (stuck
/// in a kernel, asleep) is abandoned with the training thread: the result
/// comes back without joining them, and they end with the process.
fn execute_detached(
    plan: &Plan,
    opts: TrainOptions,
    resume: Option<Checkpoint>,
    data: Arc<dyn DataSource>,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<TrainReport, RuntimeError> {
    let plan = plan.clone();
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("fsdpc-train".into())
        .spawn(move || {
            let out = execute(&plan, &opts, resume.as_ref(), data, &tx);
            let _ = tx.send(Event::Done(out));
        })
        .map_err(|e| RuntimeError::plan(format!("cannot start the training thread: {e}")))?;
    for event in rx {
        match event {
            Event::Step(r) => on_step(&r),
            Event::Done(out) => return out,
        }
    }
    Err(RuntimeError::RankFailed {
        rank: 0,
        reason: "the training thread ended without a result".into(),
    })
}

/// Runs a validated plan, reporting steps to `events`. When a rank does not
/// stop after a failure, sends the error as `Event::Done` itself and never
/// returns (the scope joins that rank).
fn execute(
    plan: &Plan,
    opts: &TrainOptions,
    resume: Option<&Checkpoint>,
    data: Arc<dyn DataSource>,
    events: &mpsc::Sender<Event>,
) -> Result<TrainReport, RuntimeError> {
    let prep = prepare(plan)?;
    let world = plan.cluster.world as usize;
    if world == 0 {
        return Err(RuntimeError::plan("the cluster has no ranks"));
    }
    let backend = CpuBackend::new(CpuConfig {
        threads: opts.threads_per_rank.max(1),
    });
    let shm = ShmWorld::new(
        world,
        CommConfig {
            timeout: opts.comm_timeout,
        },
    );
    check_fits_host(plan, opts.mode)?;
    // One accounting tag per rank when the counting allocator is installed.
    let tags = account::installed()
        .then(|| account::claim(world))
        .flatten();
    let tag_of = |rank: usize| tags.map(|t| t + rank);
    let mut arenas: Vec<Arena> = match opts.mode {
        ExecMode::Arena => (0..world)
            .map(|rank| {
                // The arena is what the rank holds: it counts as the rank's.
                let _tag = tag_of(rank).map(RankTag::enter);
                Arena::for_plan(plan)
            })
            .collect(),
        ExecMode::DebugAlloc => Vec::new(),
    };
    // Bounded: its slots are allocated here, so a rank's report allocates
    // nothing.
    let (tx, rx) = mpsc::sync_channel(2 * world + 2);
    let start = Instant::now();
    let (losses, outs) = std::thread::scope(|s| {
        let mut arena_iter = arenas.iter_mut();
        for rank in 0..world {
            let arena = arena_iter.next();
            let (tx, shm, prep, backend, data) = (tx.clone(), &shm, &prep, &backend, &*data);
            s.spawn(move || {
                let ctx = RankCtx {
                    rank,
                    tag: tag_of(rank),
                    world: shm,
                    prep,
                    backend,
                    data,
                    opts,
                    resume,
                    saver: Saver::Thread(&tx),
                    epoch: start,
                };
                let mut report = |step, loss, scalars, measured, time| {
                    let _ = tx.send(Msg::Step {
                        rank,
                        step,
                        loss,
                        scalars,
                        measured,
                        time,
                    });
                    Ok(())
                };
                let run = || ctx.run(arena, &mut report);
                let out = catch_unwind(AssertUnwindSafe(run)).unwrap_or_else(|p| {
                    Err(RuntimeError::RankFailed {
                        rank,
                        reason: format!("panic: {}", panic_text(&*p)),
                    })
                });
                if let Err(e) = &out {
                    shm.poison(rank, &e.to_string());
                }
                let _ = tx.send(Msg::Done { rank, out });
            });
        }
        drop(tx);
        let mut on_step = |r: &StepReport| {
            let _ = events.send(Event::Step(r.clone()));
        };
        let got = collect(
            rx,
            Collect {
                world,
                plan,
                opts,
                first_step: first_step(resume),
                shm: &shm,
            },
            &mut on_step,
        );
        if let Some(err) = abandoned(&got.1, &shm, opts.comm_timeout) {
            // The scope cannot end while that rank runs: hand the error out
            // now; this thread stays blocked with the rank.
            let _ = events.send(Event::Done(Err(err)));
        }
        got
    });
    let (log, saved) = losses;
    let StepLog {
        losses,
        grad_norms,
        loss_scales,
        skipped_steps,
        ..
    } = log;
    // A failed checkpoint stopped the ranks: its error is the cause.
    saved?;
    let mut outs = pick_error(outs, &shm)?;
    let elapsed = start.elapsed();
    let timelines = outs.iter_mut().filter_map(|o| o.timeline.take()).collect();
    // The shards were copied out: the arenas go before the full parameters
    // are assembled, so the two never coexist.
    drop(arenas);
    let final_params = if opts.keep_params {
        assemble(plan, &outs)?
    } else {
        Vec::new()
    };
    let tokens = (plan.model.tokens_per_rank_step * world as u64 * losses.len() as u64) as f64;
    Ok(TrainReport {
        losses,
        grad_norms,
        loss_scales,
        skipped_steps,
        final_params,
        measured_peak_bytes: outs.iter().filter_map(|o| o.measured).max(),
        planned_peak_bytes: plan.memory.rank_bytes,
        debug_peak_bytes: outs.iter().filter_map(|o| o.debug_peak).max(),
        tokens_per_s: tokens / elapsed.as_secs_f64().max(1e-9),
        elapsed,
        world,
        timelines,
    })
}

/// Runs `plan` as rank `rank` of a world of processes (one rank per
/// process; `world` is the launcher's, e.g. `comm::mpi::MpiWorld`). Each
/// process fills only its own samples. The loss of a step is gathered from
/// every rank and averaged in rank order, as `train` does, so every rank
/// reports the same global loss; `on_step` runs on every rank (the caller
/// prints on rank 0 only). Checkpoints: each rank of the first shard group
/// writes its own file, rank 0 the manifest (`RankCtx::commit_ranks`);
/// `opts.resume` loads each rank's shard, re-sharded when the plan differs.
/// With `keep_params` the full parameters are gathered to rank 0, unit by
/// unit, and are `final_params` there (empty on the other ranks).
pub fn train_rank(
    plan: &Plan,
    opts: &TrainOptions,
    world: &dyn World,
    rank: usize,
    launcher: &str,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<TrainReport, RuntimeError> {
    validate(plan)?;
    let n = world.size();
    if plan.cluster.world as usize != n {
        return Err(RuntimeError::WorldMismatch {
            plan_world: plan.cluster.world as usize,
            launcher_world: n,
            launcher: launcher.to_string(),
        });
    }
    let all: Vec<usize> = (0..n).collect();
    let comm = world
        .communicator(&all, "loss", rank)
        .map_err(|e| crate::exec::rank::comm_err(rank, e))?;
    let losses_comm = &*comm;
    let (opts, resume) = open_resume_ranks(plan, opts, losses_comm, rank)?;
    let opts = &opts;
    let data = data::open(&opts.data, &plan.training.graph, opts.seed)?;
    let prep = prepare(plan)?;
    let backend = CpuBackend::new(CpuConfig {
        threads: opts.threads_per_rank.max(1),
    });
    let tag = account::installed().then(|| account::claim(1)).flatten();
    let mut arena = match opts.mode {
        ExecMode::Arena => {
            let _tag = tag.map(RankTag::enter);
            Some(Arena::for_plan(plan))
        }
        ExecMode::DebugAlloc => None,
    };
    let ctx = RankCtx {
        rank,
        tag,
        world,
        prep: &prep,
        backend: &backend,
        data: &*data,
        opts,
        resume: resume.as_ref(),
        saver: Saver::Process(losses_comm),
        epoch: Instant::now(),
    };
    let mut log = StepLog::new(plan, n);
    let start = Instant::now();
    let mut report =
        |step: u64, loss: f32, scalars: StepScalars, measured: Option<u64>, time: Duration| {
            let mut all_losses = vec![0u8; 4 * n];
            losses_comm
                .all_gather(
                    crate::comm::Buf {
                        dtype: fsdpc_ir::DType::F32,
                        bytes: &loss.to_le_bytes(),
                    },
                    BufMut {
                        dtype: fsdpc_ir::DType::F32,
                        bytes: &mut all_losses,
                    },
                )
                .map_err(|e| crate::exec::rank::comm_err(rank, e))?;
            // The same order and arithmetic as the thread launcher's `collect`.
            let rank_losses = all_losses
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            log.record(step, rank_losses, (scalars, measured, time), on_step);
            Ok(())
        };
    let mut out = ctx.run(arena.as_mut(), &mut report)?;
    let elapsed = start.elapsed();
    // The arena goes before the full parameters are gathered.
    drop(arena);
    let final_params = if opts.keep_params {
        gather_params(plan, losses_comm, rank, &out.shards)?
    } else {
        Vec::new()
    };
    Ok(TrainReport {
        tokens_per_s: log.tokens * log.losses.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        losses: log.losses,
        grad_norms: log.grad_norms,
        loss_scales: log.loss_scales,
        skipped_steps: log.skipped_steps,
        final_params,
        measured_peak_bytes: out.measured,
        planned_peak_bytes: plan.memory.rank_bytes,
        debug_peak_bytes: out.debug_peak,
        elapsed,
        world: n,
        timelines: out.timeline.take().into_iter().collect(),
    })
}

/// `open_resume` for one process of several: rank 0 opens the checkpoint
/// and readies the checkpoint directory, then tells the others whether that
/// worked (a broadcast, so no process removes files another still reads);
/// the others then open the checkpoint themselves.
fn open_resume_ranks(
    plan: &Plan,
    opts: &TrainOptions,
    comm: &dyn crate::comm::Communicator,
    rank: usize,
) -> Result<(TrainOptions, Option<Checkpoint>), RuntimeError> {
    let lead = if rank == 0 {
        Some(open_resume(plan, opts, true))
    } else {
        None
    };
    let mut ok = [u8::from(lead.as_ref().is_some_and(|r| r.is_ok())); 4];
    comm.broadcast(
        BufMut {
            dtype: fsdpc_ir::DType::F32,
            bytes: &mut ok,
        },
        0,
    )
    .map_err(|e| crate::exec::rank::comm_err(rank, e))?;
    match lead {
        Some(r) => r,
        None if ok[0] == 1 => open_resume(plan, opts, false),
        None => Err(RuntimeError::RankFailed {
            rank: 0,
            reason: "could not open the checkpoint to resume or ready the checkpoint directory"
                .into(),
        }),
    }
}

/// The full parameters on rank 0 (empty elsewhere), gathered unit by unit
/// over `comm` (every rank of the world): each unit's shards end to end,
/// the first shard group's making the flat parameter. Only one unit's
/// gathered shards exist at a time besides the parameters already cut out.
fn gather_params(
    plan: &Plan,
    comm: &dyn crate::comm::Communicator,
    rank: usize,
    shards: &[Vec<f32>],
) -> Result<Vec<(String, Vec<f32>)>, RuntimeError> {
    let n = comm.size();
    let mut params = Vec::new();
    for (u, unit) in plan.units.iter().enumerate() {
        let shard = shards.get(u).map_or(&[][..], |s| s.as_slice());
        let send: &[u8] = bytemuck::cast_slice(shard);
        let mut all = vec![0u8; send.len() * n];
        comm.all_gather(
            crate::comm::Buf {
                dtype: fsdpc_ir::DType::F32,
                bytes: send,
            },
            BufMut {
                dtype: fsdpc_ir::DType::F32,
                bytes: &mut all,
            },
        )
        .map_err(|e| crate::exec::rank::comm_err(rank, e))?;
        if rank != 0 {
            continue;
        }
        let all: Vec<f32> = all
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let flat = unshard(unit, all.chunks(shard.len().max(1)));
        cut_params(unit, &flat, &mut params)?;
    }
    Ok(params)
}

/// The first step a run executes.
fn first_step(resume: Option<&Checkpoint>) -> u64 {
    resume.map_or(0, |c| c.manifest.step)
}

/// One rank's loss, pre-clip gradient norm, measured peak and step time
/// after a step.
type RankStep = (f32, StepScalars, Option<u64>, Duration);

/// What `collect` needs besides the messages.
struct Collect<'a> {
    world: usize,
    plan: &'a Plan,
    opts: &'a TrainOptions,
    first_step: u64,
    shm: &'a ShmWorld,
}

/// The per-step record (losses, pre-clip gradient norms, loss scales), and the first
/// failure to complete a checkpoint.
type Collected = (StepLog, Result<(), RuntimeError>);

/// Receives step reports in order, checkpoint files (completing each
/// checkpoint once every shard position wrote its file) and every rank's
/// result.
fn collect(
    rx: mpsc::Receiver<Msg>,
    c: Collect<'_>,
    on_step: &mut dyn FnMut(&StepReport),
) -> (Collected, Vec<Option<Result<RankOut, RuntimeError>>>) {
    let (world, plan) = (c.world, c.plan);
    let mut pending: BTreeMap<u64, Vec<Option<RankStep>>> = BTreeMap::new();
    let mut files: BTreeMap<u64, Vec<FileEntry>> = BTreeMap::new();
    let mut saved = Ok(());
    let mut outs: Vec<Option<Result<RankOut, RuntimeError>>> = (0..world).map(|_| None).collect();
    let mut log = StepLog::new(plan, world);
    // Once a failure is known, the ranks have one more timeout to stop.
    let mut deadline = None;
    loop {
        if deadline.is_none() && c.shm.failure().is_some() {
            deadline = Some(Instant::now() + c.opts.comm_timeout);
        }
        let msg = match deadline {
            None => match rx.recv() {
                Ok(m) => m,
                Err(mpsc::RecvError) => break,
            },
            Some(d) => match rx.recv_timeout(d.saturating_duration_since(Instant::now())) {
                Ok(m) => m,
                // The ranks still running are abandoned (`abandoned`).
                Err(_) => break,
            },
        };
        match msg {
            Msg::Step {
                rank,
                step,
                loss,
                scalars,
                measured,
                time,
            } => {
                pending.entry(step).or_insert_with(|| vec![None; world])[rank] =
                    Some((loss, scalars, measured, time))
            }
            Msg::Done { rank, out } => outs[rank] = Some(out),
            Msg::Saved { step, file } => {
                let done = file.map_err(RuntimeError::from).and_then(|f| {
                    let got = files.entry(step).or_default();
                    got.push(f);
                    complete_checkpoint(&c, step, got)
                });
                if let Err(e) = done {
                    // The ranks stop at their next collective.
                    c.shm.poison(0, &e.to_string());
                    if saved.is_ok() {
                        saved = Err(e);
                    }
                }
            }
        }
        while let Some(entry) = pending.get(&(c.first_step + log.losses.len() as u64)) {
            let Some(vals) = entry.iter().copied().collect::<Option<Vec<RankStep>>>() else {
                break;
            };
            let step = c.first_step + log.losses.len() as u64;
            pending.remove(&step);
            let measured = vals.iter().filter_map(|v| v.2).max();
            let scalars = vals.first().map(|v| v.1).unwrap_or_default();
            let time = vals.iter().map(|v| v.3).max().unwrap_or_default();
            let after = (scalars, measured, time);
            log.record(step, vals.iter().map(|v| v.0), after, on_step);
        }
    }
    ((log, saved), outs)
}

/// The per-step record both launchers keep: every step's global loss and
/// pre-clip gradient norm, the running measured peak, and the report each
/// step gets.
pub(crate) struct StepLog {
    /// Tokens (all ranks) per step.
    pub(crate) tokens: f64,
    planned: u64,
    last: Instant,
    peak: Option<u64>,
    pub(crate) losses: Vec<f32>,
    pub(crate) grad_norms: Vec<f32>,
    pub(crate) loss_scales: Vec<f32>,
    pub(crate) skipped_steps: Vec<u64>,
}

impl StepLog {
    pub(crate) fn new(plan: &Plan, world: usize) -> StepLog {
        StepLog {
            tokens: (plan.model.tokens_per_rank_step * world as u64) as f64,
            planned: plan.memory.rank_bytes,
            last: Instant::now(),
            peak: None,
            losses: Vec::new(),
            grad_norms: Vec::new(),
            loss_scales: Vec::new(),
            skipped_steps: Vec::new(),
        }
    }

    /// Records `step` from every rank's local-mean loss, summed in rank
    /// order (so both launchers compute the same bits), and reports it with
    /// the step's scalars, measured peak and step time.
    pub(crate) fn record(
        &mut self,
        step: u64,
        rank_losses: impl ExactSizeIterator<Item = f32>,
        (scalars, measured, step_time): (StepScalars, Option<u64>, Duration),
        on_step: &mut dyn FnMut(&StepReport),
    ) {
        let StepScalars {
            grad_norm,
            loss_scale,
        } = scalars;
        let n = rank_losses.len() as f32;
        let loss = rank_losses.fold(0.0f32, |a, b| a + b) / n;
        self.peak = self.peak.max(measured);
        let elapsed = self.last.elapsed();
        self.last = Instant::now();
        self.losses.push(loss);
        self.grad_norms.extend(grad_norm);
        self.loss_scales.extend(loss_scale.map(|s| s.0));
        let skipped = loss_scale.is_some_and(|s| s.1);
        if skipped {
            self.skipped_steps.push(step);
        }
        on_step(&StepReport {
            step,
            loss,
            tokens_per_s: self.tokens / elapsed.as_secs_f64().max(1e-9),
            measured_peak_bytes: self.peak,
            planned_peak_bytes: self.planned,
            elapsed,
            step_time,
            grad_norm,
            loss_scale: loss_scale.map(|s| s.0),
            skipped,
        });
    }
}

/// After a failure, the error naming the first rank that did not stop within
/// `grace` (its `Done` never came), with the failure it did not answer; `None`
/// when every rank finished.
fn abandoned(
    outs: &[Option<Result<RankOut, RuntimeError>>],
    shm: &ShmWorld,
    grace: Duration,
) -> Option<RuntimeError> {
    let rank = outs.iter().position(Option::is_none)?;
    let after = shm.failure().map_or_else(String::new, |(first, reason)| {
        format!(" after rank {first} failed ({reason})")
    });
    Some(RuntimeError::RankFailed {
        rank,
        reason: format!(
            "did not stop within {grace:?}{after}; left running (stuck in a kernel or not answering)"
        ),
    })
}

/// Writes the manifest of the checkpoint after `step` steps once every shard
/// position's file is in `got`.
fn complete_checkpoint(
    c: &Collect<'_>,
    step: u64,
    got: &mut [FileEntry],
) -> Result<(), RuntimeError> {
    let f = c.plan.config.shard_factor as usize;
    let Some(cfg) = c.opts.checkpoint.as_ref().filter(|_| got.len() == f) else {
        return Ok(());
    };
    got.sort_by_key(|e| e.position);
    let m = checkpoint::Manifest::new(c.plan, step, c.opts.seed, got.to_vec());
    checkpoint::write::commit(&cfg.dir, &m)?;
    Ok(())
}

/// The ranks' outputs, or the error of the rank that failed first.
fn pick_error(
    outs: Vec<Option<Result<RankOut, RuntimeError>>>,
    shm: &ShmWorld,
) -> Result<Vec<RankOut>, RuntimeError> {
    let mut errs: Vec<(usize, RuntimeError)> = Vec::new();
    let mut ok = Vec::new();
    for (rank, o) in outs.into_iter().enumerate() {
        match o {
            Some(Ok(out)) => ok.push(out),
            Some(Err(e)) => errs.push((rank, e)),
            None => errs.push((
                rank,
                RuntimeError::RankFailed {
                    rank,
                    reason: "the rank thread ended without a result".into(),
                },
            )),
        }
    }
    if errs.is_empty() {
        return Ok(ok);
    }
    if let Some((first, reason)) = shm.failure() {
        if let Some((_, e)) = errs
            .iter()
            .find(|(r, e)| *r == first && !matches!(e, RuntimeError::RankFailed { .. }))
        {
            return Err(e.clone());
        }
        return Err(RuntimeError::RankFailed {
            rank: first,
            reason,
        });
    }
    Err(errs.swap_remove(0).1)
}

/// Cuts `unit`'s parameters out of its gathered flat values, by layout offset.
fn cut_params(
    unit: &fsdpc_planner::plan::Unit,
    flat: &[f32],
    params: &mut Vec<(String, Vec<f32>)>,
) -> Result<(), RuntimeError> {
    for p in &unit.params {
        let vals = flat
            .get(p.offset as usize..(p.offset + p.numel) as usize)
            .ok_or_else(|| {
                RuntimeError::plan(format!(
                    "unit {}: parameter {} lies outside the gathered shards",
                    unit.id, p.name
                ))
            })?;
        params.push((p.name.clone(), vals.to_vec()));
    }
    Ok(())
}

/// `unit`'s flat parameter from its shards in shard-position order: each
/// shard's part of each segment put in its place (`Unit::shard_ranges`).
/// Elements no shard provides stay zero.
fn unshard<'s>(
    unit: &fsdpc_planner::plan::Unit,
    shards: impl Iterator<Item = &'s [f32]>,
) -> Vec<f32> {
    let mut flat = vec![0f32; unit.padded_numel as usize];
    for (pos, shard) in shards.enumerate() {
        for (lo, at, n) in unit.shard_ranges(pos as u64) {
            let (lo, at, n) = (lo as usize, at as usize, n as usize);
            if let (Some(dst), Some(src)) = (flat.get_mut(lo..lo + n), shard.get(at..at + n)) {
                dst.copy_from_slice(src);
            }
        }
    }
    flat
}

/// Full parameters from the shards of the first shard group.
/// The full parameters by name from the fp32 shards of the first shard
/// group's ranks (`shards[rank][unit]`), for launchers outside this file
/// (`cuda::train`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the cuda launcher's
pub(crate) fn assemble_shards(
    plan: &Plan,
    shards: Vec<Vec<Vec<f32>>>,
) -> Result<Vec<(String, Vec<f32>)>, RuntimeError> {
    let outs: Vec<RankOut> = shards
        .into_iter()
        .map(|shards| RankOut {
            shards,
            measured: None,
            debug_peak: None,
            timeline: None,
        })
        .collect();
    assemble(plan, &outs)
}

fn assemble(plan: &Plan, outs: &[RankOut]) -> Result<Vec<(String, Vec<f32>)>, RuntimeError> {
    let f = plan.config.shard_factor as usize;
    let mut params = Vec::new();
    for (u, unit) in plan.units.iter().enumerate() {
        let shards = outs
            .iter()
            .take(f)
            .map(|o| o.shards.get(u).map(|s| s.as_slice()).unwrap_or(&[]));
        let flat = unshard(unit, shards);
        cut_params(unit, &flat, &mut params)?;
    }
    Ok(params)
}

/// Reports one rank's loss, pre-clip gradient norm, measured peak and step
/// time after a step.
type Report<'r> =
    dyn FnMut(u64, f32, StepScalars, Option<u64>, Duration) -> Result<(), RuntimeError> + 'r;

/// Everything one rank uses, whichever launcher started it.
struct RankCtx<'a> {
    rank: usize,
    /// The rank's accounting tag, when the counting allocator is installed.
    tag: Option<usize>,
    world: &'a dyn World,
    prep: &'a Prepared<'a>,
    backend: &'a CpuBackend,
    data: &'a dyn DataSource,
    opts: &'a TrainOptions,
    resume: Option<&'a Checkpoint>,
    saver: Saver<'a>,
    /// The time origin of measured timelines (shared by thread ranks).
    epoch: Instant,
}

/// Where a rank's checkpoint file entry goes.
enum Saver<'a> {
    /// Thread ranks: to the collector, which writes the manifest.
    Thread(&'a mpsc::SyncSender<Msg>),
    /// Process ranks: gathered to rank 0 over this communicator of every
    /// rank; rank 0 writes the manifest and tells the others it did.
    Process(&'a dyn crate::comm::Communicator),
}

/// Bytes of one rank's file entry in the gather: a status byte (`ENTRY_*`),
/// 7 bytes padding, the file size (u64 little-endian), its blake3 (32 bytes).
const ENTRY_BYTES: usize = 48;
/// The rank wrote its file.
const ENTRY_OK: u8 = 1;
/// The rank failed to write its file.
const ENTRY_FAILED: u8 = 2;
/// The rank writes no file (a replica).
const ENTRY_NONE: u8 = 0;

impl RankCtx<'_> {
    fn run(&self, arena: Option<&mut Arena>, report: &mut Report) -> Result<RankOut, RuntimeError> {
        let plan = self.prep.plan;
        let mut env = RankEnv::new(
            self.rank,
            self.world,
            self.prep,
            self.backend,
            self.data,
            self.opts.seed,
        )?;
        let mut mem = match arena {
            Some(a) => Memory::arena(plan, a),
            None => {
                let mut m = Memory::debug(plan);
                for b in plan.buffers.iter().filter(|b| b.persistent()) {
                    m.alloc(b.id);
                }
                m
            }
        };
        match self.resume {
            Some(c) => self.load(c, &mem)?,
            None => self.init_shards(&mem)?,
        }
        env.init_loss_scale(&mem)?;
        if self.opts.trace_steps > 0 {
            // Reserved here, on this untagged thread, before the window:
            // the trace buffers are not the rank's memory (`timeline`).
            let from = self
                .opts
                .steps
                .saturating_sub(self.opts.trace_steps)
                .max(first_step(self.resume));
            let n = self.opts.steps.saturating_sub(from);
            env.start_trace(self.epoch, from, n, self.tag);
        }
        // The step window: from here to the last step, every allocation of
        // this thread and its stream threads counts as the rank's, on top
        // of its arena (allocated under the same tag).
        if let Some(t) = self.tag {
            account::reset_peak(t);
        }
        self.steps(&env, &mut mem, report)?;
        let measured = self.tag.map(|t| account::peak(t).max(0) as u64);
        let debug_peak = (self.opts.mode == ExecMode::DebugAlloc).then(|| mem.peak());
        // Only the first shard group's shards are assembled.
        // Process ranks all hand theirs to the gather (`gather_params`).
        let first_group = self.rank < plan.config.shard_factor as usize;
        let keep =
            self.opts.keep_params && (first_group || matches!(self.saver, Saver::Process(_)));
        Ok(RankOut {
            shards: if keep { self.shards(&mem)? } else { Vec::new() },
            measured,
            debug_peak,
            timeline: env.take_trace(),
        })
    }

    /// Runs every step, reporting each step's loss.
    fn steps(
        &self,
        env: &RankEnv,
        mem: &mut Memory,
        sink: &mut Report,
    ) -> Result<(), RuntimeError> {
        let mut report = |step: u64, mem: &Memory, time: Duration| -> Result<(), RuntimeError> {
            let loss = env.read_loss(mem)?;
            let scalars = StepScalars {
                grad_norm: env.read_grad_norm(mem)?,
                loss_scale: env.read_loss_scale(mem)?,
            };
            let measured = self.tag.map(|t| account::peak(t).max(0) as u64);
            sink(step, loss, scalars, measured, time)?;
            if let Some(f) = &self.opts.fault {
                f.inject(self.world, self.rank, step)?;
            }
            self.maybe_save(step + 1, mem)
        };
        let steps = first_step(self.resume)..self.opts.steps;
        match self.opts.mode {
            ExecMode::Arena => {
                let mem = &*mem;
                env.run_arena(mem, steps, self.tag, &mut |step, time| {
                    report(step, mem, time)
                })
            }
            ExecMode::DebugAlloc => {
                let _tag = self.tag.map(RankTag::enter);
                for step in steps {
                    let began = Instant::now();
                    env.step_debug(mem, step)?;
                    report(step, mem, began.elapsed())?;
                }
                Ok(())
            }
        }
    }

    /// The ShardParams buffer of each unit.
    fn shard_buffers(&self) -> Vec<Option<&fsdpc_planner::plan::Buffer>> {
        let plan = self.prep.plan;
        plan.units
            .iter()
            .map(|u| {
                plan.buffers
                    .iter()
                    .find(|b| b.kind == BufferKind::ShardParams && b.unit == Some(u.id))
            })
            .collect()
    }

    /// Each unit's shard buffer and optimizer state buffers (in slot order,
    /// as its optimizer instruction lists them).
    fn unit_buffers(&self) -> Vec<(Option<BufferId>, Vec<BufferId>)> {
        self.shard_buffers()
            .into_iter()
            .map(|b| {
                let b = b.map(|b| b.id);
                let state = self.prep.steps.iter().find_map(|s| match s {
                    Step::Optimizer { params, state, .. } if Some(*params) == b => {
                        Some(state.to_vec())
                    }
                    _ => None,
                });
                (b, state.unwrap_or_default())
            })
            .collect()
    }

    /// After `done` completed steps: when a checkpoint is due and this rank
    /// holds a shard position of the first group, writes its file; thread
    /// ranks hand the entry to the collector (which writes the manifest),
    /// process ranks complete the checkpoint together (`commit_ranks`).
    fn maybe_save(&self, done: u64, mem: &Memory) -> Result<(), RuntimeError> {
        let Some(cfg) = &self.opts.checkpoint else {
            return Ok(());
        };
        let f = self.prep.plan.config.shard_factor as usize;
        if cfg.every == 0 || !done.is_multiple_of(cfg.every) {
            return Ok(());
        }
        let file = (self.rank < f).then(|| self.save(&cfg.dir, done, mem));
        match self.saver {
            Saver::Thread(tx) => {
                if let Some(file) = file {
                    let _ = tx.send(Msg::Saved { step: done, file });
                }
                Ok(())
            }
            Saver::Process(comm) => self.commit_ranks(comm, &cfg.dir, done, file),
        }
    }

    /// Process ranks: gathers every rank's file entry (`ENTRY_BYTES` each)
    /// over `comm`; rank 0 writes the manifest and `latest`
    /// (`write::commit`) and broadcasts whether it did, so no rank goes on
    /// (to the next checkpoint, which prunes) before the commit.
    fn commit_ranks(
        &self,
        comm: &dyn crate::comm::Communicator,
        dir: &Path,
        done: u64,
        file: Option<Result<FileEntry, CheckpointError>>,
    ) -> Result<(), RuntimeError> {
        let ce = |e| crate::exec::rank::comm_err(self.rank, e);
        let mut mine = [0u8; ENTRY_BYTES];
        let mut own_error = None;
        match file {
            None => mine[0] = ENTRY_NONE,
            Some(Ok(e)) => match blake3::Hash::from_hex(&e.blake3) {
                Ok(h) => {
                    mine[0] = ENTRY_OK;
                    mine[8..16].copy_from_slice(&e.bytes.to_le_bytes());
                    mine[16..].copy_from_slice(h.as_bytes());
                }
                Err(err) => {
                    mine[0] = ENTRY_FAILED;
                    own_error = Some(RuntimeError::plan(format!("checkpoint hash: {err}")));
                }
            },
            Some(Err(e)) => {
                mine[0] = ENTRY_FAILED;
                own_error = Some(e.into());
            }
        }
        let n = comm.size();
        let mut all = vec![0u8; ENTRY_BYTES * n];
        comm.all_gather(
            crate::comm::Buf {
                dtype: fsdpc_ir::DType::F32,
                bytes: &mine,
            },
            BufMut {
                dtype: fsdpc_ir::DType::F32,
                bytes: &mut all,
            },
        )
        .map_err(ce)?;
        if let Some(e) = own_error {
            return Err(e);
        }
        let f = self.prep.plan.config.shard_factor as usize;
        let mut files = Vec::with_capacity(f);
        for (r, rec) in all.chunks_exact(ENTRY_BYTES).enumerate().take(f) {
            if rec[0] != ENTRY_OK {
                return Err(RuntimeError::RankFailed {
                    rank: r,
                    reason: format!("could not write its file of the checkpoint at step {done}"),
                });
            }
            let mut size = [0u8; 8];
            size.copy_from_slice(&rec[8..16]);
            let mut hash = [0u8; 32];
            hash.copy_from_slice(&rec[16..]);
            files.push(FileEntry {
                name: checkpoint::manifest::rank_file(r),
                position: r as u32,
                bytes: u64::from_le_bytes(size),
                blake3: blake3::Hash::from_bytes(hash).to_hex().to_string(),
            });
        }
        let committed = if self.rank == 0 {
            let m = checkpoint::Manifest::new(self.prep.plan, done, self.opts.seed, files);
            Some(checkpoint::write::commit(dir, &m))
        } else {
            None
        };
        let mut ok = [u8::from(committed.as_ref().is_some_and(|r| r.is_ok())); 4];
        comm.broadcast(
            BufMut {
                dtype: fsdpc_ir::DType::F32,
                bytes: &mut ok,
            },
            0,
        )
        .map_err(ce)?;
        match committed {
            Some(r) => Ok(r?),
            None if ok[0] == 1 => Ok(()),
            None => Err(RuntimeError::RankFailed {
                rank: 0,
                reason: format!("could not write the manifest of the checkpoint at step {done}"),
            }),
        }
    }

    /// Writes this rank's checkpoint file.
    fn save(&self, dir: &Path, done: u64, mem: &Memory) -> Result<FileEntry, CheckpointError> {
        let io = |e: RuntimeError| CheckpointError::Io {
            path: dir.display().to_string(),
            reason: e.to_string(),
        };
        let bufs = self.unit_buffers();
        let mut params = Vec::with_capacity(bufs.len());
        let mut states = Vec::with_capacity(bufs.len());
        for (b, state) in &bufs {
            // SAFETY: between steps no stream runs.
            let view = |id: BufferId| unsafe { mem.view(mem.whole(id)) };
            params.push(b.map(view).transpose().map_err(io)?.unwrap_or(&[]));
            states.push(
                state
                    .iter()
                    .map(|&s| view(s))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(io)?,
            );
        }
        let units: Vec<UnitBytes<'_>> = params
            .iter()
            .zip(&states)
            .map(|(p, s)| UnitBytes {
                params: p,
                state: s,
            })
            .collect();
        checkpoint::write::save_rank(dir, done, self.rank, &units)
    }

    /// Fills the shards and optimizer state from a checkpoint.
    fn load(&self, c: &Checkpoint, mem: &Memory) -> Result<(), RuntimeError> {
        let mut units = Vec::new();
        for (b, state) in self.unit_buffers() {
            // SAFETY: before the first step no stream runs; the buffers are
            // distinct persistent buffers.
            let view = |id: BufferId| unsafe { mem.view_mut(mem.whole(id)) };
            let p = b.map(view).transpose()?.unwrap_or(&mut []);
            let s = state.into_iter().map(view).collect::<Result<Vec<_>, _>>()?;
            units.push((p, s));
        }
        c.load_rank(self.prep.plan, self.rank, &mut units)?;
        Ok(())
    }

    fn init_shards(&self, mem: &Memory) -> Result<(), RuntimeError> {
        let plan = self.prep.plan;
        let pos = (self.rank % plan.config.shard_factor as usize) as u64;
        for (u, b) in self.shard_buffers().into_iter().enumerate() {
            let Some(b) = b else { continue };
            // SAFETY: before the first step no stream runs.
            let bytes = unsafe { mem.view_mut(mem.whole(b.id))? };
            let out: &mut [f32] = bytemuck::try_cast_slice_mut(bytes).map_err(|_| {
                RuntimeError::plan(format!("shard buffer {} is not f32-aligned", b.id))
            })?;
            crate::init::fill_shard(
                &plan.units[u],
                &plan.training.graph.params,
                pos,
                self.opts.seed,
                out,
            )?;
        }
        Ok(())
    }

    fn shards(&self, mem: &Memory) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let mut out = Vec::new();
        for b in self.shard_buffers() {
            let vals = match b {
                // SAFETY: after the last step no stream runs.
                Some(b) => unsafe { mem.view(mem.whole(b.id))? }
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                None => Vec::new(),
            };
            out.push(vals);
        }
        Ok(out)
    }
}

/// Most thread ranks one process runs.
const MAX_THREAD_RANKS: usize = 1024;

/// Refuses plans whose ranks cannot all live in this process: too many
/// ranks, or more memory than the machine has (rather than aborting on a
/// failed allocation or being killed for it).
fn check_fits_host(plan: &Plan, mode: ExecMode) -> Result<(), RuntimeError> {
    let world = plan.cluster.world as usize;
    if world > MAX_THREAD_RANKS {
        return Err(RuntimeError::plan(format!(
            "{world} ranks are more than the {MAX_THREAD_RANKS} thread ranks one process runs"
        )));
    }
    let per_rank = match mode {
        ExecMode::Arena => plan.memory.arena_bytes + plan.memory.host_arena_bytes,
        ExecMode::DebugAlloc => plan.memory.peak_bytes + plan.memory.host_peak_bytes,
    };
    let need = per_rank.saturating_mul(world as u64);
    match host_memory_bytes() {
        Some(have) if need > have => Err(RuntimeError::plan(format!(
            "the plan needs {per_rank} bytes per rank x {world} ranks = {need} bytes, this machine has {have}"
        ))),
        _ => Ok(()),
    }
}

/// Physical memory of this machine, if known (`/proc/meminfo`).
fn host_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
