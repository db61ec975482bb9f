//! The planner's passes as data: each a name, what it decides, and the
//! function from data to data that decides it, in the order `compile`
//! runs them (`passes()` lists them; ARCHITECTURE.md's table is checked
//! against that list).
//!
//! Three stages, each a table run by one loop over its own data:
//! - the program passes (`Stage::Program`): what depends on the program
//!   and on the settings `Prepared::key` names only; `prepare` runs them,
//!   and the auto-planner prepares once per key and lowers every
//!   candidate from a copy;
//! - the schedule passes (`Stage::Schedule`): the instruction list and
//!   its buffers; `quick` stops after them;
//! - the memory passes (`Stage::Memory`): arena offsets and fences, then
//!   the simulated step. Each leaves a whole plan: it is verified
//!   (`Plan::validate`) after every memory pass in debug builds and tests,
//!   and after the last in every build; a violation is
//!   `PlanError::Invalid`, a bug in a pass, never a plan handed on.

use crate::config::FsdpConfig;
use crate::error::PlanError;
use crate::memory::{self, Fence};
use crate::offload::UnitOffload;
use crate::schedule::{self, Schedule};
use crate::units::{self, UnitAssignment};
use crate::{
    clip, eval, flat, freeze, offload, overlap, precision, quantize, recompute, rewrite, scaler,
    workspace, Prepared,
};
use fsdpc_ir::TrainingProgram;
use fsdpc_plan::cluster::Cluster;
use fsdpc_plan::*;
use std::sync::Arc;

/// The part of compiling a pass belongs to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The training program and its units (`prepare`).
    Program,
    /// The instruction list and its buffers (`quick` stops after these).
    Schedule,
    /// Arena offsets, fences and the simulated step (`compile` only).
    Memory,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Program => "program",
            Stage::Schedule => "schedule",
            Stage::Memory => "memory",
        }
    }
}

/// A pass as `passes()` lists it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct PassInfo {
    pub name: &'static str,
    pub stage: Stage,
    /// What the pass decides, in a sentence.
    pub decides: &'static str,
}

/// Every pass, in the order `compile` runs them.
pub fn passes() -> Vec<PassInfo> {
    fn infos<S>(stage: Stage, passes: &[Pass<S>]) -> impl Iterator<Item = PassInfo> + '_ {
        passes.iter().map(move |p| PassInfo {
            name: p.name,
            stage,
            decides: p.decides,
        })
    }
    infos(Stage::Program, &program_passes())
        .chain(infos(Stage::Schedule, &schedule_passes()))
        .chain(infos(Stage::Memory, &memory_passes()))
        .collect()
}

/// One pass over a stage's data `S`.
struct Pass<S> {
    name: &'static str,
    decides: &'static str,
    run: fn(S) -> Result<S, PlanError>,
}

/// Runs `passes` in order on `data`.
fn run<S>(passes: &[Pass<S>], data: S) -> Result<S, PlanError> {
    passes.iter().try_fold(data, |data, p| (p.run)(data))
}

// The program passes.

fn program_passes<'a>() -> [Pass<ProgramData<'a>>; 5] {
    [
        Pass {
            name: "tensor",
            decides: "which layers split over the tensor group (column- and row-parallel \
                      products, heads, the vocabulary of the embedding, head and loss, \
                      padded to a multiple of T), \
                      which activations between them are row chunks (sequence \
                      parallelism) and each member's part of the program",
            run: tensor,
        },
        Pass {
            name: "freeze",
            decides: "which parameters train: those the `--freeze` patterns match lose \
                      their gradients, and the backward nodes only they needed go",
            run: freeze,
        },
        Pass {
            name: "precision",
            decides: "the program's dtypes under the mixed-precision policy: parameters, \
                      activations and gradients in `param_dtype`, the loss in f32; the casts \
                      it inserts run just before their readers",
            run: precision,
        },
        Pass {
            name: "units",
            decides: "the FSDP units (the wrap policy) and which unit owns each parameter \
                      and each node",
            run: units,
        },
        Pass {
            name: "recompute",
            decides: "which units recompute their forward in backward (activation \
                      checkpointing), and the program rewritten to do it",
            run: recompute,
        },
    ]
}

