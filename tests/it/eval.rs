//! Evaluation on held-out data (`--eval-data`, `--eval-every`): the plan's
//! forward-only prefix (`Plan::eval`) run on each evaluation batch between
//! steps. Checked against the reference evaluator (every node of the
//! graph on one thread, dropout off) on the trained parameters; shown to
//! change nothing the run trains (losses and parameters bit-identical with
//! and without it); equal across world sizes, strategies, precision,
//! recomputation, accumulation and offload within the equivalence
//! tolerances; inside the memory plan; and through the command line.

use crate::common::cli::{check_error, dir, ok, s};
use crate::common::{bits, plan_with};
use fsdpc_plan::{InstrOp, Plan, Strategy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::{
    eval_graph, Batch, DataSpec, EvalOptions, ExecMode, HostTensor, KernelCtx, TrainOptions,
    TrainReport,
};
use std::collections::HashMap;

const SEED: u64 = 7;
/// Relative tolerance between evaluations of differently sharded runs (the
/// loss tolerance of `tests/it/equivalence.rs`, widened for the few steps
/// of training before the evaluation).
const EVAL_RTOL: f32 = 1e-5;

fn gpt(batch: u32) -> String {
    format!("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch={batch},dropout=0.1")
}

fn cfg(strategy: Strategy) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

fn synthetic(every: u64, batches: u64) -> EvalOptions {
    EvalOptions {
        data: DataSpec::Synthetic,
        every,
        batches: Some(batches),
    }
}

fn run(plan: &Plan, steps: u64, eval: Option<EvalOptions>, mode: ExecMode) -> TrainReport {
    let opts = TrainOptions {
        steps,
        seed: SEED,
        mode,
        eval,
        ..TrainOptions::default()
    };
    fsdpc_runtime::train(plan, &opts, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"))
}

/// The mean loss of the reference evaluator over `batches` evaluation
/// batches of `world` ranks of `b` samples each, on the trained parameters
/// of `r`, dropout off: every rank's samples of every batch through the
/// whole graph, the losses averaged.
fn reference_eval(plan: &Plan, r: &TrainReport, spec: &DataSpec, world: u64, batches: u64) -> f64 {
    let g = &plan.training.graph;
    let by_name: HashMap<&str, &Vec<f32>> = r
        .final_params
        .iter()
        .map(|(n, v)| (n.as_str(), v))
        .collect();
    let params = g
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let v = by_name[p.name.as_str()];
            let t = HostTensor::from_f32(p.ty.shape.dims(), v).expect("param");
            (fsdpc_ir::ParamId(i as u32), t)
        })
        .collect();
    let inputs = fsdpc_runtime::data::analyse(g);
    let b = inputs[0].ty.shape.dims()[0] as u64;
    let (data, n) =
        fsdpc_runtime::data::open_eval(spec, g, SEED, world * b, Some(batches)).expect("data");
    assert_eq!(n, batches);
    let ctx = KernelCtx {
        eval: true,
        ..KernelCtx::default()
    };
    let mut sum = 0f64;
    for j in 0..batches {
        for rank in 0..world {
            let mut feeds = HashMap::new();
            for d in &inputs {
                let mut t = HostTensor::zeros(d.ty.clone());
                let batch = Batch {
                    step: j,
                    first_sample: rank * b,
                };
                data.fill(&d.name, batch, t.view_mut()).expect("fill");
                feeds.insert(d.name.clone(), t);
            }
            let vals = eval_graph(g, &feeds, &params, &ctx).expect("reference evaluates");
            sum += f64::from(vals[&plan.training.loss].to_f32()[0]);
        }
    }
    sum / (batches * world) as f64
}

#[test]
fn the_plan_evaluates_with_a_forward_only_prefix_ending_at_the_loss() {
    let plan = plan_with(&gpt(2), 2, &cfg(Strategy::FullShard));
    let end = plan.eval.expect("an evaluation pass").instructions as usize;
    let body = &plan.instructions[..end];
    assert!(
        matches!(body.last().map(|i| &i.op), Some(InstrOp::Kernel { outputs, .. }) if outputs.contains(&plan.loss))
    );
    assert!(body
        .iter()
        .any(|i| matches!(i.op, InstrOp::AllGather { .. })));
    assert!(!body.iter().any(|i| matches!(
        i.op,
        InstrOp::ReduceScatter { .. } | InstrOp::OptimizerStep { .. }
    )));
    assert!(
        end < plan.instructions.len() / 2 + 10,
        "forward is about half the step"
    );
}

