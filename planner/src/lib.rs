//! fsdpc-planner: decides how a training program is sharded and emits a static
//! schedule (`Plan`).
//!
//! The planner is a list of passes, each a function from data to data
//! named for what it decides: `passes()` lists them, with their stage, in
//! the order `compile` runs them; the `passes` module holds the tables
//! and the loops that run them. After the passes the plan is verified in
//! every build (`Plan::validate`); a violation is `PlanError::Invalid`, a
//! bug in a pass, never a plan handed on.

pub mod auto;
pub mod clip;
pub mod config;
pub mod cost;
pub mod device;
pub mod error;
mod eval;
pub mod fit;
pub mod flat;
pub mod freeze;
pub mod memory;
pub mod offload;
pub mod overlap;
mod passes;
pub mod precision;
pub mod presets;
pub mod quantize;
pub mod recompute;
pub mod rewrite;
pub mod scaler;
pub mod schedule;
pub mod simulate;
pub mod target;
pub mod tensor;
pub mod units;
pub mod workspace;

pub use config::FsdpConfig;
pub use error::PlanError;
pub use passes::{passes, PassInfo, Stage};
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
    if cfg.check_fits && plan.memory.device_peak_bytes() > cluster.memory_bytes {
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
    let plan = passes::place(passes::lower(prepared, model, cluster, cfg)?, cluster)?;
    cfg.target.check(&plan)?;
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
    /// `memory.device_peak_bytes()` of the compiled plan: the peak and the
    /// memory outside the arena (`device::outside_arena`, which depends on
    /// the instructions alone).
    pub device_peak_bytes: u64,
    /// At most the compiled plan's simulated step. Without contention: the
    /// simulated step of the schedule without fences (fences only add
    /// waits, and in the one-pass simulation a wait never makes anything
    /// start earlier). With contention, where slowing one stream may speed
    /// another: the busiest stream's total work at full speed.
    pub step_lower_s: f64,
    /// The busiest stream's total work at full speed (a bound for every
    /// schedule that runs the same instructions).
    pub busy_s: f64,
    /// At most the step of every plan whose streams run the same
    /// instructions in the same orders, whatever they wait for
    /// (`simulate::Bounds::relaxed_s`): a bound for each member of the
    /// auto-planner's class, whose schedule knobs change only waits.
    pub class_s: f64,
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
    let passes::Lowered {
        mut plan,
        mut sched,
        heap_bytes,
    } = passes::lower(prepared, model, cluster, cfg)?;
    fsdpc_plan::memory::set_lifetimes(&mut sched.buffers, &sched.instructions);
    let mut memory = fsdpc_plan::memory::summarize(&sched.buffers, sched.instructions.len(), 0);
    memory.heap_bytes = heap_bytes;
    memory.rank_bytes = memory.peak_bytes + memory.host_peak_bytes + heap_bytes;
    plan.buffers = sched.buffers;
    plan.events = sched.events;
    plan.instructions = sched.instructions;
    plan.memory = memory;
    plan.memory.outside_arena = device::outside_arena(&plan, &cluster.hardware);
    let bounds = simulate::bounds(&plan, cluster);
    Ok(Quick {
        peak_bytes: plan.memory.peak_bytes,
        device_peak_bytes: plan.memory.device_peak_bytes(),
        plan,
        step_lower_s: bounds.step_s,
        busy_s: bounds.busy_s,
        class_s: bounds.relaxed_s,
    })
}

/// The configuration's own checks and the sharding factor it gives on
/// `cluster` (what every compile refuses first).
fn check(cluster: &Cluster, cfg: &FsdpConfig) -> Result<(u32, ReshardAfterForward), PlanError> {
    cfg.check()?;
    target::check(cfg)?;
    let t = cfg.tensor_parallel;
    if t == 0 || !cluster.world.is_multiple_of(t) {
        return Err(PlanError::BadConfig {
            what: "tensor_parallel",
            value: t.to_string(),
            reason: if t == 0 {
                "must be at least 1 (1: no tensor parallelism)".to_string()
            } else {
                format!("must divide the world of {} ranks", cluster.world)
            },
        });
    }
    let shard_factor = cfg.shard_factor(cluster.world, cluster.ranks_per_node)?;
    let reshard = cfg.reshard(shard_factor)?;
    Ok((shard_factor, reshard))
}

/// A program after the program passes (`prepare`, `Stage::Program`): what
/// depends on the program and on the settings `Prepared::key` names only,
/// not on the strategy, F, offload or the schedule knobs. The auto-planner
/// prepares once per key and lowers every candidate from a copy.
#[derive(Clone, Debug)]
pub struct Prepared {
    program: std::sync::Arc<TrainingProgram>,
    tensor: Option<TensorRecord>,
    assign: units::UnitAssignment,
    checkpointed_units: Vec<UnitId>,
}

impl Prepared {
    /// The settings `prepare` reads: configurations with the same key
    /// prepare the same program.
    pub fn key(cfg: &FsdpConfig) -> String {
        format!(
            "{}|{}|{:?}|{}|{}|{}|{:?}|{:?}|{:?}",
            cfg.tensor_parallel,
            cfg.sequence_parallel,
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

/// Runs the program passes on `program` (`Prepared`).
pub fn prepare(program: TrainingProgram, cfg: &FsdpConfig) -> Result<Prepared, PlanError> {
    passes::prepare(program, cfg)
}

/// `prepare` from what the `tensor` pass gave for `cfg`'s degree and
/// sequence setting (`tensor::apply`), so that configurations of one
/// degree split the program once.
pub(crate) fn prepare_split(
    program: TrainingProgram,
    tensor: Option<TensorRecord>,
    cfg: &FsdpConfig,
) -> Result<Prepared, PlanError> {
    passes::prepare_split(program, tensor, cfg)
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
