//! The target a plan is for (`--target`), applied before planning: a
//! setting its capabilities do not cover is refused, naming the flag, and
//! the collective rewrites keep to the forms it runs. What is left is a
//! plan the target runs (`Capabilities::check`, which `compile` asserts).

use crate::config::FsdpConfig;
use crate::error::PlanError;
use crate::rewrite::{Rule, Rules};
use fsdpc_plan::target::Refusal;
use fsdpc_plan::CollectiveAlgorithm;

/// Refuses the settings of `cfg` that `cfg.target` cannot run.
pub fn check(cfg: &FsdpConfig) -> Result<(), PlanError> {
    let caps = &cfg.target;
    let refuse = |what: String, reason: &str| {
        Err(PlanError::Unsupported(Refusal {
            target: caps.target.clone(),
            instr: None,
            what,
            reason: reason.into(),
        }))
    };
    if cfg.cpu_offload && !caps.host_buffers {
        return refuse(
            "--cpu-offload".into(),
            "it holds no host buffers; plan without offload",
        );
    }
    for (flag, wire) in [
        ("--allgather-wire", &cfg.allgather_wire),
        ("--reduce-scatter-wire", &cfg.reduce_scatter_wire),
    ] {
        if !caps.runs_wire(wire) {
            return refuse(
                format!("{flag} {}", wire.name()),
                "its collectives travel in their own dtype; use native",
            );
        }
    }
    if crate::precision::needs_scaler(cfg) && !caps.loss_scaler {
        return refuse(
            "an fp16 policy (its loss scaler)".into(),
            "use bf16 (--param-dtype bf16), which needs no loss scaling",
        );
    }
    Ok(())
}

/// The rewrite rules of `cfg` whose forms `cfg.target` runs.
pub fn rules(cfg: &FsdpConfig) -> Rules {
    let caps = &cfg.target;
    let runs = |r: &Rule| match r {
        Rule::CastBeforeGather => true,
        Rule::HierarchicalAllGather | Rule::HierarchicalReduceScatter => {
            caps.runs_algorithm(CollectiveAlgorithm::Hierarchical)
        }
        Rule::AllReduceAsReduceScatterAllGather => {
            caps.runs_algorithm(CollectiveAlgorithm::ReduceScatterAllGather)
        }
        Rule::BucketAllGathers => caps.bucketed_gathers,
    };
    Rules(cfg.rewrites.0.iter().copied().filter(runs).collect())
}
