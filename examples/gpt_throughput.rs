//! Trains the throughput target — a 2-layer GPT (hidden 128, 4 heads, vocab
//! 1024, seq 128, batch 8 per rank) on 2 thread ranks, 1 thread each — and
//! prints tokens/s. `cargo run --release -p fsdpc-runtime --example
//! gpt_throughput [steps] [ranks] [strategy]`.

use fsdpc_ir::{build_training_program, Optimizer};
use fsdpc_plan::{ModelInfo, Strategy};
use fsdpc_planner::{compile, count_params, FsdpConfig};
use fsdpc_runtime::{train, TrainOptions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let steps: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20);
    let world: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(2);
    let strategy = match args.get(3).map(String::as_str) {
        Some("no_shard") => Strategy::NoShard,
        _ => Strategy::FullShard,
    };
    let m =
        fsdpc_frontends::zoo::build("gpt:layers=2,hidden=128,heads=4,seq=128,vocab=1024,batch=8")?;
    let tokens = m.tokens_per_sample * 8;
    let prog = build_training_program(m.graph, m.loss, Optimizer::adamw(1e-3))?;
    let model = ModelInfo {
        name: m.name.clone(),
        params: count_params(&prog),
        tokens_per_rank_step: tokens,
    };
    let cluster = fsdpc_planner::preset("cpu-local", world, world)?;
    let plan = compile(
        prog,
        model,
        &cluster,
        &FsdpConfig {
            settings: fsdpc_plan::Settings {
                strategy,
                ..fsdpc_plan::Settings::default()
            },
            ..FsdpConfig::default()
        },
    )?;
    let opts = TrainOptions {
        steps,
        seed: 1,
        ..TrainOptions::default()
    };
    let mut tps = Vec::new();
    let report = train(&plan, &opts, &mut |s| {
        println!(
            "step {:3} loss {:.4} {:8.0} tok/s {:?}",
            s.step, s.loss, s.tokens_per_s, s.elapsed
        );
        tps.push(s.tokens_per_s);
    })?;
    tps.sort_by(f64::total_cmp);
    println!(
        "overall {:.0} tok/s, median step {:.0} tok/s, planned peak {} bytes per rank",
        report.tokens_per_s,
        tps[tps.len() / 2],
        report.planned_peak_bytes
    );
    if let Some(cpu) = cpu_seconds() {
        // What the run would reach with one dedicated core per rank (the
        // machine is shared, so wall-clock figures vary with its load).
        let tokens = (plan.model.tokens_per_rank_step * world as u64 * steps) as f64;
        println!(
            "cpu {cpu:.2} s: {:.0} tok/s on {world} dedicated cores",
            tokens / (cpu / world as f64)
        );
    }
    Ok(())
}

/// User + system CPU seconds of this process so far (Linux).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}
