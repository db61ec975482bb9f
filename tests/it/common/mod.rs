//! Shared helpers of the end-to-end tests: compile a zoo model for a world size
//! and strategy, and train it on CPU thread ranks.

#![allow(dead_code)]

pub mod cli;

use fsdpc_frontends::LoadOptions;
use fsdpc_ir::Optimizer;
use fsdpc_plan::{Cluster, ModelInfo, Plan, Strategy, WrapPolicy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::{ExecMode, TrainOptions, TrainReport};

/// Compiles `spec` for `world` ranks on the `cpu-local` preset.
pub fn plan(spec: &str, world: u32, strategy: Strategy, wrap: WrapPolicy) -> Plan {
    plan_with(
        spec,
        world,
        &FsdpConfig {
            settings: fsdpc_plan::Settings {
                strategy,
                wrap,
                ..fsdpc_plan::Settings::default()
            },
            ..FsdpConfig::default()
        },
    )
}

/// Compiles `spec` for `world` ranks, `per_node` to a node, on the cluster
/// `preset` with `cfg`: the plan, or the planner's refusal.
pub fn compile_on(
    spec: &str,
    preset: &str,
    world: u32,
    per_node: u32,
    cfg: &FsdpConfig,
) -> Result<Plan, fsdpc_planner::PlanError> {
    let cluster = fsdpc_planner::preset(preset, world, per_node).expect("preset");
    compile_for(spec, &cluster, cfg)
}

/// Compiles `spec` on `cluster` with `cfg`: the plan, or the planner's
/// refusal.
pub fn compile_for(
    spec: &str,
    cluster: &Cluster,
    cfg: &FsdpConfig,
) -> Result<Plan, fsdpc_planner::PlanError> {
    compile_with(spec, cluster, cfg, &LoadOptions::default())
}

/// `compile_for` with the model loaded by `opts` (its optimizer, an ONNX
/// model's dimensions).
pub fn compile_with(
    spec: &str,
    cluster: &Cluster,
    cfg: &FsdpConfig,
    opts: &LoadOptions,
) -> Result<Plan, fsdpc_planner::PlanError> {
    let m = fsdpc_frontends::load(spec, opts).expect("model loads");
    let info = ModelInfo {
        tokens_per_rank_step: m.tokens_per_rank_step(),
        params: m.program.graph.param_numel(),
        name: m.name,
    };
    fsdpc_planner::compile(m.program, info, cluster, cfg)
}

/// Compiles `spec` for `world` ranks on the `cpu-local` preset with `cfg`, and
/// checks that the plan validates.
pub fn plan_with(spec: &str, world: u32, cfg: &FsdpConfig) -> Plan {
    let plan = compile_on(spec, "cpu-local", world, world, cfg).expect("plan compiles");
    if let Err(v) = plan.validate() {
        panic!("plan for {spec} at world {world} ({cfg:?}) does not validate: {v:?}");
    }
    plan
}

/// Compiles `spec` with `optimizer` for `world` thread ranks of this
/// machine as `fsdpc train` plans them: `cpu-local` at this CPU's
/// matrix-library blocking, so the plan's heap bound is what the library
/// allocates here (the memory tests' plans). Checks that it validates.
pub fn host_plan(spec: &str, world: u32, cfg: &FsdpConfig, optimizer: &Optimizer) -> Plan {
    let mut cluster = fsdpc_planner::preset("cpu-local", world, world).expect("preset");
    cluster.hardware.cpu_gemm = fsdpc_runtime::cpu::gemm_blocking();
    let opts = LoadOptions {
        optimizer: optimizer.clone(),
        ..LoadOptions::default()
    };
    let plan = compile_with(spec, &cluster, cfg, &opts).expect("plan compiles");
    if let Err(v) = plan.validate() {
        panic!("plan for {spec} at world {world} ({cfg:?}) does not validate: {v:?}");
    }
    plan
}

pub fn train(plan: &Plan, steps: u64, mode: ExecMode) -> TrainReport {
    let opts = TrainOptions {
        steps,
        seed: 7,
        mode,
        ..TrainOptions::default()
    };
    fsdpc_runtime::train(plan, &opts, &mut |_| {}).expect("training runs")
}

/// Largest relative difference between the losses of two runs, step by
/// step (each difference over `a`'s loss, at least 1e-6).
pub fn max_loss_rel_diff(a: &TrainReport, b: &TrainReport) -> f32 {
    a.losses
        .iter()
        .zip(&b.losses)
        .map(|(x, y)| (x - y).abs() / x.abs().max(1e-6))
        .fold(0f32, f32::max)
}

/// Largest absolute and relative difference between two parameter sets.
pub fn max_param_diff(a: &TrainReport, b: &TrainReport) -> (f32, f32) {
    assert_eq!(
        a.final_params.len(),
        b.final_params.len(),
        "same parameters"
    );
    let mut abs = 0f32;
    let mut rel = 0f32;
    for ((na, va), (nb, vb)) in a.final_params.iter().zip(&b.final_params) {
        assert_eq!(na, nb, "parameters in the same order");
        assert_eq!(va.len(), vb.len(), "{na} has the same size");
        for (x, y) in va.iter().zip(vb) {
            let d = (x - y).abs();
            abs = abs.max(d);
            rel = rel.max(d / x.abs().max(y.abs()).max(1e-3));
        }
    }
    (abs, rel)
}

pub fn bits(r: &TrainReport) -> (Vec<u32>, Vec<Vec<u32>>) {
    (
        r.losses.iter().map(|l| l.to_bits()).collect(),
        r.final_params
            .iter()
            .map(|(_, v)| v.iter().map(|x| x.to_bits()).collect())
            .collect(),
    )
}
