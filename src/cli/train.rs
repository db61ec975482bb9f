//! `fsdpc train (MODEL|plan.json) --ranks N --steps K [--data FILE]
//! [--save-onnx out.onnx] [--save-safetensors out.safetensors]
//! [--target threads|mpi|cuda] [--collective-timeout SECS]`

use super::compile::{optimizer, plan_model};
use super::given::Given;
use super::inspect::parse_plan;
use super::json_kind::{is_json, sniff, JsonKind};
use super::{print_out, read_file, CliError, ModelFlags, PlanFlags};
use clap::Args;
use fsdpc_plan::readable::human_bytes;
use fsdpc_runtime::train::{CheckpointConfig, EvalOptions};
use fsdpc_runtime::{DataSpec, ExecMode, StepReport, TrainOptions};
use indicatif::{ProgressBar, ProgressStyle};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// A model (as for `compile`) or a plan file written by `fsdpc compile`.
    pub model: String,
    /// Number of rank threads (the world size). Default: 1 for a model, the
    /// plan's world for a plan.
    #[arg(long)]
    pub ranks: Option<u32>,
    /// Optimizer steps to run.
    #[arg(long, default_value_t = 100)]
    pub steps: u64,
    /// Training data: a nanoGPT `.bin` file of u16 tokens, or any other file
    /// read as bytes (vocab 256). Default: a built-in synthetic task.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Write one JSON object per step (step, loss, lr (the learning rate
    /// the step's optimizer update used), tokens_per_s,
    /// step_time_s (the step's measured execution time, the slowest
    /// rank's), measured_peak_bytes, planned_peak_bytes; with --clip-grad-norm also
    /// grad_norm, the total gradient norm before clipping; with an fp16
    /// policy also loss_scale, the scale after the step, and skipped, whether
    /// an inf/NaN gradient on some rank skipped the step).
    #[arg(long)]
    pub metrics: Option<PathBuf>,
    /// Seed for initialisation and data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Allocate every buffer on its own and measure the live-bytes peak
    /// (slower; checks the plan's memory figure).
    #[arg(long)]
    pub debug_alloc: bool,
    /// Matrix-product threads per rank.
    #[arg(long, default_value_t = 1)]
    pub threads_per_rank: usize,
    /// The cluster a model is planned for: a preset or a cluster file
    /// (default: cpu-local; `--preset` is the old name of this flag).
    #[arg(long, alias = "preset", value_name = "FILE|PRESET")]
    pub cluster: Option<String>,
    #[command(flatten)]
    pub plan: Given<PlanFlags>,
    #[command(flatten)]
    pub import: Given<ModelFlags>,
    /// After training, write the ONNX model (MODEL must be an `.onnx` file)
    /// with its initializers replaced by the trained parameters.
    #[arg(long, value_name = "OUT.onnx")]
    pub save_onnx: Option<PathBuf>,
    /// After training, write every parameter (f32, original names) to a
    /// safetensors file.
    #[arg(long, value_name = "OUT.safetensors")]
    pub save_safetensors: Option<PathBuf>,
    /// After training, write a Hugging Face model directory: config.json
    /// (the source's for an `hf:` model, with its tokenizer files) and
    /// model.safetensors (f32, Hugging Face names and layouts, LoRA adapters
    /// merged into their weights), which `transformers` loads.
    #[arg(long, value_name = "DIR")]
    pub save_hf: Option<PathBuf>,
    /// Write a sharded checkpoint (one safetensors file per shard position
    /// and a manifest) into this directory every --checkpoint-every steps.
    #[arg(long, value_name = "DIR", requires = "checkpoint_every")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Steps between checkpoints.
    #[arg(long, value_name = "K", requires = "checkpoint_dir")]
    pub checkpoint_every: Option<u64>,
    /// Continue from the latest complete checkpoint in DIR, or from the
    /// step directory DIR/step-N itself (to roll back; the newer steps of
    /// DIR are removed when --checkpoint-dir is DIR), up to --steps in all,
    /// with the checkpoint's seed; re-sharded when the world, shard factor
    /// or strategy differ. A checkpoint already at --steps: nothing left to
    /// do, exit 0 (a requeued job re-runs the same command).
    #[arg(long, value_name = "DIR")]
    pub resume: Option<PathBuf>,
    /// The target that runs the ranks: `threads` (one process, a thread
    /// per rank), `mpi` (one process per rank, started by mpirun or srun;
    /// needs a build with `--features mpi`) or `cuda` (one process per GPU,
    /// alone or started by torchrun, srun or mpirun; needs `--features
    /// cuda`). A model is planned for it; a plan it cannot run is refused
    /// before anything starts. With `mpi` or `cuda`, --ranks defaults to the
    /// job's size.
    #[arg(long, alias = "backend", default_value = "threads", value_parser = clap::builder::PossibleValuesParser::new(fsdpc_runtime::targets::NAMES))]
    pub target: String,
    /// Seconds a rank waits for the others (a collective or an event) before
    /// every rank stops with an error naming the one that did not answer.
    #[arg(long, value_name = "SECS", default_value_t = 30.0)]
    pub collective_timeout: f64,
    /// Write the run's measured timeline of the last --trace-steps steps
    /// (every instruction on every rank and stream, and each rank's live
    /// heap) as a Perfetto/Chrome trace, the format of `fsdpc trace`. With
    /// `--target mpi` rank 0 writes FILE with its own rank and rank N > 0
    /// writes FILE.rankN.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// How many of the last steps --trace records.
    #[arg(long, value_name = "N", default_value_t = 1, requires = "trace")]
    pub trace_steps: u64,
    /// Held-out data to evaluate the loss on: a file as for --data, read in
    /// order window after window, or `synthetic` (samples of the built-in
    /// task no training step draws). Evaluated after the last step and with
    /// --eval-every after every N steps: the plan's forward-only evaluation
    /// pass, no gradients, dropout off, the parameters unchanged.
    #[arg(long, value_name = "FILE|synthetic")]
    pub eval_data: Option<String>,
    /// Steps between evaluations (default: only after the last step).
    #[arg(long, value_name = "N", requires = "eval_data")]
    pub eval_every: Option<u64>,
    /// Evaluation batches, each one micro-batch per rank (default: every
    /// whole batch the file holds; 4 of synthetic data).
    #[arg(long, value_name = "N", requires = "eval_data")]
    pub eval_batches: Option<u64>,
}

