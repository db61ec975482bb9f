//! `fsdpc compile MODEL --world N -o plan.json`

use super::given::Given;
use super::json_kind::{is_json, sniff, JsonKind};
use super::{print_out, read_file, CliError, ModelFlags, PlanFlags};
use clap::Args;
use fsdpc_ir::Optimizer;
use fsdpc_plan::cluster::GemmBlocking;
use fsdpc_plan::target::Capabilities;
use fsdpc_plan::{
    BackwardPrefetch, CheckpointPolicy, Cluster, ModelInfo, Plan, ReshardAfterForward, Strategy,
    WrapPolicy,
};
use fsdpc_planner::FsdpConfig;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct CompileArgs {
    /// A model: a zoo spec (`gpt2`, `gpt:layers=2,hidden=128,...`, `mlp:...`),
    /// an fsdpc IR file (`.json`) or an ONNX file (`.onnx`).
    pub model: String,
    /// Number of ranks (GPUs) in the job.
    #[arg(long)]
    pub world: u32,
    /// The cluster: a preset (a100-80g-roce, h100-80g-ib, h200-141g-ib,
    /// a100-40g-efa, l40s-48g-eth, a10-24g-eth,
    /// cpu-local) or a cluster file (`fsdpc cluster PRESET -o FILE` writes
    /// one to edit; `--preset` is the old name of this flag).
    #[arg(
        long,
        alias = "preset",
        value_name = "FILE|PRESET",
        default_value = "a100-80g-roce"
    )]
    pub cluster: String,
    /// The target the plan is for: `threads`, `mpi` or `cuda`. The plan
    /// holds only what that target runs: a setting it cannot run is
    /// refused, and collectives are rewritten only into forms it runs.
    #[arg(long, default_value = "threads", value_parser = clap::builder::PossibleValuesParser::new(fsdpc_runtime::targets::NAMES))]
    pub target: String,
    #[command(flatten)]
    pub plan: Given<PlanFlags>,
    #[command(flatten)]
    pub import: ModelFlags,
    /// Where to write the plan (JSON); `-` for stdout.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Search the configuration for the fastest simulated step that fits:
    /// wrap (blocks, half blocks), strategy and F, activation checkpointing,
    /// CPU offload, backward and forward prefetch, prefetch depth and
    /// limit_all_gathers. A flag given with --auto fixes its dimension
    /// (`--auto --strategy hybrid_shard` searches the rest). Prints the
    /// chosen plan, the fastest few that fit and a count per reason the
    /// others were set aside, and writes the chosen plan.
    #[arg(long)]
    pub auto: bool,
    /// With --auto: `given` (default) keeps the precision of the flags
    /// (f32 unless --mixed-precision/--param-dtype); `bf16` also searches
    /// bf16 parameters with f32 gradient reduction, which changes the
    /// numerics.
    #[arg(long, value_name = "given|bf16", requires = "auto")]
    pub auto_precision: Option<String>,
    /// With --auto: the optimality gap in percent. A candidate is not
    /// compiled once its step's lower bound is within this much of the
    /// best step found, so the chosen step is at most this much slower
    /// than the fastest of the space; 0 compiles until the fastest is
    /// certain (slower: the bounds of close candidates overlap).
    #[arg(long, value_name = "PERCENT", default_value_t = 0.5, requires = "auto")]
    pub auto_gap: f64,
    /// With --auto: print every candidate weighed, one line each (runs of
    /// pruned schedule variants on one line), not only the fastest few.
    #[arg(long, requires = "auto")]
    pub verbose: bool,
    /// With --auto: print the search as JSON instead of text (the record,
    /// the chosen candidate and every candidate with its verdict).
    #[arg(long, requires = "auto")]
    pub json: bool,
}

/// How many of the fastest candidates that fit `--auto` prints without
/// `--verbose`.
const AUTO_BEST: usize = 5;

/// What `compile` produced: the plan and, with `--auto`, the search.
pub struct Compiled {
    pub plan: Plan,
    pub search: Option<AutoSearch>,
}

