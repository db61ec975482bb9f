//! Mixed precision (`--mixed-precision bf16|fp16`, `--param-dtype`,
//! `--reduce-dtype`, `--buffer-dtype`): sharded training with a half policy
//! equals one unsharded rank with the same policy within a stated
//! tolerance; bf16 full_shard and no_shard at the same world are
//! bit-identical;
//! the plan moves and holds half the bytes where it should and f32 where it
//! must; the fp16 loss scaler skips a step on every rank and backs off.
//!
//! Why a tolerance against one rank, and why this one: the global batch is
//! 8 samples a step; one rank computes each weight gradient in one kernel
//! over all 8 samples (f32 accumulation) and rounds it to the half dtype
//! once, while W ranks each round their own partial gradient, and the
//! reduction sums those in f32 and rounds again. So a gradient element
//! differs by up to about two roundings, 2^-8 relative in bf16 (2^-11 in
//! fp16), and activations downstream of a parameter that moved by one
//! half-precision ulp differ by ulps too. With SGD a parameter difference is
//! lr times the summed gradient differences, so it stays of the order of
//! the half type's rounding of lr x gradient x steps; with AdamW (which
//! normalises each gradient element) it is bounded by 2 x steps x lr. The
//! measured differences are printed with --nocapture; the bounds (below)
//! sit a few times above them.

use crate::common::{bits, max_param_diff, plan_with, train};
use fsdpc_frontends::LoadOptions;
use fsdpc_ir::DType;
use fsdpc_ir::Optimizer;
use fsdpc_plan::Collective;
use fsdpc_plan::{BufferKind, InstrOp, ModelInfo, Plan, Strategy};
use fsdpc_planner::{FsdpConfig, PlanError};
use fsdpc_runtime::ExecMode;

const STEPS: u64 = 10;

fn gpt(batch: u32) -> String {
    format!("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch={batch}")
}

fn policy(d: DType, strategy: Strategy) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            param_dtype: d,
            reduce_dtype: d,
            buffer_dtype: d,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

/// `policy` for the equivalence runs: fp16 with an initial loss scale of
/// 2^10, at which no step of these runs overflows (checked). With the
/// default 2^16 some per-rank gradients of the smallest micro-batches
/// overflow fp16 and those steps are skipped, differently at each F (each
/// rank's micro-batch differs), which is the scaler working as intended
/// but leaves nothing to compare.
fn equivalence_policy(d: DType, strategy: Strategy) -> FsdpConfig {
    FsdpConfig {
        init_loss_scale: (d == DType::F16).then_some(1024.0),
        ..policy(d, strategy)
    }
}

/// Largest relative difference of two loss curves.
fn loss_rel(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / x.abs().max(1e-6))
        .fold(0f32, f32::max)
}

/// `spec` planned for `world` ranks with `cfg` and `optimizer`, validated.
fn plan_opt(spec: &str, world: u32, cfg: &FsdpConfig, optimizer: &Optimizer) -> Plan {
    let opts = LoadOptions {
        optimizer: optimizer.clone(),
        ..LoadOptions::default()
    };
    let m = fsdpc_frontends::load(spec, &opts).expect("model loads");
    let cluster = fsdpc_planner::preset("cpu-local", world, world).expect("preset");
    let info = ModelInfo {
        tokens_per_rank_step: m.tokens_per_rank_step(),
        params: m.program.graph.param_numel(),
        name: m.name,
    };
    let plan = fsdpc_planner::compile(m.program, info, &cluster, cfg).expect("plan compiles");
    plan.validate().expect("plan validates");
    plan
}

