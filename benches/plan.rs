//! Planning benchmark: time and peak RSS of compiling GPT-3 175B for 512 ranks
//! (64 nodes x 8), what validating that plan costs, and the plan's per-rank
//! figures at world 128.
//!
//! Run: `cargo bench --bench plan`

mod common;

use fsdpc_ir::DType;
use fsdpc_plan::Collective;
use fsdpc_plan::{BufferKind, CheckpointPolicy, InstrOp, Plan, Strategy};
use fsdpc_planner::FsdpConfig;
use std::time::Instant;

fn compile(model: &str, world: u32, strategy: Strategy, check_fits: bool) -> Result<Plan, String> {
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            ..fsdpc_plan::Settings::default()
        },
        check_fits,
        ..FsdpConfig::default()
    };
    compile_with(model, world, &cfg)
}

fn compile_with(model: &str, world: u32, cfg: &FsdpConfig) -> Result<Plan, String> {
    common::compile(model, "a100-80g-roce", world, 8, cfg)
}

/// Best and median of `times` (seconds).
fn best_median(times: &mut [f64]) -> (f64, f64) {
    times.sort_by(f64::total_cmp);
    (times[0], times[times.len() / 2])
}

/// What `Plan::validate` costs next to the compile that runs it, for the plan
/// of `fsdpc compile gpt3-175b --world 512 --ranks-per-node 8
/// --activation-checkpointing`: 5 compiles, and validation alone of each.
fn validation_cost() {
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            activation_checkpointing: CheckpointPolicy::Units,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let (mut compile_s, mut validate_s) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let t = Instant::now();
        let p = compile_with("gpt3-175b", 512, &cfg).expect("gpt3-175b + checkpointing compiles");
        compile_s.push(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let checked = p.validate();
        validate_s.push(t.elapsed().as_secs_f64());
        assert!(checked.is_ok(), "the compiled plan validates");
    }
    let (cb, cm) = best_median(&mut compile_s);
    let (vb, vm) = best_median(&mut validate_s);
    println!(
        "compile gpt3-175b world 512 (8/node) + activation checkpointing: best {cb:.3} s, median {cm:.3} s (validation included); Plan::validate alone: best {vb:.3} s, median {vm:.3} s ({:.0}% of the compile)",
        100.0 * vm / cm
    );
}

/// Per-rank peak of gpt3-175b at world 128 (a100 preset, 8 per node,
/// full_shard) as more blocks are checkpointed: none, every 2nd, all.
fn checkpoint_selection() {
    for policy in ["none", "every:2", "all"] {
        let cfg = FsdpConfig {
            settings: fsdpc_plan::Settings {
                activation_checkpointing: CheckpointPolicy::parse(policy).expect("a policy"),
                ..fsdpc_plan::Settings::default()
            },
            check_fits: false,
            ..FsdpConfig::default()
        };
        let p = compile_with("gpt3-175b", 128, &cfg).expect("gpt3-175b compiles at world 128");
        println!(
            "gpt3-175b world 128 full_shard, --activation-checkpointing {policy}: {} of {} units checkpointed, peak {:.2} GiB per rank (activations {:.2} GiB at the peak), step {:.2} s simulated",
            p.config.checkpointed_units.len(),
            p.units.len(),
            common::gib(p.memory.rank_bytes),
            common::gib(p.memory.breakdown.iter().filter(|(k, _)| *k == BufferKind::Activation).map(|(_, b)| *b).sum()),
            p.estimates.step_time_s
        );
    }
}

/// gpt3-175b at world 128 and 512 (a100 preset, 8 per node, full_shard):
/// per-rank peak and bytes all-gathered per step, f32 against bf16
/// (`--mixed-precision bf16`).
fn mixed_precision() {
    for world in [128u32, 512] {
        for (name, d) in [("f32", DType::F32), ("bf16", DType::Bf16)] {
            let cfg = FsdpConfig {
                settings: fsdpc_plan::Settings {
                    param_dtype: d,
                    reduce_dtype: d,
                    buffer_dtype: d,
                    ..fsdpc_plan::Settings::default()
                },
                check_fits: false,
                ..FsdpConfig::default()
            };
            let p = compile_with("gpt3-175b", world, &cfg).expect("gpt3-175b compiles");
            let cluster = p.cluster.clone();
            // Bytes one rank sends per step in collectives of a kind.
            let sent = |kind: fn(&InstrOp) -> bool| -> u64 {
                p.instructions
                    .iter()
                    .filter(|i| kind(&i.op))
                    .map(|i| fsdpc_planner::cost::instr_cost(&p, &cluster, i).1)
                    .sum()
            };
            let gathered: u64 = p
                .instructions
                .iter()
                .filter_map(|i| match i.op {
                    InstrOp::AllGather {
                        c: Collective { dst, .. },
                        ..
                    } => Some(p.buffers[dst.index()].bytes),
                    _ => None,
                })
                .sum();
            println!(
                "gpt3-175b world {world} full_shard {name}: peak {:.2} GiB per rank, all-gathered {:.1} GiB per step (each rank sends {:.1} GiB), reduce-scatter sends {:.1} GiB, step {:.2} s simulated",
                common::gib(p.memory.rank_bytes),
                common::gib(gathered),
                common::gib(sent(|op| matches!(op, InstrOp::AllGather { .. }))),
                common::gib(sent(|op| matches!(op, InstrOp::ReduceScatter { .. }))),
                p.estimates.step_time_s,
            );
        }
    }
}