/// What the program passes read and write.
struct ProgramData<'a> {
    cfg: &'a FsdpConfig,
    program: TrainingProgram,
    /// Set by `tensor` when T > 1.
    tensor: Option<TensorRecord>,
    /// Set by `units`.
    assign: Option<UnitAssignment>,
    checkpointed_units: Vec<UnitId>,
}

const NO_UNITS: &str = "the units pass runs before the passes that read units";

/// Runs the program passes on `program` (`crate::prepare`).
pub(crate) fn prepare(program: TrainingProgram, cfg: &FsdpConfig) -> Result<Prepared, PlanError> {
    prepare_from(&program_passes(), program, None, cfg)
}

/// `prepare` of the `tensor` pass's output for `cfg`'s degree and sequence
/// setting (`crate::tensor::apply`): the passes after it.
pub(crate) fn prepare_split(
    program: TrainingProgram,
    tensor: Option<TensorRecord>,
    cfg: &FsdpConfig,
) -> Result<Prepared, PlanError> {
    let passes = program_passes();
    let after = passes
        .iter()
        .position(|p| p.name == "tensor")
        .map_or(0, |i| i + 1);
    prepare_from(&passes[after..], program, tensor, cfg)
}

fn prepare_from<'a>(
    passes: &[Pass<ProgramData<'a>>],
    program: TrainingProgram,
    tensor: Option<TensorRecord>,
    cfg: &'a FsdpConfig,
) -> Result<Prepared, PlanError> {
    let data = ProgramData {
        cfg,
        program,
        tensor,
        assign: None,
        checkpointed_units: Vec::new(),
    };
    let ProgramData {
        program,
        tensor,
        assign,
        checkpointed_units,
        ..
    } = run(passes, data)?;
    Ok(Prepared {
        program: Arc::new(program),
        tensor,
        assign: assign.expect(NO_UNITS),
        checkpointed_units,
    })
}