/// Trains `d` sharded at F = 2, 4, 8 and unsharded on one rank with
/// `optimizer`; returns the largest loss and parameter differences seen;
/// checks bf16 full_shard against no_shard bit for bit at worlds 2 and 4.
fn sharded_vs_one_rank(d: DType, optimizer: &Optimizer) -> (f32, f32) {
    let one = train(
        &plan_opt(
            &gpt(8),
            1,
            &equivalence_policy(d, Strategy::NoShard),
            optimizer,
        ),
        STEPS,
        ExecMode::Arena,
    );
    assert!(
        one.losses.iter().all(|l| l.is_finite()),
        "{d}: {:?}",
        one.losses
    );
    let (mut worst_loss, mut worst_param) = (0f32, 0f32);
    for world in [2u32, 4, 8] {
        let spec = gpt(8 / world);
        let fs = train(
            &plan_opt(
                &spec,
                world,
                &equivalence_policy(d, Strategy::FullShard),
                optimizer,
            ),
            STEPS,
            ExecMode::Arena,
        );
        assert!(
            one.skipped_steps.is_empty() && fs.skipped_steps.is_empty(),
            "{d} F = {world}: skipped steps {:?} (1 rank) and {:?}",
            one.skipped_steps,
            fs.skipped_steps
        );
        let l = loss_rel(&one.losses, &fs.losses);
        let (p, _) = max_param_diff(&one, &fs);
        eprintln!("{d} {} full_shard F = {world} vs 1 rank: max loss rel diff {l:e}, max param abs diff {p:e}", name(optimizer));
        worst_loss = worst_loss.max(l);
        worst_param = worst_param.max(p);
        // fp16 is not compared: under no_shard the loss scaler unscales the
        // fp16 flat gradient in place (values below fp16's range flush),
        // while full_shard unscales the f32 gradient shard.
        if world <= 4 && d == DType::Bf16 {
            let ns = train(
                &plan_opt(
                    &spec,
                    world,
                    &equivalence_policy(d, Strategy::NoShard),
                    optimizer,
                ),
                STEPS,
                ExecMode::Arena,
            );
            assert_eq!(
                bits(&fs),
                bits(&ns),
                "{d}: full_shard and no_shard at world {world} must be bit-identical"
            );
        }
    }
    (worst_loss, worst_param)
}

const SGD_LR: f64 = 0.05;
const ADAM_LR: f64 = 1e-3;
/// Tolerances against one rank (see the module header for why). Measured
/// over F = 2, 4, 8, 10 steps: with SGD, bf16 losses within 1.5e-4
/// (relative) and parameters within 3.8e-4; fp16 within 2.2e-5 and 4.0e-5;
/// with AdamW, losses within 8.2e-5 (bf16) and 5.8e-6 (fp16). The bounds sit
/// about 4 to 7 times above.
const BF16_LOSS_RTOL: f32 = 1e-3;
const BF16_SGD_ATOL: f32 = 1.5e-3;
const FP16_LOSS_RTOL: f32 = 1e-4;
const FP16_SGD_ATOL: f32 = 2.5e-4;
/// AdamW's parameters: its bound, 2 x STEPS x lr = 0.02, measured 9.2e-3
/// (bf16) and 3.9e-3 (fp16).
/// Adam divides a gradient by its running RMS, so an element whose tiny
/// gradient changes sign under one rounding still moves by a full lr: the
/// difference is the optimizer's, not an error of the reduction, and the
/// SGD figures above are the ones that measure the reduction.
const ADAM_ATOL: f32 = 2.0 * STEPS as f32 * ADAM_LR as f32;

fn name(o: &Optimizer) -> &'static str {
    match o {
        Optimizer::Sgd { .. } => "sgd",
        Optimizer::AdamW { .. } => "adamw",
    }
}

fn sgd() -> Optimizer {
    Optimizer::Sgd {
        lr: SGD_LR,
        momentum: 0.0,
        weight_decay: 0.0,
    }
}