/// The `--auto` search: the table `compile --auto` prints, and the same as
/// JSON (`--json`).
pub struct AutoSearch {
    pub text: String,
    pub json: serde_json::Value,
}

pub fn run(a: CompileArgs) -> Result<(), CliError> {
    let Compiled { plan, search } = compile(&a)?;
    if let Some(search) = search {
        if a.json {
            print_out(&format!("{:#}\n", search.json))?;
        } else if a.output.as_os_str() == "-" {
            // The plan itself goes to standard output: the table to
            // standard error.
            eprint!("{}", search.text);
        } else {
            print_out(&search.text)?;
        }
    }
    let json = plan.to_json_pretty()?;
    if a.output.as_os_str() == "-" {
        print_out(&format!("{json}\n"))?;
    } else {
        std::fs::write(&a.output, json).map_err(|source| CliError::Io {
            path: a.output.display().to_string(),
            source,
        })?;
        eprintln!(
            "wrote {} ({} units, {} instructions, peak per rank {})",
            a.output.display(),
            plan.units.len(),
            plan.instructions.len(),
            fsdpc_plan::readable::human_bytes(plan.memory.rank_bytes)
        );
    }
    Ok(())
}

/// Plans `a.model` as the flags say (searching with `--auto`), without
/// writing anything.
pub fn compile(a: &CompileArgs) -> Result<Compiled, CliError> {
    if is_json(&a.model) {
        let path = Path::new(&a.model);
        if sniff(path, &read_file(path)?)? == JsonKind::Plan {
            return Err(CliError::Usage(format!(
                "{}: already a plan (fsdpc inspect or fsdpc train it); compile takes a model",
                a.model
            )));
        }
    }
    if a.auto {
        let (plan, search) = auto_plan(a)?;
        return Ok(Compiled {
            plan,
            search: Some(search),
        });
    }
    let plan = plan_model(
        &a.model,
        a.world,
        &a.cluster,
        &a.plan,
        &a.import,
        target_capabilities(&a.target)?,
        None,
    )?;
    Ok(Compiled { plan, search: None })
}

/// Loads `model` and plans it for `world` ranks on `cluster` (a preset or
/// a cluster file).
pub(crate) fn plan_model(
    model: &str,
    world: u32,
    cluster: &str,
    f: &PlanFlags,
    import: &ModelFlags,
    target: Capabilities,
    host: Option<GemmBlocking>,
) -> Result<Plan, CliError> {
    let (program, info, mut cluster, mut cfg) = prepare(model, world, cluster, f, import)?;
    // Ranks on this machine: the plan's bound of what the matrix library
    // allocates is this CPU's exact figure.
    if cluster.hardware.cpu_gemm.is_none() {
        cluster.hardware.cpu_gemm = host;
    }
    cfg.target = target;
    let plan = fsdpc_planner::compile(program, info, &cluster, &cfg)?;
    if let Some((bytes, secs)) = fsdpc_planner::cost::tensor_across_nodes(&plan, &cluster) {
        eprintln!(
            "warning: --tensor-parallel {} spans nodes ({} ranks per node): its activation sums \
             send {} per rank and step across nodes, {secs:.3} s a step on the \
             compute stream (not overlapped); a T dividing {} keeps them inside a node",
            cfg.tensor_parallel,
            cluster.ranks_per_node,
            fsdpc_plan::readable::human_bytes(bytes),
            cluster.ranks_per_node,
        );
    }
    if let Some(q) = plan
        .config
        .tensor
        .as_ref()
        .and_then(|r| r.sequence.as_ref())
    {
        if q.whole > 0 {
            eprintln!(
                "warning: sequence parallelism left {} of {} region exits as all-reduces: \
                 --tensor-parallel {} divides neither the sum's first axis longer than 1 nor \
                 its rows (every axis but the last); the norms and residual adds between \
                 them run whole",
                q.whole,
                q.whole + q.scattered,
                cfg.tensor_parallel,
            );
        }
    }
    if let Some(v) = plan.config.tensor.as_ref().and_then(|r| r.vocabulary_whole) {
        eprintln!(
            "warning: the vocabulary of {v} does not split over --tensor-parallel {}, even \
             padded: the embedding, the head and the logits are whole on every member \
             (`inspect` says why)",
            cfg.tensor_parallel
        );
    }
    Ok(plan)
}