fn tensor(mut d: ProgramData<'_>) -> Result<ProgramData<'_>, PlanError> {
    let (program, record) =
        crate::tensor::apply(d.program, d.cfg.tensor_parallel, d.cfg.sequence_parallel)?;
    d.program = program;
    d.tensor = record;
    Ok(d)
}

fn freeze(mut d: ProgramData<'_>) -> Result<ProgramData<'_>, PlanError> {
    d.program = freeze::apply(d.program, &d.cfg.freeze)?;
    Ok(d)
}

fn precision(mut d: ProgramData<'_>) -> Result<ProgramData<'_>, PlanError> {
    d.program = precision::apply(d.program, d.cfg)?;
    Ok(d)
}

fn units(mut d: ProgramData<'_>) -> Result<ProgramData<'_>, PlanError> {
    d.assign = Some(units::assign_units_with(
        &d.program.graph,
        &d.cfg.wrap,
        d.cfg.shared_params,
    )?);
    Ok(d)
}

/// When the pass rewrote the program, its units are assigned again (the
/// units are the same: clones keep their module and read the same
/// parameters, but nodes have new ids).
fn recompute(mut d: ProgramData<'_>) -> Result<ProgramData<'_>, PlanError> {
    let cfg = d.cfg;
    let assign = d.assign.take().expect(NO_UNITS);
    d.checkpointed_units = recompute::selected_units(&assign, &cfg.activation_checkpointing)?
        .into_iter()
        .collect();
    if cfg.activation_checkpointing == CheckpointPolicy::None {
        d.assign = Some(assign);
        return Ok(d);
    }
    d.program = recompute::apply(d.program, &assign, cfg.activation_checkpointing.clone())?;
    d.assign = Some(units::assign_units_with(
        &d.program.graph,
        &cfg.wrap,
        cfg.shared_params,
    )?);
    Ok(d)
}

// The schedule passes.

fn schedule_passes<'a>() -> [Pass<ScheduleData<'a>>; 9] {
    [
        Pass {
            name: "offload",
            decides: "which units keep their shards or their optimizer state in host \
                      memory (`--cpu-offload`, `--offload-what`)",
            run: offload,
        },
        Pass {
            name: "flat",
            decides: "each unit's flat-parameter layout and shards, and what it keeps of \
                      its parameters after forward",
            run: flat,
        },
        Pass {
            name: "schedule",
            decides: "the instruction list: gathers, kernels, frees, reductions, optimizer \
                      steps, and the events between streams",
            run: schedule,
        },
        Pass {
            name: "quantize",
            decides: "the wire format of each all-gather and reduce-scatter, with its \
                      scratch buffer",
            run: quantize,
        },
        Pass {
            name: "rewrite",
            decides: "the form of each native collective the cost model charges least \
                      (egg rewrites), with its staging buffer, and which gathers share a bucket",
            run: rewrite,
        },
        Pass {
            name: "clip",
            decides: "gradient clipping on the optimizer tail (`clip_grad_norm`)",
            run: clip,
        },
        Pass {
            name: "scaler",
            decides: "the fp16 loss scaler and its instructions (when the policy computes \
                      or reduces in fp16)",
            run: scaler,
        },
        Pass {
            name: "offload-staging",
            decides: "where offloaded optimizer state is copied to the device and back \
                      around its step (`--offload-what optimizer`)",
            run: offload_staging,
        },
        Pass {
            name: "workspace",
            decides: "each kernel's scratch, one workspace buffer per stream, and the \
                      bound of the matrix library's own heap",
            run: workspace,
        },
    ]
}

/// What the schedule passes read and write.
struct ScheduleData<'a> {
    cfg: &'a FsdpConfig,
    cluster: &'a Cluster,
    shard_factor: u32,
    reshard: ReshardAfterForward,
    program: Arc<TrainingProgram>,
    tensor: Option<TensorRecord>,
    assign: UnitAssignment,
    checkpointed_units: Vec<UnitId>,
    offloaded: UnitOffload,
    units: Vec<Unit>,
    /// Set by `schedule`.
    sched: Option<Schedule>,
    rewrites: RewriteReport,
    loss_scaler: Option<LossScaler>,
    heap_bytes: u64,
}

const NO_SCHEDULE: &str = "the schedule pass runs before the passes that rewrite it";

/// What the schedule passes give: the plan without its buffers,
/// instructions, memory and estimates, and the schedule that holds them.
pub(crate) struct Lowered {
    pub plan: Plan,
    pub sched: Schedule,
    pub heap_bytes: u64,
}

/// Runs the schedule passes on a prepared program.
pub(crate) fn lower(
    prepared: Prepared,
    model: ModelInfo,
    cluster: &Cluster,
    cfg: &FsdpConfig,
) -> Result<Lowered, PlanError> {
    let (shard_factor, reshard) = crate::check(cluster, cfg)?;
    let Prepared {
        program,
        tensor,
        assign,
        checkpointed_units,
    } = prepared;
    let data = ScheduleData {
        cfg,
        cluster,
        shard_factor,
        reshard,
        program,
        tensor,
        assign,
        checkpointed_units,
        offloaded: UnitOffload::default(),
        units: Vec::new(),
        sched: None,
        rewrites: RewriteReport::default(),
        loss_scaler: None,
        heap_bytes: 0,
    };
    Ok(run(&schedule_passes(), data)?.lowered(model))
}

impl ScheduleData<'_> {
    /// The plan around the schedule.
    fn lowered(self, model: ModelInfo) -> Lowered {
        let cfg = self.cfg;
        let sched = self.sched.expect(NO_SCHEDULE);
        let plan = Plan {
            schema: SCHEMA.to_string(),
            // Each rank processes `grad_accum` micro-batches per step.
            model: ModelInfo {
                tokens_per_rank_step: model.tokens_per_rank_step * u64::from(cfg.grad_accum),
                ..model
            },
            cluster: self.cluster.clone(),
            config: PlanConfig {
                settings: Settings {
                    no_sync: cfg.no_sync && cfg.grad_accum > 1,
                    ..cfg.settings.clone()
                },
                shard_factor: self.shard_factor,
                reshard_after_forward: self.reshard,
                loss_scaler: self.loss_scaler,
                checkpointed_units: self.checkpointed_units,
                offloaded_units: self.offloaded.units.iter().copied().collect(),
                auto: None,
                target: cfg.target.target.clone(),
                tensor: self.tensor,
            },
            units: self.units,
            // The offload stream only where it is used, so other plans read
            // as before.
            streams: Stream::ALL
                .into_iter()
                .filter(|&s| s != Stream::Offload || cfg.cpu_offload)
                .collect(),
            buffers: Vec::new(),
            events: 0,
            loss: sched.loss,
            instructions: Vec::new(),
            eval: None,
            memory: MemorySummary::default(),
            estimates: Estimates::default(),
            training: self.program,
            rewrites: self.rewrites,
        };
        Lowered {
            plan,
            sched,
            heap_bytes: self.heap_bytes,
        }
    }
}

fn offload(mut d: ScheduleData<'_>) -> Result<ScheduleData<'_>, PlanError> {
    d.offloaded = UnitOffload::select(d.cfg, &d.assign)?;
    Ok(d)
}

fn flat(mut d: ScheduleData<'_>) -> Result<ScheduleData<'_>, PlanError> {
    d.units = flat::layout_units(&d.program.graph, &d.assign, d.shard_factor)?;
    flat::mark_decay(&d.program.graph, &mut d.units, d.cfg.decay_all);
    d.cfg
        .reshard_units(d.shard_factor, d.reshard, &mut d.units)?;
    Ok(d)
}

fn schedule(mut d: ScheduleData<'_>) -> Result<ScheduleData<'_>, PlanError> {
    d.sched = Some(schedule::lower(&schedule::LowerInput {
        program: &d.program,
        assign: &d.assign,
        units: &d.units,
        cfg: d.cfg,
        world: d.cluster.world / d.cfg.tensor_parallel.max(1),
        shard_factor: d.shard_factor,
        reshard: d.reshard,
        offload: d.offloaded.clone(),
    })?);
    Ok(d)
}

fn quantize(mut d: ScheduleData<'_>) -> Result<ScheduleData<'_>, PlanError> {
    let sched = d.sched.as_mut().expect(NO_SCHEDULE);
    quantize::apply(sched, &d.units, d.shard_factor, d.cfg.wires());
    Ok(d)
}

fn rewrite(mut d: ScheduleData<'_>) -> Result<ScheduleData<'_>, PlanError> {
    let sched = d.sched.as_mut().expect(NO_SCHEDULE);
    d.rewrites = rewrite::apply(
        sched,
        &rewrite::RewriteInput {
            cluster: d.cluster,
            shard_factor: d.shard_factor,
            rules: &crate::target::rules(d.cfg),
        },
    )?;
    Ok(d)
}

fn clip(mut d: ScheduleData<'_>) -> Result<ScheduleData<'_>, PlanError> {
    let sched = d.sched.as_mut().expect(NO_SCHEDULE);
    if let Some(max_norm) = d.cfg.clip_grad_norm {
        let tensor = d.cfg.tensor_parallel > 1;
        clip::insert(sched, max_norm, d.shard_factor > 1, tensor)?;
    }
    Ok(d)
}

fn scaler(mut d: ScheduleData<'_>) -> Result<ScheduleData<'_>, PlanError> {
    let sched = d.sched.as_mut().expect(NO_SCHEDULE);
    d.loss_scaler =
        precision::needs_scaler(d.cfg).then(|| scaler::torch_defaults(d.cfg.init_loss_scale));
    if let Some(s) = &d.loss_scaler {
        let t = d.cfg.tensor_parallel.max(1);
        let groups = scaler::Groups {
            shard: d.shard_factor,
            replicate: d.cluster.world / t / d.shard_factor.max(1),
            tensor: t,
        };
        scaler::insert(sched, &d.program, s, groups)?;
    }
    Ok(d)
}

fn offload_staging(mut d: ScheduleData<'_>) -> Result<ScheduleData<'_>, PlanError> {
    let sched = d.sched.as_mut().expect(NO_SCHEDULE);
    offload::stage_state(sched, &d.offloaded);
    Ok(d)
}

fn workspace(mut d: ScheduleData<'_>) -> Result<ScheduleData<'_>, PlanError> {
    let sched = d.sched.as_mut().expect(NO_SCHEDULE);
    let heap = workspace::plan_workspaces(
        sched,
        &d.program.graph,
        d.cluster.hardware.cpu_gemm.as_ref(),
    );
    // The CPU matrix library's packing: a GPU rank's products are cuBLAS
    // calls, whose memory is outside the arena's own lines (`device`).
    d.heap_bytes = if d.cfg.target.target == "cuda" {
        0
    } else {
        heap
    };
    Ok(d)
}

// The memory passes.

fn memory_passes<'a>() -> [Pass<MemoryData<'a>>; 4] {
    [
        Pass {
            name: "memory",
            decides: "buffer lifetimes, offsets in the device and host arenas, the fences \
                      that make reuse safe across streams, and the exact peaks",
            run: memory,
        },
        Pass {
            name: "device",
            decides: "on a cluster of GPUs, what a rank holds outside the arena: the CUDA \
                      context, the cuBLAS workspaces and NCCL's buffers by communicator",
            run: device,
        },
        Pass {
            name: "overlap",
            decides: "which stalling fences to trade for arena bytes (the step simulated, \
                      the memory planned again), and the plan's estimates",
            run: overlap,
        },
        Pass {
            name: "eval",
            decides: "the forward-only prefix of the step a runtime runs to evaluate \
                      held-out data: up to micro-batch 0's loss, no gradient, no state written",
            run: eval,
        },
    ]
}

/// What the memory passes read and write.
struct MemoryData<'a> {
    cluster: &'a Cluster,
    plan: Plan,
    /// The schedule before memory planning (what `overlap` plans again).
    scheduled: Schedule,
    heap_bytes: u64,
    /// The fences of the plan's memory plan (set by `memory`).
    fences: Vec<Fence>,
}

/// Runs the memory passes on a lowered plan, verifying each result (see
/// the module header).
pub(crate) fn place(lowered: Lowered, cluster: &Cluster) -> Result<Plan, PlanError> {
    let mut data = MemoryData {
        cluster,
        plan: lowered.plan,
        scheduled: lowered.sched,
        heap_bytes: lowered.heap_bytes,
        fences: Vec::new(),
    };
    let passes = memory_passes();
    for (i, pass) in passes.iter().enumerate() {
        data = (pass.run)(data)?;
        if cfg!(debug_assertions) || i + 1 == passes.len() {
            data.plan.validate().map_err(PlanError::Invalid)?;
        }
    }
    Ok(data.plan)
}

fn memory(mut d: MemoryData<'_>) -> Result<MemoryData<'_>, PlanError> {
    let mut sched = d.scheduled.clone();
    let (mut memory, fences) = memory::plan_memory(&mut sched, &memory::Apart::new());
    memory.heap_bytes = d.heap_bytes;
    memory.rank_bytes = memory.arena_bytes + memory.host_arena_bytes + d.heap_bytes;
    d.plan.buffers = sched.buffers;
    d.plan.events = sched.events;
    d.plan.instructions = sched.instructions;
    d.plan.memory = memory;
    d.fences = fences;
    Ok(d)
}

fn device(mut d: MemoryData<'_>) -> Result<MemoryData<'_>, PlanError> {
    d.plan.memory.outside_arena = crate::device::outside_arena(&d.plan, &d.cluster.hardware);
    Ok(d)
}

fn overlap(mut d: MemoryData<'_>) -> Result<MemoryData<'_>, PlanError> {
    let fences = std::mem::take(&mut d.fences);
    overlap::relieve_stalls(&mut d.plan, &d.scheduled, fences, d.heap_bytes, d.cluster);
    Ok(d)
}

/// The prefix of the final list; `overlap`'s estimates already hold its
/// simulated time (`simulate::eval_time`).
fn eval(mut d: MemoryData<'_>) -> Result<MemoryData<'_>, PlanError> {
    d.plan.eval = eval::prefix(&d.plan);
    Ok(d)
}
