//! The plan: the versioned JSON document the planner emits and the runtime
//! executes. Field names are stable within a schema version.
//!
//! The instruction list is rank-generic (SPMD): every rank runs the same list and
//! finds its shard from its rank and group, so a plan does not grow with the
//! number of ranks.

use fsdpc_ir::{DType, NodeId, ParamId, TrainingProgram, ValueId};
use serde::{Deserialize, Serialize};

pub use crate::offload::{OffloadUnits, OffloadWhat};
pub use crate::wire::{Fp8Scale, Wire};

pub const SCHEMA: &str = "fsdpc.plan/v1";

macro_rules! id_type {
    ($($(#[$m:meta])* $name:ident;)*) => {$(
        $(#[$m])*
        #[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub u32);
        impl $name {
            pub fn index(self) -> usize { self.0 as usize }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}", self.0)
            }
        }
    )*};
}

id_type! {
    /// Index into `Plan::units`.
    UnitId;
    /// Index into `Plan::buffers`.
    BufferId;
    /// An event recorded by one stream and waited on by others (`0..Plan::events`).
    EventId;
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Plan {
    /// Always `SCHEMA`.
    pub schema: String,
    pub model: ModelInfo,
    pub cluster: ClusterInfo,
    pub config: PlanConfig,
    pub units: Vec<Unit>,
    pub streams: Vec<Stream>,
    pub buffers: Vec<Buffer>,
    /// Number of events; instructions refer to `EventId(0..events)`.
    pub events: u32,
    /// The loss buffer, read by the runtime after each step.
    pub loss: Slot,
    /// Every rank executes these in order on their streams.
    pub instructions: Vec<Instr>,
    pub memory: MemorySummary,
    pub estimates: Estimates,
    /// The program the kernels refer to (nodes by id).
    pub training: TrainingProgram,
    /// What the collective rewrites (`rewrite`) chose: the rules that
    /// fired, how often, and the step time each saved by the cost model.
    #[serde(default)]
    pub rewrites: RewriteReport,
}

/// The `rewrite` pass's account (`Plan::rewrites`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct RewriteReport {
    /// The rules the configuration allowed (`FsdpConfig::rewrites`).
    pub enabled: Vec<String>,
    /// The rules whose form was chosen, in rule order.
    pub fired: Vec<RuleFired>,
    /// Distinct collectives (kind, size, group, dtypes) rewritten.
    pub saturated: u32,
    /// Distinct collectives whose rewriting stopped at a runner limit
    /// (the best form found so far was kept).
    pub limited: u32,
}

/// One rule of `RewriteReport::fired`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RuleFired {
    pub rule: String,
    /// Collective instructions whose chosen form uses it.
    pub count: u32,
    /// Sum over those instructions of the cost model's time of the
    /// original form less that of the chosen one (seconds per step, each
    /// collective alone; overlap decides how much of it the step sees).
    pub saved_s: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    pub name: String,
    /// Parameter elements (tied parameters counted once).
    pub params: u64,
    /// Tokens (or samples, for a non-sequence model) one rank processes per step.
    pub tokens_per_rank_step: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterInfo {
    pub world: u32,
    pub ranks_per_node: u32,
    /// The hardware preset the estimates used (`a100-80g-roce`, `cpu-local`).
    pub preset: String,
    /// Per-rank memory capacity in bytes.
    pub memory_bytes: u64,
    /// The speeds the estimates used (so a loaded plan can be re-simulated).
    #[serde(default)]
    pub hardware: crate::cluster::Hardware,
}

/// PyTorch FSDP's sharding strategies. Every sharded strategy shards over
/// groups of F ranks (`PlanConfig::shard_factor`); where F < world the
/// groups are replicas of each other and each gradient shard is also
/// all-reduced across them (hybrid sharding).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    /// ZeRO-3: parameters, gradients and optimizer state sharded; gathered
    /// parameters freed after forward and gathered again for backward.
    /// F defaults to the world.
    FullShard,
    /// ZeRO-2: as `FullShard`, but gathered parameters are kept from forward
    /// to backward (one all-gather per unit per step). F defaults to the world.
    ShardGradOp,
    /// `FullShard` inside each group of F ranks (F defaults to one node),
    /// replicated across the groups.
    HybridShard,
    /// `ShardGradOp` inside each group of F ranks (F defaults to one node),
    /// replicated across the groups.
    HybridShardZero2,
    /// DDP: F = 1; gradients all-reduced.
    NoShard,
}

impl Strategy {
    pub const ALL: [Strategy; 5] = [
        Strategy::FullShard,
        Strategy::ShardGradOp,
        Strategy::HybridShard,
        Strategy::HybridShardZero2,
        Strategy::NoShard,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::FullShard => "full_shard",
            Strategy::ShardGradOp => "shard_grad_op",
            Strategy::HybridShard => "hybrid_shard",
            Strategy::HybridShardZero2 => "hybrid_shard_zero2",
            Strategy::NoShard => "no_shard",
        }
    }

    /// Whether gathered parameters are freed after forward by default
    /// (PyTorch's `reshard_after_forward`).
    pub fn reshards_after_forward(self) -> bool {
        matches!(self, Strategy::FullShard | Strategy::HybridShard)
    }

    /// Whether F defaults to the ranks of one node rather than the world.
    pub fn is_hybrid(self) -> bool {
        matches!(self, Strategy::HybridShard | Strategy::HybridShardZero2)
    }
}