/// What a compile needs: the training program, its model record, the
/// cluster and the configuration the flags give.
fn prepare(
    model: &str,
    world: u32,
    cluster: &str,
    f: &PlanFlags,
    import: &ModelFlags,
) -> Result<(fsdpc_ir::TrainingProgram, ModelInfo, Cluster, FsdpConfig), CliError> {
    let opts = import.load_options(optimizer(f)?)?;
    let model = fsdpc_frontends::load(model, &opts)?;
    import.warn_merged(&model.program.graph);
    let cluster = resolve_cluster(cluster, Some(world), f.ranks_per_node)?;
    let cfg = FsdpConfig { settings: fsdpc_plan::Settings { strategy: Strategy::parse(&f.strategy)?, forward_prefetch: f.forward_prefetch, prefetch_depth: f.prefetch_depth, grad_accum: f.grad_accum, no_sync: f.no_sync, wrap: WrapPolicy::parse(&f.wrap)?, backward_prefetch: BackwardPrefetch::parse(&f.backward_prefetch)?, limit_all_gathers: f.limit_all_gathers, activation_checkpointing: match &f.activation_checkpointing {
            Some(which) => CheckpointPolicy::parse(which)?,
            None => CheckpointPolicy::None,
        }, clip_grad_norm: f.clip_grad_norm, freeze: fsdpc_planner::freeze::split_patterns(&f.freeze), shared_params: fsdpc_plan::SharedParams::parse(&f.shared_params)?, cpu_offload: f.cpu_offload.is_some(), offload_what: match (&f.offload_what, &f.cpu_offload) {
            (Some(what), Some(_)) => fsdpc_plan::OffloadWhat::parse(what)?,
            (Some(_), None) => return Err(CliError::Usage(
                "--offload-what says what --cpu-offload moves to the host: give --cpu-offload too"
                    .into(),
            )),
            (None, _) => fsdpc_plan::OffloadWhat::Params,
        }, allgather_wire: fsdpc_plan::Wire::parse(&f.allgather_wire, f.wire_block)?, reduce_scatter_wire: fsdpc_plan::Wire::parse(&f.reduce_scatter_wire, f.wire_block)?, lr_schedule: lr_schedule(f)?, decay_all: f.weight_decay_all, tensor_parallel: f.tensor_parallel, sequence_parallel: f.sequence_parallel == "on", ..fsdpc_plan::Settings::default() }, shard_factor: f.shard_factor, reshard_after_forward: f
            .reshard_after_forward
            .iter()
            .rfind(|v| !v.contains('='))
            .map(|v| ReshardAfterForward::parse(v))
            .transpose()?, reshard_units: f
            .reshard_after_forward
            .iter()
            .filter_map(|v| v.split_once('='))
            .map(|(path, v)| Ok((path.trim().to_string(), ReshardAfterForward::parse(v)?)))
            .collect::<Result<_, fsdpc_planner::PlanError>>()?, offload_units: match &f.cpu_offload {
            Some(which) => fsdpc_plan::OffloadUnits::parse(which)?,
            None => fsdpc_plan::OffloadUnits::All,
        }, rewrites: fsdpc_planner::rewrite::Rules::parse(&f.rewrites)?, check_fits: !f.no_fit_check, ..FsdpConfig::default() };
    let cfg = with_precision(cfg, f)?;
    let info = ModelInfo {
        tokens_per_rank_step: model.tokens_per_rank_step(),
        params: model.program.graph.param_numel(),
        name: model.name,
    };
    Ok((model.program, info, cluster, cfg))
}

