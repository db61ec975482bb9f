//! Strategy figures from the memory plan: gpt3-175b at 128 and 512 ranks
//! (8 per node, the A100 80 GB preset), in f32 and in bf16 (parameters
//! gathered and gradients reduced in bf16, f32 master shards), per sharding
//! strategy: the per-rank peak (without and with activation checkpointing
//! of every block), the bytes a rank all-gathers, reduce-scatters and
//! all-reduces per step, the bytes it sends across nodes, and what
//! `reshard_after_forward` saves.
//!
//! Run: `cargo bench --bench strategies`

#[allow(dead_code)] // each bench uses part of it
mod common;

use fsdpc_ir::DType;
use fsdpc_plan::{CheckpointPolicy, Plan, ReshardAfterForward, Strategy};
use fsdpc_planner::cost::traffic;
use fsdpc_planner::FsdpConfig;

/// The settings compared: a name and the configuration.
fn settings(dtype: DType) -> Vec<(&'static str, FsdpConfig)> {
    let base = FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: dtype,
            reduce_dtype: dtype,
            ..fsdpc_plan::Settings::default()
        },
        check_fits: false,
        ..FsdpConfig::default()
    };
    let with = |strategy: Strategy, reshard: Option<ReshardAfterForward>| FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            ..base.settings.clone()
        },
        reshard_after_forward: reshard,
        ..base.clone()
    };
    vec![
        ("full_shard", with(Strategy::FullShard, None)),
        ("shard_grad_op", with(Strategy::ShardGradOp, None)),
        ("hybrid_shard", with(Strategy::HybridShard, None)),
        ("hybrid_shard_zero2", with(Strategy::HybridShardZero2, None)),
        (
            "full_shard, reshard 8",
            with(Strategy::FullShard, Some(ReshardAfterForward::To(8))),
        ),
        ("no_shard", with(Strategy::NoShard, None)),
    ]
}

/// Bytes a rank sends per step: in all-gathers, reduce-scatters and
/// all-reduces, and in groups that span nodes (one pass over the plan).
fn sent(plan: &Plan) -> [u64; 4] {
    let mut out = [0u64; 4];
    for t in traffic(plan, &plan.cluster) {
        let k = match t.op {
            "all_gather" => 0,
            "reduce_scatter" => 1,
            _ => 2,
        };
        out[k] += t.bytes_sent;
        if t.inter_node {
            out[3] += t.bytes_sent;
        }
    }
    out
}

fn table(world: u32, dtype: DType) {
    println!("\ngpt3-175b, world {world} (8 per node, a100-80g-roce), {dtype}: per rank and step");
    println!(
        "  {:<22} {:>4} {:>11} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "strategy",
        "F",
        "peak",
        "peak (AC)",
        "all-gather",
        "red.-scatter",
        "all-reduce",
        "inter-node"
    );
    let mut peaks = Vec::new();
    for (name, cfg) in settings(dtype) {
        let plan = common::compile("gpt3-175b", "a100-80g-roce", world, 8, &cfg);
        let ckpt = FsdpConfig {
            settings: fsdpc_plan::Settings {
                activation_checkpointing: CheckpointPolicy::Units,
                ..cfg.settings.clone()
            },
            ..cfg.clone()
        };
        let plan_ac = common::compile("gpt3-175b", "a100-80g-roce", world, 8, &ckpt);
        match (plan, plan_ac) {
            (Ok(p), Ok(a)) => {
                let [ag, rs, ar, inter] = sent(&p);
                println!(
                    "  {:<22} {:>4} {:>7.2} GiB {:>8.2} GiB {:>8.2} GiB {:>8.2} GiB {:>8.2} GiB {:>8.2} GiB",
                    name,
                    p.config.shard_factor,
                    common::gib(p.memory.rank_bytes),
                    common::gib(a.memory.rank_bytes),
                    common::gib(ag),
                    common::gib(rs),
                    common::gib(ar),
                    common::gib(inter),
                );
                peaks.push((name, p.memory.rank_bytes, a.memory.rank_bytes));
            }
            (Err(e), _) | (_, Err(e)) => println!("  {name:<22} does not plan: {e}"),
        }
    }
    let peak = |n: &str| peaks.iter().find(|(m, _, _)| *m == n).map(|p| (p.1, p.2));
    if let (Some(full), Some(keep), Some(hpz)) = (
        peak("full_shard"),
        peak("shard_grad_op"),
        peak("full_shard, reshard 8"),
    ) {
        println!(
            "  reshard_after_forward saves {:.2} GiB per rank ({:.2} GiB with AC) against keeping parameters to backward; resharding to 8 ranks saves {:.2} GiB ({:.2} GiB with AC)",
            common::gib(keep.0.saturating_sub(full.0)),
            common::gib(keep.1.saturating_sub(full.1)),
            common::gib(keep.0.saturating_sub(hpz.0)),
            common::gib(keep.1.saturating_sub(hpz.1)),
        );
    }
}

fn main() {
    common::figures(
        "strategies",
        "sharding strategies at scale",
        "gpt3-175b at world 128 and 512 (`a100-80g-roce`, 8 ranks per node), f32 and bf16, from the memory plan and the cost model's traffic: for every `--strategy` and for `--reshard-after-forward 8`, the per-rank peak without and with activation checkpointing of every block, and the bytes a rank sends per step by collective and across nodes.",
    );
    for dtype in [DType::F32, DType::Bf16] {
        for world in [128, 512] {
            table(world, dtype);
        }
    }
}
