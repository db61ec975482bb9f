//! What a plan was configured with: the strategy and sharding factor, the
//! wrap, prefetch and limiter settings, the precision policy, recomputation,
//! offload, accumulation, clipping and the wire formats, as `fsdpc compile`
//! chose them. The runtime reads only what it must execute; the rest is a
//! record.

use crate::error::ConfigError;
use crate::ids::UnitId;
use crate::lr::LrSchedule;
use crate::offload::OffloadWhat;
use crate::selector::{self, Selector};
use crate::serde_default::{is_false, is_one, is_yes, is_zero_f64, one, yes};
use crate::wire::Wire;
use fsdpc_ir::DType;
use serde::{Deserialize, Serialize};

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
/// the planner's `recompute` pass). Only non-root units are ever checkpointed.
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
    /// Every non-root unit, by operation (torchtitan's selective op
    /// recomputation): the outputs of attention and of every other matrix
    /// product (the first, third, ... in the unit's forward) are kept; the
    /// rest of the unit's forward is recomputed from them and the unit's
    /// input.
    Ops,
}

/// What a user chooses that a plan records as chosen: the settings the
/// planner's configuration holds beside what it resolves (`FsdpConfig`)
/// and a plan's configuration flattens (`PlanConfig`), listed once so
/// nothing asked for is dropped on the way.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Settings {
    pub strategy: Strategy,
    /// T: the ranks each layer's matrices are split over (Megatron-style
    /// tensor parallelism, the mesh's inner dimension; absent: 1, none).
    /// The strategy shards over the world / T data ranks.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub tensor_parallel: u32,
    /// With T > 1, sequence parallelism (Megatron-SP): the activations
    /// between split regions held as row chunks over the tensor group
    /// (absent: on).
    #[serde(default = "yes", skip_serializing_if = "is_yes")]
    pub sequence_parallel: bool,
    pub wrap: WrapPolicy,
    pub backward_prefetch: BackwardPrefetch,
    /// At most this many units' gathered parameters alive at once
    /// (PyTorch's `limit_all_gathers`; at least 1).
    pub limit_all_gathers: u32,
    /// The dtype parameters are gathered and computed in.
    pub param_dtype: DType,
    /// The dtype gradients are reduced in: f32 or `param_dtype`.
    pub reduce_dtype: DType,
    /// The dtype constants (PyTorch's buffers) are cast to (absent in plans
    /// written before mixed precision existed: f32).
    #[serde(default = "crate::serde_default::f32")]
    pub buffer_dtype: DType,
    /// Which units recompute their forward in backward (absent: none).
    #[serde(default)]
    pub activation_checkpointing: CheckpointPolicy,
    /// Clip gradients to this total L2 norm before the optimizer step
    /// (PyTorch's `clip_grad_norm_(max_norm)`; absent: no clipping).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm: Option<f64>,
    /// The `--freeze` glob patterns (absent: every parameter trainable);
    /// the parameters they match train not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub freeze: Vec<String>,
    /// Where parameters shared across units are owned (absent: the root).
    #[serde(default)]
    pub shared_params: SharedParams,
    /// Whether a forward gather is issued before compute reaches its unit
    /// (absent: yes).
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
    /// copied on the offload stream (PyTorch's
    /// `CPUOffload(offload_params=True)`; absent: no).
    #[serde(default, skip_serializing_if = "is_false")]
    pub cpu_offload: bool,
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
    /// The learning-rate schedule of the optimizer's `lr` (absent:
    /// constant).
    #[serde(default, skip_serializing_if = "LrSchedule::is_constant")]
    pub lr_schedule: LrSchedule,
    /// Weight decay on every parameter (`--weight-decay-all`; absent: not
    /// on norms, biases and embedding tables, `FlatParam::decay`).
    #[serde(default, skip_serializing_if = "is_false")]
    pub decay_all: bool,
}

impl Default for Settings {
    /// PyTorch FSDP's defaults: full sharding, one unit per block,
    /// backward prefetch before, two gathers in flight, f32 throughout.
    fn default() -> Settings {
        Settings {
            strategy: Strategy::FullShard,
            tensor_parallel: 1,
            sequence_parallel: true,
            wrap: WrapPolicy::Blocks,
            backward_prefetch: BackwardPrefetch::Pre,
            limit_all_gathers: 2,
            param_dtype: DType::F32,
            reduce_dtype: DType::F32,
            buffer_dtype: DType::F32,
            activation_checkpointing: CheckpointPolicy::None,
            clip_grad_norm: None,
            freeze: Vec::new(),
            shared_params: SharedParams::Root,
            forward_prefetch: true,
            prefetch_depth: 1,
            grad_accum: 1,
            no_sync: false,
            cpu_offload: false,
            offload_what: OffloadWhat::Params,
            allgather_wire: Wire::Native,
            reduce_scatter_wire: Wire::Native,
            lr_schedule: LrSchedule::default(),
            decay_all: false,
        }
    }
}