/// `compile --auto`: searches the space the flags leave open; returns the
/// chosen plan and the candidate table.
fn auto_plan(a: &CompileArgs) -> Result<(Plan, AutoSearch), CliError> {
    use fsdpc_planner::auto::Fixed;
    let given = |name: &str| a.plan.given().iter().any(|g| g == name);
    for refused in ["--no-fit-check"] {
        if given(refused) {
            return Err(CliError::Usage(format!(
                "--auto searches for a plan that fits; {refused} does not apply"
            )));
        }
    }
    let allow_bf16 = match a.auto_precision.as_deref() {
        None | Some("given") => false,
        Some("bf16") => true,
        Some(other) => {
            return Err(CliError::Usage(format!(
                "--auto-precision {other}: expected given or bf16"
            )))
        }
    };
    if a.json && a.output.as_os_str() == "-" {
        return Err(CliError::Usage(
            "--json prints the candidates on standard output, where -o - would write the plan: \
             give -o a file"
                .into(),
        ));
    }
    let started = std::time::Instant::now();
    let (program, info, cluster, mut cfg) =
        prepare(&a.model, a.world, &a.cluster, &a.plan, &a.import)?;
    cfg.target = target_capabilities(&a.target)?;
    let fixed = Fixed {
        precision: ["--mixed-precision", "--param-dtype", "--reduce-dtype"]
            .iter()
            .any(|f| given(f)),
        strategy: given("--strategy").then_some(cfg.strategy),
        shard_factor: cfg.shard_factor,
        wrap: given("--wrap"),
        checkpointing: given("--activation-checkpointing"),
        // A target without host buffers runs no offload.
        cpu_offload: given("--cpu-offload") || !cfg.target.host_buffers,
        backward_prefetch: given("--backward-prefetch"),
        forward_prefetch: given("--forward-prefetch"),
        prefetch_depth: given("--prefetch-depth"),
        limit_all_gathers: given("--limit-all-gathers"),
    };
    if !(a.auto_gap.is_finite() && (0.0..=100.0).contains(&a.auto_gap)) {
        return Err(CliError::Usage(format!(
            "--auto-gap must be a percentage from 0 to 100, not {}",
            a.auto_gap
        )));
    }
    let degrees = fsdpc_planner::auto::tensor_degrees(
        &cluster,
        given("--tensor-parallel").then_some(cfg.tensor_parallel),
    );
    let mesh = fsdpc_planner::auto::search_mesh(
        &program,
        &info,
        &cluster,
        &cfg,
        &fixed,
        allow_bf16,
        a.auto_gap / 100.0,
        &degrees,
    )?;
    let result = &mesh.result;
    let r = &result.record;
    let mut text = format!(
        "auto: {} on {}, world {} ({} per rank): {} candidates, {} compiled, {} screened without \
         compiling, {} pruned by the memory bound, {} by a time bound ({:.2} s)\n",
        info.name,
        cluster.name,
        cluster.world,
        fsdpc_plan::readable::human_bytes(cluster.memory_bytes),
        r.candidates,
        r.compiled,
        r.screened,
        r.pruned_by_memory,
        r.pruned_by_time,
        started.elapsed().as_secs_f64()
    );
    text.push_str(&format!(
        "precision: {} ({})\n",
        if allow_bf16 {
            "searched: the flags' and bf16 with f32 reduction (--auto-precision bf16)"
        } else {
            "the flags' only (--auto-precision bf16 also searches bf16)"
        },
        if fixed.precision { "given" } else { "default" }
    ));
    for s in &r.searched {
        text.push_str(&format!("searched  {s}\n"));
    }
    if mesh.rows.len() > 1 {
        text.push_str(&mesh_table(&mesh, &cluster));
    }
    if a.verbose {
        text.push_str(&result.table());
    } else {
        text.push_str(&result.summary(AUTO_BEST));
    }
    text.push_str(&format!(
        "chosen: {} (step {:.4} s, peak per rank {}; {})\n",
        fsdpc_planner::auto::short(&config_of(&result.plan, &cfg)),
        result.plan.estimates.step_time_s,
        fsdpc_plan::readable::human_bytes(result.plan.memory.rank_bytes),
        if a.auto_gap > 0.0 {
            format!(
                "at most {}% slower than the fastest of the space (--auto-gap)",
                a.auto_gap
            )
        } else {
            "the fastest of the space".to_string()
        }
    ));
    let mesh_json: Vec<_> = mesh
        .rows
        .iter()
        .map(|row| match &row.outcome {
            Ok(b) => serde_json::json!({
                "tensor_parallel": row.degree,
                "config": b.config,
                "step_time_s": b.step_time_s,
                "tokens_per_s_per_rank": b.tokens_per_s_per_rank,
                "peak_bytes": b.peak_bytes,
                "chosen": row.degree == mesh.degree,
            }),
            Err(e) => serde_json::json!({
                "tensor_parallel": row.degree,
                "error": e,
            }),
        })
        .collect();
    let chosen = result
        .weighed
        .iter()
        .find(|w| matches!(w.verdict, fsdpc_planner::auto::Verdict::Chosen))
        .map(|w| w.candidate.index);
    let json = serde_json::json!({
        "record": r,
        "tensor_parallel": mesh_json,
        "chosen": chosen,
        "candidates": result.candidates_json(),
    });
    Ok((mesh.result.plan, AutoSearch { text, json }))
}