/// Where a parameter read by modules of two units (a tied embedding and
/// output projection) is owned (see `units`).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SharedParams {
    /// In the root unit, gathered for the whole step.
    #[default]
    Root,
    /// In the unit of its first reader; gathered again wherever another
    /// unit reads it, its gradient summed from every use.
    Owner,
}

impl SharedParams {
    /// The values `SharedParams::parse` accepts.
    pub const ALLOWED: &'static str = "root, owner";

    pub fn name(self) -> &'static str {
        match self {
            SharedParams::Root => "root",
            SharedParams::Owner => "owner",
        }
    }
}

/// What a non-root unit does with its gathered parameters after forward
/// (FSDP2's `reshard_after_forward`; the root unit always keeps them).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReshardAfterForward {
    /// Free them; backward gathers again over the shard group (`true`).
    Full,
    /// Keep them until the unit's backward is done (`false`; ZeRO-2).
    Keep,
    /// Keep this rank's 1/n slice (n divides F) and free the rest; backward
    /// gathers over the n ranks of `Group::Reshard` (FSDP2's integer form,
    /// ZeRO++ hpZ: with n ranks per node, backward's gather stays in a node).
    To(u32),
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackwardPrefetch {
    /// Issue the next unit's all-gather before the current unit's backward.
    Pre,
    /// Issue it after the current unit's gradient computation.
    Post,
    None,
}

/// How the units were chosen, as the user asked.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "snake_case")]
pub enum WrapPolicy {
    /// One unit per repeated block found in the module hierarchy.
    Blocks,
    /// One unit per module of this class (`transformer_auto_wrap_policy`).
    Kind { kind: String },
    /// Size-based: a module becomes a unit once it holds at least this many
    /// parameter elements not already in a smaller unit.
    Size { min_numel: u64 },
    /// These module paths.
    Paths { paths: Vec<String> },
}

/// Which units re-run their forward in backward (activation checkpointing,
/// PyTorch's `apply_activation_checkpointing` with a `check_fn`; see
/// `checkpoint`). Only non-root units are ever checkpointed.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointPolicy {
    /// Keep every forward activation the backward reads.
    #[default]
    None,
    /// Every non-root unit: keep only what a unit reads from outside itself
    /// (its input), recompute the rest just before the unit's backward.
    Units,
    /// Every K-th non-root unit in unit order, counting from the first
    /// (units 1, 1 + K, 1 + 2K, ...). `Every(1)` is `Units`.
    Every(u32),
    /// The units defined by these module paths (each must be a unit's path).
    Paths(Vec<String>),
    /// The units whose module class is this (`GPT2Block`).
    Kind(String),
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanConfig {
    pub strategy: Strategy,
    /// F: the number of ranks one flat parameter is sharded over.
    pub shard_factor: u32,
    pub wrap: WrapPolicy,
    pub backward_prefetch: BackwardPrefetch,
    /// At most this many units' gathered parameters alive at once.
    pub limit_all_gathers: u32,
    pub param_dtype: DType,
    pub reduce_dtype: DType,
    /// The dtype constants are cast to (absent in plans written before
    /// mixed precision existed: f32).
    #[serde(default = "crate::precision::f32")]
    pub buffer_dtype: DType,
    /// The dynamic loss scaler of an fp16 policy (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<LossScaler>,
    /// Absent in plans written before checkpointing existed: `none`.
    #[serde(default)]
    pub activation_checkpointing: CheckpointPolicy,
    /// The units `activation_checkpointing` selected, in unit order (absent
    /// when none is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpointed_units: Vec<UnitId>,
    /// Clip gradients to this total L2 norm before the optimizer step
    /// (PyTorch's `clip_grad_norm_(max_norm)`); absent: no clipping.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm: Option<f64>,
    /// The `--freeze` patterns (absent: every parameter trainable); the
    /// parameters they froze have `requires_grad: false`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub freeze: Vec<String>,
    /// Where parameters shared across units are owned (absent: the root).
    #[serde(default)]
    pub shared_params: SharedParams,
    /// What non-root units do after forward (absent in older plans: what the
    /// strategy does by default).
    #[serde(default = "reshard_full")]
    pub reshard_after_forward: ReshardAfterForward,
    /// Whether a forward gather is issued before compute reaches its unit
    /// (absent in older plans: yes).
    #[serde(default = "yes")]
    pub forward_prefetch: bool,
    /// How many windows ahead a gather is issued (absent: 1).
    #[serde(default = "one")]
    pub prefetch_depth: u32,
    /// Micro-batches per optimizer step (absent: 1). The step's loss is the
    /// `Loss` buffer (their sum) divided by it.
    #[serde(default = "one")]
    pub grad_accum: u32,
    /// With `grad_accum > 1`: unsharded gradients accumulate across the
    /// micro-batches and are reduced once (PyTorch's `no_sync()`), instead
    /// of reduce-scattering every micro-batch into the gradient shard.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_sync: bool,
    /// Parameter and gradient shards and optimizer state in host memory,
    /// copied on the offload stream; the optimizer runs on the host
    /// (PyTorch's `CPUOffload(offload_params=True)`; absent: no).
    #[serde(default, skip_serializing_if = "is_false")]
    pub cpu_offload: bool,
    /// Set when `fsdpc compile --auto` chose this configuration (absent:
    /// the user chose it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoRecord>,
    /// With `cpu_offload`: the units offloaded, in unit order (absent in
    /// plans written before partial offload: every unit; see
    /// `Plan::unit_offload`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offloaded_units: Vec<UnitId>,
    /// With `cpu_offload`: what the offloaded units keep in host memory
    /// (absent: `params`, shards and optimizer state; see `offload`).
    #[serde(default, skip_serializing_if = "OffloadWhat::is_params")]
    pub offload_what: OffloadWhat,
    /// How parameter all-gathers travel (`wire`; absent: native).
    #[serde(default, skip_serializing_if = "Wire::is_native")]
    pub allgather_wire: Wire,
    /// How gradient reduce-scatters travel (`wire`; absent: native).
    #[serde(default, skip_serializing_if = "Wire::is_native")]
    pub reduce_scatter_wire: Wire,
}

