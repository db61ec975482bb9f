//! Learning-rate schedules (`--lr-schedule`, `--warmup-steps`, `--min-lr`,
//! `--lr-decay-steps`): the rate of every step is the formula's, training
//! follows it, a checkpointed run resumes the schedule exactly, `--metrics`
//! reports it and bad settings are one error naming the flag.

use crate::common::{bits, plan_with};
use fsdpc_plan::{LrDecay, LrSchedule, Plan};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::train::CheckpointConfig;
use fsdpc_runtime::{TrainOptions, TrainReport};
use std::process::Command;

const GPT: &str = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=4";

fn scheduled(decay: LrDecay) -> Plan {
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            lr_schedule: LrSchedule {
                decay,
                warmup_steps: 2,
                decay_steps: 6,
                min_lr: 1e-4,
            },
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    plan_with(GPT, 2, &cfg)
}

fn run(plan: &Plan, o: TrainOptions) -> TrainReport {
    fsdpc_runtime::train(plan, &o, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"))
}

fn opts(steps: u64) -> TrainOptions {
    TrainOptions {
        steps,
        seed: 5,
        ..TrainOptions::default()
    }
}

/// Hugging Face's `get_cosine_with_min_lr_schedule_with_warmup` (one half
/// cosine) at 0-based step `s`, written out again here: warmup `s / w`,
/// then the cosine from `lr` to `min`, held at `min` after step `t`.
fn hf_cosine(lr: f64, min: f64, w: u64, t: u64, s: u64) -> f64 {
    if s < w {
        return lr * s as f64 / w as f64;
    }
    let p = ((s - w) as f64 / (t - w) as f64).min(1.0);
    let rate = min / lr;
    lr * ((0.5 * (1.0 + (std::f64::consts::PI * p).cos())) * (1.0 - rate) + rate)
}

#[test]
fn the_rates_are_the_formula() {
    let p = scheduled(LrDecay::Cosine);
    let lr = p.training.optimizer.lr();
    for s in 0..10 {
        let want = hf_cosine(lr, 1e-4, 2, 6, s);
        assert!(
            (p.lr_at(s) - want).abs() <= 1e-15 * lr,
            "cosine step {s}: {} vs {want}",
            p.lr_at(s)
        );
    }
    assert_eq!(p.lr_at(0), 0.0);
    assert_eq!(p.lr_at(2), lr);
    assert_eq!(p.lr_at(6), 1e-4);
    assert_eq!(p.lr_at(100), 1e-4);
    let l = scheduled(LrDecay::Linear);
    // Halfway through the decay (step 4 of 2..6): halfway from lr to min.
    assert!((l.lr_at(4) - (1e-4 + (lr - 1e-4) * 0.5)).abs() < 1e-15);
    assert!((l.lr_at(1) - lr / 2.0).abs() < 1e-15);
    assert_eq!(l.lr_at(7), 1e-4);
    let c = scheduled(LrDecay::Constant);
    assert!((0..8).all(|s| c.lr_at(s) == lr));
    // The schedule is in the plan's JSON, and comes back from it.
    let json = p.to_json_pretty().expect("json");
    assert!(json.contains("\"lr_schedule\""), "{json}");
    let back = Plan::from_json(&json).expect("plan");
    assert_eq!(back.config.lr_schedule, p.config.lr_schedule);
}

/// The schedule reaches the optimizer: step 0 of a warmup trains at rate 0
/// (AdamW leaves the parameters as they were), and the run differs from
/// the constant rate's after it.
#[test]
fn training_follows_the_schedule() {
    let cosine = scheduled(LrDecay::Cosine);
    let constant = scheduled(LrDecay::Constant);
    let mut keep = opts(1);
    keep.keep_params = true;
    let init = {
        let mut o = keep.clone();
        o.steps = 0;
        run(&cosine, o)
    };
    let one = run(&cosine, keep.clone());
    // AdamW at rate 0: `p *= 1 - 0 * wd`, `p -= 0 * ...`: unchanged.
    assert_eq!(bits(&one).1, bits(&init).1, "step 0 trains at rate 0");
    assert!(!bits(&one).1.is_empty());
    let a = run(&cosine, opts(4));
    let b = run(&constant, opts(4));
    assert_eq!(
        a.losses[0], b.losses[0],
        "the first loss is before any step"
    );
    assert_ne!(a.losses[3], b.losses[3], "the schedule changes training");
}

/// 6 steps straight equal 3 steps, a checkpoint, and 3 resumed steps, bit
/// for bit: the resumed run continues the schedule at step 3.
#[test]
fn a_resumed_run_continues_the_schedule_exactly() {
    let p = scheduled(LrDecay::Cosine);
    let full = run(&p, opts(6));
    let dir = tempfile::tempdir().expect("tmp");
    let first = run(
        &p,
        TrainOptions {
            checkpoint: Some(CheckpointConfig {
                dir: dir.path().to_path_buf(),
                every: 3,
            }),
            ..opts(3)
        },
    );
    let rest = run(
        &p,
        TrainOptions {
            resume: Some(dir.path().to_path_buf()),
            ..opts(6)
        },
    );
    let (full_loss, full_params) = bits(&full);
    assert_eq!(bits(&first).0, full_loss[..3]);
    assert_eq!(bits(&rest).0, full_loss[3..]);
    assert_eq!(bits(&rest).1, full_params);
}

fn fsdpc(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(args)
        .output()
        .expect("fsdpc runs")
}

#[test]
fn cli_metrics_report_the_rate_and_bad_settings_name_their_flag() {
    let dir = tempfile::tempdir().expect("tmp");
    let m = dir.path().join("m.jsonl");
    let m_s = m.to_str().expect("utf-8");
    let train = [
        "train",
        GPT,
        "--ranks",
        "2",
        "--steps",
        "5",
        "--lr",
        "0.01",
        "--lr-schedule",
        "linear",
        "--warmup-steps",
        "1",
        "--min-lr",
        "0.001",
    ];
    let mut a = train.to_vec();
    a.extend(["--metrics", m_s]);
    let o = fsdpc(&a);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&m).expect("metrics");
    let lrs: Vec<f64> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json line");
            v["lr"].as_f64().expect("lr")
        })
        .collect();
    // Warmup 1 then linear from 0.01 to 0.001 over steps 1..5 (--steps).
    let want = [0.0, 0.01, 0.00775, 0.0055, 0.00325];
    assert_eq!(lrs.len(), want.len(), "{text}");
    for (got, want) in lrs.iter().zip(want) {
        assert!((got - want).abs() < 1e-12, "{lrs:?}");
    }
    // A compiled plan records it, and `compile` needs the horizon.
    let plan = dir.path().join("p.json");
    let p_s = plan.to_str().expect("utf-8");
    let compile = |extra: &[&str]| {
        let mut a = vec!["compile", GPT, "--world", "2", "-o", p_s];
        a.extend(extra);
        fsdpc(&a)
    };
    let o = compile(&["--lr-schedule", "cosine", "--lr-decay-steps", "100"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = Plan::from_json(&std::fs::read_to_string(&plan).expect("plan")).expect("plan");
    assert_eq!(p.config.lr_schedule.decay, LrDecay::Cosine);
    assert_eq!(p.config.lr_schedule.decay_steps, 100);
    for (extra, needle) in [
        (vec!["--lr-schedule", "cosine"], "--lr-decay-steps"),
        (vec!["--lr-schedule", "step"], "--lr-schedule"),
        (
            vec![
                "--lr-schedule",
                "cosine",
                "--lr-decay-steps",
                "10",
                "--min-lr",
                "1",
            ],
            "--min-lr",
        ),
        (
            vec![
                "--lr-schedule",
                "linear",
                "--lr-decay-steps",
                "3",
                "--warmup-steps",
                "3",
            ],
            "--lr-decay-steps",
        ),
        (vec!["--warmup-steps", "3"], "--lr-schedule"),
        (vec!["--lr-decay-steps", "3"], "--lr-schedule"),
    ] {
        let o = compile(&extra);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{extra:?}");
        assert!(err.contains(needle), "{extra:?}: {err}");
        assert!(
            err.lines().count() <= 3 && !err.contains("panicked"),
            "{err}"
        );
    }
}
