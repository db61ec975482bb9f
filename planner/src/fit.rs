//! What to suggest when a plan does not fit in a rank's memory: computed from
//! the plan, not guessed.
//!
//! Persistent buffers (shards, reduced gradients, optimizer state) shrink as
//! 1/F; everything else (gathered parameters, flat gradients, activations)
//! does not depend on F. So the peak at another world size is the transient
//! peak plus the persistent bytes at that F. Sharding and activation
//! checkpointing change the transient part, so those candidates are compiled.

use crate::config::FsdpConfig;
use crate::error::PlanError;
use fsdpc_plan::cluster::Cluster;
use fsdpc_plan::readable::human_bytes;
use fsdpc_plan::*;

/// The `DoesNotFit` error for `plan`, with a suggestion.
pub fn does_not_fit(plan: &Plan, cluster: &Cluster, cfg: &FsdpConfig) -> PlanError {
    let needed = plan.memory.device_peak_bytes();
    let capacity = cluster.memory_bytes;
    PlanError::DoesNotFit {
        needed_bytes: needed,
        capacity_bytes: capacity,
        over_by: needed.saturating_sub(capacity),
        suggestion: suggestion(plan, cluster, cfg),
    }
}

/// What would fit, tried in order of how little it changes: full_shard
/// instead of no_shard, then activation checkpointing (when off); each
/// candidate is compiled and measured. When none fits at this world, the
/// smallest world for full_shard, without and with checkpointing.
fn suggestion(plan: &Plan, cluster: &Cluster, cfg: &FsdpConfig) -> String {
    let mut measured: Vec<(String, Plan)> = Vec::new();
    for (label, alt) in alternatives(cfg) {
        let model = plan.model.clone();
        match crate::compile_unchecked((*plan.training).clone(), model, cluster, &alt) {
            Ok(p) if p.memory.device_peak_bytes() <= cluster.memory_bytes => {
                return format!(
                    "{label} at world {} fits (peak {} bytes per rank)",
                    cluster.world,
                    p.memory.device_peak_bytes()
                )
            }
            Ok(p) => measured.push((label, p)),
            Err(e) => return format!("{label} could not be planned: {e}"),
        }
    }
    let base = match cfg.strategy {
        Strategy::NoShard => measured.first().map(|(_, p)| p),
        _ => Some(plan),
    };
    let Some(base) = base else {
        return smallest_world(plan, cluster, plan.config.strategy.name());
    };
    let mut out = smallest_world(base, cluster, "full_shard");
    let checkpointed = measured
        .iter()
        .find(|(_, p)| p.config.activation_checkpointing != CheckpointPolicy::None);
    if let Some((_, p)) = checkpointed {
        let with = smallest_world(p, cluster, "full_shard with activation checkpointing");
        out = format!("{out}; {with}");
    }
    out
}

/// The configurations `suggestion` tries, with how it names them.
fn alternatives(cfg: &FsdpConfig) -> Vec<(String, FsdpConfig)> {
    let sharded = FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy: Strategy::FullShard,
            ..cfg.settings.clone()
        },
        check_fits: false,
        ..cfg.clone()
    };
    let mut out = Vec::new();
    if cfg.strategy == Strategy::NoShard {
        out.push(("full_shard".to_string(), sharded.clone()));
    }
    if cfg.activation_checkpointing == CheckpointPolicy::None {
        let ckpt = FsdpConfig {
            settings: fsdpc_plan::Settings {
                activation_checkpointing: CheckpointPolicy::Units,
                ..sharded.settings.clone()
            },
            ..sharded
        };
        out.push((
            "full_shard with activation checkpointing (--activation-checkpointing)".to_string(),
            ckpt,
        ));
    }
    out
}

/// Bytes per rank of the persistent buffers of `plan` at sharding factor `f`.
fn persistent_at(plan: &Plan, f: u64) -> u64 {
    plan.buffers
        .iter()
        .filter(|b| b.persistent())
        .map(|b| match (b.kind, b.unit) {
            (BufferKind::Loss, _) | (_, None) => b.bytes,
            (_, Some(u)) => {
                let flat = plan.units.get(u.index()).map_or(0, |u| u.flat_numel);
                flat.div_ceil(f) * 4
            }
        })
        .sum()
}

/// The smallest world (a multiple of ranks per node) at which a full_shard
/// plan of the same shape fits, or why none does.
fn smallest_world(plan: &Plan, cluster: &Cluster, strategy: &str) -> String {
    let f_now = u64::from(plan.config.shard_factor.max(1));
    let transient = plan
        .memory
        .device_peak_bytes()
        .saturating_sub(persistent_at(plan, f_now));
    let capacity = cluster.memory_bytes;
    let outside = plan.memory.outside_arena_bytes();
    if outside >= capacity {
        return format!(
            "{strategy} does not fit at any world size: what a GPU rank holds outside the arena \
             (its context, cuBLAS workspaces and NCCL buffers) alone needs {} ({outside} bytes); \
             check the cluster's context_bytes and nccl_channels",
            human_bytes(outside)
        );
    }
    if transient >= capacity {
        let beside = if outside > 0 {
            format!(" with {} outside the arena", human_bytes(outside))
        } else {
            String::new()
        };
        return format!(
            "{strategy} does not fit at any world size: the unsharded working set (gathered \
             parameters, flat gradients, activations){beside} alone needs {} ({transient} \
             bytes); use a finer wrap policy or a smaller batch",
            human_bytes(transient)
        );
    }
    let rpn = u64::from(cluster.ranks_per_node.max(1));
    let fits = |k: u64| transient + persistent_at(plan, k * rpn) <= capacity;
    let (mut lo, mut hi) = (1u64, 1u64);
    while !fits(hi) {
        if hi > u64::from(u32::MAX) / rpn {
            return "it does not fit at any representable world size".into();
        }
        lo = hi;
        hi *= 2;
    }
    while lo < hi {
        let mid = (lo + hi) / 2;
        if fits(mid) {
            hi = mid
        } else {
            lo = mid + 1
        }
    }
    let world = hi * rpn;
    format!(
        "{strategy} needs world >= {world} ({} nodes of {rpn}) to fit: peak {} bytes per rank",
        hi,
        transient + persistent_at(plan, world)
    )
}