/// How the auto-planner (`auto`) chose a plan's configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AutoRecord {
    /// Candidates in the searched space.
    pub candidates: u64,
    /// Candidates compiled and simulated.
    pub compiled: u64,
    /// Candidates screened (every pass but memory planning: the exact peak
    /// and a lower bound of the step) and not compiled: over memory, or
    /// their bound could not beat the best step (absent in older plans).
    #[serde(default)]
    pub screened: u64,
    /// Candidates skipped because a memory lower bound exceeded the
    /// capacity.
    pub pruned_by_memory: u64,
    /// Candidates skipped because a time lower bound could not beat the
    /// best step found.
    pub pruned_by_time: u64,
    /// The dimensions searched (`sharding: full_shard@8 ...`); the others
    /// were fixed by the user's flags.
    pub searched: Vec<String>,
    /// The optimality gap the search ran with (`auto::Search::gap`, a
    /// fraction; absent in older plans: 0, exact).
    #[serde(default, skip_serializing_if = "is_zero_f64")]
    pub gap: f64,
}

fn is_zero_f64(x: &f64) -> bool {
    *x == 0.0
}

fn reshard_full() -> ReshardAfterForward {
    ReshardAfterForward::Full
}

fn yes() -> bool {
    true
}

fn one() -> u32 {
    1
}

/// A dynamic loss scaler (PyTorch's `ShardedGradScaler`): the loss
/// gradient is seeded with `scale`; after a step whose gradients held an
/// inf or NaN on any rank the step is skipped and the scale multiplied by
/// `backoff_factor`, after `growth_interval` good steps in a row by
/// `growth_factor`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    pub init_scale: f64,
    pub growth_factor: f64,
    pub backoff_factor: f64,
    pub growth_interval: u32,
}

/// One FSDP unit: a flat parameter and the modules whose parameters it holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Unit {
    pub id: UnitId,
    /// The module path that defines the unit (`h.2`; empty for the root unit).
    pub module: String,
    pub kind: String,
    /// Elements of all parameters laid end to end.
    pub flat_numel: u64,
    /// `flat_numel` rounded up to a multiple of F.
    pub padded_numel: u64,
    /// `padded_numel / F`: what each rank keeps.
    pub shard_numel: u64,
    /// Elements of the frozen segment at the end of the flat parameter
    /// (frozen parameters, padded to a multiple of F; see `flat`). 0 when
    /// every parameter is trainable (and in plans written before freezing
    /// existed).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub frozen_numel: u64,
    /// This unit's own `reshard_after_forward` where it differs from the
    /// plan's (FSDP2's per-module setting); absent: the plan's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reshard_after_forward: Option<ReshardAfterForward>,
    /// Trainable parameters first (offsets below `trainable_numel()`), then
    /// frozen ones.
    pub params: Vec<FlatParam>,
}

/// One contiguous part of a flat parameter that is sharded on its own: the
/// trainable or the frozen segment (see `flat`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First element in the flat parameter.
    pub flat_offset: u64,
    /// First element in each rank's shard.
    pub shard_offset: u64,
    /// Elements in the flat parameter (a multiple of F).
    pub numel: u64,
}

impl Plan {
    /// What unit `u` does after forward: the root always keeps its
    /// parameters; another unit follows its own setting, else the plan's.
    pub fn unit_reshard(&self, u: UnitId) -> ReshardAfterForward {
        unit_reshard(&self.units, u, self.config.reshard_after_forward)
    }

    /// The ranks of `Group::Reshard`: the n of the plan's or any unit's
    /// `ReshardAfterForward::To(n)` (a plan has at most one such n).
    pub fn reshard_group(&self) -> Option<u32> {
        reshard_group(&self.units, self.config.reshard_after_forward)
    }
}

/// What unit `u` of `units` does after forward, `default` being the plan's
/// setting (see `Plan::unit_reshard`).
pub fn unit_reshard(
    units: &[Unit],
    u: UnitId,
    default: ReshardAfterForward,
) -> ReshardAfterForward {
    if u == UnitId(0) {
        return ReshardAfterForward::Keep;
    }
    units
        .get(u.index())
        .and_then(|unit| unit.reshard_after_forward)
        .unwrap_or(default)
}

/// The n of `Group::Reshard` for `units` and the plan's `default`.
pub fn reshard_group(units: &[Unit], default: ReshardAfterForward) -> Option<u32> {
    std::iter::once(default)
        .chain(units.iter().filter_map(|u| u.reshard_after_forward))
        .find_map(|r| match r {
            ReshardAfterForward::To(n) => Some(n),
            _ => None,
        })
}

