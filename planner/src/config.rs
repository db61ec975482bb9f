//! The FSDP configuration a user chooses, and parsers for the CLI's strings.

use crate::error::PlanError;
use fsdpc_plan::target::Capabilities;
use fsdpc_plan::{ReshardAfterForward, Settings, Strategy};
use serde::{Deserialize, Serialize};

/// How to shard a training program: the user's settings (`Settings`, which
/// a plan records as they are and which read through the configuration:
/// `cfg.grad_accum`) and what the planner resolves from them or needs
/// besides.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FsdpConfig {
    #[serde(flatten)]
    pub settings: Settings,
    /// F, the ranks one flat parameter is sharded over (`--shard-factor`);
    /// `None`: the strategy's default (the world; one node for the hybrid
    /// strategies; 1 for no_shard). Must divide the world.
    #[serde(default)]
    pub shard_factor: Option<u32>,
    /// What non-root units do with gathered parameters after forward;
    /// `None`: the strategy's default (`Full` for full_shard and
    /// hybrid_shard, `Keep` for the ZeRO-2 strategies).
    #[serde(default)]
    pub reshard_after_forward: Option<ReshardAfterForward>,
    /// Per-unit overrides of `reshard_after_forward`, by the module path
    /// that defines the unit (FSDP2's per-module setting; the root unit
    /// always keeps its parameters). Every `To(n)` of a plan has one n.
    #[serde(default)]
    pub reshard_units: Vec<(String, ReshardAfterForward)>,
    /// The fp16 loss scaler's initial scale (`None`: 2^16, PyTorch's
    /// `ShardedGradScaler` default); only with an fp16 policy.
    #[serde(default)]
    pub init_loss_scale: Option<f64>,
    /// With `cpu_offload`: which units offload (`--cpu-offload WHICH`;
    /// default all).
    #[serde(default)]
    pub offload_units: fsdpc_plan::OffloadUnits,
    /// The collective rewrite rules the `rewrite` pass may use
    /// (`--rewrites`; default all).
    #[serde(default)]
    pub rewrites: crate::rewrite::Rules,
    /// Return `PlanError::DoesNotFit` when the peak exceeds the rank's memory.
    /// `fsdpc inspect` turns this off: a plan that does not fit is still worth
    /// reading.
    pub check_fits: bool,
    /// What the target the plan is for runs (`--target`; default the
    /// thread ranks', which run everything): the compile refuses settings
    /// it cannot run and rewrites only into forms it runs.
    #[serde(default = "threads")]
    pub target: Capabilities,
}

fn threads() -> Capabilities {
    Capabilities::all("threads")
}

impl Default for FsdpConfig {
    fn default() -> FsdpConfig {
        FsdpConfig {
            settings: Settings::default(),
            shard_factor: None,
            reshard_after_forward: None,
            reshard_units: Vec::new(),
            init_loss_scale: None,
            offload_units: fsdpc_plan::OffloadUnits::All,
            rewrites: crate::rewrite::Rules::default(),
            check_fits: true,
            target: threads(),
        }
    }
}

impl std::ops::Deref for FsdpConfig {
    type Target = Settings;
    fn deref(&self) -> &Settings {
        &self.settings
    }
}

impl std::ops::DerefMut for FsdpConfig {
    fn deref_mut(&mut self) -> &mut Settings {
        &mut self.settings
    }
}

impl FsdpConfig {
    /// The sharding factor F for `world` ranks, `ranks_per_node` to a node:
    /// the user's, or the strategy's default. An F that does not divide the
    /// world (or is not 1 under no_shard) is `PlanError::BadConfig`.
    ///
    /// With tensor parallelism (T > 1) these are the world / T data ranks,
    /// ranks per node / T of them to a node.
    pub fn shard_factor(&self, world: u32, ranks_per_node: u32) -> Result<u32, PlanError> {
        let t = self.tensor_parallel.max(1);
        let world = (world / t).max(1);
        let ranks_per_node = (ranks_per_node / t).max(1);
        let default = match self.strategy {
            Strategy::NoShard => 1,
            s if s.is_hybrid() => ranks_per_node.clamp(1, world),
            _ => world,
        };
        let f = self.shard_factor.unwrap_or(default);
        let bad = |reason: String| PlanError::BadConfig {
            what: "shard_factor",
            value: f.to_string(),
            reason,
        };
        if self.strategy == Strategy::NoShard && f != 1 {
            return Err(bad("no_shard replicates every parameter: F is 1".into()));
        }
        if f == 0 || !world.is_multiple_of(f) {
            let divisors: Vec<String> = (1..=world)
                .filter(|d| world.is_multiple_of(*d))
                .map(|d| d.to_string())
                .collect();
            let ranks = if t > 1 { "data ranks" } else { "ranks" };
            return Err(bad(format!(
                "must divide the world of {world} {ranks}: one of {}",
                divisors.join(", ")
            )));
        }
        Ok(f)
    }

