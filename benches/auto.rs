//! `fsdpc compile --auto` figures: the search's wall time, candidates
//! compiled and pruned, and the chosen configuration, for gpt3-175b at 512
//! ranks of a100-80g-roce (precision as given, f32, and with bf16 allowed),
//! gpt2 at world 8, and t5-11b at world 8 when the zoo has it.
//!
//! Run: `cargo bench --bench auto`

#[allow(dead_code)] // only `figures` is used here
mod common;

use fsdpc_frontends::LoadOptions;
use fsdpc_plan::ModelInfo;
use fsdpc_planner::auto::{short, Fixed, Search, Space};
use fsdpc_planner::FsdpConfig;
use std::time::Instant;

/// One search. `knobs_fixed`: the schedule knobs kept at their defaults
/// (as `--auto` with `--backward-prefetch pre --forward-prefetch true
/// --prefetch-depth 1 --limit-all-gathers 2` given), so only the structure
/// (wrap, strategy and F, checkpointing, offload, precision) is searched.
fn run(spec: &str, preset: &str, world: u32, allow_bf16: bool, knobs_fixed: bool) {
    let label = format!(
        "{spec}@{world} {preset}{}{}",
        if allow_bf16 { ", bf16 allowed" } else { "" },
        if knobs_fixed {
            ", schedule knobs fixed"
        } else {
            ""
        }
    );
    let started = Instant::now();
    let m = match fsdpc_frontends::load(spec, &LoadOptions::default()) {
        Ok(m) => m,
        Err(e) => {
            println!("{label}: not run ({e})");
            return;
        }
    };
    let info = ModelInfo {
        name: m.name.clone(),
        params: m.program.graph.param_numel(),
        tokens_per_rank_step: m.tokens_per_rank_step(),
    };
    let cluster = fsdpc_planner::preset(preset, world, None).expect("preset");
    let base = FsdpConfig::default();
    let fixed = Fixed {
        backward_prefetch: knobs_fixed,
        forward_prefetch: knobs_fixed,
        prefetch_depth: knobs_fixed,
        limit_all_gathers: knobs_fixed,
        ..Fixed::default()
    };
    let space = Space::around(&base, &m.program, world, &fixed, allow_bf16).expect("space");
    let search = Search::new(&m.program, &info, &cluster, &base, &space);
    match search.run() {
        Ok(r) => {
            let secs = started.elapsed().as_secs_f64();
            let chosen = r
                .weighed
                .iter()
                .find(|w| w.verdict == fsdpc_planner::auto::Verdict::Chosen)
                .map(|w| short(&w.candidate.config))
                .unwrap_or_default();
            println!(
                "{label}: {secs:.2} s (load included), {} candidates, {} compiled, {} pruned by memory, {} by time\n  chosen {chosen}: step {:.4} s, peak per rank {:.1} GiB",
                r.record.candidates,
                r.record.compiled,
                r.record.pruned_by_memory,
                r.record.pruned_by_time,
                r.plan.estimates.step_time_s,
                r.plan.memory.rank_bytes as f64 / (1u64 << 30) as f64
            );
        }
        Err(e) => println!("{label}: {:.2} s: {e}", started.elapsed().as_secs_f64()),
    }
}

fn main() {
    common::figures(
        "auto",
        "the auto-planner's search",
        "`fsdpc compile --auto` searches, timed with the model's loading: candidates, how many were compiled and pruned, and the chosen configuration with its simulated step and peak.",
    );
    run("gpt2", "a100-80g-roce", 8, false, false);
    run("gpt3-175b", "a100-80g-roce", 512, false, true);
    run("gpt3-175b", "a100-80g-roce", 512, true, true);
    run("gpt3-175b", "a100-80g-roce", 512, false, false);
    if fsdpc_frontends::zoo::preset_names()
        .iter()
        .any(|n| n == "t5-11b")
    {
        run("t5-11b", "a100-80g-roce", 8, true, true);
    } else {
        println!("t5-11b: not in the zoo yet");
    }
}