#[test]
fn bf16_sharded_training_equals_one_rank_within_bf16_rounding() {
    let (l, p) = sharded_vs_one_rank(DType::Bf16, &sgd());
    assert!(
        l <= BF16_LOSS_RTOL,
        "bf16 sgd losses differ by {l:e} (relative)"
    );
    assert!(p <= BF16_SGD_ATOL, "bf16 sgd parameters differ by {p:e}");
    let (l, p) = sharded_vs_one_rank(DType::Bf16, &Optimizer::adamw(ADAM_LR));
    assert!(
        l <= BF16_LOSS_RTOL,
        "bf16 adamw losses differ by {l:e} (relative)"
    );
    assert!(p <= ADAM_ATOL, "bf16 adamw parameters differ by {p:e}");
}

#[test]
fn fp16_sharded_training_equals_one_rank_within_fp16_rounding() {
    let (l, p) = sharded_vs_one_rank(DType::F16, &sgd());
    assert!(
        l <= FP16_LOSS_RTOL,
        "fp16 sgd losses differ by {l:e} (relative)"
    );
    assert!(p <= FP16_SGD_ATOL, "fp16 sgd parameters differ by {p:e}");
    let (l, p) = sharded_vs_one_rank(DType::F16, &Optimizer::adamw(ADAM_LR));
    assert!(
        l <= FP16_LOSS_RTOL,
        "fp16 adamw losses differ by {l:e} (relative)"
    );
    assert!(p <= ADAM_ATOL, "fp16 adamw parameters differ by {p:e}");
}

/// Bytes of the buffers of `kind`.
fn bytes_of(plan: &Plan, kind: BufferKind) -> Vec<u64> {
    plan.buffers
        .iter()
        .filter(|b| b.kind == kind)
        .map(|b| b.bytes)
        .collect()
}

/// Bytes each all-gather moves (its gathered buffer).
fn gathered_bytes(plan: &Plan) -> Vec<u64> {
    plan.instructions
        .iter()
        .filter_map(|i| match i.op {
            InstrOp::AllGather {
                c: Collective { dst, .. },
                ..
            } => Some(plan.buffers[dst.index()].bytes),
            _ => None,
        })
        .collect()
}

#[test]
fn bf16_plan_gathers_and_holds_half_the_bytes_and_keeps_f32_masters() {
    let f32_plan = plan_with(&gpt(2), 4, &FsdpConfig::default());
    let bf16_plan = plan_with(&gpt(2), 4, &policy(DType::Bf16, Strategy::FullShard));
    let half = |v: Vec<u64>| v.into_iter().map(|b| b / 2).collect::<Vec<u64>>();
    assert!(!gathered_bytes(&f32_plan).is_empty());
    assert_eq!(gathered_bytes(&bf16_plan), half(gathered_bytes(&f32_plan)));
    assert_eq!(
        bytes_of(&bf16_plan, BufferKind::GatheredParams),
        half(bytes_of(&f32_plan, BufferKind::GatheredParams))
    );
    assert_eq!(
        bytes_of(&bf16_plan, BufferKind::FlatGrads),
        half(bytes_of(&f32_plan, BufferKind::FlatGrads))
    );
    for kind in [
        BufferKind::ShardParams,
        BufferKind::ShardGrads,
        BufferKind::OptimizerState,
    ] {
        assert_eq!(
            bytes_of(&bf16_plan, kind),
            bytes_of(&f32_plan, kind),
            "{kind:?}"
        );
        assert!(bf16_plan
            .buffers
            .iter()
            .filter(|b| b.kind == kind)
            .all(|b| b.dtype == DType::F32));
    }
    for i in &bf16_plan.instructions {
        match i.op {
            InstrOp::AllGather {
                c: Collective { dtype, .. },
                ..
            }
            | InstrOp::ReduceScatter {
                c: Collective { dtype, .. },
            } => {
                assert_eq!(dtype, DType::Bf16)
            }
            _ => {}
        }
    }
    // The loss stays f32; the parameters are read in bf16.
    let g = &bf16_plan.training.graph;
    assert_eq!(g.value_type(bf16_plan.training.loss).dtype, DType::F32);
    assert!(g.params.iter().all(|p| p.ty.dtype == DType::Bf16));
    // The cost model's all-gather bytes halve with them.
    let (f, b) = (
        f32_plan.estimates.comm_bytes_per_step,
        bf16_plan.estimates.comm_bytes_per_step,
    );
    assert!(
        b * 2 <= f + 64 && b * 2 + 64 >= f,
        "comm bytes {f} (f32) vs {b} (bf16)"
    );
    assert!(bf16_plan.memory.peak_bytes < f32_plan.memory.peak_bytes);
}

