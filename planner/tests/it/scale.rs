//! Planning at scale: GPT-3 175B.
use crate::common::*;
use fsdpc_plan::*;
use fsdpc_planner::*;
use std::time::Instant;

fn gpt3(world: u32, cfg: &FsdpConfig) -> (Plan, f64) {
    let (p, info) = program("gpt3-175b");
    let cluster = fsdpc_planner::preset("a100-80g-roce", world, 8).unwrap();
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
    let t = Instant::now();
    assert_eq!(plan.validate(), Ok(()));
    eprintln!("validated in {:.3}s", t.elapsed().as_secs_f64());
    assert!(peak > persistent);
    assert!(peak < persistent + 400e9);
}

#[test]
fn gpt3_175b_world_512_plans_fast_and_does_not_grow_with_world() {
    // Without the collective rewrites: at 512 ranks (64 nodes) the
    // hierarchical forms add a staging buffer and its free per collective,
    // which one node (world 8) has no use for.
    let cfg = FsdpConfig {
        check_fits: false,
        rewrites: fsdpc_planner::rewrite::Rules::none(),
        ..FsdpConfig::default()
    };
    let (small, _) = gpt3(8, &cfg);
    let (plan, secs) = gpt3(512, &cfg);
    eprintln!(
        "gpt3-175b world 512: planned in {secs:.3}s, peak {:.2} GiB",
        plan.memory.peak_bytes as f64 / 2f64.powi(30)
    );
    assert!(secs < 5.0, "planning took {secs}s");
    assert_eq!(plan.instructions.len(), small.instructions.len());
    assert_eq!(plan.buffers.len(), small.buffers.len());
}

#[test]
fn no_shard_gpt3_does_not_fit_and_says_what_would() {
    let (p, info) = program("gpt3-175b");
    let cluster = fsdpc_planner::preset("a100-80g-roce", 128, 8).unwrap();
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy: Strategy::NoShard,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    match compile(p, info, &cluster, &cfg) {
        Err(PlanError::DoesNotFit {
            needed_bytes,
            capacity_bytes,
            over_by,
            suggestion,
        }) => {
            eprintln!("no_shard: needs {needed_bytes}, capacity {capacity_bytes}: {suggestion}");
            assert_eq!(over_by, needed_bytes - capacity_bytes);
            // full_shard alone needs ~190 GiB at world 128; with activation
            // checkpointing it fits, and the suggestion says so.
            assert!(
                suggestion.contains("activation checkpointing") && suggestion.contains("fits"),
                "{suggestion}"
            );
            let (p, info) = program("gpt3-175b");
            let suggested = FsdpConfig {
                settings: fsdpc_plan::Settings {
                    activation_checkpointing: CheckpointPolicy::Units,
                    ..fsdpc_plan::Settings::default()
                },
                ..FsdpConfig::default()
            };
            compile(p, info, &cluster, &suggested).expect("the suggestion fits");
        }
        r => panic!(
            "expected DoesNotFit, got {:?}",
            r.map(|p| p.memory.peak_bytes)
        ),
    }
}

#[test]
fn does_not_fit_suggests_the_smallest_world_that_fits() {
    // gpt2-xl with AdamW in f32 needs ~25 GB of persistent state: with 8 GiB
    // ranks (cpu-local at 3 ranks per node) it fits only once sharded enough.
    let (p, info) = program("gpt2-xl");
    let cluster = fsdpc_planner::preset("cpu-local", 3, 3).unwrap();
    match compile(p.clone(), info.clone(), &cluster, &FsdpConfig::default()) {
        Err(PlanError::DoesNotFit { suggestion, .. }) => {
            eprintln!("{suggestion}");
            let world: u32 = suggestion
                .split("world >= ")
                .nth(1)
                .and_then(|s| s.split(' ').next())
                .and_then(|s| s.parse().ok())
                .expect("a world size in the suggestion");
            let bigger = fsdpc_planner::preset("cpu-local", world, 3).unwrap();
            let bigger = Cluster {
                memory_bytes: cluster.memory_bytes,
                ..bigger
            };
            compile(p.clone(), info.clone(), &bigger, &FsdpConfig::default())
                .expect("the suggested world fits");
            let smaller = Cluster {
                memory_bytes: cluster.memory_bytes,
                ..bigger.with_world(world - 3).unwrap()
            };
            assert!(compile(p, info, &smaller, &FsdpConfig::default()).is_err());
        }
        r => panic!(
            "expected DoesNotFit, got {:?}",
            r.map(|p| p.memory.peak_bytes)
        ),
    }
}

#[test]
fn gpt3_175b_checkpointed_plans_validate_and_fit() {
    for world in [128, 512] {
        let plain = FsdpConfig {
            check_fits: false,
            ..FsdpConfig::default()
        };
        let ckpt = FsdpConfig {
            settings: fsdpc_plan::Settings {
                activation_checkpointing: CheckpointPolicy::Units,
                ..fsdpc_plan::Settings::default()
            },
            ..FsdpConfig::default()
        };
        let (before, _) = gpt3(world, &plain);
        let (after, secs) = gpt3(world, &ckpt);
        eprintln!(
            "gpt3-175b world {world}: peak {:.2} GiB -> {:.2} GiB with activation checkpointing (planned in {secs:.3}s)",
            before.memory.peak_bytes as f64 / 2f64.powi(30),
            after.memory.peak_bytes as f64 / 2f64.powi(30),
        );
        assert_eq!(after.validate(), Ok(()));
        assert!(after.memory.peak_bytes < before.memory.peak_bytes);
        assert!(after.memory.peak_bytes <= after.cluster.memory_bytes);
    }
}

#[test]
fn a_plan_that_fits_nowhere_names_each_candidate_once_in_readable_units() {
    // 4 MiB ranks: not even one layer's gathered parameters of gpt2 fit,
    // with or without checkpointing.
    let (p, info) = program("gpt2");
    let cluster = Cluster {
        memory_bytes: 4 << 20,
        ..fsdpc_planner::preset("cpu-local", 2, 2).unwrap()
    };
    let err = compile(p, info, &cluster, &FsdpConfig::default()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("capacity is 4.00 MiB (4194304;"), "{text}");
    for label in ["full_shard", "full_shard with activation checkpointing"] {
        let clause = format!("; {label} does not fit at any world size");
        assert_eq!(text.matches(&clause).count(), 1, "{label}: {text}");
    }
}