impl Unit {
    /// Elements of the trainable segment (padded): what the flat gradient
    /// holds.
    pub fn trainable_numel(&self) -> u64 {
        self.padded_numel.saturating_sub(self.frozen_numel)
    }

    /// The sharding factor the layout was made for (`padded / shard`; 1 for
    /// an empty unit).
    pub fn factor(&self) -> u64 {
        self.padded_numel
            .checked_div(self.shard_numel)
            .map_or(1, |f| f.max(1))
    }

    /// Elements of each rank's shard in the trainable segment: what its
    /// gradient shard and each optimizer-state buffer hold. The optimizer
    /// updates the first this many elements of the parameter shard.
    pub fn trainable_shard_numel(&self) -> u64 {
        self.trainable_numel() / self.factor()
    }

    /// The non-empty segments, trainable first. A rank's shard is its part
    /// of each segment, end to end: `[trainable shard | frozen shard]`.
    pub fn segments(&self) -> Vec<Segment> {
        let f = self.factor();
        let t = self.trainable_numel();
        [
            Segment {
                flat_offset: 0,
                shard_offset: 0,
                numel: t,
            },
            Segment {
                flat_offset: t,
                shard_offset: t / f,
                numel: self.frozen_numel,
            },
        ]
        .into_iter()
        .filter(|s| s.numel > 0)
        .collect()
    }

    /// The flat elements the shard at position `pos` holds, as
    /// `(flat offset, shard offset, elements)` per segment.
    pub fn shard_ranges(&self, pos: u64) -> Vec<(u64, u64, u64)> {
        let f = self.factor();
        self.segments()
            .into_iter()
            .map(|s| {
                let n = s.numel / f;
                (s.flat_offset + pos * n, s.shard_offset, n)
            })
            .collect()
    }
}

/// Where one original parameter sits inside its unit's flat parameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlatParam {
    pub param: ParamId,
    pub name: String,
    pub shape: Vec<usize>,
    /// Element offset in the flat parameter.
    pub offset: u64,
    pub numel: u64,
    pub requires_grad: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Kernels, optimizer steps, frees of activations.
    Compute,
    /// All-gathers of parameters.
    Unshard,
    /// Reduce-scatters and all-reduces of gradients.
    Reduce,
    /// Copies from host to device memory (`cpu_offload`): parameter shards
    /// in before their all-gather. (Gradient shards go out on `Reduce`,
    /// after their reduction.)
    Offload,
}

impl Stream {
    pub const ALL: [Stream; 4] = [
        Stream::Compute,
        Stream::Unshard,
        Stream::Reduce,
        Stream::Offload,
    ];
    pub fn index(self) -> usize {
        self as usize
    }
}

/// What a buffer holds; also the memory breakdown's categories.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// A rank's fp32 shard of a unit's flat parameter (persistent).
    ShardParams,
    /// A unit's full flat parameter after the all-gather.
    GatheredParams,
    /// A rank's 1/n slice of a unit's flat parameter kept from forward to
    /// backward (`ReshardAfterForward::To(n)`), in the gather dtype.
    ReshardedParams,
    /// A unit's full (unsharded) flat gradient, before reduction.
    FlatGrads,
    /// `cpu_offload`: a unit's parameter shard copied from the host for its
    /// all-gather (the gather's source), freed after the gather.
    StagedParams,
    /// `cpu_offload`: a unit's reduced gradient shard on the device (the
    /// reduction's destination), freed after its copy to the host.
    StagedGrads,
    /// `--offload-what optimizer`: one optimizer-state slot of a unit on
    /// the device, copied in from the host before its optimizer step and
    /// back out after it (offload stream), then freed.
    StagedState,
    /// A rank's shard of a unit's reduced gradient (persistent).
    ShardGrads,
    /// Gradient accumulation: one micro-batch's reduced gradient shard,
    /// added into `ShardGrads`.
    PartialGrads,
    /// Optimizer state for a unit's shard (persistent): one buffer per slot.
    OptimizerState,
    /// Forward activations and backward intermediate values.
    Activation,
    /// Data inputs loaded each step.
    Input,
    /// The scalar loss (persistent, read after each step).
    Loss,
    /// The f32 sum of squares of every gradient shard (persistent, one
    /// scalar), all-reduced into the squared global norm for clipping.
    GradNorm,
    /// The fp16 loss scaler's state (persistent, two f32: the scale and the
    /// count of good steps since it last changed).
    LossScale,
    /// The fp16 loss scaler's inf/NaN flag (persistent, one f32 scalar:
    /// nonzero when a gradient of this step was not finite on some rank).
    FoundInf,
    /// A stream's kernel scratch (persistent): each kernel of the stream
    /// uses its first `workspace_bytes` (attention tiles, normalisation
    /// rows, f32 copies of half-precision operands).
    Workspace,
    /// A quantized collective's payloads (`wire`: codes and scales, sent
    /// and received; raw bytes, dtype `bool`), written by the collective
    /// and freed right after it on its stream.
    Wire,
    /// Rewritten collectives' intermediate values (`CollectiveAlgorithm`:
    /// the cross-node gather of a hierarchical all-gather, the per-node
    /// sums of a hierarchical reduce-scatter, the reduced slice of an
    /// all-reduce done as reduce-scatter then all-gather): one persistent
    /// buffer per stream that runs them (raw bytes, dtype `bool`), each
    /// collective using its first bytes. Persistent, so it never shares
    /// bytes with another stream's buffers (no fences: a transient one made
    /// gathers wait for compute).
    Staging,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub id: BufferId,
    pub kind: BufferKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<UnitId>,
    /// The graph value an activation buffer holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<ValueId>,
    pub dtype: DType,
    pub bytes: u64,
    /// Byte offset in the rank's arena.
    pub offset: u64,
    /// Instruction index of the first write (0 for persistent buffers).
    pub start: u32,
    /// Instruction index of its `Free`; `None` for persistent buffers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u32>,
    /// The stream whose kernels use a `Workspace` buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<Stream>,
    /// Which memory holds it (absent: the device). `offset` is in that
    /// location's arena.
    #[serde(default, skip_serializing_if = "Location::is_device")]
    pub location: Location,
}

