//! Summaries of a plan for people (`fsdpc inspect`): a serialisable
//! `Summary` (what `--json` prints) and, in `text`, its rendering with
//! human units.

mod text;

pub use text::{flops_line, render_text};

use fsdpc_plan::*;
use serde::Serialize;

/// What `fsdpc inspect` shows, as data.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub model: String,
    pub params: u64,
    pub preset: String,
    pub world: u32,
    pub ranks_per_node: u32,
    /// The target the plan was made for (`threads`, `mpi`, `cuda`).
    pub target: String,
    pub strategy: String,
    pub shard_factor: u32,
    /// With tensor parallelism: T, what split and what stayed replicated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tensor: Option<TensorRecord>,
    /// What non-root units do with gathered parameters after forward.
    pub reshard_after_forward: ReshardAfterForward,
    /// Units with their own `reshard_after_forward` (module path, setting).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unit_reshard: Vec<(String, ReshardAfterForward)>,
    pub forward_prefetch: bool,
    pub prefetch_depth: u32,
    /// How `fsdpc compile --auto` chose the configuration (absent: the
    /// user chose it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoRecord>,
    /// Micro-batches per optimizer step.
    pub grad_accum: u32,
    /// Whether gradients are reduced once per step (`no_sync`).
    pub no_sync: bool,
    pub wrap: WrapPolicy,
    pub backward_prefetch: BackwardPrefetch,
    pub limit_all_gathers: u32,
    pub activation_checkpointing: CheckpointPolicy,
    /// Module paths of the units that recompute their forward in backward.
    pub checkpointed_units: Vec<String>,
    /// The total gradient norm gradients are clipped to (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm: Option<f64>,
    /// The mixed-precision policy (absent: everything f32).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<PrecisionSummary>,
    /// The optimizer: its kind, rate, schedule and weight decay.
    pub optimizer: OptimizerSummary,
    /// The `--freeze` patterns (empty: every parameter trainable).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub freeze: Vec<String>,
    /// Where parameters read by several units live.
    pub shared_params: SharedParams,
    /// Bytes per rank that frozen parameters would have taken as gradient
    /// shards (full_shard) and optimizer state, and that the plan does not
    /// allocate.
    #[serde(skip_serializing_if = "is_zero")]
    pub frozen_saved_bytes: u64,
    /// The (device) arena's live peak: the most bytes of buffers live at
    /// once, what is compared with the capacity. The text's "peak per
    /// rank" is `rank_bytes`.
    pub peak_bytes_per_rank: u64,
    /// Instruction index of the arena's live peak.
    pub peak_at: u32,
    /// The (device) arena: its live peak plus what offsets leave unused.
    pub arena_bytes: u64,
    pub capacity_bytes: u64,
    /// Live bytes at the peak, by buffer kind.
    pub breakdown: Vec<(BufferKind, u64)>,
    /// What the matrix-product library allocates at most outside the arena.
    pub heap_bytes: u64,
    /// On a cluster of GPUs, what a rank of the cuda target holds on its
    /// device outside the arena (`memory.outside_arena`); counted with the
    /// live peak against the capacity.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub outside_arena: Vec<fsdpc_plan::OutsideArena>,
    /// "Peak per rank", the one figure `compile`, `train` and `inspect`
    /// print: the arenas plus that heap, the most a rank holds during a
    /// step (`memory.rank_bytes`).
    pub rank_bytes: u64,
    /// Shards and optimizer state in host memory (`cpu_offload`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cpu_offload: bool,
    /// With `cpu_offload`, the module paths of the offloaded units when not
    /// every unit is (`root` for the root unit; empty: every unit).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub offloaded_units: Vec<String>,
    /// With `cpu_offload`, what the offloaded units keep on the host.
    #[serde(skip_serializing_if = "OffloadWhat::is_params")]
    pub offload_what: OffloadWhat,
    /// How parameter all-gathers travel (`wire`; absent: native).
    #[serde(skip_serializing_if = "Wire::is_native")]
    pub allgather_wire: Wire,
    /// How gradient reduce-scatters travel (absent: native).
    #[serde(skip_serializing_if = "Wire::is_native")]
    pub reduce_scatter_wire: Wire,
    /// The collective rewrites: the rules allowed and those that fired.
    pub rewrites: fsdpc_plan::RewriteReport,
    /// Peak of host memory per rank (`cpu_offload`; 0 without).
    #[serde(skip_serializing_if = "is_zero")]
    pub host_peak_bytes: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub host_arena_bytes: u64,
    /// Host bytes by buffer kind (all host buffers are persistent).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub host_breakdown: Vec<(BufferKind, u64)>,
    /// Bytes copied host -> device and device -> host per rank and step.
    #[serde(skip_serializing_if = "is_zero")]
    pub copied_to_device_bytes: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub copied_to_host_bytes: u64,
    /// The host <-> device bandwidth the estimates charge copies at.
    pub host_bw: f64,
    pub units: Vec<UnitSummary>,
    pub comm_bytes_per_step: u64,
    /// Collectives by operation and group: count and bytes sent per rank
    /// per step, inside a node or across nodes.
    pub traffic: Vec<fsdpc_planner::cost::Traffic>,
    /// Bytes a rank sends per step in groups that span nodes.
    pub inter_node_bytes: u64,
    /// With tensor parallelism: the traffic by mesh dimension (`tensor`,
    /// then `data`: every FSDP group).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub by_dimension: Vec<DimensionTraffic>,
    pub all_gathers: usize,
    pub reduce_scatters: usize,
    pub all_reduces: usize,
    /// The tensor group's collectives on activations and their gradients
    /// (`TensorAllReduce`, and `TensorChunks` gathers and reduce-scatters
    /// with sequence parallelism; absent: none).
    #[serde(skip_serializing_if = "is_zero_usize")]
    pub tensor_sums: usize,
    pub instructions: usize,
    /// Instructions of the forward-only evaluation prefix (`Plan::eval`;
    /// absent: the plan has none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_instructions: Option<u32>,
    /// Simulated time of one evaluation batch.
    pub eval_s: f64,
    pub instructions_per_stream: Vec<(Stream, usize)>,
    pub buffers: usize,
    pub events: u32,
    /// Executed FLOPs per rank and step (recomputation counted).
    pub flops_per_rank_step: f64,
    /// Model FLOPs per rank and step (recomputation not counted).
    pub model_flops_per_rank_step: f64,
    pub step_time_s: f64,
    pub exposed_comm_s: f64,
    pub tflops_per_rank: f64,
    pub mfu: f64,
    pub hfu: f64,
}

