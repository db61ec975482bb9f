//! Frozen parameters (`--freeze`) end to end: a GPT with block 0 frozen,
//! block 1's attention frozen (a unit mixing frozen and trainable
//! parameters) and the position embedding frozen (the root unit mixes too)
//! trains at full_shard F = 2, 4, 8 and no_shard within the tolerances of
//! `tests/it/equivalence.rs` of one unsharded rank with the same parameters
//! frozen; full_shard and no_shard at the same world agree bit for bit;
//! frozen parameters end bit-identical to their initial values; and the
//! measured memory stays within the plan (this binary installs the counting
//! allocator, as `tests/it/memory.rs` does); checkpoints of frozen plans
//! resume bit-identically and re-shard.

use crate::common;

use crate::common::{bits, max_loss_rel_diff, max_param_diff, plan_with, train};
use fsdpc_plan::{Plan, Strategy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::{ExecMode, TrainOptions, TrainReport};

const STEPS: u64 = 20;
/// The tolerances of `tests/it/equivalence.rs` (loss relative, parameter absolute).
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;
/// The seed `common::train` uses.
const SEED: u64 = 7;

fn gpt(batch: u32) -> String {
    format!("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch={batch}")
}

const FROZEN: [&str; 3] = [
    "transformer.h.0.*",
    "transformer.h.1.attn.*",
    "*.wpe.weight",
];

fn cfg(strategy: Strategy) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            freeze: FROZEN.iter().map(|s| s.to_string()).collect(),
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

/// Names of the frozen parameters of `plan`.
fn frozen_names(plan: &Plan) -> Vec<String> {
    plan.training
        .graph
        .params
        .iter()
        .filter(|p| !p.requires_grad)
        .map(|p| p.name.clone())
        .collect()
}

#[test]
fn frozen_gpt_sharded_equals_unsharded_and_frozen_parameters_stay_put() {
    let ref_plan = plan_with(&gpt(8), 1, &cfg(Strategy::NoShard));
    let reference = train(&ref_plan, STEPS, ExecMode::Arena);
    assert!(reference.losses.iter().all(|l| l.is_finite()));
    let frozen = frozen_names(&ref_plan);
    assert!(
        frozen.len() > 12,
        "block 0, block 1's attention, wpe: {frozen:?}"
    );
    let init = fsdpc_runtime::init_params(&ref_plan.training.graph, SEED).expect("init");
    let initial = |name: &str| -> Vec<u32> {
        let (id, _) = ref_plan
            .training
            .graph
            .params
            .iter()
            .enumerate()
            .find(|(_, p)| p.name == name)
            .expect("parameter");
        init[&fsdpc_ir::ParamId(id as u32)]
            .to_f32()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    let mut runs = Vec::new();
    for (world, strategy) in [
        (2, Strategy::FullShard),
        (4, Strategy::FullShard),
        (8, Strategy::FullShard),
        (2, Strategy::NoShard),
    ] {
        let p = plan_with(&gpt(8 / world), world, &cfg(strategy));
        assert!(p
            .units
            .iter()
            .any(|u| u.frozen_numel > 0 && u.trainable_numel() > 0));
        let r = train(&p, STEPS, ExecMode::Arena);
        let loss_rel = max_loss_rel_diff(&reference, &r);
        let (abs, _) = max_param_diff(&reference, &r);
        eprintln!(
            "frozen gpt world {world} {strategy:?}: max loss rel diff {loss_rel:e}, max param abs diff {abs:e}"
        );
        assert!(
            loss_rel <= LOSS_RTOL,
            "world {world} {strategy:?}: losses {loss_rel:e}"
        );
        assert!(
            abs <= PARAM_ATOL,
            "world {world} {strategy:?}: parameters {abs:e}"
        );
        for (name, vals) in &r.final_params {
            let now: Vec<u32> = vals.iter().map(|x| x.to_bits()).collect();
            if frozen.contains(name) {
                assert_eq!(now, initial(name), "world {world}: frozen {name} moved");
            } else {
                assert_ne!(
                    now,
                    initial(name),
                    "world {world}: trainable {name} did not move"
                );
            }
        }
        runs.push(((world, strategy), r));
    }
    let find = |k| &runs.iter().find(|(x, _)| *x == k).expect("ran").1;
    assert_eq!(
        bits(find((2, Strategy::FullShard))),
        bits(find((2, Strategy::NoShard))),
        "full_shard and no_shard at world 2 must be bit-identical"
    );
}

#[test]
fn freezing_matches_the_unfrozen_run_where_nothing_is_frozen_yet() {
    // The first step's loss does not depend on what is frozen (parameters
    // are still initial): bit-identical to the unfrozen plan.
    let frozen = train(
        &plan_with(&gpt(4), 2, &cfg(Strategy::FullShard)),
        1,
        ExecMode::Arena,
    );
    let all = train(
        &plan_with(&gpt(4), 2, &FsdpConfig::default()),
        1,
        ExecMode::Arena,
    );
    assert_eq!(frozen.losses[0].to_bits(), all.losses[0].to_bits());
}

#[test]
fn frozen_gpt_debug_allocation_follows_the_plan() {
    let p = plan_with(&gpt(4), 2, &cfg(Strategy::FullShard));
    let r = train(&p, 2, ExecMode::DebugAlloc);
    assert_eq!(r.debug_peak_bytes, Some(p.memory.peak_bytes));
    let arena = train(&p, 2, ExecMode::Arena);
    assert_eq!(bits(&r), bits(&arena), "debug mode computes the same");
}

#[test]
fn frozen_gpt_measured_memory_within_plan() {
    const BIG: &str = "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=4096,batch=4";
    for world in [2u32, 4] {
        let p = common::host_plan(
            BIG,
            world,
            &cfg(Strategy::FullShard),
            &fsdpc_frontends::LoadOptions::default().optimizer,
        );
        let opts = TrainOptions {
            steps: 2,
            seed: 3,
            mode: ExecMode::Arena,
            ..TrainOptions::default()
        };
        let r = fsdpc_runtime::train(&p, &opts, &mut |_| {}).expect("training runs");
        let planned = p.memory.rank_bytes;
        let measured = r.measured_peak_bytes.expect("counting allocator installed");
        let unfrozen = common::host_plan(
            BIG,
            world,
            &FsdpConfig::default(),
            &fsdpc_frontends::LoadOptions::default().optimizer,
        );
        eprintln!(
            "frozen {BIG} world {world}: measured {measured}, planned {planned} (unfrozen plan {})",
            unfrozen.memory.rank_bytes
        );
        assert!(
            measured <= planned,
            "measured {measured} > planned {planned}"
        );
        assert!(
            (planned - measured) as f64 <= 0.02 * planned as f64,
            "plan overstates by more than 2%: measured {measured}, planned {planned}"
        );
        assert!(planned < unfrozen.memory.rank_bytes);
    }
}

/// Trains 3 steps of `from` checkpointing into `dir`, resumes `to` up to
/// step 6, and returns the resumed run and an uninterrupted run of `to`.
fn checkpoint_and_resume(
    from: &Plan,
    to: &Plan,
    dir: &std::path::Path,
) -> (TrainReport, TrainReport) {
    let opts = |steps| TrainOptions {
        steps,
        seed: 11,
        ..TrainOptions::default()
    };
    let saving = TrainOptions {
        checkpoint: Some(fsdpc_runtime::train::CheckpointConfig {
            dir: dir.to_path_buf(),
            every: 3,
        }),
        ..opts(3)
    };
    let first = fsdpc_runtime::train(from, &saving, &mut |_| {}).expect("first 3 steps");
    // The checkpoint reads back every parameter as the run ended.
    let ckpt = fsdpc_runtime::checkpoint::Checkpoint::open(dir).expect("opens");
    for (name, vals) in &first.final_params {
        let p = ckpt.params().find(|p| &p.name == name).expect("saved");
        let got = ckpt.param_values(p).expect("reads");
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            vals.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "{name} read back from the checkpoint"
        );
    }
    let resuming = TrainOptions {
        resume: Some(dir.to_path_buf()),
        ..opts(6)
    };
    let rest = fsdpc_runtime::train(to, &resuming, &mut |_| {}).expect("resume");
    let full = fsdpc_runtime::train(to, &opts(6), &mut |_| {}).expect("uninterrupted");
    (rest, full)
}

#[test]
fn frozen_checkpoints_resume_bit_identically_and_reshard() {
    let f2 = plan_with(&gpt(4), 2, &cfg(Strategy::FullShard));
    // Same plan: the saved segments are copied back.
    let dir = tempfile::tempdir().expect("tempdir");
    let (rest, full) = checkpoint_and_resume(&f2, &f2, dir.path());
    assert_eq!(bits(&rest).0, bits(&full).0[3..], "resumed losses at F = 2");
    assert_eq!(bits(&rest).1, bits(&full).1, "final parameters at F = 2");
    // full_shard -> no_shard at the same world re-shards both segments and
    // the trainable state exactly.
    let ns = plan_with(&gpt(4), 2, &cfg(Strategy::NoShard));
    let dir = tempfile::tempdir().expect("tempdir");
    let (rest, full) = checkpoint_and_resume(&f2, &ns, dir.path());
    assert_eq!(
        bits(&rest).0,
        bits(&full).0[3..],
        "F = 2 -> no_shard losses"
    );
    assert_eq!(bits(&rest).1, bits(&full).1, "F = 2 -> no_shard parameters");
    // 4 ranks -> 2 ranks: the reduction order of the first steps differs.
    let f4 = plan_with(&gpt(2), 4, &cfg(Strategy::FullShard));
    let dir = tempfile::tempdir().expect("tempdir");
    let (rest, full) = checkpoint_and_resume(&f4, &f2, dir.path());
    let loss_rel = full.losses[3..]
        .iter()
        .zip(&rest.losses)
        .map(|(a, b)| (a - b).abs() / a.abs().max(1e-6))
        .fold(0f32, f32::max);
    let (abs, _) = max_param_diff(&full, &rest);
    eprintln!("frozen checkpoint F = 4 -> 2: loss rel diff {loss_rel:e}, param abs diff {abs:e}");
    assert!(loss_rel <= LOSS_RTOL && abs <= PARAM_ATOL);
    // Unfrozen run resumed from a frozen checkpoint: the unfrozen
    // parameters start with a fresh (zero) optimizer state.
    let all = plan_with(&gpt(4), 2, &FsdpConfig::default());
    let dir = tempfile::tempdir().expect("tempdir");
    let (rest, _) = checkpoint_and_resume(&f2, &all, dir.path());
    assert!(rest.losses.iter().all(|l| l.is_finite()));
}

fn lora_gpt(batch: u32) -> String {
    format!("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,lora=4,batch={batch}")
}

#[test]
fn lora_gpt_trains_only_its_adapters_like_one_unsharded_rank() {
    // Rank 4 adapters on c_attn (32 -> 96) and c_proj (32 -> 32), 2 blocks.
    let base = fsdpc_frontends::zoo::build(&gpt(8)).expect("gpt");
    let lora = fsdpc_frontends::zoo::build(&lora_gpt(8)).expect("lora gpt");
    assert_eq!(
        lora.graph.param_numel() - base.graph.param_numel(),
        2 * (4 * (32 + 96) + 4 * (32 + 32))
    );
    let no_freeze = |strategy| FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let ref_plan = plan_with(&lora_gpt(8), 1, &no_freeze(Strategy::NoShard));
    let reference = train(&ref_plan, STEPS, ExecMode::Arena);
    let init = fsdpc_runtime::init_params(&ref_plan.training.graph, SEED).expect("init");
    let specs = &ref_plan.training.graph.params;
    for world in [2u32, 4] {
        let p = plan_with(&lora_gpt(8 / world), world, &no_freeze(Strategy::FullShard));
        for u in &p.units[1..] {
            assert!(
                u.frozen_numel > 0 && u.trainable_numel() > 0,
                "block units mix"
            );
        }
        assert_eq!(p.units[0].trainable_numel(), 0, "the root holds no adapter");
        let r = train(&p, STEPS, ExecMode::Arena);
        let loss_rel = max_loss_rel_diff(&reference, &r);
        let (abs, _) = max_param_diff(&reference, &r);
        eprintln!(
            "lora gpt world {world}: max loss rel diff {loss_rel:e}, max param abs diff {abs:e}"
        );
        assert!(loss_rel <= LOSS_RTOL && abs <= PARAM_ATOL, "world {world}");
        for (name, vals) in &r.final_params {
            let (i, spec) = specs
                .iter()
                .enumerate()
                .find(|(_, s)| &s.name == name)
                .expect("parameter");
            let start = init[&fsdpc_ir::ParamId(i as u32)].to_f32();
            let moved = vals
                .iter()
                .zip(&start)
                .any(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(
                moved, spec.requires_grad,
                "{name}: trains iff it is an adapter"
            );
            assert_eq!(spec.requires_grad, name.contains(".lora_"), "{name}");
        }
    }
    assert!(
        reference.losses[STEPS as usize - 1] < reference.losses[0],
        "adapters learn"
    );
}

fn fsdpc(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(args)
        .output()
        .expect("fsdpc runs")
}

#[test]
fn cli_freezes_by_pattern_lists_names_for_a_typo_and_refuses_the_flag_with_a_plan() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = dir.path().join("plan.json");
    let plan_s = plan.to_str().expect("utf8");
    let spec = gpt(4);
    let o = fsdpc(&[
        "compile",
        &spec,
        "--world",
        "2",
        "--freeze",
        "transformer.h.0.*,*.wpe.weight",
        "--freeze",
        "transformer.h.1.attn.*",
        "-o",
        plan_s,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let loaded = Plan::from_json(&std::fs::read_to_string(&plan).expect("plan")).expect("loads");
    assert_eq!(loaded.config.freeze.len(), 3);
    assert!(loaded.units.iter().any(|u| u.frozen_numel > 0));
    let o = fsdpc(&["inspect", plan_s]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("frozen parameters"), "{text}");
    let o = fsdpc(&["train", plan_s, "--steps", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = fsdpc(&["train", plan_s, "--freeze", "transformer.h.0.*"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--freeze"), "{err}");
    let o = fsdpc(&[
        "compile", &spec, "--world", "2", "--freeze", "h.0.*", "-o", plan_s,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a typo is refused");
    assert!(
        err.contains("`h.0.*` matches no parameter") && err.contains("transformer.wte.weight"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