#[test]
fn policies_the_planner_cannot_honour_are_refused() {
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            reduce_dtype: DType::Bf16,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let m = fsdpc_frontends::load(&gpt(2), &Default::default()).expect("model");
    let cluster = fsdpc_planner::preset("cpu-local", 2, 2).expect("preset");
    let info = fsdpc_plan::ModelInfo {
        tokens_per_rank_step: m.tokens_per_rank_step(),
        params: m.program.graph.param_numel(),
        name: m.name.clone(),
    };
    match fsdpc_planner::compile(m.program.clone(), info.clone(), &cluster, &cfg) {
        Err(PlanError::BadConfig { what, .. }) => assert_eq!(what, "reduce_dtype"),
        other => panic!("expected a BadConfig error, got {other:?}"),
    }
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: DType::I64,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    match fsdpc_planner::compile(m.program, info, &cluster, &cfg) {
        Err(PlanError::BadConfig { what, .. }) => assert_eq!(what, "param_dtype"),
        other => panic!("expected a BadConfig error, got {other:?}"),
    }
}

/// Trains `plan` for `steps` with the run's parameters kept.
fn run(plan: &Plan, steps: u64) -> fsdpc_runtime::TrainReport {
    train(plan, steps, ExecMode::Arena)
}

#[test]
fn fp16_overflow_skips_the_step_on_every_rank_and_halves_the_scale() {
    // A scale so large that every scaled fp16 gradient is inf: each step
    // finds an overflow, every rank skips it and the scale halves.
    let huge = 1e30;
    let cfg = FsdpConfig {
        init_loss_scale: Some(huge),
        ..policy(DType::F16, Strategy::FullShard)
    };
    let plan = plan_with(&gpt(4), 2, &cfg);
    let untouched = run(&plan, 0);
    let r = run(&plan, 3);
    assert_eq!(r.skipped_steps, vec![0, 1, 2], "every step overflows");
    let want: Vec<f32> = (1..=3)
        .map(|k| (huge as f32 as f64 * 0.5f64.powi(k)) as f32)
        .collect();
    assert_eq!(r.loss_scales, want, "halved once per skipped step");
    // Both ranks' shards are in the assembled parameters: unchanged bit for
    // bit, so no rank stepped.
    assert_eq!(
        bits(&r).1,
        bits(&untouched).1,
        "parameters moved on a skipped step"
    );
    assert!(
        r.losses.iter().all(|l| l.is_finite()),
        "the loss itself is unscaled"
    );
}

#[test]
fn fp16_default_scale_trains_without_skipping_and_keeps_its_scale() {
    let plan = plan_with(&gpt(4), 2, &policy(DType::F16, Strategy::FullShard));
    let scaler = plan.config.loss_scaler.clone().expect("fp16 has a scaler");
    assert_eq!(
        (
            scaler.init_scale,
            scaler.growth_factor,
            scaler.backoff_factor,
            scaler.growth_interval
        ),
        (65536.0, 2.0, 0.5, 2000),
        "PyTorch's ShardedGradScaler defaults"
    );
    let r = run(&plan, 8);
    assert!(r.skipped_steps.is_empty(), "skipped {:?}", r.skipped_steps);
    assert_eq!(r.loss_scales, vec![65536.0; 8]);
    assert!(r.losses[7] < r.losses[0], "loss falls: {:?}", r.losses);
    // bf16 has f32's exponent range: no scaler.
    let bf16 = plan_with(&gpt(4), 2, &policy(DType::Bf16, Strategy::FullShard));
    assert!(bf16.config.loss_scaler.is_none());
    assert!(!bf16.instructions.iter().any(|i| matches!(
        i.op,
        InstrOp::UnscaleGrads { .. } | InstrOp::ScaleSeed { .. }
    )));
}

