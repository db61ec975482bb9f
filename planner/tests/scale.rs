//! Planning at scale: GPT-3 175B.
mod common;
use common::*;
use fsdpc_planner::*;
use std::time::Instant;

fn gpt3(world: u32, cfg: &FsdpConfig) -> (Plan, f64) {
    let (p, info) = program("gpt3-175b");
    let cluster = Cluster::preset("a100-80g-roce", world, 8).unwrap();
    let t = Instant::now();
    let plan = compile(p, info, &cluster, cfg).unwrap();
    (plan, t.elapsed().as_secs_f64())
}

#[test]
fn gpt3_175b_world_128_full_shard_peak_is_plausible() {
    let cfg = FsdpConfig {
        check_fits: false,
        ..FsdpConfig::default()
    };
    let (plan, secs) = gpt3(128, &cfg);
    let params = plan.model.params as f64;
    let persistent = params * 16.0 / 128.0; // params + grads + two Adam moments, f32
    let peak = plan.memory.peak_bytes as f64;
    eprintln!(
        "gpt3-175b world 128: planned in {secs:.3}s, {} instructions, {} buffers, peak {:.2} GiB (persistent {:.2} GiB), arena {:.2} GiB, step {:.3}s mfu {:.3}",
        plan.instructions.len(),
        plan.buffers.len(),
        peak / 2f64.powi(30),
        persistent / 2f64.powi(30),
        plan.memory.arena_bytes as f64 / 2f64.powi(30),
        plan.estimates.step_time_s,
        plan.estimates.mfu,
    );
    for (k, b) in &plan.memory.breakdown {
        eprintln!("  {k:?}: {:.2} GiB", *b as f64 / 2f64.powi(30));
    }
    assert!(peak > persistent);
    assert!(peak < persistent + 400e9);
}