/// One unit's line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnitSummary {
    pub id: UnitId,
    pub module: String,
    pub kind: String,
    /// Number of original parameters in the unit.
    pub params: usize,
    pub flat_numel: u64,
    pub padded_numel: u64,
    pub shard_numel: u64,
    /// Elements of frozen parameters (not padded).
    #[serde(skip_serializing_if = "is_zero")]
    pub frozen_numel: u64,
    /// Elements of each rank's gradient shard and of each optimizer-state
    /// slot (the trainable part of its shard).
    pub trainable_shard_numel: u64,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// Bytes per rank of gradient shards and optimizer state that frozen
/// parameters do not take: each unit's frozen part of the shard, times one
/// gradient shard (when sharded) plus the optimizer's state slots, in f32.
fn frozen_saved_bytes(plan: &Plan) -> u64 {
    let slots = plan.training.optimizer.state_slots() as u64;
    let grads = u64::from(plan.config.shard_factor > 1);
    plan.units
        .iter()
        .map(|u| (u.shard_numel - u.trainable_shard_numel()) * 4 * (slots + grads))
        .sum()
}

/// A mixed-precision policy as `inspect` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PrecisionSummary {
    pub param_dtype: fsdpc_ir::DType,
    pub reduce_dtype: fsdpc_ir::DType,
    pub buffer_dtype: fsdpc_ir::DType,
    /// The fp16 dynamic loss scaler (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<LossScaler>,
}

/// The module paths of the offloaded units when `cpu_offload` offloads
/// only some (empty when it offloads every unit or none).
fn partial_offload(plan: &Plan) -> Vec<String> {
    let on: Vec<String> = plan
        .units
        .iter()
        .filter(|u| plan.unit_offload(u.id).is_some())
        .map(|u| {
            if u.module.is_empty() {
                "root".to_string()
            } else {
                u.module.clone()
            }
        })
        .collect();
    if on.len() == plan.units.len() {
        Vec::new()
    } else {
        on
    }
}

fn precision_summary(plan: &Plan) -> Option<PrecisionSummary> {
    let c = &plan.config;
    let f32 = fsdpc_ir::DType::F32;
    if (c.param_dtype, c.reduce_dtype, c.buffer_dtype) == (f32, f32, f32) {
        return None;
    }
    Some(PrecisionSummary {
        param_dtype: c.param_dtype,
        reduce_dtype: c.reduce_dtype,
        buffer_dtype: c.buffer_dtype,
        loss_scaler: c.loss_scaler.clone(),
    })
}

