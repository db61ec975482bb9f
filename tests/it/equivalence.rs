//! Correctness is equivalence: sharded training gives the same losses and final
//! parameters as unsharded single-rank training of the same program.
//!
//! The global batch is fixed (8 samples a step); a world of W ranks runs a
//! micro-batch of 8 / W each. Reduction order differs between 1 rank (one
//! kernel sums over all 8 samples) and W ranks (each sums its own samples, then
//! the collective sums the ranks in rank order), so those are compared within
//! a tolerance. `full_shard` and `no_shard` at the same world sum in the same
//! order and must agree bit for bit, as must two runs with the same seed, and
//! runs with and without activation checkpointing (recomputation runs the
//! same kernels on the same values).

use crate::common;

use crate::common::{bits, max_loss_rel_diff, max_param_diff, plan, train};
use fsdpc_plan::{CheckpointPolicy, InstrOp, Plan, Strategy, WrapPolicy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::ExecMode;

const STEPS: u64 = 20;
/// Loss tolerance (relative) and parameter tolerance (absolute) against the
/// 1-rank run. Measured (printed by the tests): losses differ by at most
/// 1.2e-7 relative, parameters after 20 AdamW steps by at most 5.2e-6 (GPT;
/// Adam's normalisation amplifies last-bit differences of small gradients) and
/// 6e-8 (MLP). The bounds leave about 4x headroom.
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;

fn gpt(batch: u32) -> String {
    format!("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch={batch}")
}

fn mlp(batch: u32) -> String {
    format!("mlp:layers=3,in=16,hidden=32,classes=5,batch={batch}")
}

fn check_family(spec: impl Fn(u32) -> String) {
    let reference = train(
        &plan(&spec(8), 1, Strategy::NoShard, WrapPolicy::Blocks),
        STEPS,
        ExecMode::Arena,
    );
    assert!(reference.losses.iter().all(|l| l.is_finite()));
    let mut runs = Vec::new();
    for (world, strategy) in [
        (2, Strategy::FullShard),
        (4, Strategy::FullShard),
        (8, Strategy::FullShard),
        (2, Strategy::NoShard),
        (4, Strategy::NoShard),
    ] {
        let r = train(
            &plan(&spec(8 / world), world, strategy, WrapPolicy::Blocks),
            STEPS,
            ExecMode::Arena,
        );
        let loss_rel = max_loss_rel_diff(&reference, &r);
        let (abs, _) = max_param_diff(&reference, &r);
        eprintln!("{} world {world} {strategy:?}: max loss rel diff {loss_rel:e}, max param abs diff {abs:e}", spec(8 / world));
        assert!(
            loss_rel <= LOSS_RTOL,
            "world {world} {strategy:?}: losses differ by {loss_rel:e} (relative)"
        );
        assert!(
            abs <= PARAM_ATOL,
            "world {world} {strategy:?}: parameters differ by {abs:e}"
        );
        runs.push(((world, strategy), r));
    }
    for world in [2, 4] {
        let fs = &runs
            .iter()
            .find(|(k, _)| *k == (world, Strategy::FullShard))
            .expect("ran")
            .1;
        let ns = &runs
            .iter()
            .find(|(k, _)| *k == (world, Strategy::NoShard))
            .expect("ran")
            .1;
        assert_eq!(
            bits(fs),
            bits(ns),
            "full_shard and no_shard at world {world} must be bit-identical"
        );
    }
}

#[test]
fn gpt_sharded_training_equals_unsharded() {
    check_family(gpt);
}

#[test]
fn mlp_sharded_training_equals_unsharded() {
    check_family(mlp);
}

#[test]
fn same_seed_is_bit_identical() {
    let p = plan(&gpt(2), 4, Strategy::FullShard, WrapPolicy::Blocks);
    let a = train(&p, 5, ExecMode::Arena);
    let b = train(&p, 5, ExecMode::Arena);
    assert_eq!(bits(&a), bits(&b));
}

/// The debug allocator (one allocation per buffer, at the plan's own
/// lifetimes) is a check of the executor against the plan's lifetimes and of
/// the arena's offsets: the same training in both modes. It re-derives the
/// plan's peak rather than measuring the run; the measured memory is
/// `tests/it/memory.rs` (a counting allocator).
#[test]
fn debug_allocation_follows_the_plans_lifetimes() {
    for (spec, world, strategy) in [
        (gpt(2), 4, Strategy::FullShard),
        (mlp(4), 2, Strategy::FullShard),
        (gpt(4), 2, Strategy::NoShard),
    ] {
        let p = plan(&spec, world, strategy, WrapPolicy::Blocks);
        let r = train(&p, 2, ExecMode::DebugAlloc);
        assert_eq!(
            r.debug_peak_bytes,
            Some(p.memory.peak_bytes),
            "{spec} world {world} {strategy:?}"
        );
        // And the debug allocator computes the same numbers as the arena run.
        let arena = train(&p, 2, ExecMode::Arena);
        assert_eq!(
            bits(&r),
            bits(&arena),
            "{spec}: debug allocation and arena give the same training"
        );
    }
}

#[test]
fn loss_falls_on_the_synthetic_task() {
    let p = plan(
        "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=64,batch=8",
        2,
        Strategy::FullShard,
        WrapPolicy::Blocks,
    );
    let r = train(&p, 120, ExecMode::Arena);
    let first = r.losses[0];
    let last = r.losses[r.losses.len() - 5..].iter().sum::<f32>() / 5.0;
    eprintln!("synthetic task: loss {first} -> {last}");
    assert!(
        last < 0.5 * first,
        "loss should fall clearly: {first} -> {last}"
    );
}

/// `spec` planned like `common::plan`, with activation checkpointing `policy`.
fn plan_checkpointed(spec: &str, world: u32, strategy: Strategy, policy: CheckpointPolicy) -> Plan {
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            activation_checkpointing: policy,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    common::plan_with(spec, world, &cfg)
}

/// Kernels of `plan` that recompute a forward node.
fn recomputes(plan: &Plan) -> usize {
    let g = &plan.training.graph;
    plan.instructions
        .iter()
        .filter(|i| match i.op {
            InstrOp::Kernel { node, .. } => g
                .try_node(node)
                .is_some_and(fsdpc_planner::recompute::is_recompute),
            _ => false,
        })
        .count()
}

/// A zoo spec for a micro-batch size.
type Spec = fn(u32) -> String;

fn gpt_dropout(batch: u32) -> String {
    format!("{},dropout=0.1", gpt(batch))
}

#[test]
fn activation_checkpointing_is_bit_identical() {
    let families: [(&str, Spec); 3] = [("gpt", gpt), ("mlp", mlp), ("gpt+dropout", gpt_dropout)];
    for (family, spec) in families {
        for world in [2, 4] {
            let spec = spec(8 / world);
            let plain =
                plan_checkpointed(&spec, world, Strategy::FullShard, CheckpointPolicy::None);
            let ckpt =
                plan_checkpointed(&spec, world, Strategy::FullShard, CheckpointPolicy::Units);
            assert!(recomputes(&ckpt) > 0, "{family}: something is recomputed");
            eprintln!(
                "{spec} world {world}: peak {} -> {} bytes with checkpointing, {} recompute kernels",
                plain.memory.peak_bytes,
                ckpt.memory.peak_bytes,
                recomputes(&ckpt)
            );
            assert!(ckpt.memory.peak_bytes <= plain.memory.peak_bytes);
            let a = train(&plain, STEPS, ExecMode::Arena);
            let b = train(&ckpt, STEPS, ExecMode::Arena);
            assert!(a.losses.iter().all(|l| l.is_finite()));
            assert_eq!(
                bits(&a),
                bits(&b),
                "{family} world {world}: checkpointing must not change training"
            );
        }
    }
}

#[test]
fn debug_allocation_follows_the_plans_lifetimes_with_checkpointing() {
    for (spec, world, strategy) in [
        (gpt(2), 4, Strategy::FullShard),
        (mlp(4), 2, Strategy::FullShard),
        (gpt_dropout(4), 2, Strategy::FullShard),
        (gpt(4), 2, Strategy::NoShard),
    ] {
        let p = plan_checkpointed(&spec, world, strategy, CheckpointPolicy::Units);
        let r = train(&p, 2, ExecMode::DebugAlloc);
        assert_eq!(
            r.debug_peak_bytes,
            Some(p.memory.peak_bytes),
            "{spec} world {world} {strategy:?} with checkpointing"
        );
    }
}
