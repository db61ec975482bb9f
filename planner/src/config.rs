//! The FSDP configuration a user chooses, and parsers for the CLI's strings.

use crate::error::PlanError;
use crate::plan::{BackwardPrefetch, CheckpointPolicy, SharedParams, Strategy, WrapPolicy};
use fsdpc_ir::DType;
use serde::{Deserialize, Serialize};

/// How to shard a training program.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FsdpConfig {
    pub strategy: Strategy,
    pub wrap: WrapPolicy,
    pub backward_prefetch: BackwardPrefetch,
    /// At most this many resharded units' gathered parameters alive at once
    /// (PyTorch's `limit_all_gathers`). Must be at least 1.
    pub limit_all_gathers: u32,
    /// The dtype parameters are gathered and computed in (see `precision`).
    pub param_dtype: DType,
    /// The dtype gradients are reduced in: f32 or `param_dtype`.
    pub reduce_dtype: DType,
    /// The dtype the model's constants (PyTorch's buffers) are cast to.
    #[serde(default = "crate::precision::f32")]
    pub buffer_dtype: DType,
    /// The fp16 loss scaler's initial scale (`None`: 2^16, PyTorch's
    /// `ShardedGradScaler` default); only with an fp16 policy.
    #[serde(default)]
    pub init_loss_scale: Option<f64>,
    /// Which units recompute their forward activations in backward instead
    /// of keeping them (trades compute for activation memory).
    #[serde(default)]
    pub activation_checkpointing: CheckpointPolicy,
    /// Clip gradients to this total L2 norm over all shards before each
    /// optimizer step (PyTorch's `FSDP.clip_grad_norm_(max_norm)`); `None`:
    /// no clipping. Must be finite and positive.
    #[serde(default)]
    pub clip_grad_norm: Option<f64>,
    /// Freeze the parameters whose names match any of these glob patterns
    /// (`transformer.h.0.*`, `*.wte.weight`; see `freeze`): no gradient,
    /// no gradient memory, no reduction, no optimizer state for them.
    #[serde(default)]
    pub freeze: Vec<String>,
    /// Where parameters read by several units live (`--shared-params`; see
    /// `units`).
    #[serde(default)]
    pub shared_params: SharedParams,
    /// Return `PlanError::DoesNotFit` when the peak exceeds the rank's memory.
    /// `fsdpc inspect` turns this off: a plan that does not fit is still worth
    /// reading.
    pub check_fits: bool,
}

impl Default for FsdpConfig {
    fn default() -> FsdpConfig {
        FsdpConfig {
            strategy: Strategy::FullShard,
            wrap: WrapPolicy::Blocks,
            backward_prefetch: BackwardPrefetch::Pre,
            limit_all_gathers: 2,
            param_dtype: DType::F32,
            reduce_dtype: DType::F32,
            buffer_dtype: DType::F32,
            init_loss_scale: None,
            activation_checkpointing: CheckpointPolicy::None,
            clip_grad_norm: None,
            freeze: Vec::new(),
            shared_params: SharedParams::Root,
            check_fits: true,
        }
    }
}

impl FsdpConfig {
    /// The sharding factor F for `world` ranks.
    pub fn shard_factor(&self, world: u32) -> u32 {
        match self.strategy {
            Strategy::FullShard => world,
            Strategy::NoShard => 1,
        }
    }

    /// Rejects settings the planner does not support yet.
    pub fn check(&self) -> Result<(), PlanError> {
        let bad = |what, value: String, reason: &str| PlanError::BadConfig {
            what,
            value,
            reason: reason.to_string(),
        };
        if self.limit_all_gathers == 0 {
            return Err(bad("limit_all_gathers", "0".into(), "must be at least 1"));
        }
        if let Some(x) = self.clip_grad_norm {
            if !(x.is_finite() && x > 0.0) {
                return Err(bad(
                    "clip_grad_norm",
                    x.to_string(),
                    "must be a finite number greater than 0",
                ));
            }
        }
        crate::precision::check(self)
    }
}

impl CheckpointPolicy {
    /// The forms `CheckpointPolicy::parse` accepts.
    pub const ALLOWED: &'static str =
        "none, all (or units), every:<K>, paths:<path>,<path>,..., kind:<ModuleClass>";

    /// The policy as `parse` accepts it (`every:2`, `paths:h.0,h.2`).
    pub fn name(&self) -> String {
        match self {
            CheckpointPolicy::None => "none".to_string(),
            CheckpointPolicy::Units => "all".to_string(),
            CheckpointPolicy::Every(k) => format!("every:{k}"),
            CheckpointPolicy::Paths(p) => format!("paths:{}", p.join(",")),
            CheckpointPolicy::Kind(k) => format!("kind:{k}"),
        }
    }