/// The summary of `plan`.
pub fn summary(plan: &Plan) -> Summary {
    let count = |f: fn(&InstrOp) -> bool| plan.instructions.iter().filter(|i| f(&i.op)).count();
    // The offload stream is listed only when the plan offloads, so other
    // plans read as before.
    let per_stream = Stream::ALL
        .iter()
        .filter(|&&s| s != Stream::Offload || plan.config.cpu_offload)
        .map(|&s| {
            (
                s,
                plan.instructions.iter().filter(|i| i.stream == s).count(),
            )
        })
        .collect();
    let e = &plan.estimates;
    let traffic = fsdpc_planner::cost::traffic(plan, &plan.cluster);
    Summary {
        model: plan.model.name.clone(),
        params: plan.model.params,
        preset: plan.cluster.name.clone(),
        world: plan.cluster.world,
        ranks_per_node: plan.cluster.ranks_per_node,
        target: plan.config.target.clone(),
        strategy: plan.config.strategy.name().to_string(),
        tensor: plan.config.tensor.clone(),
        shard_factor: plan.config.shard_factor,
        reshard_after_forward: plan.config.reshard_after_forward,
        unit_reshard: plan
            .units
            .iter()
            .filter_map(|u| u.reshard_after_forward.map(|r| (u.module.clone(), r)))
            .collect(),
        forward_prefetch: plan.config.forward_prefetch,
        prefetch_depth: plan.config.prefetch_depth,
        auto: plan.config.auto.clone(),
        grad_accum: plan.config.grad_accum,
        no_sync: plan.config.no_sync,
        wrap: plan.config.wrap.clone(),
        backward_prefetch: plan.config.backward_prefetch,
        limit_all_gathers: plan.config.limit_all_gathers,
        activation_checkpointing: plan.config.activation_checkpointing.clone(),
        checkpointed_units: plan
            .config
            .checkpointed_units
            .iter()
            .filter_map(|u| plan.units.get(u.0 as usize))
            .map(|u| u.module.clone())
            .collect(),
        clip_grad_norm: plan.config.clip_grad_norm,
        precision: precision_summary(plan),
        optimizer: optimizer_summary(plan),
        freeze: plan.config.freeze.clone(),
        shared_params: plan.config.shared_params,
        frozen_saved_bytes: frozen_saved_bytes(plan),
        peak_bytes_per_rank: plan.memory.peak_bytes,
        peak_at: plan.memory.peak_at,
        arena_bytes: plan.memory.arena_bytes,
        capacity_bytes: plan.cluster.memory_bytes,
        breakdown: plan.memory.breakdown.clone(),
        heap_bytes: plan.memory.heap_bytes,
        outside_arena: plan.memory.outside_arena.clone(),
        rank_bytes: plan.memory.rank_bytes,
        cpu_offload: plan.config.cpu_offload,
        offloaded_units: partial_offload(plan),
        offload_what: plan.config.offload_what,
        allgather_wire: plan.config.allgather_wire,
        reduce_scatter_wire: plan.config.reduce_scatter_wire,
        rewrites: plan.rewrites.clone(),
        host_peak_bytes: plan.memory.host_peak_bytes,
        host_arena_bytes: plan.memory.host_arena_bytes,
        host_breakdown: host_breakdown(plan),
        copied_to_device_bytes: plan.copied_bytes(Location::Device),
        copied_to_host_bytes: plan.copied_bytes(Location::Host),
        host_bw: plan.cluster.hardware.host_bw,
        units: plan.units.iter().map(unit_summary).collect(),
        comm_bytes_per_step: e.comm_bytes_per_step,
        inter_node_bytes: traffic.iter().map(|t| t.across_bytes).sum(),
        by_dimension: by_dimension(plan, &traffic),
        traffic,
        all_gathers: count(|op| matches!(op, InstrOp::AllGather { .. })),
        reduce_scatters: count(|op| matches!(op, InstrOp::ReduceScatter { .. })),
        all_reduces: count(|op| {
            matches!(
                op,
                InstrOp::AllReduce { .. }
                    | InstrOp::NormAllReduce { .. }
                    | InstrOp::FoundInfAllReduce { .. }
            )
        }),
        tensor_sums: count(|op| {
            matches!(
                op,
                InstrOp::TensorAllReduce { .. }
                    | InstrOp::TensorChunks {
                        kind: ChunkKind::Gather | ChunkKind::ReduceScatter,
                        ..
                    }
            )
        }),
        instructions: plan.instructions.len(),
        eval_instructions: plan.eval.map(|e| e.instructions),
        eval_s: e.eval_s,
        instructions_per_stream: per_stream,
        buffers: plan.buffers.len(),
        events: plan.events,
        flops_per_rank_step: e.flops_per_rank_step,
        model_flops_per_rank_step: e.model_flops_per_rank_step,
        step_time_s: e.step_time_s,
        exposed_comm_s: e.exposed_comm_s,
        tflops_per_rank: e.tflops_per_rank,
        mfu: e.mfu,
        hfu: e.hfu,
    }
}