/// Where a buffer lives: each location is one arena of its own.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Location {
    /// Accelerator memory: what kernels and collectives read and write.
    #[default]
    Device,
    /// Host memory (`cpu_offload`): reached by kernels and collectives only
    /// through a `Copy`; the optimizer runs on it.
    Host,
}

impl Location {
    /// True for `Device` (the serde default).
    pub fn is_device(&self) -> bool {
        *self == Location::Device
    }
}

impl Buffer {
    pub fn persistent(&self) -> bool {
        self.end.is_none()
    }
}

/// A tensor inside a buffer: a parameter inside a gathered flat parameter, a
/// parameter gradient inside a flat gradient, or a whole activation buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Slot {
    pub buffer: BufferId,
    /// Byte offset inside the buffer.
    pub offset: u64,
}

/// Which ranks a collective runs over.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Group {
    /// The F ranks that share one flat parameter: rank r is in the group of
    /// ranks `(r / F) * F .. (r / F + 1) * F`, at position `r % F`.
    Shard,
    /// The world / F ranks that hold the same shard: ranks `r % F + k * F`.
    Replicate,
    /// Under `ReshardAfterForward::To(n)`: the n consecutive ranks of rank
    /// r's shard group that r is among, `b + (p / n) * n .. b + (p / n + 1) * n`
    /// where `b = (r / F) * F` and `p = r % F`.
    Reshard,
    /// A hierarchical collective's first or last step: the k ranks of rank
    /// r's shard group on r's node, `b + (p / k) * k ..`, k the ranks per
    /// node (`CollectiveAlgorithm::Hierarchical` only; no instruction
    /// names it).
    NodeLocal,
    /// A hierarchical collective's cross-node step: the F / k ranks of r's
    /// shard group at r's place on their nodes, `b + p % k + j * k`.
    CrossNode,
}

/// How a collective runs: the planner's `rewrite` pass chooses, the cost
/// model charges and the runtime executes it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveAlgorithm {
    /// One ring over the group.
    #[default]
    Ring,
    /// An all-gather or reduce-scatter over a shard group that spans nodes
    /// (k ranks on each of m nodes), in two levels. All-gather: across
    /// nodes first (the m shards at this rank's place on its node into
    /// `staging`, m shards), then inside the node, once per node's block
    /// (block j of every member into its place). Reduce-scatter: inside
    /// the node first, once per block (block j's k chunks summed over the
    /// node into chunk j of `staging`, f32, m chunks), then across nodes
    /// (divided there). The cross-node step moves 1/k of the ring's bytes.
    /// The sum runs over each node in position order, then over the nodes.
    Hierarchical,
    /// An all-reduce as a reduce-scatter (into `staging`, this member's
    /// 1/n slice in the buffer's dtype, divided) then an all-gather from it:
    /// bit-identical to the all-reduce (one rounding, same order).
    ReduceScatterAllGather,
}

impl CollectiveAlgorithm {
    /// True for `Ring` (the serde default).
    pub fn is_ring(&self) -> bool {
        *self == CollectiveAlgorithm::Ring
    }
}

/// The shape a hierarchical collective over the shard group runs on:
/// `(k, m)`, k > 1 ranks per node on each of m > 1 nodes, F a multiple of
/// the ranks per node; `None` where no two-level form can run.
pub fn hierarchical_shape(shard_factor: u32, ranks_per_node: u32) -> Option<(u32, u32)> {
    let (f, k) = (shard_factor, ranks_per_node);
    (k > 1 && f > k && f.is_multiple_of(k)).then_some((k, f / k))
}

/// What a gather that can be in a bucket (`InstrOp::AllGather::bucketed`,
/// as a member or as the last one, whose call runs it) moves: its wire
/// dtype and shard elements; `None` for any other instruction. A native
/// ring gather over the shard group from a persistent shard.
pub fn bucketable_gather(op: &InstrOp, buffers: &[Buffer]) -> Option<(DType, u64)> {
    match op {
        InstrOp::AllGather {
            src,
            dtype,
            group: Group::Shard,
            wire,
            algorithm: CollectiveAlgorithm::Ring,
            ..
        } if wire.is_native() => {
            let b = buffers.get(src.index())?;
            (b.kind == BufferKind::ShardParams)
                .then(|| (*dtype, b.bytes / b.dtype.size().max(1) as u64))
        }
        _ => None,
    }
}