#[test]
fn the_evaluation_loss_is_the_reference_forward_on_the_trained_parameters() {
    for (world, strategy) in [(1, Strategy::NoShard), (2, Strategy::FullShard)] {
        let plan = plan_with(&gpt(2), world, &cfg(strategy));
        let r = run(&plan, 3, Some(synthetic(0, 3)), ExecMode::Arena);
        assert_eq!(r.evals.len(), 1, "only after the last step");
        let e = r.evals[0];
        assert_eq!((e.steps_done, e.batches), (3, 3));
        let want = reference_eval(&plan, &r, &DataSpec::Synthetic, u64::from(world), 3);
        let rel = (f64::from(e.loss) - want).abs() / want;
        assert!(rel < 1e-6, "world {world}: {} vs reference {want}", e.loss);
    }
}

#[test]
fn evaluating_changes_nothing_the_run_trains() {
    let plan = plan_with(&gpt(2), 2, &cfg(Strategy::FullShard));
    let plain = run(&plan, 4, None, ExecMode::Arena);
    let evaluated = run(&plan, 4, Some(synthetic(1, 2)), ExecMode::Arena);
    assert_eq!(bits(&plain), bits(&evaluated));
    assert!(plain.evals.is_empty());
    assert_eq!(evaluated.evals.len(), 4);
    // Dropout is off and the parameters move: the losses differ step to step.
    let losses: Vec<f32> = evaluated.evals.iter().map(|e| e.loss).collect();
    assert!(losses.windows(2).all(|w| w[0] != w[1]), "{losses:?}");
    // The same evaluation twice gives the same bits.
    let again = run(&plan, 4, Some(synthetic(1, 2)), ExecMode::Arena);
    let key = |r: &TrainReport| {
        r.evals
            .iter()
            .map(|e| (e.steps_done, e.batches, e.loss.to_bits()))
            .collect::<Vec<_>>()
    };
    assert_eq!(key(&again), key(&evaluated));
}

#[test]
fn debug_allocation_evaluates_the_same_bits_inside_the_plan() {
    let plan = plan_with(&gpt(2), 2, &cfg(Strategy::FullShard));
    let arena = run(&plan, 2, Some(synthetic(1, 2)), ExecMode::Arena);
    let debug = run(&plan, 2, Some(synthetic(1, 2)), ExecMode::DebugAlloc);
    let loss_bits = |r: &TrainReport| r.evals.iter().map(|e| e.loss.to_bits()).collect::<Vec<_>>();
    assert_eq!(loss_bits(&arena), loss_bits(&debug));
    let peak = debug.debug_peak_bytes.expect("debug peak");
    assert!(
        peak <= plan.memory.peak_bytes,
        "{peak} > {}",
        plan.memory.peak_bytes
    );
}

/// Sharded evaluations equal the one-rank evaluation within the
/// equivalence tolerance, for every setting the step has.
#[test]
fn evaluations_agree_across_world_sizes_and_settings() {
    let one = run(
        &plan_with(&gpt(4), 1, &cfg(Strategy::NoShard)),
        3,
        Some(synthetic(1, 2)),
        ExecMode::Arena,
    );
    let with = |f: &dyn Fn(&mut FsdpConfig)| {
        let mut c = cfg(Strategy::FullShard);
        f(&mut c);
        c
    };
    let settings: Vec<(&str, u32, u32, FsdpConfig)> = vec![
        ("full_shard F=2", 2, 2, cfg(Strategy::FullShard)),
        (
            "bf16 parameters and reductions",
            2,
            2,
            with(&|c| {
                c.settings.param_dtype = fsdpc_ir::DType::Bf16;
                c.settings.reduce_dtype = fsdpc_ir::DType::Bf16;
            }),
        ),
        ("full_shard F=4", 4, 1, cfg(Strategy::FullShard)),
        ("shard_grad_op F=2", 2, 2, cfg(Strategy::ShardGradOp)),
        (
            "hybrid F=2 of 4",
            4,
            1,
            FsdpConfig {
                shard_factor: Some(2),
                ..cfg(Strategy::HybridShard)
            },
        ),
        (
            "recompute every block",
            2,
            2,
            with(&|c| {
                c.activation_checkpointing =
                    fsdpc_plan::CheckpointPolicy::parse("all").expect("policy")
            }),
        ),
        ("cpu offload", 2, 2, with(&|c| c.cpu_offload = true)),
    ];
    for (name, world, b, c) in settings {
        let plan = plan_with(&gpt(b), world, &c);
        let r = run(&plan, 3, Some(synthetic(1, 2)), ExecMode::Arena);
        assert_eq!(r.evals.len(), 3, "{name}");
        // bf16 rounds every parameter and activation: a percent of loss.
        let tol = if name.starts_with("bf16") {
            2e-2
        } else {
            EVAL_RTOL
        };
        for (a, e) in one.evals.iter().zip(&r.evals) {
            let rel = (a.loss - e.loss).abs() / a.loss;
            assert!(rel < tol, "{name}: {} vs {} (one rank)", e.loss, a.loss);
        }
        if let Some(m) = r.measured_peak_bytes {
            assert!(
                m <= plan.memory.rank_bytes,
                "{name}: measured {m} > planned"
            );
        }
    }
}