fn unit_summary(u: &Unit) -> UnitSummary {
    UnitSummary {
        id: u.id,
        module: if u.module.is_empty() {
            "(root)".into()
        } else {
            u.module.clone()
        },
        kind: u.kind.clone(),
        params: u.params.len(),
        flat_numel: u.flat_numel,
        padded_numel: u.padded_numel,
        shard_numel: u.shard_numel,
        frozen_numel: u
            .params
            .iter()
            .filter(|p| !p.requires_grad)
            .map(|p| p.numel)
            .sum(),
        trainable_shard_numel: u.trainable_shard_numel(),
    }
}

/// Host bytes by buffer kind.
fn host_breakdown(plan: &Plan) -> Vec<(BufferKind, u64)> {
    let mut by_kind: std::collections::BTreeMap<BufferKind, u64> = Default::default();
    for b in plan.buffers.iter().filter(|b| b.location == Location::Host) {
        *by_kind.entry(b.kind).or_default() += b.bytes;
    }
    by_kind.into_iter().collect()
}

/// The optimizer and which trainable parameters its weight decay applies
/// to (`FlatParam::decay`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OptimizerSummary {
    /// `adamw` or `sgd`.
    pub kind: String,
    pub lr: f64,
    /// The learning-rate schedule (absent: constant).
    #[serde(skip_serializing_if = "fsdpc_plan::LrSchedule::is_constant")]
    pub lr_schedule: fsdpc_plan::LrSchedule,
    pub weight_decay: f64,
    /// Whether decay applies to every parameter (`--weight-decay-all`).
    pub decay_all: bool,
    /// Trainable parameters and their elements decay applies to, and all
    /// trainable ones.
    pub decayed_params: u64,
    pub decayed_numel: u64,
    pub trainable_params: u64,
    pub trainable_numel: u64,
}

fn optimizer_summary(plan: &Plan) -> OptimizerSummary {
    let o = &plan.training.optimizer;
    let trainable = || {
        plan.units
            .iter()
            .flat_map(|u| u.params.iter())
            .filter(|p| p.requires_grad)
    };
    let decayed = || trainable().filter(|p| p.decay);
    OptimizerSummary {
        kind: match o {
            fsdpc_ir::Optimizer::Sgd { .. } => "sgd".into(),
            fsdpc_ir::Optimizer::AdamW { .. } => "adamw".into(),
        },
        lr: o.lr(),
        lr_schedule: plan.config.lr_schedule.clone(),
        weight_decay: o.weight_decay(),
        decay_all: plan.config.decay_all,
        decayed_params: decayed().count() as u64,
        decayed_numel: decayed().map(|p| p.numel).sum(),
        trainable_params: trainable().count() as u64,
        trainable_numel: trainable().map(|p| p.numel).sum(),
    }
}

fn is_zero_usize(n: &usize) -> bool {
    *n == 0
}

/// The bytes a rank sends per step along one dimension of the mesh.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DimensionTraffic {
    /// `tensor` or `data`.
    pub dimension: &'static str,
    pub bytes_sent: u64,
    /// Of those, the bytes that cross nodes.
    pub across_bytes: u64,
}

/// `traffic` summed by mesh dimension; empty without tensor parallelism.
fn by_dimension(plan: &Plan, traffic: &[fsdpc_planner::cost::Traffic]) -> Vec<DimensionTraffic> {
    if plan.geometry().t() <= 1 {
        return Vec::new();
    }
    ["tensor", "data"]
        .into_iter()
        .map(|dimension| {
            let of = traffic
                .iter()
                .filter(|t| (t.group == Group::Tensor) == (dimension == "tensor"));
            DimensionTraffic {
                dimension,
                bytes_sent: of.clone().map(|t| t.bytes_sent).sum(),
                across_bytes: of.map(|t| t.across_bytes).sum(),
            }
        })
        .collect()
}
