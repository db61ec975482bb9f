//! Shared test helpers: programs from the zoo, and a `plan` shortcut.
#![allow(dead_code)]

use fsdpc_ir::{Optimizer, TrainingProgram};
use fsdpc_plan::*;
use fsdpc_planner::*;

/// The training program of a zoo spec, with AdamW.
pub fn program(spec: &str) -> (TrainingProgram, ModelInfo) {
    program_with(spec, Optimizer::adamw(1e-3))
}

/// The training program of a zoo spec with `optimizer`.
pub fn program_with(spec: &str, optimizer: Optimizer) -> (TrainingProgram, ModelInfo) {
    let m = fsdpc_frontends::zoo::build(spec).expect("zoo spec builds");
    let p = fsdpc_ir::autodiff::build_training_program(m.graph, m.loss, optimizer)
        .expect("autodiff succeeds");
    let info = ModelInfo {
        name: m.name,
        params: count_params(&p),
        tokens_per_rank_step: m.tokens_per_sample,
    };
    (p, info)
}

/// Plans `spec` on `cpu-local` at `world` ranks with `cfg`.
pub fn plan(spec: &str, world: u32, cfg: &FsdpConfig) -> Result<Plan, PlanError> {
    let (p, info) = program(spec);
    let cluster = fsdpc_planner::preset("cpu-local", world, world).expect("cluster");
    compile(p, info, &cluster, cfg)
}

pub const TINY_GPT: &str = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=128,batch=2";
pub const TINY_MLP: &str = "mlp:layers=2,in=4,hidden=8,classes=3,batch=2";