fn main() {
    common::figures(
        "plan",
        "compiling GPT-3 175B",
        "The planner's own speed and the plans it makes for gpt3-175b on `a100-80g-roce` (8 ranks per node): the time of a whole compile (model, autodiff, every pass, validation) at world 512, what `Plan::validate` alone costs, the instruction count at world 16 and 512, the per-rank peak and its breakdown at world 128 with and without activation checkpointing (none, `every:2`, all), and f32 against bf16.",
    );
    // Time: best and median of 5 full compiles (model build + autodiff + plan).
    let mut times = Vec::new();
    let mut plan = None;
    for _ in 0..5 {
        let t = Instant::now();
        let p = compile("gpt3-175b", 512, Strategy::FullShard, false)
            .expect("gpt3-175b compiles at world 512");
        times.push(t.elapsed().as_secs_f64());
        plan = Some(p);
    }
    let (best, median) = best_median(&mut times);
    let plan = plan.expect("compiled");
    let json = plan.to_json_pretty().expect("plan serialises");
    println!(
        "compile gpt3-175b world 512 (8/node): best {:.3} s, median {:.3} s; {} units, {} instructions, plan JSON {:.1} MiB",
        best,
        median,
        plan.units.len(),
        plan.instructions.len(),
        common::mib(json.len() as u64)
    );
    println!(
        "gpt3-175b world 512 full_shard: peak {:.2} GiB per rank (the arena's live peak and {:.2} GiB outside it on a GPU) of {:.0} GiB: {}",
        common::gib(plan.memory.device_peak_bytes()),
        common::gib(plan.memory.outside_arena_bytes()),
        common::gib(plan.cluster.memory_bytes),
        if plan.memory.device_peak_bytes() <= plan.cluster.memory_bytes {
            "fits"
        } else {
            "does not fit"
        }
    );
    validation_cost();
    let small = compile("gpt3-175b", 16, Strategy::FullShard, false).expect("compiles at world 16");
    println!(
        "plan size does not grow with world: {} instructions at world 16, {} at world 512",
        small.instructions.len(),
        plan.instructions.len()
    );

    let p128 = compile("gpt3-175b", 128, Strategy::FullShard, false).expect("world 128 full_shard");
    println!(
        "gpt3-175b world 128 full_shard: peak {:.2} GiB per rank (arena {:.2} GiB, capacity {:.0} GiB), step {:.2} s simulated, MFU {:.1}%",
        common::gib(p128.memory.rank_bytes),
        common::gib(p128.memory.arena_bytes),
        common::gib(p128.cluster.memory_bytes),
        p128.estimates.step_time_s,
        p128.estimates.mfu * 100.0
    );
    for (kind, bytes) in &p128.memory.breakdown {
        println!("  {kind:?}: {:.2} GiB", common::gib(*bytes));
    }
    match compile("gpt3-175b", 128, Strategy::NoShard, true) {
        Ok(p) => println!(
            "gpt3-175b world 128 no_shard fits: peak {:.1} GiB",
            common::gib(p.memory.rank_bytes)
        ),
        Err(e) => println!("gpt3-175b world 128 no_shard does not fit 80 GB: {e}"),
    }
    for world in [128, 512] {
        let cfg = FsdpConfig {
            settings: fsdpc_plan::Settings {
                activation_checkpointing: CheckpointPolicy::Units,
                ..fsdpc_plan::Settings::default()
            },
            ..FsdpConfig::default()
        };
        match compile_with("gpt3-175b", world, &cfg) {
            Ok(p) => println!(
                "gpt3-175b world {world} full_shard + activation checkpointing: peak {:.2} GiB per rank (fits 80 GiB), activations {:.2} GiB, step {:.2} s simulated",
                common::gib(p.memory.rank_bytes),
                common::gib(p.memory.breakdown.iter().filter(|(k, _)| *k == BufferKind::Activation).map(|(_, b)| *b).sum()),
                p.estimates.step_time_s
            ),
            Err(e) => println!("gpt3-175b world {world} with activation checkpointing: {e}"),
        }
    }
    checkpoint_selection();
    mixed_precision();
    if let Some(rss) = common::peak_rss_bytes() {
        println!(
            "peak RSS of this benchmark process: {:.1} MiB",
            common::mib(rss)
        );
    }
}