/// The device and its memory after a `--target cuda` run: the planned
/// arena beside what `cuMemGetInfo` shows used, less the context.
fn device_summary(
    plan: &fsdpc_plan::Plan,
    d: &fsdpc_runtime::targets::cuda::DeviceReport,
) -> String {
    let m = &d.memory;
    let mean = |v: &[Duration]| {
        let s: Vec<f64> = v.iter().skip(1).map(|d| d.as_secs_f64()).collect();
        if s.is_empty() {
            f64::NAN
        } else {
            s.iter().sum::<f64>() / s.len() as f64
        }
    };
    // The plan's lines outside the arena: the context's against the
    // baseline, the rest against what set-up used beyond the arena.
    let context = plan.memory.outside_bytes(fsdpc_plan::OutsideKind::Context);
    let rest = plan.memory.outside_arena_bytes() - context;
    format!(
        "cuda: {} ({}): planned arena {}, one allocation of {} (arena + kernel scratch + cuBLAS workspace); device memory used beyond the context: {} after set-up, {} after the steps (of {}); mean step {:.2} ms after the first\n\
         cuda: outside the arena, planned against measured: context {} / {}, the rest (cuBLAS workspaces, NCCL buffers) {} / {} beyond the arena after set-up\n",
        d.name,
        plan.model.name,
        human_bytes(m.planned_arena),
        human_bytes(m.allocated),
        human_bytes(m.setup_used),
        human_bytes(m.end_used),
        human_bytes(m.total),
        mean(&d.step_times) * 1e3,
        human_bytes(context),
        human_bytes(m.baseline_used),
        human_bytes(rest),
        human_bytes(m.setup_used.saturating_sub(m.planned_arena)),
    )
}

/// The checkpoint to resume from: `--resume`'s, except on the first run
/// of a job that resumes from its own `--checkpoint-dir` (the command a
/// scheduler requeues), where that directory holds no checkpoint yet and
/// the run starts at step 0, saying so.
fn first_run_resume(a: &TrainArgs, lead: bool) -> Result<Option<PathBuf>, CliError> {
    let (Some(resume), Some(ckpt)) = (&a.resume, &a.checkpoint_dir) else {
        return Ok(a.resume.clone());
    };
    let same = resume == ckpt
        || std::fs::canonicalize(resume).ok() == std::fs::canonicalize(ckpt).ok()
            && resume.exists();
    use fsdpc_runtime::checkpoint::manifest::{LATEST, MANIFEST};
    let empty = !resume.join(LATEST).exists() && !resume.join(MANIFEST).exists();
    if !(same && empty) {
        return Ok(a.resume.clone());
    }
    if lead {
        print_out(&format!(
            "no checkpoint in {} yet: starting at step 0\n",
            resume.display()
        ))?;
    }
    Ok(None)
}

