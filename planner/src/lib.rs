//! fsdpc-planner: decides how a training program is sharded and emits a static
//! schedule (`Plan`).
//!
//! The planner is a list of passes, each a function from data to data named
//! for what it decides (see `compile`):
//!
//! 0. `freeze::apply`: the `--freeze` patterns' parameters frozen in the
//!    training program (no gradient; backward nodes only they needed
//!    removed); then `precision::apply`: the program retyped to the
//!    mixed-precision policy (parameters, activations and gradients in
//!    `param_dtype`, the loss in f32);
//! 1. `units::assign_units`: FSDP units from the module tree (wrap policy);
//!    then `recompute::apply`: activation checkpointing rewrites the program
//!    (checkpointed units recompute their forward in backward), and units
//!    are assigned again on the rewritten graph;
//! 2. `flat::layout_units`: flat-parameter layout and shards;
//! 3. `schedule::lower`: the instruction list (gathers, kernels, frees,
//!    reductions, optimizer steps, events); `wire::apply` puts the wire
//!    formats (low-precision collectives) and their scratch on it;
//!    `rewrite::apply` rewrites each native collective with egg (cast
//!    before gathering, hierarchical all-gather and reduce-scatter,
//!    all-reduce as reduce-scatter then all-gather) into the form the
//!    cluster's cost model charges least, with its staging buffer, and
//!    buckets the gathers a stream issues back to back where that makes
//!    their parameters ready sooner on the whole;
//!    then `workspace::plan_workspaces`: each kernel's scratch, one
//!    `Workspace` buffer per stream that runs kernels, and the bound of
//!    what the matrix-product library allocates on its own (before it,
//!    `clip::insert` and, for fp16, `scaler::insert` rewrite the optimizer
//!    tail);
//! 4. `memory::plan_memory`: lifetimes, arena offsets, fences, exact peak;
//! 5. `overlap::relieve_stalls`: simulates the step (`simulate`: cost model
//!    and discrete-event simulation) and, where a memory fence stalls a
//!    stream, plans memory again with those buffers apart (arena bytes for
//!    overlap, while the arena fits the rank's memory); sets the estimates.
//!
//! The plan is validated after the passes in every build (`Plan::validate`);
//! a violation is `PlanError::Invalid`, a bug in a pass, never a plan handed on.

pub mod auto;
pub mod clip;
pub mod compare;
pub mod config;
pub mod cost;
pub mod error;
pub mod fit;
pub mod flat;
pub mod freeze;
pub mod inspect;
pub mod memory;
pub mod offload;
pub mod overlap;
pub mod precision;
pub mod presets;
pub mod quantize;
pub mod recompute;
pub mod report;
pub mod rewrite;
pub mod scaler;
pub mod schedule;
pub mod simulate;
pub mod trace;
pub mod units;
pub mod workspace;

pub use config::FsdpConfig;
pub use error::PlanError;
pub use presets::preset;

use fsdpc_ir::TrainingProgram;
use fsdpc_plan::*;

/// Plans `program` for `cluster` with `cfg`: runs every pass and returns the
/// plan. With `cfg.check_fits`, a plan whose peak exceeds the rank's memory is
/// `PlanError::DoesNotFit`, with a suggestion of what would fit.
pub fn compile(
    program: TrainingProgram,
    model: ModelInfo,
    cluster: &Cluster,
    cfg: &FsdpConfig,
) -> Result<Plan, PlanError> {
    let plan = compile_unchecked(program, model, cluster, cfg)?;
    if cfg.check_fits && plan.memory.peak_bytes > cluster.memory_bytes {
        return Err(fit::does_not_fit(&plan, cluster, cfg));
    }
    Ok(plan)
}

/// `compile` without the memory-capacity check.
pub fn compile_unchecked(
    program: TrainingProgram,
    model: ModelInfo,
    cluster: &Cluster,
    cfg: &FsdpConfig,
) -> Result<Plan, PlanError> {
    check(cluster, cfg)?;
    compile_prepared(prepare(program, cfg)?, model, cluster, cfg)
}

/// `compile_unchecked` from a prepared program (`prepare`, with `cfg`'s
/// `Prepared::key`).
pub fn compile_prepared(
    prepared: Prepared,
    model: ModelInfo,
    cluster: &Cluster,
    cfg: &FsdpConfig,
) -> Result<Plan, PlanError> {
    let Lowered {
        mut plan,
        sched,
        heap_bytes,
    } = lower(prepared, model, cluster, cfg)?;
    let scheduled = sched.clone();
    let mut sched = sched;
    let (mut memory, fences) = memory::plan_memory(&mut sched, &memory::Apart::new());
    memory.heap_bytes = heap_bytes;
    memory.rank_bytes = memory.arena_bytes + memory.host_arena_bytes + heap_bytes;
    plan.buffers = sched.buffers;
    plan.events = sched.events;
    plan.instructions = sched.instructions;
    plan.memory = memory;
    overlap::relieve_stalls(&mut plan, &scheduled, fences, heap_bytes, cluster);
    plan.validate().map_err(PlanError::Invalid)?;
    Ok(plan)
}