/// With gradient accumulation an evaluation batch is one micro-batch per
/// rank: world 2 with 2 micro-batches of 1 sample evaluates like one rank
/// with 2 micro-batches of 2, and like the reference.
#[test]
fn with_accumulation_an_evaluation_batch_is_one_micro_batch_per_rank() {
    let accum = |b: u32, world: u32| {
        let mut c = cfg(if world == 1 {
            Strategy::NoShard
        } else {
            Strategy::FullShard
        });
        c.settings.grad_accum = 2;
        plan_with(&gpt(b), world, &c)
    };
    let one = run(&accum(2, 1), 3, Some(synthetic(0, 2)), ExecMode::Arena);
    let plan = accum(1, 2);
    let two = run(&plan, 3, Some(synthetic(0, 2)), ExecMode::Arena);
    let (a, e) = (one.evals[0].loss, two.evals[0].loss);
    assert!((a - e).abs() / a < EVAL_RTOL, "{e} vs {a} (one rank)");
    let want = reference_eval(&plan, &two, &DataSpec::Synthetic, 2, 2);
    assert!(
        (f64::from(e) - want).abs() / want < 1e-6,
        "{e} vs reference {want}"
    );
}

/// A held-out file is read in order: evaluation batch j's window of global
/// sample g starts at token (j * global + g) * seq, every whole batch the
/// file holds is evaluated unless fewer are asked for, and a file too
/// short for one batch, or asked for more than it holds, is refused.
#[test]
fn a_held_out_file_is_read_window_after_window() {
    let d = dir("eval-file");
    let text: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
    let file = d.join("held-out.txt");
    std::fs::write(&file, &text).expect("write");
    let spec = DataSpec::TextFile(file.clone());
    let m = fsdpc_frontends::load(
        "gpt:layers=1,hidden=16,heads=2,seq=16,vocab=256,batch=2",
        &fsdpc_frontends::LoadOptions::default(),
    )
    .expect("model");
    let g = &m.program.graph;
    // World 2, batch 2: 4 windows of 16 tokens a batch; 999 / 16 = 62 windows.
    let (data, n) = fsdpc_runtime::data::open_eval(&spec, g, SEED, 4, None).expect("open");
    assert_eq!(n, 15);
    let ids = fsdpc_runtime::data::analyse(g)
        .into_iter()
        .find(|i| i.name == "ids")
        .expect("ids");
    let mut t = HostTensor::zeros(ids.ty.clone());
    let (j, first) = (3u64, 2u64);
    data.fill(
        "ids",
        Batch {
            step: j,
            first_sample: first,
        },
        t.view_mut(),
    )
    .expect("fill");
    let got: Vec<i64> = t.to_f32().iter().map(|&x| x as i64).collect();
    let start = ((j * 4 + first) * 16) as usize;
    let want: Vec<i64> = text[start..start + 32]
        .iter()
        .map(|&b| i64::from(b))
        .collect();
    // Two samples: windows `start` and `start + 16`, back to back.
    assert_eq!(got, want);
    let refused =
        |asked: Option<u64>, world_batch: u64, needle: &str| match fsdpc_runtime::data::open_eval(
            &spec,
            g,
            SEED,
            world_batch,
            asked,
        ) {
            Ok(_) => panic!("{asked:?} of {world_batch}: accepted"),
            Err(e) => assert!(e.to_string().contains(needle), "`{e}` lacks `{needle}`"),
        };
    refused(Some(16), 4, "holds 15 batches");
    refused(None, 100, "one evaluation batch is 100 windows");
    assert_eq!(
        fsdpc_runtime::data::open_eval(&spec, g, SEED, 4, Some(2))
            .expect("open")
            .1,
        2
    );
}

