//! Executor tests: tiny GPT and MLP plans trained on thread ranks.

use crate::support::plan::plan;
use fsdpc_ir::Optimizer;
use fsdpc_plan::Strategy;
use fsdpc_runtime::{train, ExecMode, TrainOptions, TrainReport};

const GPT: &str = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=2";
const MLP: &str = "mlp:layers=2,in=8,hidden=16,classes=4,batch=4";

fn run(p: &fsdpc_plan::Plan, steps: u64, mode: ExecMode) -> TrainReport {
    let opts = TrainOptions {
        steps,
        seed: 7,
        mode,
        ..TrainOptions::default()
    };
    train(p, &opts, &mut |_| {}).unwrap()
}

#[test]
fn gpt_trains_and_debug_peak_matches_plan() {
    let p = plan(GPT, 2, Strategy::FullShard, Optimizer::adamw(1e-2));
    let r = run(&p, 3, ExecMode::DebugAlloc);
    assert_eq!(r.losses.len(), 3);
    assert!(r.losses.iter().all(|l| l.is_finite()), "{:?}", r.losses);
    assert_eq!(r.debug_peak_bytes, Some(p.memory.peak_bytes));
    let a = run(&p, 3, ExecMode::Arena);
    assert_eq!(a.losses, r.losses);
    assert_eq!(a.final_params, r.final_params);
}

#[test]
fn mlp_trains() {
    let p = plan(MLP, 2, Strategy::FullShard, Optimizer::adamw(1e-2));
    let r = run(&p, 3, ExecMode::DebugAlloc);
    assert!(r.losses.iter().all(|l| l.is_finite()), "{:?}", r.losses);
    assert_eq!(r.debug_peak_bytes, Some(p.memory.peak_bytes));
}

#[test]
fn full_shard_equals_no_shard_bitwise() {
    for world in [2u32, 4] {
        let fs = plan(GPT, world, Strategy::FullShard, Optimizer::adamw(1e-2));
        let ns = plan(GPT, world, Strategy::NoShard, Optimizer::adamw(1e-2));
        let (a, b) = (run(&fs, 4, ExecMode::Arena), run(&ns, 4, ExecMode::Arena));
        assert_eq!(a.losses, b.losses, "world {world}");
        assert_eq!(a.final_params, b.final_params, "world {world}");
    }
}

#[test]
fn same_seed_is_reproducible() {
    let p = plan(GPT, 2, Strategy::FullShard, Optimizer::adamw(1e-2));
    let (a, b) = (run(&p, 3, ExecMode::Arena), run(&p, 3, ExecMode::Arena));
    assert_eq!(
        a,
        TrainReport {
            elapsed: a.elapsed,
            tokens_per_s: a.tokens_per_s,
            ..b
        }
    );
}

#[test]
fn synthetic_lm_loss_falls() {
    let p = plan(GPT, 2, Strategy::FullShard, Optimizer::adamw(1e-2));
    let r = run(&p, 60, ExecMode::Arena);
    eprintln!("losses {:?}", r.losses);
    let (first, last) = (r.losses[0], *r.losses.last().unwrap());
    assert!(
        (first - 64f32.ln()).abs() < 0.5,
        "initial loss {first} should be near ln(64)"
    );
    assert!(last < first * 0.5, "loss {first} -> {last}");
}

#[test]
fn world_1_matches_world_4_within_tolerance() {
    let one = plan(
        "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=8",
        1,
        Strategy::FullShard,
        Optimizer::adamw(1e-2),
    );
    let four = plan(GPT, 4, Strategy::FullShard, Optimizer::adamw(1e-2));
    let (a, b) = (
        run(&one, 5, ExecMode::Arena),
        run(&four, 5, ExecMode::Arena),
    );
    let dl = a
        .losses
        .iter()
        .zip(&b.losses)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let mut dp = 0f32;
    for ((na, va), (nb, vb)) in a.final_params.iter().zip(&b.final_params) {
        assert_eq!(na, nb);
        dp = va
            .iter()
            .zip(vb)
            .map(|(x, y)| (x - y).abs())
            .fold(dp, f32::max);
    }
    eprintln!("world 1 vs 4: max |dloss| {dl:e}, max |dparam| {dp:e}");
    assert!(
        dl < 1e-4 && dp < 5e-4,
        "max |dloss| {dl}, max |dparam| {dp}"
    );
}

#[test]
fn debug_peak_matches_plan_at_world_4_and_mlp_sharding_is_exact() {
    let p = plan(GPT, 4, Strategy::FullShard, Optimizer::adamw(1e-2));
    assert_eq!(
        run(&p, 1, ExecMode::DebugAlloc).debug_peak_bytes,
        Some(p.memory.peak_bytes)
    );
    let sgd = Optimizer::Sgd {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.01,
    };
    let fs = plan(MLP, 4, Strategy::FullShard, sgd.clone());
    let ns = plan(MLP, 4, Strategy::NoShard, sgd);
    let (a, b) = (
        run(&fs, 4, ExecMode::Arena),
        run(&ns, 4, ExecMode::DebugAlloc),
    );
    assert_eq!(a.losses, b.losses);
    assert_eq!(a.final_params, b.final_params);
    assert_eq!(
        run(&ns, 1, ExecMode::DebugAlloc).debug_peak_bytes,
        Some(ns.memory.peak_bytes)
    );
}