/// A configuration judged without planning its arena: the exact peak and a
/// lower bound of the step `compile_unchecked` would simulate, at a small
/// fraction of its cost (the auto-planner's screen).
#[derive(Clone, Debug)]
pub struct Quick {
    /// The plan before memory planning: buffers with lifetimes but no
    /// offsets, no fences, `memory` with the exact peaks (`arena_bytes` 0,
    /// `rank_bytes` the device and host peaks plus the heap bound: at most
    /// the compiled figure) and no estimates.
    pub plan: Plan,
    /// `memory.peak_bytes` of the compiled plan: live bytes do not depend on
    /// offsets, and the fences memory planning inserts (records and waits)
    /// write and free nothing.
    pub peak_bytes: u64,
    /// At most the compiled plan's simulated step. Without contention: the
    /// simulated step of the schedule without fences (fences only add
    /// waits, and in the one-pass simulation a wait never makes anything
    /// start earlier). With contention, where slowing one stream may speed
    /// another: the busiest stream's total work at full speed.
    pub step_lower_s: f64,
    /// The busiest stream's total work at full speed (a bound for every
    /// schedule that runs the same instructions).
    pub busy_s: f64,
}

/// Runs every pass up to memory planning and judges the result (`Quick`).
pub fn quick(
    program: TrainingProgram,
    model: ModelInfo,
    cluster: &Cluster,
    cfg: &FsdpConfig,
) -> Result<Quick, PlanError> {
    check(cluster, cfg)?;
    quick_prepared(prepare(program, cfg)?, model, cluster, cfg)
}

/// `quick` from a prepared program (`prepare`, with `cfg`'s
/// `Prepared::key`).
pub fn quick_prepared(
    prepared: Prepared,
    model: ModelInfo,
    cluster: &Cluster,
    cfg: &FsdpConfig,
) -> Result<Quick, PlanError> {
    let Lowered {
        mut plan,
        mut sched,
        heap_bytes,
    } = lower(prepared, model, cluster, cfg)?;
    fsdpc_plan::memory::set_lifetimes(&mut sched.buffers, &sched.instructions);
    let mut memory = fsdpc_plan::memory::summarize(&sched.buffers, sched.instructions.len(), 0);
    memory.heap_bytes = heap_bytes;
    memory.rank_bytes = memory.peak_bytes + memory.host_peak_bytes + heap_bytes;
    plan.buffers = sched.buffers;
    plan.events = sched.events;
    plan.instructions = sched.instructions;
    plan.memory = memory;
    let busy_s = simulate::busiest_stream_s(&plan, cluster);
    let step_lower_s = if simulate::contends(cluster) {
        busy_s
    } else {
        simulate::simulate(&plan, cluster).step_time_s
    };
    Ok(Quick {
        peak_bytes: plan.memory.peak_bytes,
        plan,
        step_lower_s,
        busy_s,
    })
}

/// What the passes before memory planning give: the plan without its
/// buffers, instructions, memory and estimates, and the schedule that
/// holds them.
struct Lowered {
    plan: Plan,
    sched: schedule::Schedule,
    heap_bytes: u64,
}

/// The configuration's own checks and the sharding factor it gives on
/// `cluster` (what every compile refuses first).
fn check(cluster: &Cluster, cfg: &FsdpConfig) -> Result<(u32, ReshardAfterForward), PlanError> {
    cfg.check()?;
    let shard_factor = cfg.shard_factor(cluster.world, cluster.ranks_per_node)?;
    let reshard = cfg.reshard(shard_factor)?;
    Ok((shard_factor, reshard))
}

/// The program side of lowering, passes 0 to 2b (freeze, precision,
/// units, checkpointing): what depends on the program and on the settings
/// `Prepared::key` names only, not on the strategy, F, offload or the
/// schedule knobs. The auto-planner prepares once per key and lowers every
/// candidate from a copy.
#[derive(Clone, Debug)]
pub struct Prepared {
    program: TrainingProgram,
    assign: units::UnitAssignment,
    checkpointed_units: Vec<UnitId>,
}

impl Prepared {
    /// The settings `prepare` reads: configurations with the same key
    /// prepare the same program.
    pub fn key(cfg: &FsdpConfig) -> String {
        format!(
            "{:?}|{}|{}|{}|{:?}|{:?}|{:?}",
            cfg.freeze,
            cfg.param_dtype,
            cfg.reduce_dtype,
            cfg.buffer_dtype,
            cfg.wrap,
            cfg.shared_params,
            cfg.activation_checkpointing
        )
    }
}

/// Passes 0 to 2b on `program` (`Prepared`).
pub fn prepare(program: TrainingProgram, cfg: &FsdpConfig) -> Result<Prepared, PlanError> {
    let program = freeze::apply(program, &cfg.freeze)?;
    let program = precision::apply(program, cfg)?;
    let assign = units::assign_units_with(&program.graph, &cfg.wrap, cfg.shared_params)?;
    let checkpointed_units: Vec<UnitId> =
        recompute::selected_units(&assign, &cfg.activation_checkpointing)?
            .into_iter()
            .collect();
    let (program, assign) = checkpointed(program, assign, cfg)?;
    Ok(Prepared {
        program,
        assign,
        checkpointed_units,
    })
}