/// Bytes of a hierarchical all-gather's staging: the m shards of the
/// cross-node step, in the gathered buffer's dtype.
pub fn hier_gather_staging_bytes(shard_numel: u64, nodes: u32, dst: DType) -> u64 {
    shard_numel * u64::from(nodes) * dst.size() as u64
}

/// Bytes of a hierarchical reduce-scatter's staging: m chunks of the
/// reduced shard's length, in f32 (the per-node sums are not rounded).
pub fn hier_reduce_staging_bytes(shard_numel: u64, nodes: u32) -> u64 {
    shard_numel * u64::from(nodes) * DType::F32.size() as u64
}

impl Group {
    /// The shard group, the default of collectives that name no group.
    pub fn shard() -> Group {
        Group::Shard
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Instr {
    pub stream: Stream,
    #[serde(flatten)]
    pub op: InstrOp,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum InstrOp {
    /// Gather the members' `src` (their shards over `group`: the shard
    /// group, or `Reshard` from a resharded slice) into the unit's full flat
    /// parameter `dst`, cast to `dtype` first; with a quantized `wire`,
    /// quantized instead and dequantized into `dst` through the
    /// `wire_buffer` scratch (exact semantics in `wire`).
    AllGather {
        unit: UnitId,
        src: BufferId,
        dst: BufferId,
        dtype: DType,
        #[serde(default = "Group::shard")]
        group: Group,
        /// How the payload travels (absent: native, in `dtype`).
        #[serde(default, skip_serializing_if = "Wire::is_native")]
        wire: Wire,
        /// The `Wire` scratch of a quantized `wire` (absent for native).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wire_buffer: Option<BufferId>,
        /// How it runs (absent: one ring over `group`).
        #[serde(default, skip_serializing_if = "CollectiveAlgorithm::is_ring")]
        algorithm: CollectiveAlgorithm,
        /// The `Staging` buffer of a hierarchical algorithm.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        staging: Option<BufferId>,
        /// Bucketed (the `rewrite` pass's `bucket-all-gathers`): this
        /// gather joins the call of the next all-gather of its stream, the
        /// bucket's last member (not bucketed), and moves nothing at its own
        /// place. Only `Wait`s come between them on the stream, so no
        /// record announces `dst` before the call. A native ring gather of
        /// a persistent shard over the shard group; the values are those of
        /// the unbucketed gathers.
        #[serde(default, skip_serializing_if = "is_false")]
        bucketed: bool,
    },
    /// Sum the unit's full flat gradient `src` over `group` (the shard
    /// group), divide by the world size times `PlanConfig::grad_accum`, and
    /// keep this rank's shard in `dst`. Regions of `src` not written by a gradient kernel (padding,
    /// frozen parameters) count as zero. With a quantized `wire` the
    /// members' slices travel quantized through the `wire_buffer` scratch
    /// and are summed dequantized, in position order in f32 (see `wire`).
    ReduceScatter {
        unit: UnitId,
        src: BufferId,
        dst: BufferId,
        dtype: DType,
        #[serde(default = "Group::shard")]
        group: Group,
        /// How the payload travels (absent: native, in `dtype`).
        #[serde(default, skip_serializing_if = "Wire::is_native")]
        wire: Wire,
        /// The `Wire` scratch of a quantized `wire` (absent for native).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wire_buffer: Option<BufferId>,
        /// How it runs (absent: one ring over `group`).
        #[serde(default, skip_serializing_if = "CollectiveAlgorithm::is_ring")]
        algorithm: CollectiveAlgorithm,
        /// The `Staging` buffer of a hierarchical algorithm.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        staging: Option<BufferId>,
    },
    /// Keep this rank's slice of the gathered flat parameter `src` in `dst`:
    /// with n members of `group` (`Reshard`) and this rank at position p,
    /// the elements `p * len .. (p + 1) * len`, `len` being `dst`'s.
    /// Issued after a unit's forward under `ReshardAfterForward::To(n)`.
    Reshard {
        unit: UnitId,
        src: BufferId,
        dst: BufferId,
        group: Group,
    },
    /// Sum `buffer` over `group` in place and divide by `divide_by`.
    AllReduce {
        unit: UnitId,
        buffer: BufferId,
        group: Group,
        divide_by: u32,
        dtype: DType,
        /// How it runs (absent: one ring all-reduce; or a reduce-scatter
        /// into `staging` and an all-gather from it).
        #[serde(default, skip_serializing_if = "CollectiveAlgorithm::is_ring")]
        algorithm: CollectiveAlgorithm,
        /// The `Staging` buffer of `ReduceScatterAllGather`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        staging: Option<BufferId>,
    },
    /// Copy the data input of this name into `dst`: this rank's samples of
    /// micro-batch `micro_batch` (samples `(micro_batch * world + rank) *
    /// b ..` of the step's global batch, `b` samples per rank).
    LoadInput {
        node: NodeId,
        name: String,
        dst: Slot,
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        micro_batch: u32,
    },
    /// Run the kernel of graph node `node`, with the first `workspace_bytes`
    /// of its stream's `Workspace` buffer as scratch.
    Kernel {
        node: NodeId,
        kernel: String,
        inputs: Vec<Slot>,
        outputs: Vec<Slot>,
        #[serde(default, skip_serializing_if = "is_zero")]
        workspace_bytes: u64,
        /// The micro-batch the kernel computes on (its samples are those of
        /// `LoadInput` with the same index: random masks follow them).
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        micro_batch: u32,
    },
    /// Gradient accumulation: add `src` into `dst` element by element (same
    /// size and dtype; summed in f32, rounded once to the dtype).
    Accumulate {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unit: Option<UnitId>,
        src: BufferId,
        dst: BufferId,
    },
    /// Update `params` (fp32 shard) from `grads` (reduced shard) with the
    /// program's optimizer, using the state buffers; with `skip_if` (a
    /// `FoundInf` flag), not on a step where that flag is nonzero. `grads`
    /// and the state cover the shard's trainable part, its first elements
    /// (`Unit::trainable_shard_numel`); the frozen part is not touched.
    OptimizerStep {
        unit: UnitId,
        params: BufferId,
        grads: BufferId,
        state: Vec<BufferId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        skip_if: Option<BufferId>,
    },
    /// Loss scaling, step 0 (instead of the kernel of the constant that
    /// seeds backward, `d loss = 1`): write the current scale, element 0 of
    /// the `LossScale` buffer `scale`, into `dst` in the seed's dtype.
    ScaleSeed {
        node: NodeId,
        scale: BufferId,
        dst: Slot,
    },
    /// Loss scaling, step 1: multiply every element of `grads` by
    /// `1 / scale` (f32 arithmetic, in list order) and set the `FoundInf`
    /// scalar `found_inf` to 1 if any element was inf or NaN, else 0.
    UnscaleGrads {
        grads: Vec<BufferId>,
        scale: BufferId,
        found_inf: BufferId,
    },
    /// Loss scaling, step 2: sum the `FoundInf` scalar over `group` in rank
    /// order, so every rank skips the step when any found an inf or NaN.
    FoundInfAllReduce { buffer: BufferId, group: Group },
    /// Loss scaling, step 3 (after the optimizer steps): when `found_inf`
    /// is nonzero multiply the scale by `backoff_factor` and reset the good
    /// steps; else count a good step, and after `growth_interval` of them
    /// multiply the scale by `growth_factor` and reset the count
    /// (PyTorch's `_amp_update_scale_`).
    UpdateScale {
        scale: BufferId,
        found_inf: BufferId,
        growth_factor: f64,
        backoff_factor: f64,
        growth_interval: u32,
    },
    /// Gradient clipping, step 1: write into `dst` (a `GradNorm` scalar)
    /// the sum of squares of every element of the buffers `grads`, in list
    /// order, accumulated in f64.
    GradNormSq { grads: Vec<BufferId>, dst: BufferId },
    /// Gradient clipping, step 2: sum the scalar `buffer` over `group` in
    /// rank order (no division): the squared global norm.
    NormAllReduce { buffer: BufferId, group: Group },
    /// Gradient clipping, step 3: scale `grads` by
    /// `min(1, max_norm / (sqrt(norm) + 1e-6))`, where `norm` holds the
    /// squared global norm.
    ClipGrads {
        unit: UnitId,
        norm: BufferId,
        grads: BufferId,
        max_norm: f64,
    },
    /// The buffer's memory may be reused after this point.
    Free { buffer: BufferId },
    /// `cpu_offload`: copy all of `src` into `dst` (same size, one in host
    /// memory and the other on the device): a unit's parameter shard in
    /// before its all-gather (offload stream), its reduced gradient shard
    /// out before its optimizer step (reduce stream).
    Copy {
        unit: UnitId,
        src: BufferId,
        dst: BufferId,
    },
    /// Mark the completion of everything issued so far on this stream.
    Record { event: EventId },
    /// Block this stream until the event has been recorded.
    Wait { event: EventId },
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

fn is_zero_u32(x: &u32) -> bool {
    *x == 0
}

fn is_false(x: &bool) -> bool {
    !*x
}

/// Per-rank memory: the arena (every buffer, kernel workspaces included) and
/// the bounded transient heap of the matrix-product library; `rank_bytes` is
/// what a rank holds at most during a step.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct MemorySummary {
    /// Maximum over the schedule of the bytes of live buffers.
    pub peak_bytes: u64,
    /// Instruction index at which the peak is reached.
    pub peak_at: u32,
    /// Size of the arena the runtime allocates (>= peak_bytes; the difference
    /// is fragmentation left by offset assignment).
    pub arena_bytes: u64,
    /// Live bytes at the peak, by buffer kind.
    pub breakdown: Vec<(BufferKind, u64)>,
    /// Bytes of the streams' `Workspace` buffers (inside the arena).
    #[serde(default)]
    pub workspace_bytes: u64,
    /// Most bytes the matrix-product library (`gemm`) allocates on its own
    /// at once, outside the arena: its packing buffers for the largest
    /// product panel plus its per-thread L2 slab (`workspace::gemm_heap`).
    #[serde(default)]
    pub heap_bytes: u64,
    /// `arena_bytes + host_arena_bytes + heap_bytes`: the most a rank holds
    /// during a step, the figure the runtime's measured peak is compared
    /// with.
    #[serde(default)]
    pub rank_bytes: u64,
    /// `cpu_offload`: the maximum of live host bytes (parameter and
    /// gradient shards, optimizer state; all persistent). `peak_bytes`,
    /// `arena_bytes` and `breakdown` count the device only. 0 without
    /// offload.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_peak_bytes: u64,
    /// `cpu_offload`: size of the host arena (>= `host_peak_bytes`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub host_arena_bytes: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, Default)]
pub struct Estimates {
    pub peak_bytes_per_rank: u64,
    /// Bytes each rank sends per step over all collectives.
    pub comm_bytes_per_step: u64,
    /// FLOPs one rank computes per step (activation-checkpointing
    /// recomputation included).
    pub flops_per_rank_step: f64,
    /// Simulated step time in seconds.
    pub step_time_s: f64,
    /// Simulated time the compute stream waits on communication.
    pub exposed_comm_s: f64,
    /// Model FLOP/s per rank, in TFLOP/s: recomputation does not count.
    pub tflops_per_rank: f64,
    /// Model FLOPs utilisation against the preset's peak (recomputation
    /// does not count).
    pub mfu: f64,
}

impl InstrOp {
    /// The buffers this instruction reads (a read-write buffer appears in
    /// both `reads` and `writes`).
    pub fn reads(&self) -> Vec<BufferId> {
        match self {
            // A quantized collective's scratch and a rewritten one's staging
            // are written before they are read, by the collective itself:
            // they are in `writes` only.
            InstrOp::AllGather { src, .. }
            | InstrOp::ReduceScatter { src, .. }
            | InstrOp::Reshard { src, .. }
            | InstrOp::Copy { src, .. } => vec![*src],
            InstrOp::AllReduce { buffer, .. }
            | InstrOp::NormAllReduce { buffer, .. }
            | InstrOp::FoundInfAllReduce { buffer, .. } => vec![*buffer],
            InstrOp::GradNormSq { grads, .. } => grads.clone(),
            InstrOp::Accumulate { src, dst, .. } => vec![*src, *dst],
            InstrOp::ScaleSeed { scale, .. } => vec![*scale],
            InstrOp::UnscaleGrads { grads, scale, .. } => {
                grads.iter().copied().chain([*scale]).collect()
            }
            InstrOp::UpdateScale {
                scale, found_inf, ..
            } => vec![*scale, *found_inf],
            InstrOp::ClipGrads { norm, grads, .. } => vec![*norm, *grads],
            InstrOp::Kernel { inputs, .. } => inputs.iter().map(|s| s.buffer).collect(),
            InstrOp::OptimizerStep {
                params,
                grads,
                state,
                skip_if,
                ..
            } => [*params, *grads]
                .into_iter()
                .chain(state.iter().copied())
                .chain(*skip_if)
                .collect(),
            InstrOp::LoadInput { .. }
            | InstrOp::Free { .. }
            | InstrOp::Record { .. }
            | InstrOp::Wait { .. } => Vec::new(),
        }
    }

    /// The buffers this instruction writes.
    pub fn writes(&self) -> Vec<BufferId> {
        match self {
            InstrOp::AllGather {
                dst,
                wire_buffer,
                staging,
                ..
            }
            | InstrOp::ReduceScatter {
                dst,
                wire_buffer,
                staging,
                ..
            } => std::iter::once(*dst)
                .chain(*wire_buffer)
                .chain(*staging)
                .collect(),
            InstrOp::Reshard { dst, .. } | InstrOp::Copy { dst, .. } => vec![*dst],
            InstrOp::AllReduce {
                buffer, staging, ..
            } => std::iter::once(*buffer).chain(*staging).collect(),
            InstrOp::NormAllReduce { buffer, .. } | InstrOp::FoundInfAllReduce { buffer, .. } => {
                vec![*buffer]
            }
            InstrOp::GradNormSq { dst, .. } | InstrOp::Accumulate { dst, .. } => vec![*dst],
            InstrOp::ScaleSeed { dst, .. } => vec![dst.buffer],
            InstrOp::UnscaleGrads {
                grads, found_inf, ..
            } => grads.iter().copied().chain([*found_inf]).collect(),
            InstrOp::UpdateScale { scale, .. } => vec![*scale],
            InstrOp::ClipGrads { grads, .. } => vec![*grads],
            InstrOp::LoadInput { dst, .. } => vec![dst.buffer],
            InstrOp::Kernel { outputs, .. } => outputs.iter().map(|s| s.buffer).collect(),
            InstrOp::OptimizerStep { params, state, .. } => std::iter::once(*params)
                .chain(state.iter().copied())
                .collect(),
            InstrOp::Free { .. } | InstrOp::Record { .. } | InstrOp::Wait { .. } => Vec::new(),
        }
    }

    /// True for all-gathers, reduce-scatters and all-reduces.
    pub fn is_collective(&self) -> bool {
        matches!(
            self,
            InstrOp::AllGather { .. }
                | InstrOp::ReduceScatter { .. }
                | InstrOp::AllReduce { .. }
                | InstrOp::NormAllReduce { .. }
                | InstrOp::FoundInfAllReduce { .. }
        )
    }
}

impl BufferKind {
    /// Buffers that live for the whole run (`end: None`, `start: 0`).
    pub fn is_persistent(self) -> bool {
        matches!(
            self,
            BufferKind::ShardParams
                | BufferKind::ShardGrads
                | BufferKind::OptimizerState
                | BufferKind::Loss
                | BufferKind::GradNorm
                | BufferKind::LossScale
                | BufferKind::FoundInf
                | BufferKind::Workspace
                | BufferKind::Staging
        )
    }
}