/// Whether the checkpoint `--resume` names already completed `--steps`:
/// a job its scheduler requeued re-runs the same command, and there is
/// nothing left to do (said by the lead rank). Further than `--steps` is
/// left to the run's own refusal.
fn nothing_left(resume: &Path, steps: u64, lead: bool) -> Result<bool, CliError> {
    let at = fsdpc_runtime::checkpoint::Checkpoint::step_of(resume)
        .map_err(fsdpc_runtime::RuntimeError::from)?;
    if at != steps {
        return Ok(false);
    }
    if lead {
        print_out(&format!(
            "nothing left to do: the checkpoint {} is at step {at}, --steps is {steps}\n",
            resume.display()
        ))?;
    }
    Ok(true)
}

pub fn run(a: TrainArgs) -> Result<(), CliError> {
    check_flags(&a)?;
    let timeout = Duration::from_secs_f64(a.collective_timeout);
    let target = fsdpc_runtime::targets::open(&a.target, timeout)
        .map_err(|e| CliError::Usage(e.to_string()))?;
    // Only rank 0 reports: metrics, the progress bar and the summary.
    let lead = target.rank() == 0;
    let resume = first_run_resume(&a, lead)?;
    if let Some(dir) = &resume {
        if nothing_left(dir, a.steps, lead)? {
            return Ok(());
        }
    }
    // Opened before any work, so an unwritable path is reported at once.
    let mut metrics = if lead {
        open_metrics(&a.metrics)?
    } else {
        None
    };
    if a.save_onnx.is_some() && !is_onnx(&a.model) {
        return Err(CliError::Usage(format!(
            "--save-onnx needs an ONNX model to write back into, but `{}` is not an `.onnx` file",
            a.model
        )));
    }
    let plan = if let Some(text) = plan_text(&a.model)? {
        refuse_compile_flags(&a)?;
        let plan = parse_plan(Path::new(&a.model), &text)?;
        if let Some(ranks) = a.ranks.filter(|&r| r != plan.cluster.world) {
            return Err(CliError::Usage(format!(
                "the plan was compiled for world {} but --ranks is {ranks}",
                plan.cluster.world
            )));
        }
        plan
    } else {
        // A decay ends at the run's last step unless told otherwise.
        let mut flags = (*a.plan).clone();
        if fsdpc_plan::LrDecay::parse(&flags.lr_schedule)
            .is_ok_and(|d| d != fsdpc_plan::LrDecay::Constant)
        {
            flags.lr_decay_steps = flags.lr_decay_steps.or(Some(a.steps));
        }
        plan_model(
            &a.model,
            a.ranks.or(target.processes()).unwrap_or(1),
            a.cluster.as_deref().unwrap_or("cpu-local"),
            &flags,
            &a.import,
            target.capabilities(),
            target.host_gemm(),
        )?
    };
    // What --save-hf writes beside the weights, known before any step: a
    // model it cannot write is refused before training, not after.
    let hf_config = match &a.save_hf {
        Some(_) => Some(fsdpc_frontends::hf::saved_config(&plan.model.name)?),
        None => None,
    };
    let opts = TrainOptions {
        steps: a.steps,
        seed: a.seed,
        data: data_spec(&a.data),
        mode: if a.debug_alloc {
            ExecMode::DebugAlloc
        } else {
            ExecMode::Arena
        },
        threads_per_rank: a.threads_per_rank,
        // The full parameters are assembled only to be saved.
        keep_params: a.save_onnx.is_some() || a.save_safetensors.is_some() || a.save_hf.is_some(),
        checkpoint: a
            .checkpoint_dir
            .clone()
            .zip(a.checkpoint_every)
            .map(|(dir, every)| CheckpointConfig { dir, every }),
        resume,
        comm_timeout: timeout,
        fault: fault()?,
        trace_steps: if a.trace.is_some() { a.trace_steps } else { 0 },
        eval: a.eval_data.as_ref().map(|d| EvalOptions {
            data: match d.as_str() {
                "synthetic" => DataSpec::Synthetic,
                file => data_spec(&Some(PathBuf::from(file))),
            },
            every: a.eval_every.unwrap_or(0),
            batches: a.eval_batches,
        }),
    };
    let mut metrics_error = None;
    let bar = if lead {
        progress_bar(a.steps)
    } else {
        ProgressBar::hidden()
    };
    let mut eval_msg = String::new();
    let mut on_step = |r: &StepReport| {
        bar.set_position(r.step + 1);
        if let Some(e) = &r.eval {
            eval_msg = format!("  eval {:.4}", e.loss);
        }
        bar.set_message(format!(
            "loss {:.4}{eval_msg}  {:.0} tok/s",
            r.loss, r.tokens_per_s
        ));
        if let Some(m) = metrics.as_mut() {
            let mut line = serde_json::json!({
                "step": r.step, "loss": r.loss, "lr": plan.lr_at(r.step),
                "tokens_per_s": r.tokens_per_s,
                "step_time_s": r.step_time.as_secs_f64(),
                "measured_peak_bytes": r.measured_peak_bytes,
                "planned_peak_bytes": r.planned_peak_bytes,
            });
            if let Some(n) = r.grad_norm {
                line["grad_norm"] = serde_json::json!(n);
            }
            if let Some(s) = r.loss_scale {
                line["loss_scale"] = serde_json::json!(s);
                line["skipped"] = serde_json::json!(r.skipped);
            }
            if let Some(e) = &r.eval {
                line["eval_loss"] = serde_json::json!(e.loss);
                line["eval_batches"] = serde_json::json!(e.batches);
                line["eval_time_s"] = serde_json::json!(e.time.as_secs_f64());
            }
            // A metrics write failure must not kill a training run; the
            // first one is reported at the end.
            if let Err(e) = writeln!(m, "{line}") {
                metrics_error.get_or_insert(e);
            }
        }
    };
    let report = target.run(&plan, &opts, &mut on_step)?;
    bar.finish_and_clear();
    if let Some(path) = &a.trace {
        write_trace(&plan, &report.timelines, &trace_path(path, target.rank()))?;
    }
    if !lead {
        return Ok(());
    }
    let last = report.losses.last().copied().unwrap_or(f32::NAN);
    let first = report.losses.first().copied().unwrap_or(f32::NAN);
    print_out(&format!(
        "trained {} for {} on {} ({}): loss {:.4} -> {:.4}, {:.0} tokens/s, peak per rank {} measured, {} planned\n",
        plan.model.name,
        plural(report.losses.len() as u64, "step"),
        plural(u64::from(plan.cluster.world), "rank"),
        match plan.config.tensor_parallel {
            t if t > 1 => format!("{}, tensor-parallel {t}", plan.config.strategy.name()),
            _ => plan.config.strategy.name().to_string(),
        },
        first,
        last,
        report.tokens_per_s,
        report
            .measured_peak_bytes
            .map_or_else(|| "not".to_string(), human_bytes),
        human_bytes(report.planned_peak_bytes),
    ))?;
    if let Some(e) = report.evals.last() {
        print_out(&format!(
            "eval loss {:.4} (perplexity {:.2}) after {}: {} on every rank in {:.2} s, {:.2} ms a batch ({:.2} ms predicted on {})\n",
            e.loss,
            f64::from(e.loss).exp(),
            plural(e.steps_done, "step"),
            match e.batches {
                1 => "1 batch".to_string(),
                n => format!("{n} batches"),
            },
            e.time.as_secs_f64(),
            e.time.as_secs_f64() * 1e3 / e.batches.max(1) as f64,
            plan.estimates.eval_s * 1e3,
            plan.cluster.name,
        ))?;
    }
    if let Some(d) = &report.device {
        print_out(&device_summary(&plan, d))?;
    }
    super::save::save(
        &a,
        &plan,
        &report.final_params,
        &report.final_buffers,
        hf_config,
    )?;
    match (metrics_error, &a.metrics) {
        (Some(source), Some(path)) => Err(CliError::Io {
            path: path.display().to_string(),
            source,
        }),
        _ => Ok(()),
    }
}