/// Passes 2c to 3 (flat layout, schedule, clipping, the loss scaler,
/// workspaces) on a prepared program.
fn lower(
    prepared: Prepared,
    model: ModelInfo,
    cluster: &Cluster,
    cfg: &FsdpConfig,
) -> Result<Lowered, PlanError> {
    let (shard_factor, reshard) = check(cluster, cfg)?;
    let Prepared {
        program,
        assign,
        checkpointed_units,
    } = prepared;
    let offloaded = offload::UnitOffload::select(cfg, &assign)?;
    let mut units = flat::layout_units(&program.graph, &assign, shard_factor)?;
    cfg.reshard_units(shard_factor, reshard, &mut units)?;
    let mut sched = schedule::lower(&schedule::LowerInput {
        program: &program,
        assign: &assign,
        units: &units,
        cfg,
        world: cluster.world,
        shard_factor,
        reshard,
        offload: offloaded.clone(),
    })?;
    quantize::apply(&mut sched, &units, shard_factor, cfg.wires());
    let rewrites = rewrite::apply(
        &mut sched,
        &rewrite::RewriteInput {
            cluster,
            shard_factor,
            rules: &cfg.rewrites,
        },
    )?;
    if let Some(max_norm) = cfg.clip_grad_norm {
        clip::insert(&mut sched, max_norm, shard_factor > 1)?;
    }
    let loss_scaler =
        precision::needs_scaler(cfg).then(|| scaler::torch_defaults(cfg.init_loss_scale));
    if let Some(s) = &loss_scaler {
        let groups = scaler::Groups {
            shard: shard_factor,
            replicate: cluster.world / shard_factor.max(1),
        };
        scaler::insert(&mut sched, &program, s, groups)?;
    }
    offload::stage_state(&mut sched, &offloaded);
    let heap_bytes = workspace::plan_workspaces(
        &mut sched,
        &program.graph,
        cluster.hardware.cpu_gemm.as_ref(),
    );
    let plan = Plan {
        schema: SCHEMA.to_string(),
        // Each rank processes `grad_accum` micro-batches per step.
        model: ModelInfo {
            tokens_per_rank_step: model.tokens_per_rank_step * u64::from(cfg.grad_accum),
            ..model
        },
        cluster: cluster.clone(),
        config: PlanConfig {
            strategy: cfg.strategy,
            shard_factor,
            wrap: cfg.wrap.clone(),
            backward_prefetch: cfg.backward_prefetch,
            limit_all_gathers: cfg.limit_all_gathers,
            param_dtype: cfg.param_dtype,
            reduce_dtype: cfg.reduce_dtype,
            buffer_dtype: cfg.buffer_dtype,
            loss_scaler,
            activation_checkpointing: cfg.activation_checkpointing.clone(),
            checkpointed_units,
            clip_grad_norm: cfg.clip_grad_norm,
            reshard_after_forward: reshard,
            forward_prefetch: cfg.forward_prefetch,
            prefetch_depth: cfg.prefetch_depth,
            grad_accum: cfg.grad_accum,
            no_sync: cfg.no_sync && cfg.grad_accum > 1,
            freeze: cfg.freeze.clone(),
            shared_params: cfg.shared_params,
            cpu_offload: cfg.cpu_offload,
            offloaded_units: offloaded.units.iter().copied().collect(),
            offload_what: offloaded.what,
            auto: None,
            allgather_wire: cfg.allgather_wire,
            reduce_scatter_wire: cfg.reduce_scatter_wire,
        },
        units,
        // The offload stream only where it is used, so other plans read as
        // before.
        streams: Stream::ALL
            .into_iter()
            .filter(|&s| s != Stream::Offload || cfg.cpu_offload)
            .collect(),
        buffers: Vec::new(),
        events: 0,
        loss: sched.loss,
        instructions: Vec::new(),
        memory: MemorySummary::default(),
        estimates: Estimates::default(),
        training: program,
        rewrites,
    };
    Ok(Lowered {
        plan,
        sched,
        heap_bytes,
    })
}

/// Runs the checkpointing pass; when it rewrote the program, assigns units
/// again (the units are the same: clones keep their module and read the same
/// parameters, but nodes have new ids).
fn checkpointed(
    program: TrainingProgram,
    assign: units::UnitAssignment,
    cfg: &FsdpConfig,
) -> Result<(TrainingProgram, units::UnitAssignment), PlanError> {
    if cfg.activation_checkpointing == CheckpointPolicy::None {
        return Ok((program, assign));
    }
    let program = recompute::apply(program, &assign, cfg.activation_checkpointing.clone())?;
    let assign = units::assign_units_with(&program.graph, &cfg.wrap, cfg.shared_params)?;
    Ok((program, assign))
}

/// Parameter elements of a program (tied parameters counted once): what
/// `ModelInfo::params` should hold.
pub fn count_params(program: &TrainingProgram) -> u64 {
    program
        .graph
        .params
        .iter()
        .filter(|p| p.tied_to.is_none())
        .map(|p| p.ty.numel())
        .sum()
}