#[test]
fn a_plan_with_the_scaler_taken_out_does_not_validate() {
    let mut plan = plan_with(&gpt(4), 2, &policy(DType::F16, Strategy::FullShard));
    plan.instructions
        .retain(|i| !matches!(i.op, InstrOp::FoundInfAllReduce { .. }));
    let v = plan
        .validate()
        .expect_err("a scaler without its all-reduce");
    assert!(
        v.iter().any(|e| e
            .to_string()
            .contains("found-inf flag is all-reduced over []")),
        "{v:?}"
    );
    let mut plan = plan_with(&gpt(4), 2, &policy(DType::Bf16, Strategy::FullShard));
    let b = plan
        .buffers
        .iter()
        .position(|b| b.kind == BufferKind::GatheredParams)
        .expect("a gathered buffer");
    plan.buffers[b].dtype = DType::F32;
    let v = plan
        .validate()
        .expect_err("a gathered buffer in the wrong dtype");
    assert!(
        v.iter()
            .any(|e| e.to_string().contains("the policy gives bf16")),
        "{v:?}"
    );
}

#[test]
fn inspect_shows_the_bf16_policy_and_halved_bytes() {
    let plan = plan_with(&gpt(2), 4, &policy(DType::Bf16, Strategy::FullShard));
    insta::assert_snapshot!(fsdpc_report::inspect::render_text(&plan));
}

#[test]
fn cli_flags_set_the_policy_and_are_refused_with_a_plan() {
    let dir = std::env::temp_dir().join(format!("fsdpc-precision-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let plan_path = dir.join("bf16.json");
    let fsdpc = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fsdpc"))
            .args(args)
            .output()
            .expect("fsdpc runs")
    };
    let spec = gpt(2);
    let p = plan_path.to_str().expect("utf-8 path");
    let out = fsdpc(&[
        "compile",
        &spec,
        "--world",
        "2",
        "--preset",
        "cpu-local",
        "--mixed-precision",
        "bf16",
        "--reduce-dtype",
        "f32",
        "-o",
        p,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan = Plan::from_json(&std::fs::read_to_string(&plan_path).expect("plan")).expect("loads");
    assert_eq!(
        (
            plan.config.param_dtype,
            plan.config.reduce_dtype,
            plan.config.buffer_dtype
        ),
        (DType::Bf16, DType::F32, DType::Bf16)
    );
    let out = fsdpc(&["train", p, "--steps", "1", "--param-dtype", "fp16"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--param-dtype"), "{err}");
    let out = fsdpc(&[
        "compile",
        &spec,
        "--world",
        "2",
        "--mixed-precision",
        "bf8",
        "-o",
        p,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bf8") && err.contains("bf16"), "{err}");
    let metrics = dir.join("m.jsonl");
    let m = metrics.to_str().expect("utf-8 path");
    let out = fsdpc(&[
        "train",
        &spec,
        "--ranks",
        "2",
        "--steps",
        "2",
        "--mixed-precision",
        "fp16",
        "--metrics",
        m,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&metrics).expect("metrics");
    let first: serde_json::Value =
        serde_json::from_str(text.lines().next().expect("a line")).expect("json");
    assert_eq!(first["loss_scale"], serde_json::json!(65536.0));
    assert_eq!(first["skipped"], serde_json::json!(false));
    let _ = std::fs::remove_dir_all(&dir);
}
