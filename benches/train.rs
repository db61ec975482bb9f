//! Training throughput on CPU thread ranks: the 2-layer GPT of the README
//! (hidden 128, 4 heads, vocab 1024, seq 128, batch 8 per rank, AdamW), 2 ranks,
//! 1 matrix-product thread per rank, full_shard; then in bf16 and fp16
//! (`--mixed-precision`: half-precision storage, f32 arithmetic on widened
//! copies).
//!
//! Run: `cargo bench --bench train`

mod common;

use fsdpc_ir::DType;
use fsdpc_plan::Strategy;
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::{ExecMode, TrainOptions};

const SPEC: &str = "gpt:layers=2,hidden=128,heads=4,seq=128,vocab=1024,batch=8";

fn main() {
    common::figures(
        "train",
        "training throughput on CPU thread ranks",
        "A 2-layer GPT (hidden 128, vocab 1024, seq 128, batch 8 per rank, AdamW) on this machine's CPU thread ranks, one matrix-product thread per rank: tokens per second for full_shard and no_shard at 2 ranks, one rank, and bf16 and fp16 at 2 ranks, with the loss and the plan's peak per rank.",
    );
    let steps: u64 = std::env::var("FSDPC_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    for (world, strategy, dtype) in [
        (2, Strategy::FullShard, DType::F32),
        (2, Strategy::NoShard, DType::F32),
        (1, Strategy::NoShard, DType::F32),
        (2, Strategy::FullShard, DType::Bf16),
        (2, Strategy::FullShard, DType::F16),
    ] {
        let cfg = FsdpConfig {
            settings: fsdpc_plan::Settings {
                strategy,
                param_dtype: dtype,
                reduce_dtype: dtype,
                buffer_dtype: dtype,
                ..fsdpc_plan::Settings::default()
            },
            ..FsdpConfig::default()
        };
        let plan = common::compile(SPEC, "cpu-local", world, world, &cfg).expect("plan");
        let opts = TrainOptions {
            steps,
            seed: 1,
            mode: ExecMode::Arena,
            threads_per_rank: 1,
            ..TrainOptions::default()
        };
        let mut rates = Vec::new();
        let report = fsdpc_runtime::train(&plan, &opts, &mut |r| {
            if r.step >= 5 {
                rates.push(r.tokens_per_s);
            }
        })
        .expect("training runs");
        rates.sort_by(f64::total_cmp);
        let median = rates
            .get(rates.len() / 2)
            .copied()
            .unwrap_or(report.tokens_per_s);
        println!(
            "{SPEC} world {world} {} {dtype}: {:.0} tokens/s overall, {:.0} tokens/s median step (steps 5..{steps}), loss {:.3} -> {:.3}, peak per rank {:.1} MiB planned",
            strategy.name(),
            report.tokens_per_s,
            median,
            report.losses[0],
            report.losses[report.losses.len() - 1],
            common::mib(plan.memory.rank_bytes),
        );
    }
    if let Some(rss) = common::peak_rss_bytes() {
        println!(
            "peak RSS of this process (all ranks are threads of it): {:.1} MiB",
            common::mib(rss)
        );
    }
}
