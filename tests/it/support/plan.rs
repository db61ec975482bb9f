//! Shared helpers for executor tests: zoo model -> training program -> plan.

use fsdpc_ir::{build_training_program, Optimizer};
use fsdpc_plan::{ModelInfo, Plan, Strategy};
use fsdpc_planner::{compile, count_params, FsdpConfig};

/// A plan for zoo model `spec` on `world` cpu-local ranks.
pub fn plan(spec: &str, world: u32, strategy: Strategy, optimizer: Optimizer) -> Plan {
    plan_config(spec, world, optimizer, |c| c.strategy = strategy)
}

/// A full-shard AdamW plan for `spec` on `world` ranks with the config
/// changed by `edit`.
pub fn plan_with(spec: &str, world: u32, edit: impl FnOnce(&mut FsdpConfig)) -> Plan {
    plan_config(spec, world, Optimizer::adamw(1e-2), edit)
}

fn plan_config(
    spec: &str,
    world: u32,
    optimizer: Optimizer,
    edit: impl FnOnce(&mut FsdpConfig),
) -> Plan {
    let m = fsdpc_frontends::zoo::build(spec).unwrap();
    let batch = m.graph.node_ids().find_map(|n| match &m.graph.node(n).op {
        fsdpc_ir::Op::Input { .. } => m.graph.node(n).outputs[0].shape.0.first().copied(),
        _ => None,
    });
    let tokens = m.tokens_per_sample * batch.unwrap_or(1) as u64;
    let prog = build_training_program(m.graph, m.loss, optimizer).unwrap();
    let model = ModelInfo {
        name: m.name.clone(),
        params: count_params(&prog),
        tokens_per_rank_step: tokens,
    };
    let cluster = fsdpc_planner::preset("cpu-local", world, world).unwrap();
    let mut cfg = FsdpConfig::default();
    edit(&mut cfg);
    compile(prog, model, &cluster, &cfg).unwrap()
}