/// The tensor-parallel degrees the search compared: each one's fastest
/// plan that fits (or why none does), by tokens per second per rank.
fn mesh_table(mesh: &fsdpc_planner::auto::MeshChoice, cluster: &fsdpc_plan::Cluster) -> String {
    let mut out = format!(
        "tensor parallelism: T dividing the {} ranks of a node; the model's per-rank batch is \
         kept, so the global batch is batch x world / T, and degrees are compared by tokens/s \
         per rank\n",
        cluster.ranks_per_node
    );
    let chosen = mesh
        .rows
        .iter()
        .find(|r| r.degree == mesh.degree)
        .and_then(|r| r.outcome.as_ref().ok())
        .map_or(0.0, |b| b.tokens_per_s_per_rank);
    for row in &mesh.rows {
        match &row.outcome {
            Ok(b) => out.push_str(&format!(
                "  T={:<3} {:<72} step {:>10.4} s  {:>10.1} tokens/s per rank  peak {:>10}  {}\n",
                row.degree,
                b.config,
                b.step_time_s,
                b.tokens_per_s_per_rank,
                fsdpc_plan::readable::human_bytes(b.peak_bytes),
                if row.degree == mesh.degree {
                    "chosen".to_string()
                } else if chosen > 0.0 {
                    format!(
                        "{:.1}% fewer tokens/s per rank",
                        100.0 * (1.0 - b.tokens_per_s_per_rank / chosen)
                    )
                } else {
                    String::new()
                }
            )),
            Err(e) => out.push_str(&format!("  T={:<3} {e}\n", row.degree)),
        }
    }
    out
}

/// The configuration a plan was compiled with, in `FsdpConfig` form (for
/// its short name).
fn config_of(plan: &Plan, base: &FsdpConfig) -> FsdpConfig {
    let c = &plan.config;
    FsdpConfig {
        settings: c.settings.clone(),
        shard_factor: Some(c.shard_factor),
        ..base.clone()
    }
}

/// What target `name` runs (`--target`), without starting it.
pub(crate) fn target_capabilities(name: &str) -> Result<Capabilities, CliError> {
    fsdpc_runtime::targets::capabilities(name).ok_or_else(|| {
        CliError::Usage(format!(
            "unknown target `{name}`; the targets: {}",
            fsdpc_runtime::targets::NAMES.join(", ")
        ))
    })
}

/// The cluster `name` (a preset or a cluster file) at `plan`'s world and
/// ranks per node; the plan's own without a name (`simulate`, `report`).
pub(crate) fn plan_cluster(plan: &Plan, name: Option<&str>) -> Result<Cluster, CliError> {
    match name {
        None => Ok(plan.cluster.clone()),
        Some(name) => resolve_cluster(
            name,
            Some(plan.cluster.world),
            Some(plan.cluster.ranks_per_node),
        ),
    }
}