/// Where this process writes its trace: FILE on rank 0 (every thread
/// rank), FILE.rankN on process rank N.
fn trace_path(path: &Path, rank: usize) -> PathBuf {
    if rank == 0 {
        return path.to_path_buf();
    }
    let mut p = path.as_os_str().to_owned();
    p.push(format!(".rank{rank}"));
    PathBuf::from(p)
}

/// Writes the measured timelines as a trace (`trace::measured_trace`).
fn write_trace(
    plan: &fsdpc_plan::Plan,
    timelines: &[fsdpc_runtime::exec::timeline::RankTimeline],
    path: &Path,
) -> Result<(), CliError> {
    let spans: Vec<fsdpc_report::trace::MeasuredSpan> = timelines
        .iter()
        .flat_map(|t| {
            t.streams.iter().flat_map(move |s| {
                s.spans
                    .iter()
                    .map(move |x| fsdpc_report::trace::MeasuredSpan {
                        rank: t.rank,
                        step: x.step,
                        instr: x.instr as usize,
                        start_s: x.start_ns as f64 * 1e-9,
                        end_s: x.end_ns as f64 * 1e-9,
                        live_bytes: x.live_bytes,
                    })
            })
        })
        .collect();
    let trace = fsdpc_report::trace::measured_trace(plan, &spans).map_err(CliError::Usage)?;
    std::fs::write(path, trace.to_string()).map_err(|source| CliError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// The fault the failure tests inject (`FSDPC_TEST_FAULT`), if any.
fn fault() -> Result<Option<fsdpc_runtime::fault::Fault>, CliError> {
    match std::env::var(fsdpc_runtime::fault::FAULT_VAR) {
        Ok(v) => v
            .parse()
            .map(Some)
            .map_err(|e: fsdpc_runtime::fault::BadFault| CliError::Usage(e.to_string())),
        Err(_) => Ok(None),
    }
}

/// Numeric flags that cannot mean anything, refused before any work.
fn check_flags(a: &TrainArgs) -> Result<(), CliError> {
    for (flag, value) in [
        ("--ranks", a.ranks.map_or(1, u64::from)),
        ("--steps", a.steps),
        ("--threads-per-rank", a.threads_per_rank as u64),
        ("--checkpoint-every", a.checkpoint_every.unwrap_or(1)),
        ("--trace-steps", a.trace_steps),
        ("--eval-every", a.eval_every.unwrap_or(1)),
        ("--eval-batches", a.eval_batches.unwrap_or(1)),
    ] {
        if value == 0 {
            return Err(CliError::Usage(format!("{flag} must be at least 1")));
        }
    }
    let t = a.collective_timeout;
    if !(t.is_finite() && t > 0.0 && t <= 1e6) {
        return Err(CliError::Usage(format!(
            "--collective-timeout must be a positive number of seconds, at most 1e6, not {t}"
        )));
    }
    if let Some(file) = a.eval_data.as_deref().filter(|d| *d != "synthetic") {
        if !Path::new(file).is_file() {
            return Err(CliError::Usage(format!(
                "--eval-data {file}: no such file (a held-out text or `.bin` token file, or `synthetic`)"
            )));
        }
    }
    // The optimizer flags, also when they end up unused (training a plan).
    optimizer(&a.plan)?;
    Ok(())
}

/// Refuses the compile flags given with a plan file: the plan has fixed what
/// they would decide (units, strategy, schedule, optimizer, cluster, import).
fn refuse_compile_flags(a: &TrainArgs) -> Result<(), CliError> {
    let preset = a.cluster.as_ref().map(|_| "--cluster".to_string());
    let given: Vec<&str> = preset
        .iter()
        .chain(a.plan.given())
        .chain(a.import.given())
        .map(String::as_str)
        .collect();
    if given.is_empty() {
        return Ok(());
    }
    Err(CliError::Usage(format!(
        "`{}` is a compiled plan, so {} cannot apply to it; compile the model again with {}, or leave {} out",
        a.model,
        given.join(", "),
        if given.len() == 1 { "it" } else { "them" },
        if given.len() == 1 { "it" } else { "them" },
    )))
}

fn is_onnx(model: &str) -> bool {
    Path::new(model)
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("onnx"))
}

/// `n thing` or `n things`.
fn plural(n: u64, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

/// The text of `model` if it is a plan file, read once; `None` for a model
/// (a spec, an ONNX or IR file). A `.json` that cannot be read, or that is
/// neither a plan nor an IR model, is an error saying so.
fn plan_text(model: &str) -> Result<Option<String>, CliError> {
    if !is_json(model) {
        return Ok(None);
    }
    let path = Path::new(model);
    let text = read_file(path)?;
    Ok((sniff(path, &text)? == JsonKind::Plan).then_some(text))
}

fn data_spec(path: &Option<PathBuf>) -> DataSpec {
    match path {
        None => DataSpec::Synthetic,
        Some(p) if p.extension().is_some_and(|e| e == "bin") => DataSpec::TokenBin(p.clone()),
        Some(p) => DataSpec::TextFile(p.clone()),
    }
}

fn open_metrics(path: &Option<PathBuf>) -> Result<Option<std::fs::File>, CliError> {
    path.as_ref()
        .map(|p| {
            std::fs::File::create(p).map_err(|source| CliError::Io {
                path: p.display().to_string(),
                source,
            })
        })
        .transpose()
}

fn progress_bar(steps: u64) -> ProgressBar {
    let bar = ProgressBar::new(steps);
    if let Ok(style) =
        ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed_precise}]")
    {
        bar.set_style(style);
    }
    bar
}