#[test]
fn the_command_line_reports_evaluations_in_the_metrics_and_the_summary() {
    let d = dir("eval-cli");
    let metrics = d.join("m.jsonl");
    let spec = "gpt:layers=1,hidden=16,heads=2,seq=8,vocab=64,batch=2";
    let out = ok(&[
        "train",
        spec,
        "--ranks",
        "2",
        "--steps",
        "5",
        "--eval-data",
        "synthetic",
        "--eval-every",
        "2",
        "--eval-batches",
        "3",
        "--metrics",
        s(&metrics),
    ]);
    assert!(out.contains("eval loss "), "{out}");
    assert!(
        out.contains("after 5 steps: 3 batches on every rank"),
        "{out}"
    );
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&metrics)
        .expect("metrics")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let evaluated: Vec<u64> = lines
        .iter()
        .filter(|l| l.get("eval_loss").is_some())
        .map(|l| l["step"].as_u64().expect("step"))
        .collect();
    // After steps 2 and 4 and after the last (0-based 1, 3, 4).
    assert_eq!(evaluated, [1, 3, 4]);
    assert!(lines[1]["eval_batches"] == 3 && lines[1]["eval_time_s"].as_f64().is_some());

    let short = d.join("short.txt");
    std::fs::write(&short, "too short").expect("write");
    let spec256 = "gpt:layers=1,hidden=16,heads=2,seq=8,vocab=256,batch=2";
    for (args, needle) in [
        (vec!["--eval-every", "2"], "--eval-data"),
        (
            vec!["--eval-data", "synthetic", "--eval-every", "0"],
            "--eval-every must be at least 1",
        ),
        (
            vec!["--eval-data", "synthetic", "--eval-batches", "0"],
            "--eval-batches must be at least 1",
        ),
        (vec!["--eval-data", s(&short)], "has 9 tokens"),
        (
            vec!["--eval-data", "/nonexistent/held-out.txt"],
            "/nonexistent/held-out.txt",
        ),
    ] {
        let mut all = vec!["train", spec256, "--ranks", "2", "--steps", "2"];
        all.extend(args);
        check_error(&all, needle);
    }
}

/// A resumed run evaluates what the uninterrupted run evaluates, bit for
/// bit: the held-out data depends on the seed and the batch only.
#[test]
fn a_resumed_run_evaluates_like_the_uninterrupted_one() {
    let d = dir("eval-resume");
    let plan = plan_with(&gpt(2), 2, &cfg(Strategy::FullShard));
    let full = run(&plan, 4, Some(synthetic(2, 2)), ExecMode::Arena);
    let ckpt = d.join("ck");
    let _ = std::fs::remove_dir_all(&ckpt);
    let first = TrainOptions {
        steps: 2,
        seed: SEED,
        eval: Some(synthetic(2, 2)),
        checkpoint: Some(fsdpc_runtime::train::CheckpointConfig {
            dir: ckpt.clone(),
            every: 2,
        }),
        ..TrainOptions::default()
    };
    let a = fsdpc_runtime::train(&plan, &first, &mut |_| {}).expect("first part");
    let rest = TrainOptions {
        steps: 4,
        resume: Some(ckpt),
        ..first
    };
    let b = fsdpc_runtime::train(&plan, &rest, &mut |_| {}).expect("second part");
    let losses = |r: &[fsdpc_runtime::EvalReport]| {
        r.iter()
            .map(|e| (e.steps_done, e.loss.to_bits()))
            .collect::<Vec<_>>()
    };
    let mut parts = losses(&a.evals);
    parts.extend(losses(&b.evals));
    assert_eq!(losses(&full.evals), parts);
}

/// A plan without an evaluation pass (written before plans had one) is
/// refused for evaluation in one message, before any step.
#[test]
fn a_plan_without_an_evaluation_pass_is_refused_for_evaluation() {
    let mut plan = plan_with(&gpt(2), 2, &cfg(Strategy::FullShard));
    plan.eval = None;
    let opts = TrainOptions {
        steps: 2,
        eval: Some(synthetic(1, 1)),
        ..TrainOptions::default()
    };
    let mut steps = 0;
    let err = fsdpc_runtime::train(&plan, &opts, &mut |_| steps += 1).expect_err("refused");
    assert!(err.to_string().contains("no evaluation pass"), "{err}");
    assert_eq!(steps, 0);
}
