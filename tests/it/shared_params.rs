//! Parameters shared across units (`--shared-params owner`): the GPT's tied
//! embedding / output projection with `transformer.wte` wrapped as a unit of
//! its own is owned by that unit (not forced into the root), gathered again
//! around the head in forward and backward, its gradient summed from both
//! uses before its one reduce-scatter; training at full_shard F = 2, 4
//! equals one unsharded rank within the tolerances of `tests/it/equivalence.rs`
//! and equals the `root` placement bit for bit at the same world; the same
//! holds for the tied initializer of the ONNX GPT-2 fixture.

use crate::common::{max_loss_rel_diff, max_param_diff, plan_with, train};
use fsdpc_plan::Collective;
use fsdpc_plan::{InstrOp, Plan, SharedParams, Strategy, WrapPolicy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::ExecMode;

const STEPS: u64 = 20;
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;

fn gpt(batch: u32) -> String {
    format!("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch={batch}")
}

fn cfg(strategy: Strategy, shared: SharedParams) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            wrap: WrapPolicy::Paths {
                paths: vec![
                    "transformer.wte".into(),
                    "transformer.h.0".into(),
                    "transformer.h.1".into(),
                ],
            },
            shared_params: shared,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

/// The unit holding `transformer.wte.weight`.
fn wte_unit(p: &Plan) -> usize {
    p.units
        .iter()
        .position(|u| u.params.iter().any(|x| x.name == "transformer.wte.weight"))
        .expect("wte is laid out")
}

fn gathers_of(p: &Plan, unit: usize) -> usize {
    p.instructions
        .iter()
        .filter(|i| matches!(i.op, InstrOp::AllGather { c: Collective { unit: u, .. }, .. } if u.index() == unit))
        .count()
}

#[test]
fn tied_embedding_is_owned_by_its_unit_and_gathered_again_for_the_head() {
    let owner = plan_with(&gpt(4), 2, &cfg(Strategy::FullShard, SharedParams::Owner));
    let root = plan_with(&gpt(4), 2, &cfg(Strategy::FullShard, SharedParams::Root));
    let u = wte_unit(&owner);
    assert_eq!(owner.units[u].module, "transformer.wte");
    assert_eq!(wte_unit(&root), 0, "root rule: the root unit");
    assert!(
        root.units[1].params.is_empty(),
        "root rule leaves the wte unit empty"
    );
    // Root rule: no gather of the (empty) wte unit. Owner rule: its forward
    // window, one around the head in forward, one in backward covering the
    // head and, at the end, the token lookup's gradient (or two).
    assert_eq!(gathers_of(&root, 1), 0);
    let g = gathers_of(&owner, u);
    println!(
        "wte unit all-gathers per step: owner {g}, root 0 (root unit: {})",
        gathers_of(&root, 0)
    );
    assert!(g >= 3, "owner: {g} gathers of the wte unit");
    assert_eq!(owner.config.shared_params, SharedParams::Owner);
    // One reduce-scatter of the wte unit's gradient, after both uses.
    let rs: Vec<usize> = owner
        .instructions
        .iter()
        .enumerate()
        .filter(|(_, i)| matches!(i.op, InstrOp::ReduceScatter { c: Collective { unit, .. } } if unit.index() == u))
        .map(|(k, _)| k)
        .collect();
    assert_eq!(rs.len(), 1);
    assert!(
        owner.estimates.comm_bytes_per_step > root.estimates.comm_bytes_per_step,
        "gathering wte again costs all-gather bytes"
    );
    println!(
        "comm per step: owner {} B, root {} B; peak owner {} B, root {} B",
        owner.estimates.comm_bytes_per_step,
        root.estimates.comm_bytes_per_step,
        owner.memory.peak_bytes,
        root.memory.peak_bytes
    );
}

#[test]
fn owner_placement_trains_like_one_unsharded_rank() {
    let reference = train(
        &plan_with(&gpt(8), 1, &cfg(Strategy::NoShard, SharedParams::Owner)),
        STEPS,
        ExecMode::Arena,
    );
    for world in [2u32, 4] {
        let owner = train(
            &plan_with(
                &gpt(8 / world),
                world,
                &cfg(Strategy::FullShard, SharedParams::Owner),
            ),
            STEPS,
            ExecMode::Arena,
        );
        let loss_rel = max_loss_rel_diff(&reference, &owner);
        let (abs, _) = max_param_diff(&reference, &owner);
        eprintln!("shared owner world {world}: max loss rel diff {loss_rel:e}, max param abs diff {abs:e}");
        assert!(loss_rel <= LOSS_RTOL, "world {world}: losses {loss_rel:e}");
        assert!(abs <= PARAM_ATOL, "world {world}: parameters {abs:e}");
        let root = train(
            &plan_with(
                &gpt(8 / world),
                world,
                &cfg(Strategy::FullShard, SharedParams::Root),
            ),
            STEPS,
            ExecMode::Arena,
        );
        let mut a = owner.final_params.clone();
        let mut b = root.final_params.clone();
        a.sort_by(|x, y| x.0.cmp(&y.0));
        b.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(
            owner.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
            root.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
            "world {world}: owner and root placement give the same losses"
        );
        assert_eq!(a, b, "world {world}: and the same parameters");
    }
}

#[test]
fn shared_params_parse() {
    assert_eq!(SharedParams::parse("owner").ok(), Some(SharedParams::Owner));
    assert_eq!(SharedParams::parse(" Root ").ok(), Some(SharedParams::Root));
    let e = SharedParams::parse("first").expect_err("unknown");
    assert!(e.to_string().contains("root, owner"), "{e}");
}

#[test]
fn cli_takes_shared_params_and_inspect_names_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let plan = dir.path().join("plan.json");
    let plan_s = plan.to_str().expect("utf8");
    let spec = gpt(4);
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_fsdpc"))
            .args(args)
            .output()
            .expect("fsdpc runs")
    };
    let o = run(&[
        "compile",
        &spec,
        "--world",
        "2",
        "--wrap",
        "paths:transformer.wte,transformer.h.0,transformer.h.1",
        "--shared-params",
        "owner",
        "-o",
        plan_s,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let p = Plan::from_json(&std::fs::read_to_string(&plan).expect("plan")).expect("validates");
    assert_eq!(p.config.shared_params, SharedParams::Owner);
    let o = run(&["inspect", plan_s]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("--shared-params owner"));
    let o = run(&["train", plan_s, "--shared-params", "root"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--shared-params"),
        "{err}"
    );
    let o = run(&[
        "compile",
        &spec,
        "--world",
        "2",
        "--shared-params",
        "first",
        "-o",
        plan_s,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("root, owner"), "{err}");
}

/// The ONNX GPT-2 fixture (TorchScript export) shares one initializer
/// between the token lookup and the head: `owner` moves it into the
/// embedding's unit and trains bit-identically to `root`.
#[test]
fn onnx_gpt2_tied_initializer_is_owned_by_the_embedding_unit() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/onnx/gpt2_torchscript_eval.onnx"
    );
    let opts = fsdpc_frontends::LoadOptions {
        dims: [("batch".to_string(), 2), ("seq".to_string(), 8)].into(),
        ..fsdpc_frontends::LoadOptions::default()
    };
    let cluster = fsdpc_planner::preset("cpu-local", 2, 2).expect("preset");
    let plan = |shared| {
        let m = fsdpc_frontends::load(path, &opts).expect("fixture loads");
        let info = fsdpc_plan::ModelInfo {
            tokens_per_rank_step: m.tokens_per_rank_step(),
            params: m.program.graph.param_numel(),
            name: m.name,
        };
        let cfg = FsdpConfig {
            settings: fsdpc_plan::Settings {
                wrap: WrapPolicy::Paths {
                    paths: vec![
                        "model.transformer.wte".into(),
                        "model.transformer.h.0".into(),
                        "model.transformer.h.1".into(),
                    ],
                },
                shared_params: shared,
                ..fsdpc_plan::Settings::default()
            },
            ..FsdpConfig::default()
        };
        fsdpc_planner::compile(m.program, info, &cluster, &cfg).expect("plan compiles")
    };
    let owner = plan(SharedParams::Owner);
    let root = plan(SharedParams::Root);
    let wte = |p: &Plan| {
        p.units
            .iter()
            .position(|u| {
                u.params
                    .iter()
                    .any(|x| x.name == "model.transformer.wte.weight")
            })
            .expect("laid out")
    };
    assert_eq!(owner.units[wte(&owner)].module, "model.transformer.wte");
    assert_eq!(wte(&root), 0);
    assert!(gathers_of(&owner, wte(&owner)) >= 2);
    let a = train(&owner, 3, ExecMode::Arena);
    let b = train(&root, 3, ExecMode::Arena);
    assert_eq!(
        a.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>(),
        b.losses.iter().map(|l| l.to_bits()).collect::<Vec<_>>()
    );
}
