//! Gradient accumulation (`--grad-accum K`, with and without `--no-sync`)
//! trains like one unsharded rank on the whole global batch: K
//! micro-batches of b samples on W ranks are the K * W * b samples of the
//! 1-rank step, micro-batch m on rank r being samples (m W + r) b ..
//! (m W + r + 1) b. The losses reported are the mean over the micro-batches.
//!
//! Reduction order differs from one rank (and between reducing every
//! micro-batch and `no_sync`), so runs are compared within the tolerances
//! of `tests/it/equivalence.rs`.

use crate::common::{compile_on, max_loss_rel_diff, max_param_diff, plan_with, train};
use fsdpc_plan::{InstrOp, Plan, Strategy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::ExecMode;

const STEPS: u64 = 20;
/// The tolerances of `tests/it/equivalence.rs` (loss relative, parameter absolute).
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;

fn gpt(batch: u32) -> String {
    format!("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch={batch}")
}

fn gpt_dropout(batch: u32) -> String {
    format!("{},dropout=0.1", gpt(batch))
}

fn mlp(batch: u32) -> String {
    format!("mlp:layers=3,in=16,hidden=32,classes=5,batch={batch}")
}

fn cfg(strategy: Strategy, f: Option<u32>, k: u32, no_sync: bool) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            grad_accum: k,
            no_sync,
            ..fsdpc_plan::Settings::default()
        },
        shard_factor: f,
        ..FsdpConfig::default()
    }
}

/// (name, world, config) with a global batch of 8 samples.
fn settings() -> Vec<(&'static str, u32, FsdpConfig)> {
    use Strategy::*;
    vec![
        ("1 rank, 2 micro-batches", 1, cfg(NoShard, None, 2, false)),
        ("full_shard F=2, K=2", 2, cfg(FullShard, None, 2, false)),
        (
            "full_shard F=2, K=2, no_sync",
            2,
            cfg(FullShard, None, 2, true),
        ),
        ("full_shard F=2, K=4", 2, cfg(FullShard, None, 4, false)),
        (
            "full_shard F=2, K=4, no_sync",
            2,
            cfg(FullShard, None, 4, true),
        ),
        ("full_shard F=4, K=2", 4, cfg(FullShard, None, 2, false)),
        (
            "full_shard F=4, K=2, no_sync",
            4,
            cfg(FullShard, None, 2, true),
        ),
        (
            "shard_grad_op F=2, K=2",
            2,
            cfg(ShardGradOp, None, 2, false),
        ),
        (
            "hybrid_shard 2x2, K=2",
            4,
            cfg(HybridShard, Some(2), 2, false),
        ),
        (
            "hybrid_shard 2x2, K=2, no_sync",
            4,
            cfg(HybridShard, Some(2), 2, true),
        ),
        ("no_shard W=2, K=2", 2, cfg(NoShard, None, 2, false)),
        ("no_shard W=2, K=2, no_sync", 2, cfg(NoShard, None, 2, true)),
    ]
}

fn check_family(spec: impl Fn(u32) -> String) {
    let reference = train(
        &plan_with(&spec(8), 1, &cfg(Strategy::NoShard, None, 1, false)),
        STEPS,
        ExecMode::Arena,
    );
    for (name, world, c) in settings() {
        let b = 8 / (world * c.grad_accum);
        let p = plan_with(&spec(b), world, &c);
        let r = train(&p, STEPS, ExecMode::Arena);
        let loss_rel = max_loss_rel_diff(&reference, &r);
        let (abs, _) = max_param_diff(&reference, &r);
        eprintln!(
            "{}: {name}: max loss rel diff {loss_rel:e}, max param abs diff {abs:e}",
            spec(b)
        );
        assert_eq!(r.losses.len(), STEPS as usize, "{name}");
        assert!(
            loss_rel <= LOSS_RTOL,
            "{name}: losses differ by {loss_rel:e}"
        );
        assert!(abs <= PARAM_ATOL, "{name}: parameters differ by {abs:e}");
    }
}

#[test]
fn gpt_accumulation_equals_one_rank_on_the_global_batch() {
    check_family(gpt);
}

/// Dropout masks follow the samples, so they follow the micro-batches too.
#[test]
fn gpt_with_dropout_accumulation_equals_one_rank() {
    check_family(gpt_dropout);
}

#[test]
fn mlp_accumulation_equals_one_rank_on_the_global_batch() {
    check_family(mlp);
}

fn count(plan: &Plan, f: impl Fn(&InstrOp) -> bool) -> usize {
    plan.instructions.iter().filter(|i| f(&i.op)).count()
}

/// The plan shows the trade: reducing every micro-batch communicates K
/// times the gradient bytes; `no_sync` communicates them once but holds
/// every unit's unsharded gradient across the micro-batches.
#[test]
fn no_sync_trades_gradient_bytes_for_memory() {
    let spec = "gpt:layers=4,hidden=64,heads=2,seq=16,vocab=128,batch=2";
    let one = plan_with(spec, 4, &cfg(Strategy::FullShard, None, 1, false));
    let sync = plan_with(spec, 4, &cfg(Strategy::FullShard, None, 4, false));
    let nosync = plan_with(spec, 4, &cfg(Strategy::FullShard, None, 4, true));
    let scatters = |p: &Plan| count(p, |o| matches!(o, InstrOp::ReduceScatter { .. }));
    let gathers = |p: &Plan| count(p, |o| matches!(o, InstrOp::AllGather { .. }));
    assert_eq!(scatters(&sync), 4 * scatters(&one));
    assert_eq!(scatters(&nosync), scatters(&one));
    // Parameters are gathered for every micro-batch either way.
    assert_eq!(gathers(&sync), gathers(&nosync));
    assert!(gathers(&sync) > gathers(&one));
    let loads = count(&sync, |o| matches!(o, InstrOp::LoadInput { .. }));
    let first = count(&one, |o| matches!(o, InstrOp::LoadInput { .. }));
    assert_eq!(loads, 4 * first);
    let rs_bytes = |p: &Plan| -> u64 {
        let cluster = p.cluster.clone();
        fsdpc_planner::cost::traffic(p, &cluster)
            .iter()
            .filter(|t| t.op == "reduce_scatter")
            .map(|t| t.bytes_sent)
            .sum()
    };
    assert_eq!(rs_bytes(&sync), 4 * rs_bytes(&nosync));
    assert!(nosync.memory.peak_bytes > sync.memory.peak_bytes);
    eprintln!(
        "K=4 at world 4: reduce-scatter {} B per rank and step, peak {} B; no_sync: {} B, peak {} B",
        rs_bytes(&sync),
        sync.memory.peak_bytes,
        rs_bytes(&nosync),
        nosync.memory.peak_bytes
    );
    assert_eq!(
        sync.model.tokens_per_rank_step,
        4 * one.model.tokens_per_rank_step
    );
    for p in [&one, &sync, &nosync] {
        p.validate().expect("validates");
    }
}

#[test]
fn no_sync_without_accumulation_is_refused() {
    let err = compile_on(
        "gpt-mini",
        "cpu-local",
        2,
        2,
        &cfg(Strategy::FullShard, None, 1, true),
    )
    .expect_err("no_sync needs grad_accum > 1");
    assert!(err.to_string().contains("grad_accum > 1"), "{err}");
}