/// What a plan was compiled with: the user's settings and what the planner
/// resolved from them. Its settings read through it (`plan.config.grad_accum`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PlanConfig {
    #[serde(flatten)]
    pub settings: Settings,
    /// F: the number of ranks one flat parameter is sharded over.
    pub shard_factor: u32,
    /// What non-root units do after forward (absent in older plans: what the
    /// strategy does by default).
    #[serde(default = "reshard_full")]
    pub reshard_after_forward: ReshardAfterForward,
    /// The dynamic loss scaler of an fp16 policy (absent: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<LossScaler>,
    /// The units `activation_checkpointing` selected, in unit order (absent
    /// when none is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checkpointed_units: Vec<UnitId>,
    /// With `cpu_offload`: the units offloaded, in unit order (absent in
    /// plans written before partial offload: every unit; see
    /// `Plan::unit_offload`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub offloaded_units: Vec<UnitId>,
    /// Set when `fsdpc compile --auto` chose this configuration (absent:
    /// the user chose it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoRecord>,
    /// The target the plan was made for (`threads`, `mpi`, `cuda`; absent:
    /// `threads`, whose capabilities are every plan's).
    #[serde(default = "threads", skip_serializing_if = "is_threads")]
    pub target: String,
    /// With `tensor_parallel` > 1: what the `tensor` pass split and what
    /// it left replicated (absent: no tensor parallelism).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensor: Option<TensorRecord>,
}

/// What the planner's `tensor` pass found (`PlanConfig::tensor`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorRecord {
    /// T.
    pub degree: u32,
    /// The split layers: regions, each named by the module of its first
    /// (column-parallel) product, then the head and the embeddings split
    /// by vocabulary, by module.
    pub split: Vec<String>,
    /// What was left whole, each `module: why`: regions and vocabulary
    /// layers that do not split, and key/value projections computed whole
    /// on every member.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replicated: Vec<String>,
    /// The vocabulary, when it does not split over T even padded (a
    /// member would hold none of it; plans before padding: when T does not
    /// divide it): the head and the embedding are then whole on every
    /// member, and so are the logits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocabulary_whole: Option<u64>,
    /// A split vocabulary T does not divide, padded to a multiple of T
    /// (absent: none is).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocabulary_padded: Option<VocabularyPadding>,
    /// With sequence parallelism: how the regions are left (absent: plain
    /// tensor parallelism).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<SequenceRecord>,
}

/// A vocabulary split over T members in parts of `ceil(vocabulary / T)`:
/// each member's part holds its rows or columns of the whole, then zeros
/// (`fsdpc_ir::TpSlice`). Checkpoints, exports and the trained parameters
/// hold the whole `vocabulary`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VocabularyPadding {
    /// The whole vocabulary (GPT-2's 50,257).
    pub vocabulary: u64,
    /// What the members' parts add up to: the smallest multiple of T at
    /// least `vocabulary`.
    pub padded: u64,
}

/// How sequence parallelism left the split regions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequenceRecord {
    /// Region exits that reduce-scatter into row chunks.
    pub scattered: u32,
    /// Region exits left as all-reduces (T divides neither the sum's first
    /// axis longer than 1, before its last, nor its rows).
    pub whole: u32,
    /// Chunks gathered whole for ops that do not run on chunks (a
    /// replicated head's product, the loss).
    #[serde(default)]
    pub gathered: u32,
}

impl std::ops::Deref for PlanConfig {
    type Target = Settings;
    fn deref(&self) -> &Settings {
        &self.settings
    }
}

fn threads() -> String {
    "threads".to_string()
}

fn is_threads(t: &String) -> bool {
    t == "threads"
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

fn reshard_full() -> ReshardAfterForward {
    ReshardAfterForward::Full
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

impl CheckpointPolicy {
    /// The forms `CheckpointPolicy::parse` accepts.
    pub const ALLOWED: &'static str =
        "none, all (or units), ops, every:<K>, paths:<path>,<path>,..., kind:<ModuleClass>";

    /// The policy as `parse` accepts it (`every:2`, `paths:h.0,h.2`).
    pub fn name(&self) -> String {
        match self {
            CheckpointPolicy::None => "none".to_string(),
            CheckpointPolicy::Units => "all".to_string(),
            CheckpointPolicy::Every(k) => format!("every:{k}"),
            CheckpointPolicy::Paths(p) => format!("paths:{}", p.join(",")),
            CheckpointPolicy::Kind(k) => format!("kind:{k}"),
            CheckpointPolicy::Ops => "ops".to_string(),
        }
    }

    /// Parses `none`, `all` (`units`, or the empty string: the bare flag),
    /// `ops`, `every:K` (K >= 1), `paths:a,b` or `kind:GPT2Block`
    /// (`selector`).
    pub fn parse(s: &str) -> Result<CheckpointPolicy, ConfigError> {
        let accepts = ["none", "", "all", "units", "ops", "every", "paths", "kind"];
        let what = "activation checkpointing";
        Ok(
            match selector::parse(s, what, CheckpointPolicy::ALLOWED, &accepts)? {
                Selector::Word(w) if w == "none" => CheckpointPolicy::None,
                Selector::Word(w) if w == "ops" => CheckpointPolicy::Ops,
                Selector::Every(k) => CheckpointPolicy::Every(k),
                Selector::Paths(p) => CheckpointPolicy::Paths(p),
                Selector::Kind(k) => CheckpointPolicy::Kind(k),
                Selector::Word(_) | Selector::Size(_) => CheckpointPolicy::Units,
            },
        )
    }
}

impl SharedParams {
    /// Parses `root` or `owner`.
    pub fn parse(s: &str) -> Result<SharedParams, ConfigError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "root" => Ok(SharedParams::Root),
            "owner" => Ok(SharedParams::Owner),
            _ => Err(ConfigError {
                what: "shared params",
                value: s.to_string(),
                reason: format!("allowed values: {}", SharedParams::ALLOWED),
            }),
        }
    }
}

