//! What a training run is, whichever target runs it: its options, the
//! reports of each step and of the run (losses, the final parameters
//! assembled from the shards by original name, the measured memory),
//! resuming from a checkpoint, and the per-step log every launcher keeps.
//! `rank` is one CPU rank's run whichever launcher started it (its memory,
//! steps and checkpoint files); `params` turns shards back into full
//! parameters. The launchers are targets (`crate::targets`).

pub(crate) mod params;
pub(crate) mod rank;

#[cfg(feature = "cuda")]
pub(crate) use params::assemble_shards;

use crate::account::{self, RankTag};
use crate::checkpoint::{self, write::UnitBytes, Checkpoint, CheckpointError, FileEntry};
use crate::comm::{BufMut, World};
use crate::cpu::CpuBackend;
use crate::data::{DataSource, DataSpec};
use crate::error::RuntimeError;
use crate::exec::memory::{Arena, Memory};
use crate::exec::rank::{Pass, RankEnv};
use crate::exec::resolve::Resolved;
use crate::exec::resolve::Step;
use crate::exec::timeline::RankTimeline;
use crate::exec::ExecMode;
use crate::fault::Fault;
use fsdpc_plan::{BufferId, BufferKind, Plan};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
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
    /// Evaluate the loss on held-out data (`EvalOptions`).
    pub eval: Option<EvalOptions>,
}

/// Evaluation on held-out data: the plan's evaluation prefix (`Plan::eval`:
/// forward to the loss, no gradient, dropout off) on each evaluation batch,
/// between steps, with the parameters as they are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvalOptions {
    /// The held-out data (`data::open_eval`).
    pub data: DataSpec,
    /// Evaluate after every `every` steps; 0: only after the run's last
    /// step, which is always evaluated.
    pub every: u64,
    /// Evaluation batches, each one micro-batch on every rank; `None`: all
    /// the held-out corpus holds (`data::SYNTHETIC_EVAL_BATCHES` of
    /// synthetic data).
    pub batches: Option<u64>,
}

impl EvalOptions {
    /// Whether an evaluation follows 0-based step `step` of a run of
    /// `steps` steps.
    pub fn due(&self, step: u64, steps: u64) -> bool {
        let done = step + 1;
        done == steps || (self.every > 0 && done.is_multiple_of(self.every))
    }
}

/// One evaluation.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct EvalReport {
    /// Optimizer steps completed before it.
    pub steps_done: u64,
    /// The global mean loss over the evaluation batches: every rank's mean
    /// over its batches, averaged in rank order.
    pub loss: f32,
    /// Evaluation batches run.
    pub batches: u64,
    /// Its wall time, the slowest rank's (process ranks: this rank's).
    pub time: Duration,
}

/// One rank's evaluation: its mean loss over the batches and its time.
pub(crate) type RankEval = (f32, Duration);

/// After 0-based `step` of a run of `steps`, when `opts` makes an
/// evaluation due: every one of `batches` evaluation batches through
/// `batch` (which runs it and returns its loss), and this rank's mean over
/// them with the time they took. Every target evaluates through this.
pub(crate) fn evaluate(
    opts: &EvalOptions,
    step: u64,
    steps: u64,
    batches: u64,
    batch: &mut dyn FnMut(u64) -> Result<f32, RuntimeError>,
) -> Result<Option<RankEval>, RuntimeError> {
    if !opts.due(step, steps) {
        return Ok(None);
    }
    let began = Instant::now();
    let mut sum = 0f64;
    for j in 0..batches {
        sum += f64::from(batch(j)?);
    }
    Ok(Some(((sum / batches as f64) as f32, began.elapsed())))
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
            eval: None,
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
    /// The evaluation that followed this step, if one was due.
    pub eval: Option<EvalReport>,
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
    /// Every evaluation, in order.
    pub evals: Vec<EvalReport>,
    /// Full parameters by original name, in unit and layout order (empty
    /// unless `TrainOptions::keep_params`).
    pub final_params: Vec<(String, Vec<f32>)>,
    /// Rank 0's module buffers (running statistics) by name after the last
    /// step: what PyTorch's rank-0 state dict holds (empty unless
    /// `TrainOptions::keep_params`, or on a process rank other than 0).
    pub final_buffers: Vec<(String, Vec<f32>)>,
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
    /// A GPU rank's device: its name, its memory, its step times.
    pub device: Option<Box<crate::targets::cuda::DeviceReport>>,
}