    /// What non-root units do after forward for sharding factor `f`: the
    /// user's setting or the strategy's, with `To(1)` read as `Keep` and
    /// `To(f)` as `Full`. An n that does not divide F is
    /// `PlanError::BadConfig`.
    pub fn reshard(&self, f: u32) -> Result<ReshardAfterForward, PlanError> {
        let default = if self.strategy.reshards_after_forward() {
            ReshardAfterForward::Full
        } else {
            ReshardAfterForward::Keep
        };
        normalize_reshard(self.reshard_after_forward.unwrap_or(default), f)
    }

    /// Sets each unit's own `reshard_after_forward` from `reshard_units`
    /// (normalised for F = `f`; left unset where it equals `default`, the
    /// plan's). A path that defines no non-root unit, or two different n of
    /// `To(n)` in one plan, is `PlanError::BadConfig`.
    pub fn reshard_units(
        &self,
        f: u32,
        default: ReshardAfterForward,
        units: &mut [fsdpc_plan::Unit],
    ) -> Result<(), PlanError> {
        for (path, r) in &self.reshard_units {
            let r = normalize_reshard(*r, f)?;
            let Some(unit) = units.iter_mut().skip(1).find(|u| &u.module == path) else {
                let known: Vec<&str> = units.iter().skip(1).map(|u| u.module.as_str()).collect();
                return Err(PlanError::BadConfig {
                    what: "reshard_after_forward",
                    value: format!("{path}={}", r.name()),
                    reason: format!(
                        "`{path}` is not a non-root unit; the units are: {}",
                        known.join(", ")
                    ),
                });
            };
            unit.reshard_after_forward = (r != default).then_some(r);
        }
        let ns: std::collections::BTreeSet<u32> = std::iter::once(default)
            .chain(units.iter().filter_map(|u| u.reshard_after_forward))
            .filter_map(|r| match r {
                ReshardAfterForward::To(n) => Some(n),
                _ => None,
            })
            .collect();
        if ns.len() > 1 {
            let list: Vec<String> = ns.iter().map(|n| n.to_string()).collect();
            return Err(PlanError::BadConfig {
                what: "reshard_after_forward",
                value: list.join(", "),
                reason: "units of one plan reshard to one group size".into(),
            });
        }
        Ok(())
    }
}

/// `r` for shard factor `f`: `To(1)` is `Keep`, `To(f)` is `Full`, nothing is
/// resharded when F is 1; an n that does not divide F is an error.
fn normalize_reshard(r: ReshardAfterForward, f: u32) -> Result<ReshardAfterForward, PlanError> {
    if f <= 1 {
        return Ok(ReshardAfterForward::Keep);
    }
    match r {
        ReshardAfterForward::To(1) => Ok(ReshardAfterForward::Keep),
        ReshardAfterForward::To(n) if n == f => Ok(ReshardAfterForward::Full),
        ReshardAfterForward::To(n) if n == 0 || !f.is_multiple_of(n) => Err(PlanError::BadConfig {
            what: "reshard_after_forward",
            value: n.to_string(),
            reason: format!("must divide the shard factor {f}"),
        }),
        r => Ok(r),
    }
}

impl FsdpConfig {
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
        if self.prefetch_depth == 0 {
            return Err(bad("prefetch_depth", "0".into(), "must be at least 1"));
        }
        if self.grad_accum == 0 {
            return Err(bad("grad_accum", "0".into(), "must be at least 1"));
        }
        if self.no_sync && self.grad_accum <= 1 {
            return Err(bad(
                "no_sync",
                "true".into(),
                "skips gradient reduction between micro-batches: give grad_accum > 1",
            ));
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
        if self.cpu_offload && self.strategy == Strategy::NoShard {
            return Err(bad(
                "cpu_offload",
                "true".into(),
                "needs a sharded strategy (no_shard's kernels read the parameters in place)",
            ));
        }
        crate::quantize::check(self.wires(), self.strategy)?;
        crate::precision::check(self)
    }

    /// The wire formats of the collectives (see `wire`).
    pub fn wires(&self) -> crate::quantize::Wires {
        crate::quantize::Wires {
            all_gather: self.allgather_wire,
            reduce_scatter: self.reduce_scatter_wire,
        }
    }
}