    /// Parses `none`, `all` (`units`, or the empty string: the bare flag),
    /// `every:K` (K >= 1), `paths:a,b` or `kind:GPT2Block`.
    pub fn parse(s: &str) -> Result<CheckpointPolicy, PlanError> {
        let s = s.trim();
        let bad = |reason: String| PlanError::BadConfig {
            what: "activation checkpointing",
            value: s.to_string(),
            reason,
        };
        let (head, arg) = match s.split_once(':') {
            Some((h, a)) => (h.trim().to_ascii_lowercase(), Some(a.trim())),
            None => (s.to_ascii_lowercase(), None),
        };
        match (head.as_str(), arg) {
            ("none", None) => Ok(CheckpointPolicy::None),
            ("" | "all" | "units", None) => Ok(CheckpointPolicy::Units),
            ("every", Some(k)) => k
                .parse::<u32>()
                .ok()
                .filter(|&k| k > 0)
                .map(CheckpointPolicy::Every)
                .ok_or_else(|| bad(format!("`{k}` is not a positive whole number"))),
            ("kind", Some(k)) if !k.is_empty() => Ok(CheckpointPolicy::Kind(k.to_string())),
            ("paths", Some(p)) => module_paths(p).map(CheckpointPolicy::Paths).map_err(bad),
            _ => Err(bad(format!("allowed forms: {}", CheckpointPolicy::ALLOWED))),
        }
    }
}

impl SharedParams {
    /// Parses `root` or `owner`.
    pub fn parse(s: &str) -> Result<SharedParams, PlanError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "root" => Ok(SharedParams::Root),
            "owner" => Ok(SharedParams::Owner),
            _ => Err(PlanError::BadConfig {
                what: "shared params",
                value: s.to_string(),
                reason: format!("allowed values: {}", SharedParams::ALLOWED),
            }),
        }
    }
}

impl Strategy {
    /// The values `Strategy::parse` accepts.
    pub const ALLOWED: &'static str = "full_shard, no_shard";

    /// Parses `full_shard` or `no_shard` (PyTorch's upper-case names too).
    pub fn parse(s: &str) -> Result<Strategy, PlanError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "full_shard" => Ok(Strategy::FullShard),
            "no_shard" => Ok(Strategy::NoShard),
            _ => Err(PlanError::BadConfig {
                what: "strategy",
                value: s.to_string(),
                reason: format!("allowed values: {}", Strategy::ALLOWED),
            }),
        }
    }
}

impl BackwardPrefetch {
    /// The values `BackwardPrefetch::parse` accepts.
    pub const ALLOWED: &'static str = "pre, post, none";

    /// Parses `pre`, `post` or `none` (also `backward_pre`, `backward_post`).
    pub fn parse(s: &str) -> Result<BackwardPrefetch, PlanError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "pre" | "backward_pre" => Ok(BackwardPrefetch::Pre),
            "post" | "backward_post" => Ok(BackwardPrefetch::Post),
            "none" => Ok(BackwardPrefetch::None),
            _ => Err(PlanError::BadConfig {
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

    /// Parses `blocks`, `kind:GPT2Block`, `size:1000000` or `paths:a,b`.
    pub fn parse(s: &str) -> Result<WrapPolicy, PlanError> {
        let s = s.trim();
        let bad = |reason: String| PlanError::BadConfig {
            what: "wrap policy",
            value: s.to_string(),
            reason,
        };
        let (head, arg) = match s.split_once(':') {
            Some((h, a)) => (h.trim(), Some(a.trim())),
            None => (s, None),
        };
        match (head, arg) {
            ("blocks", None) => Ok(WrapPolicy::Blocks),
            ("kind", Some(k)) if !k.is_empty() => Ok(WrapPolicy::Kind {
                kind: k.to_string(),
            }),
            ("size", Some(n)) => n
                .replace('_', "")
                .parse::<u64>()
                .ok()
                .filter(|&n| n > 0)
                .map(|min_numel| WrapPolicy::Size { min_numel })
                .ok_or_else(|| bad(format!("`{n}` is not a positive whole number"))),
            ("paths", Some(p)) => module_paths(p)
                .map(|paths| WrapPolicy::Paths { paths })
                .map_err(bad),
            _ => Err(bad(format!("allowed forms: {}", WrapPolicy::ALLOWED))),
        }
    }
}

/// The module paths of a `paths:a,b` policy: comma-separated, blanks
/// dropped, at least one.
fn module_paths(list: &str) -> Result<Vec<String>, String> {
    let paths: Vec<String> = list
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(String::from)
        .collect();
    if paths.is_empty() {
        return Err("give at least one module path".into());
    }
    Ok(paths)
}