/// The verified checkpoint `opts.resume` names, checked against `plan`, and
/// the options with its seed. With `prepare_dir`, the checkpoint directory is
/// readied for writing (`write::prepare_dir`); of several processes only one
/// does that.
pub(crate) fn open_resume(
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

/// The held-out data of an evaluating run and the batches of each
/// evaluation (`TrainOptions::eval`).
pub(crate) type EvalData = Option<(Arc<dyn DataSource>, u64)>;

/// Opens the held-out data `opts.eval` names for `plan` on `world` ranks
/// (`data::open_eval`); a plan without an evaluation prefix is refused.
pub(crate) fn open_eval(
    plan: &Plan,
    opts: &TrainOptions,
    world: usize,
) -> Result<EvalData, RuntimeError> {
    let Some(e) = &opts.eval else {
        return Ok(None);
    };
    if plan.eval.is_none() {
        return Err(crate::exec::rank::no_eval_pass());
    }
    let graph = &plan.training.graph;
    // The members of a tensor group read the same samples.
    let data_ranks = world / plan.geometry().t().max(1) as usize;
    let global = (data_ranks * crate::exec::resolve::batch_size(graph)) as u64;
    crate::data::open_eval(&e.data, graph, opts.seed, global, e.batches).map(Some)
}

/// `open_resume` with the held-out data opened first, so that a bad
/// evaluation file is refused before the checkpoint directory is readied,
/// and again under a resumed checkpoint's seed when it differs.
pub(crate) fn open_resume_eval(
    plan: &Plan,
    opts: &TrainOptions,
    world: usize,
    resume: impl FnOnce(&TrainOptions) -> Result<(TrainOptions, Option<Checkpoint>), RuntimeError>,
) -> Result<(TrainOptions, Option<Checkpoint>, EvalData), RuntimeError> {
    let eval = open_eval(plan, opts, world)?;
    let (resumed, ckpt) = resume(opts)?;
    let eval = match resumed.seed == opts.seed {
        true => eval,
        false => open_eval(plan, &resumed, world)?,
    };
    Ok((resumed, ckpt, eval))
}

/// A run's wall time without its evaluations.
pub(crate) fn training_time(elapsed: Duration, evals: &[EvalReport]) -> Duration {
    elapsed.saturating_sub(evals.iter().map(|e| e.time).sum())
}

/// The first step a run executes.
pub(crate) fn first_step(resume: Option<&Checkpoint>) -> u64 {
    resume.map_or(0, |c| c.manifest.step)
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
    pub(crate) evals: Vec<EvalReport>,
    /// Evaluation batches of each evaluation.
    eval_batches: u64,
    /// T: the members of a tensor group compute one data rank's loss, so
    /// one in T ranks' losses is averaged.
    tensor: usize,
}

impl StepLog {
    pub(crate) fn new(plan: &Plan, world: usize, eval_batches: u64) -> StepLog {
        StepLog {
            tokens: (plan.model.tokens_per_rank_step * world as u64
                / u64::from(plan.config.tensor_parallel.max(1))) as f64,
            planned: plan.memory.rank_bytes,
            last: Instant::now(),
            peak: None,
            losses: Vec::new(),
            grad_norms: Vec::new(),
            loss_scales: Vec::new(),
            skipped_steps: Vec::new(),
            evals: Vec::new(),
            eval_batches,
            tensor: plan.config.tensor_parallel.max(1) as usize,
        }
    }

    /// The run's report from this log: its losses and scalars, the
    /// throughput over `elapsed`; the measured peak, timelines and device
    /// are the launcher's to fill in.
    pub(crate) fn into_report(
        self,
        elapsed: Duration,
        world: usize,
        final_params: Vec<(String, Vec<f32>)>,
    ) -> TrainReport {
        TrainReport {
            tokens_per_s: self.tokens * self.losses.len() as f64
                / training_time(elapsed, &self.evals).as_secs_f64().max(1e-9),
            losses: self.losses,
            grad_norms: self.grad_norms,
            loss_scales: self.loss_scales,
            skipped_steps: self.skipped_steps,
            evals: self.evals,
            final_params,
            final_buffers: Vec::new(),
            measured_peak_bytes: None,
            planned_peak_bytes: self.planned,
            debug_peak_bytes: None,
            elapsed,
            world,
            timelines: Vec::new(),
            device: None,
        }
    }

    /// Records `step` from every rank's local-mean loss, summed in rank
    /// order (so both launchers compute the same bits), and reports it with
    /// the step's scalars, measured peak and step time, and the evaluation
    /// that followed it (every rank's mean loss in rank order, the slowest
    /// rank's time), if any. The step's throughput leaves the evaluation's
    /// time out.
    pub(crate) fn record(
        &mut self,
        step: u64,
        rank_losses: impl ExactSizeIterator<Item = f32>,
        (scalars, measured, step_time): (StepScalars, Option<u64>, Duration),
        eval: Option<(&[f32], Duration)>,
        on_step: &mut dyn FnMut(&StepReport),
    ) {
        let StepScalars {
            grad_norm,
            loss_scale,
        } = scalars;
        let data_ranks = rank_losses.step_by(self.tensor);
        let n = data_ranks.len() as f32;
        let loss = data_ranks.fold(0.0f32, |a, b| a + b) / n;
        self.peak = self.peak.max(measured);
        let elapsed = self.last.elapsed();
        self.last = Instant::now();
        let eval = eval.map(|(losses, time)| EvalReport {
            steps_done: step + 1,
            loss: losses
                .iter()
                .step_by(self.tensor)
                .fold(0.0f32, |a, b| a + b)
                / losses.len().div_ceil(self.tensor).max(1) as f32,
            batches: self.eval_batches,
            time,
        });
        self.evals.extend(eval);
        let training = elapsed.saturating_sub(eval.map_or(Duration::ZERO, |e| e.time));
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
            tokens_per_s: self.tokens / training.as_secs_f64().max(1e-9),
            measured_peak_bytes: self.peak,
            planned_peak_bytes: self.planned,
            elapsed,
            step_time,
            grad_norm,
            loss_scale: loss_scale.map(|s| s.0),
            skipped,
            eval,
        });
    }
}
