//! The plan document: the versioned JSON a planner emits and every runtime
//! executes, its model and program, and how it is read back (schema
//! version, then every invariant: `validate`).
//!
//! The instruction list is rank-generic (SPMD): every rank runs the same
//! list and finds its shard from its rank and group (`Plan::geometry`), so
//! a plan does not grow with the number of ranks.

use crate::buffer::{Buffer, Location, Slot};
use crate::cluster::Cluster;
use crate::config::{PlanConfig, ReshardAfterForward};
use crate::error::LoadError;
use crate::eval::EvalPass;
use crate::group::Geometry;
use crate::ids::UnitId;
use crate::instr::{Instr, InstrOp, Stream};
use crate::memory::{Estimates, MemorySummary};
use crate::offload::OffloadWhat;
use crate::unit::{reshard_group, unit_reshard, Unit};
use fsdpc_ir::TrainingProgram;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// The schema version of every plan this crate writes and reads.
pub const SCHEMA: &str = "fsdpc.plan/v1";

/// A plan: everything a runtime needs to train the program on every rank,
/// and what the planner predicted of it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Plan {
    /// Always `SCHEMA`.
    pub schema: String,
    pub model: ModelInfo,
    /// The cluster the plan was made for (its estimates are for it).
    pub cluster: Cluster,
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
    /// The forward-only prefix of `instructions` a runtime runs to
    /// evaluate held-out data (`eval`); absent in a plan that has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<EvalPass>,
    pub memory: MemorySummary,
    pub estimates: Estimates,
    /// The program the kernels refer to (nodes by id). Shared: plans the
    /// planner lowers from one prepared program hold the same one.
    pub training: Arc<TrainingProgram>,
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

    /// The learning rate of 0-based optimizer step `step`: the program's
    /// optimizer `lr` under the configured schedule (`config.lr_schedule`).
    pub fn lr_at(&self, step: u64) -> f64 {
        let lr = self.training.optimizer.lr();
        self.config.lr_schedule.lr_at(lr, step)
    }

    /// The optimizer a rank steps with at `step`: the program's, at that
    /// step's learning rate.
    pub fn optimizer_at(&self, step: u64) -> fsdpc_ir::Optimizer {
        self.training.optimizer.with_lr(self.lr_at(step))
    }

    /// What a rank needs to find its groups' members.
    pub fn geometry(&self) -> Geometry {
        Geometry {
            world: self.cluster.world,
            tensor: self.config.tensor_parallel,
            shard_factor: self.config.shard_factor,
            reshard: self.reshard_group(),
            ranks_per_node: self.cluster.ranks_per_node,
        }
    }

    /// What unit `u` keeps in host memory, if anything: with `cpu_offload`,
    /// the units of `offloaded_units` (every unit when the list is absent,
    /// as in plans written before partial offload) offload `offload_what`.
    pub fn unit_offload(&self, u: UnitId) -> Option<OffloadWhat> {
        let c = &self.config;
        let listed = c.offloaded_units.is_empty() || c.offloaded_units.contains(&u);
        (c.cpu_offload && listed).then_some(c.offload_what)
    }

    /// Whether buffer `b` belongs in host memory: an offloaded unit's
    /// shards and state (`params`) or its state (`optimizer`).
    pub fn offloads_buffer(&self, b: &Buffer) -> bool {
        b.unit
            .and_then(|u| self.unit_offload(u))
            .is_some_and(|what| what.keeps_on_host(b.kind))
    }

    /// Bytes the plan's copies move into `to` per step (offload traffic:
    /// `Location::Device` is what is fetched, `Location::Host` written back).
    pub fn copied_bytes(&self, to: Location) -> u64 {
        self.instructions
            .iter()
            .filter_map(|i| match i.op {
                InstrOp::Copy { dst, .. } => self.buffers.get(dst.index()),
                _ => None,
            })
            .filter(|b| b.location == to)
            .map(|b| b.bytes)
            .sum()
    }

    /// Parses a plan, checks its schema version and validates it.
    pub fn from_json(text: &str) -> Result<Plan, LoadError> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| LoadError::Json(e.to_string()))?;
        let found = value
            .get("schema")
            .and_then(|s| s.as_str())
            .unwrap_or("(none)");
        if found != SCHEMA {
            return Err(LoadError::Schema {
                found: found.to_string(),
                expected: SCHEMA.to_string(),
            });
        }
        let plan: Plan =
            serde_json::from_value(value).map_err(|e| LoadError::Json(e.to_string()))?;
        plan.validate().map_err(LoadError::Invalid)?;
        Ok(plan)
    }

    /// The plan as pretty-printed JSON.
    pub fn to_json_pretty(&self) -> Result<String, LoadError> {
        serde_json::to_string_pretty(self).map_err(|e| LoadError::Json(e.to_string()))
    }
}