impl Strategy {
    /// The values `Strategy::parse` accepts.
    pub const ALLOWED: &'static str =
        "full_shard, shard_grad_op, hybrid_shard, hybrid_shard_zero2, no_shard";

    /// Parses a strategy by its PyTorch name (`full_shard`, `FULL_SHARD`,
    /// `ShardingStrategy.HYBRID_SHARD`, `_hybrid_shard_zero2`).
    pub fn parse(s: &str) -> Result<Strategy, ConfigError> {
        let name = s.trim().to_ascii_lowercase();
        let name = name.strip_prefix("shardingstrategy.").unwrap_or(&name);
        let name = name.trim_start_matches('_');
        Strategy::ALL
            .into_iter()
            .find(|st| st.name() == name)
            .ok_or_else(|| ConfigError {
                what: "strategy",
                value: s.to_string(),
                reason: format!("allowed values: {}", Strategy::ALLOWED),
            })
    }
}

impl ReshardAfterForward {
    /// The values `ReshardAfterForward::parse` accepts.
    pub const ALLOWED: &'static str = "true, false, or a number of ranks n dividing F";

    /// Parses `true`, `false` or a whole number n >= 1 (FSDP2's forms).
    pub fn parse(s: &str) -> Result<ReshardAfterForward, ConfigError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "true" => Ok(ReshardAfterForward::Full),
            "false" => Ok(ReshardAfterForward::Keep),
            n => n
                .parse::<u32>()
                .ok()
                .filter(|&n| n > 0)
                .map(ReshardAfterForward::To)
                .ok_or_else(|| ConfigError {
                    what: "reshard_after_forward",
                    value: s.to_string(),
                    reason: format!("allowed values: {}", ReshardAfterForward::ALLOWED),
                }),
        }
    }

    /// The setting as `parse` accepts it.
    pub fn name(self) -> String {
        match self {
            ReshardAfterForward::Full => "true".into(),
            ReshardAfterForward::Keep => "false".into(),
            ReshardAfterForward::To(n) => n.to_string(),
        }
    }
}

impl BackwardPrefetch {
    /// The values `BackwardPrefetch::parse` accepts.
    pub const ALLOWED: &'static str = "pre, post, none";

    /// Parses `pre`, `post` or `none` (also `backward_pre`, `backward_post`).
    pub fn parse(s: &str) -> Result<BackwardPrefetch, ConfigError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "pre" | "backward_pre" => Ok(BackwardPrefetch::Pre),
            "post" | "backward_post" => Ok(BackwardPrefetch::Post),
            "none" => Ok(BackwardPrefetch::None),
            _ => Err(ConfigError {
                what: "backward prefetch",
                value: s.to_string(),
                reason: format!("allowed values: {}", BackwardPrefetch::ALLOWED),
            }),
        }
    }
}

impl WrapPolicy {
    /// The forms `WrapPolicy::parse` accepts.
    pub const ALLOWED: &'static str =
        "blocks, kind:<ModuleClass>, size:<min parameter elements>, paths:<path>,<path>,...";

    /// Parses `blocks`, `kind:GPT2Block`, `size:1000000` or `paths:a,b`
    /// (`selector`).
    pub fn parse(s: &str) -> Result<WrapPolicy, ConfigError> {
        let accepts = ["blocks", "kind", "size", "paths"];
        Ok(
            match selector::parse(s, "wrap policy", WrapPolicy::ALLOWED, &accepts)? {
                Selector::Kind(kind) => WrapPolicy::Kind { kind },
                Selector::Size(min_numel) => WrapPolicy::Size { min_numel },
                Selector::Paths(paths) => WrapPolicy::Paths { paths },
                Selector::Word(_) | Selector::Every(_) => WrapPolicy::Blocks,
            },
        )
    }
}
