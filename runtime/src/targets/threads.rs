//! The `threads` target: every rank of the plan on a thread of this
//! process, one shared-memory world between them, and a collector that
//! orders their step reports, completes checkpoints once every shard
//! position wrote its file, and after a failure gives the ranks one
//! collective timeout to stop before abandoning one that does not.

use crate::account::{self, RankTag};
use crate::checkpoint::{self, Checkpoint, FileEntry};
use crate::comm::shm::{CommConfig, ShmWorld};
use crate::comm::World;
use crate::cpu::{CpuBackend, CpuConfig};
use crate::data::{self, DataSource};
use crate::error::RuntimeError;
use crate::exec::memory::Arena;
use crate::exec::rank::panic_text;
use crate::exec::resolve::resolve;
use crate::exec::ExecMode;
use crate::train::params::assemble;
use crate::train::rank::{Msg, RankCtx, RankOut, RankStep, Saver};
use crate::train::*;
use fsdpc_plan::Plan;
use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every rank a thread of this process (`--target threads`, the default).
#[derive(Debug)]
pub struct Threads;

impl Threads {
    /// Thread ranks for this process; refused when a multi-process
    /// launcher started it as one of several (each process would run the
    /// whole world as threads).
    pub fn new() -> Result<Threads, RuntimeError> {
        let launched =
            crate::launch::detect_env().map_err(|e| RuntimeError::Launch(e.to_string()))?;
        if let Some(l) = launched.filter(|l| l.world > 1) {
            return Err(RuntimeError::Launch(format!(
                "{} started this process as rank {} of {}; thread ranks run in one process: use --target mpi",
                l.launcher.name(),
                l.rank,
                l.world
            )));
        }
        Ok(Threads)
    }
}

impl super::Target for Threads {
    fn name(&self) -> &'static str {
        "threads"
    }

    fn host_gemm(&self) -> Option<fsdpc_plan::cluster::GemmBlocking> {
        crate::cpu::gemm_blocking()
    }

    fn run(
        &self,
        plan: &Plan,
        opts: &TrainOptions,
        on_step: &mut dyn FnMut(&StepReport),
    ) -> Result<TrainReport, RuntimeError> {
        validate(plan)?;
        self.refuse(plan, opts)?;
        train(plan, opts, on_step)
    }
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
    let world = plan.cluster.world as usize;
    let (opts, resume, eval) = open_resume_eval(plan, opts, world, |o| open_resume(plan, o, true))?;
    let data = data::open(&opts.data, &plan.training.graph, opts.seed)?;
    execute_detached(plan, opts, resume, (data, eval), on_step)
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
    let world = plan.cluster.world as usize;
    let (opts, resume, eval) = open_resume_eval(plan, opts, world, |o| open_resume(plan, o, true))?;
    execute_detached(plan, opts, resume, (data, eval), on_step)
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
    data: (Arc<dyn DataSource>, EvalData),
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
    (data, eval): (Arc<dyn DataSource>, EvalData),
    events: &mpsc::Sender<Event>,
) -> Result<TrainReport, RuntimeError> {
    let prep = resolve(plan)?;
    let eval = eval.as_ref().map(|(d, n)| (&**d, *n));
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
                    eval,
                    opts,
                    resume,
                    saver: Saver::Thread(&tx),
                    epoch: start,
                };
                let mut report = |step, out| {
                    let _ = tx.send(Msg::Step { rank, step, out });
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
                eval_batches: eval.map_or(0, |e| e.1),
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
        evals,
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
    let training = training_time(elapsed, &evals);
    Ok(TrainReport {
        losses,
        grad_norms,
        loss_scales,
        skipped_steps,
        evals,
        final_params,
        final_buffers: outs
            .first_mut()
            .map(|o| std::mem::take(&mut o.buffers))
            .unwrap_or_default(),
        measured_peak_bytes: outs.iter().filter_map(|o| o.measured).max(),
        planned_peak_bytes: plan.memory.rank_bytes,
        debug_peak_bytes: outs.iter().filter_map(|o| o.debug_peak).max(),
        tokens_per_s: tokens / training.as_secs_f64().max(1e-9),
        elapsed,
        world,
        timelines,
        device: None,
    })
}

/// What `collect` needs besides the messages.
struct Collect<'a> {
    world: usize,
    plan: &'a Plan,
    opts: &'a TrainOptions,
    first_step: u64,
    /// Batches of each evaluation.
    eval_batches: u64,
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
    let mut log = StepLog::new(plan, world, c.eval_batches);
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
            Msg::Step { rank, step, out } => {
                pending
                    .entry(step)
                    .or_insert_with(|| (0..world).map(|_| None).collect())[rank] = Some(out)
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
            if entry.iter().any(Option::is_none) {
                break;
            }
            let step = c.first_step + log.losses.len() as u64;
            let Some(vals) = pending.remove(&step) else {
                break;
            };
            let vals: Vec<RankStep> = vals.into_iter().flatten().collect();
            let measured = vals.iter().filter_map(|v| v.measured).max();
            let scalars = vals.first().map(|v| v.scalars).unwrap_or_default();
            let time = vals.iter().map(|v| v.time).max().unwrap_or_default();
            let after = (scalars, measured, time);
            // Every rank evaluates after the same steps.
            let eval_losses: Option<Vec<f32>> = vals.iter().map(|v| v.eval.map(|e| e.0)).collect();
            let eval_time = vals.iter().filter_map(|v| v.eval.map(|e| e.1)).max();
            let eval = eval_losses
                .as_deref()
                .map(|l| (l, eval_time.unwrap_or_default()));
            log.record(step, vals.iter().map(|v| v.loss), after, eval, on_step);
        }
    }
    ((log, saved), outs)
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
    let f = c.plan.config.shard_factor as usize * c.plan.geometry().t() as usize;
    let Some(cfg) = c.opts.checkpoint.as_ref().filter(|_| got.len() == f) else {
        return Ok(());
    };
    got.sort_by_key(|e| (e.position, e.tensor));
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