/// The cluster `name` names: a preset (at the preset's own ranks per node
/// unless given) or a cluster file (its own ranks per node unless given);
/// `world` defaults to the file's nodes.
pub(crate) fn resolve_cluster(
    name: &str,
    world: Option<u32>,
    ranks_per_node: Option<u32>,
) -> Result<Cluster, CliError> {
    if fsdpc_planner::presets::PRESETS
        .iter()
        .any(|(n, _)| *n == name)
    {
        let world = world.ok_or_else(|| {
            CliError::Usage(format!("the preset {name} needs a world size (--world)"))
        })?;
        return Ok(fsdpc_planner::preset(name, world, ranks_per_node)?);
    }
    let path = Path::new(name);
    if !path.exists() {
        return Err(CliError::Usage(format!(
            "--cluster {name}: neither a preset ({}) nor a file",
            fsdpc_planner::presets::PRESETS.map(|(n, _)| n).join(", ")
        )));
    }
    let text = read_file(path)?;
    Cluster::from_file(&text, world, ranks_per_node)
        .map_err(|e| CliError::Usage(format!("{name}: {e}")))
}

/// `cfg` with the precision policy of the flags: `--mixed-precision` for
/// all three dtypes, each overridden by its own flag.
fn with_precision(mut cfg: FsdpConfig, f: &PlanFlags) -> Result<FsdpConfig, CliError> {
    use fsdpc_planner::precision::{parse_dtype, parse_mixed};
    if let Some(m) = &f.mixed_precision {
        let d = parse_mixed(m)?;
        (cfg.param_dtype, cfg.reduce_dtype, cfg.buffer_dtype) = (d, d, d);
    }
    if let Some(d) = &f.param_dtype {
        cfg.param_dtype = parse_dtype("param dtype", d)?;
    }
    if let Some(d) = &f.reduce_dtype {
        cfg.reduce_dtype = parse_dtype("reduce dtype", d)?;
    }
    if let Some(d) = &f.buffer_dtype {
        cfg.buffer_dtype = parse_dtype("buffer dtype", d)?;
    }
    cfg.init_loss_scale = f.init_loss_scale;
    Ok(cfg)
}

/// The learning-rate schedule the flags ask for, checked against `--lr`.
fn lr_schedule(f: &PlanFlags) -> Result<fsdpc_plan::LrSchedule, CliError> {
    use fsdpc_plan::LrDecay;
    let decay = LrDecay::parse(&f.lr_schedule)?;
    let usage = |m: String| Err(CliError::Usage(m));
    let decay_steps = match (decay, f.lr_decay_steps) {
        (LrDecay::Constant, Some(_)) => {
            return usage(
                "--lr-decay-steps says when a decay ends: give --lr-schedule cosine or linear"
                    .into(),
            )
        }
        (LrDecay::Constant, None) => 0,
        (_, Some(n)) => n,
        (_, None) => {
            return usage(format!(
                "--lr-schedule {}: say when the decay reaches --min-lr (--lr-decay-steps N)",
                decay.name()
            ))
        }
    };
    let schedule = fsdpc_plan::LrSchedule {
        decay,
        warmup_steps: f.warmup_steps,
        decay_steps,
        min_lr: f.min_lr,
    };
    schedule.check(f.lr)?;
    Ok(schedule)
}

/// The optimizer the flags ask for, its hyperparameters checked: a value
/// outside its range is a usage error naming the flag.
pub(crate) fn optimizer(f: &PlanFlags) -> Result<Optimizer, CliError> {
    let o = named_optimizer(f)?;
    o.check().map_err(|e| {
        CliError::Usage(format!(
            "--{} {}: {}",
            e.name.replace('_', "-"),
            e.value,
            e.expected
        ))
    })?;
    Ok(o)
}

fn named_optimizer(f: &PlanFlags) -> Result<Optimizer, CliError> {
    match f.optimizer.as_str() {
        "adamw" | "adam" => Ok(Optimizer::AdamW {
            lr: f.lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: f.weight_decay,
        }),
        "sgd" => Ok(Optimizer::Sgd {
            lr: f.lr,
            momentum: 0.0,
            weight_decay: f.weight_decay,
        }),
        other => Err(CliError::Usage(format!(
            "unknown optimizer `{other}` (expected adamw or sgd)"
        ))),
    }
}
