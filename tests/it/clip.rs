//! Gradient clipping (`--clip-grad-norm`): the global L2 norm over all shards
//! equals unsharded clipping; a one-step hand computation of the norm and the
//! scale; and a clip value no norm reaches changes nothing, bit for bit.

use crate::common::{bits, max_loss_rel_diff, max_param_diff, plan_with, train};
use fsdpc_frontends::LoadOptions;
use fsdpc_ir::Optimizer;
use fsdpc_plan::{InstrOp, ModelInfo, Plan, Strategy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::ExecMode;

const STEPS: u64 = 20;
/// The tolerances of `tests/it/equivalence.rs` (loss relative, parameter absolute).
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;
/// Small enough that the tiny models' gradient norms exceed it (the
/// one-step test measures the first step's norm).
const CLIP: f64 = 0.05;

fn mlp(batch: u32) -> String {
    format!("mlp:layers=3,in=16,hidden=30,classes=5,batch={batch}")
}

fn cfg(strategy: Strategy, clip: Option<f64>) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            clip_grad_norm: clip,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

/// `spec` compiled with SGD (lr 1, no momentum): one step moves each
/// parameter by exactly its (clipped) gradient.
fn sgd_plan(spec: &str, world: u32, cfg: &FsdpConfig) -> Plan {
    let opts = LoadOptions {
        optimizer: Optimizer::Sgd {
            lr: 1.0,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        ..LoadOptions::default()
    };
    let m = fsdpc_frontends::load(spec, &opts).expect("model loads");
    let cluster = fsdpc_planner::preset("cpu-local", world, world).expect("preset");
    let info = ModelInfo {
        tokens_per_rank_step: m.tokens_per_rank_step(),
        params: m.program.graph.param_numel(),
        name: m.name,
    };
    fsdpc_planner::compile(m.program, info, &cluster, cfg).expect("plan compiles")
}

#[test]
fn plan_orders_norm_all_reduce_before_every_optimizer_step() {
    let p = plan_with(&mlp(4), 2, &cfg(Strategy::FullShard, Some(CLIP)));
    let pos = |f: &dyn Fn(&InstrOp) -> bool| p.instructions.iter().position(|i| f(&i.op));
    let all = pos(&|o| matches!(o, InstrOp::NormAllReduce { .. })).expect("norm all-reduce");
    let first_step = pos(&|o| matches!(o, InstrOp::OptimizerStep { .. })).expect("a step");
    assert!(all < first_step);
    let clips = p
        .instructions
        .iter()
        .filter(|i| matches!(i.op, InstrOp::ClipGrads { .. }))
        .count();
    let steps = p
        .instructions
        .iter()
        .filter(|i| matches!(i.op, InstrOp::OptimizerStep { .. }))
        .count();
    assert_eq!(clips, steps);
    // Moving the all-reduce after the first optimizer step breaks validation.
    let mut bad = p.clone();
    let ins = bad.instructions.remove(all);
    bad.instructions.push(ins);
    assert!(bad.validate().is_err(), "validation catches a late norm");
    // no_shard: every rank holds the whole gradient, no collective.
    let n = plan_with(&mlp(4), 2, &cfg(Strategy::NoShard, Some(CLIP)));
    assert!(!n
        .instructions
        .iter()
        .any(|i| matches!(i.op, InstrOp::NormAllReduce { .. })));
}

#[test]
fn one_sgd_step_scales_by_max_norm_over_global_norm() {
    for world in [1, 2] {
        let spec = mlp(8 / world);
        let p0 = train(
            &sgd_plan(&spec, world, &cfg(Strategy::FullShard, None)),
            0,
            ExecMode::Arena,
        );
        let free = train(
            &sgd_plan(&spec, world, &cfg(Strategy::FullShard, None)),
            1,
            ExecMode::Arena,
        );
        let clipped = train(
            &sgd_plan(&spec, world, &cfg(Strategy::FullShard, Some(CLIP))),
            1,
            ExecMode::Arena,
        );
        // The gradient, by hand: p0 - p1 with lr 1.
        let mut sq = 0f64;
        for ((_, a), (_, b)) in p0.final_params.iter().zip(&free.final_params) {
            sq += a
                .iter()
                .zip(b)
                .map(|(x, y)| f64::from(x - y).powi(2))
                .sum::<f64>();
        }
        let norm = sq.sqrt();
        assert!(norm > CLIP, "clipping is active: norm {norm} > {CLIP}");
        // The runtime reports the same pre-clip norm (PyTorch's return value).
        let reported = f64::from(clipped.grad_norms[0]);
        assert!(
            (reported - norm).abs() < 1e-5 * norm,
            "reported norm {reported} vs by hand {norm}"
        );
        assert!(free.grad_norms.is_empty(), "no norm without clipping");
        let coef = CLIP / (norm + 1e-6);
        let mut worst = 0f64;
        for (((_, a), (_, b)), (_, c)) in p0
            .final_params
            .iter()
            .zip(&free.final_params)
            .zip(&clipped.final_params)
        {
            for ((x, y), z) in a.iter().zip(b).zip(c) {
                let want = f64::from(x - y) * coef;
                let got = f64::from(x - z);
                worst = worst.max((want - got).abs());
            }
        }
        println!(
            "world {world}: grad norm {norm:.6}, coef {coef:.6}, max update error {worst:.3e}"
        );
        assert!(
            worst < 1e-6,
            "clipped update = coef * gradient (error {worst:e})"
        );
    }
}

#[test]
fn sharded_clipping_equals_unsharded_clipping() {
    let c = Some(CLIP);
    let reference = train(
        &plan_with(&mlp(8), 1, &cfg(Strategy::NoShard, c)),
        STEPS,
        ExecMode::Arena,
    );
    let unclipped = train(
        &plan_with(&mlp(8), 1, &cfg(Strategy::NoShard, None)),
        STEPS,
        ExecMode::Arena,
    );
    let (d, _) = max_param_diff(&reference, &unclipped);
    assert!(d > 1e-4, "clipping changes training (diff {d:e})");
    let active = reference
        .grad_norms
        .iter()
        .filter(|&&n| f64::from(n) > CLIP)
        .count();
    println!(
        "reference: clipping active on {active} of {STEPS} steps, norms {:?}",
        reference.grad_norms
    );
    assert_eq!(reference.grad_norms.len(), STEPS as usize);
    assert!(
        active * 4 >= STEPS as usize * 3,
        "clipping active on most steps"
    );
    for (world, strategy) in [
        (2, Strategy::FullShard),
        (4, Strategy::FullShard),
        (8, Strategy::FullShard),
        (2, Strategy::NoShard),
        (4, Strategy::NoShard),
    ] {
        let r = train(
            &plan_with(&mlp(8 / world), world, &cfg(strategy, c)),
            STEPS,
            ExecMode::Arena,
        );
        let loss_rel = max_loss_rel_diff(&reference, &r);
        let (abs, _) = max_param_diff(&reference, &r);
        println!("{strategy:?} world {world}: loss rel {loss_rel:.2e}, param abs {abs:.2e}");
        assert!(
            loss_rel < LOSS_RTOL,
            "{strategy:?} {world}: loss {loss_rel}"
        );
        assert!(abs < PARAM_ATOL, "{strategy:?} {world}: params {abs}");
        let norm_rel = reference
            .grad_norms
            .iter()
            .zip(&r.grad_norms)
            .map(|(a, b)| (a - b).abs() / a.abs().max(1e-6))
            .fold(0f32, f32::max);
        println!("{strategy:?} world {world}: grad norm rel {norm_rel:.2e}");
        assert_eq!(r.grad_norms.len(), STEPS as usize);
        assert!(
            norm_rel < LOSS_RTOL,
            "{strategy:?} {world}: norm {norm_rel}"
        );
    }
}

#[test]
fn huge_clip_value_equals_no_clipping_bit_for_bit() {
    for (world, strategy) in [(1, Strategy::NoShard), (4, Strategy::FullShard)] {
        let spec = mlp(8 / world);
        let free = train(
            &plan_with(&spec, world, &cfg(strategy, None)),
            5,
            ExecMode::Arena,
        );
        let huge = train(
            &plan_with(&spec, world, &cfg(strategy, Some(1e30))),
            5,
            ExecMode::Arena,
        );
        assert_eq!(bits(&free), bits(&huge), "{strategy:?} world {world}");
    }
}

#[test]
fn bad_clip_values_are_refused() {
    for x in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let c = cfg(Strategy::FullShard, Some(x));
        let e = c.check().expect_err("refused");
        assert!(e.to_string().contains("clip_grad_norm"), "{e}");
    }
}

fn fsdpc(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(args)
        .output()
        .expect("fsdpc runs")
}

fn tmp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("fsdpc-clip-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    dir.join(name)
}

const TINY: &str = "gpt:layers=2,hidden=16,heads=2,seq=4,vocab=32,batch=2";

#[test]
fn cli_refuses_bad_values_and_the_flag_with_a_plan_and_reports_the_norm() {
    for bad in ["0", "-1", "nan", "inf"] {
        let o = fsdpc(&[
            "compile",
            TINY,
            "--world",
            "2",
            "--clip-grad-norm",
            bad,
            "-o",
            "/dev/null",
        ]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{bad} refused");
        assert!(err.contains("clip_grad_norm"), "{bad}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let plan = tmp("clip-plan.json");
    let o = fsdpc(&[
        "compile",
        TINY,
        "--world",
        "2",
        "--clip-grad-norm",
        "0.5",
        "-o",
        plan.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = fsdpc(&["inspect", plan.to_str().expect("utf8")]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("clip"), "inspect shows clipping: {text}");
    let o = fsdpc(&[
        "train",
        plan.to_str().expect("utf8"),
        "--clip-grad-norm",
        "1",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--clip-grad-norm"),
        "{err}"
    );
    let metrics = tmp("clip-metrics.jsonl");
    let o = fsdpc(&[
        "train",
        plan.to_str().expect("utf8"),
        "--steps",
        "3",
        "--metrics",
        metrics.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&metrics).expect("metrics written");
    assert_eq!(text.lines().count(), 3);
    for l in text.lines() {
        let v: serde_json::Value = serde_json::from_str(l).expect("JSON");
        assert!(v["grad_norm"].as_f64().is_some_and(|n| n > 0.0), "{v}");
    }
}

#[test]
fn memory_plan_counts_the_norm_scalar_and_padding_is_zero_weight() {
    let free = plan_with(&mlp(1), 8, &cfg(Strategy::FullShard, None));
    let clip = plan_with(&mlp(1), 8, &cfg(Strategy::FullShard, Some(CLIP)));
    // At F = 8 the units' flat parameters are padded: the equivalence at
    // world 8 above shows padded elements add nothing to the norm.
    assert!(clip.units.iter().any(|u| u.padded_numel > u.flat_numel));
    let kind = |p: &Plan| {
        p.memory
            .breakdown
            .iter()
            .find(|(k, _)| *k == fsdpc_plan::BufferKind::GradNorm)
            .map(|(_, b)| *b)
    };
    assert_eq!(kind(&free), None);
    assert_eq!(
        kind(&clip),
        Some(4),
        "the persistent scalar is live at the peak"
    );
    // One all-reduce of a 4-byte scalar over 8 ranks: 2 * 7 ring steps.
    assert_eq!(
        clip.estimates.comm_bytes_per_step,
        free.estimates.comm_bytes_per_step + 2 * 7 * 4
    );
    insta::assert_snapshot!(fsdpc_report::inspect::render_text(&clip));
}
