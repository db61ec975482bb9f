//! The collective rewrites (`planner::rewrite`) per cluster preset: for
//! each model and world, the rules that fired, on how many collectives,
//! the time each saves by the cost model (each collective alone), and the
//! simulated step with every rule and with none (`--rewrites none`), which
//! is what the overlap leaves of those savings. bf16 mixed precision, full
//! activation checkpointing, full_shard; 8 ranks per node on the GPU
//! presets. `+flat` is the preset with a collective library whose rings
//! are flat across nodes (`Hardware::flat_collectives`, as MPI over TCP):
//! where the explicit hierarchical forms pay.
//!
//! Run: `cargo bench --bench rewrites` (about half a minute).

mod common;

use fsdpc_planner::rewrite::Rules;
use fsdpc_planner::FsdpConfig;
use std::time::Instant;

fn main() {
    common::figures(
        "rewrites",
        "collective rewrites per cluster",
        "The egg rewrites of the collectives (`--rewrites`) per cluster preset, bf16, activation checkpointing of every block, full_shard: the simulated step with no rule and with every rule, and the rules that fired with the time each saves. `+flat` is the preset with `\"flat_collectives\": true` (a collective library whose rings are flat across nodes).",
    );
    let presets = [
        ("a100-80g-roce", false),
        ("a100-80g-roce", true),
        ("h100-80g-ib", false),
        ("h100-80g-ib", true),
        ("h200-141g-ib", false),
        ("cpu-local", false),
    ];
    // The small models at scale: units small next to a ring's latency,
    // where bucketing the gathers issued together pays.
    let cases = [
        ("gpt3-175b", 512u32),
        ("t5-11b", 64),
        ("t5-11b", 8),
        ("t5-large", 512),
        ("gpt2", 64),
    ];
    let base = common::bf16_recomputed();
    println!(
        "{:<14} {:<10} {:>5} {:>11} {:>11} {:>7} {:>8}  rules fired (collectives, saved per step)",
        "preset", "model", "world", "none s", "all s", "gain %", "compile"
    );
    for (model, world) in cases {
        for (preset, flat) in presets {
            // The preset's own node size.
            let mut cluster = match fsdpc_planner::preset(preset, world, None) {
                Ok(c) => c,
                Err(e) => {
                    println!("{preset}: {e}");
                    continue;
                }
            };
            cluster.hardware.flat_collectives |= flat;
            let compile = |cfg: &FsdpConfig| common::compile_for(model, &cluster, cfg);
            let none = compile(&FsdpConfig {
                rewrites: Rules::none(),
                ..base.clone()
            });
            let t = Instant::now();
            let all = compile(&base);
            let preset = format!("{preset}{}", if flat { "+flat" } else { "" });
            let compile_s = t.elapsed().as_secs_f64();
            let (none, all) = match (none, all) {
                (Ok(n), Ok(a)) => (n, a),
                (Err(e), _) | (_, Err(e)) => {
                    println!("{preset:<14} {model:<10} {world:>5}  does not compile: {e}");
                    continue;
                }
            };
            let (a, n) = (all.estimates.step_time_s, none.estimates.step_time_s);
            let fired: Vec<String> = all
                .rewrites
                .fired
                .iter()
                .map(|f| format!("{} ({}, {:.3} s)", f.rule, f.count, f.saved_s))
                .collect();
            println!(
                "{preset:<14} {model:<10} {world:>5} {n:>11.3} {a:>11.3} {:>7.1} {:>7.2}s  {}",
                100.0 * (n - a) / n,
                compile_s,
                if fired.is_empty() {
                    "none".to_string()
                } else {
                    fired.join(", ")
                }
            );
        }
    }
}
