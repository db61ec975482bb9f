//! Selective activation checkpointing (`every:K`, `paths:a,b`, `ops`) trains like
//! the unsharded single-rank run, and bit for bit like the same run without
//! checkpointing (recomputation runs the same kernels on the same values);
//! and the CLI flag's forms.

use crate::common::{bits, max_loss_rel_diff, max_param_diff, plan_with, train};
use fsdpc_plan::{CheckpointPolicy, InstrOp, Plan, Strategy, UnitId};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::ExecMode;
use std::process::{Command, Output};

const STEPS: u64 = 20;
/// The tolerances of tests/it/equivalence.rs against the 1-rank run.
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;

/// A 4-layer GPT (units `transformer.h.0` .. `transformer.h.3`), with
/// dropout so recomputation must reproduce a mask.
fn gpt4(batch: u32) -> String {
    format!("gpt:layers=4,hidden=32,heads=2,seq=8,vocab=64,batch={batch},dropout=0.1")
}

fn planned(world: u32, strategy: Strategy, policy: CheckpointPolicy) -> Plan {
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            activation_checkpointing: policy,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    plan_with(&gpt4(8 / world), world, &cfg)
}

/// Kernels of `plan` that recompute a forward node.
fn recomputes(plan: &Plan) -> usize {
    let g = &plan.training.graph;
    plan.instructions
        .iter()
        .filter(|i| match i.op {
            InstrOp::Kernel { node, .. } => g
                .try_node(node)
                .is_some_and(fsdpc_planner::recompute::is_recompute),
            _ => false,
        })
        .count()
}

#[test]
fn selective_checkpointing_equals_unsharded_and_unchanged_training() {
    let reference = train(
        &planned(1, Strategy::NoShard, CheckpointPolicy::None),
        STEPS,
        ExecMode::Arena,
    );
    assert!(reference.losses.iter().all(|l| l.is_finite()));
    let all = planned(2, Strategy::FullShard, CheckpointPolicy::Units);
    let policies = [
        (CheckpointPolicy::Every(2), vec![UnitId(1), UnitId(3)]),
        (
            CheckpointPolicy::Paths(vec!["transformer.h.2".into()]),
            vec![UnitId(3)],
        ),
        (
            CheckpointPolicy::Ops,
            vec![UnitId(1), UnitId(2), UnitId(3), UnitId(4)],
        ),
    ];
    for world in [2, 4] {
        let plain = planned(world, Strategy::FullShard, CheckpointPolicy::None);
        let base = train(&plain, STEPS, ExecMode::Arena);
        for (policy, units) in &policies {
            let p = planned(world, Strategy::FullShard, policy.clone());
            assert_eq!(&p.config.checkpointed_units, units, "{policy:?}");
            assert_eq!(p.validate(), Ok(()));
            let n = recomputes(&p);
            assert!(n > 0 && n < recomputes(&all), "{policy:?}: {n} recomputes");
            let r = train(&p, STEPS, ExecMode::Arena);
            let loss_rel = max_loss_rel_diff(&reference, &r);
            let (abs, _) = max_param_diff(&reference, &r);
            eprintln!(
                "F = {world} {}: peak {} -> {} bytes, {n} recompute kernels; vs 1 rank: loss rel {loss_rel:e}, param abs {abs:e}",
                policy_name(policy),
                plain.memory.peak_bytes,
                p.memory.peak_bytes
            );
            assert!(p.memory.peak_bytes <= plain.memory.peak_bytes);
            assert!(loss_rel <= LOSS_RTOL, "losses differ by {loss_rel:e}");
            assert!(abs <= PARAM_ATOL, "parameters differ by {abs:e}");
            assert_eq!(
                bits(&base),
                bits(&r),
                "F = {world} {policy:?}: checkpointing must not change training"
            );
        }
    }
}

/// `ops` recomputes by operation, as torchtitan's selective op policy:
/// in each block no attention is recomputed, and of its matrix products in
/// forward order the first, third, ... are kept and only others are
/// recomputed; its peak lies between no checkpointing and `all`.
#[test]
fn op_checkpointing_keeps_attention_and_every_other_product() {
    use fsdpc_ir::Op;
    let p = planned(2, Strategy::FullShard, CheckpointPolicy::Ops);
    let g = &p.training.graph;
    let recomputed: Vec<&fsdpc_ir::Node> = p
        .instructions
        .iter()
        .filter_map(|i| match i.op {
            InstrOp::Kernel { node, .. } => g
                .try_node(node)
                .filter(|n| fsdpc_planner::recompute::is_recompute(n)),
            _ => None,
        })
        .collect();
    assert!(!recomputed.is_empty());
    assert!(!recomputed
        .iter()
        .any(|n| matches!(n.op, Op::Attention { .. })));
    // Each block's forward products, in order (c_attn, c_proj, c_fc,
    // c_proj): the even-numbered ones are the only products recomputed.
    for layer in 0..4 {
        let products: Vec<&str> = g
            .topo_order()
            .expect("acyclic")
            .into_iter()
            .map(|id| g.node(id))
            .filter(|n| {
                n.phase == fsdpc_ir::Phase::Forward
                    && matches!(n.op, Op::MatMul { .. })
                    && n.name.contains(&format!("h.{layer}."))
            })
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(products.len(), 4, "{products:?}");
        let again: Vec<&str> = recomputed
            .iter()
            .filter(|n| matches!(n.op, Op::MatMul { .. }))
            .filter_map(|n| {
                n.name
                    .strip_prefix(fsdpc_planner::recompute::RECOMPUTE_PREFIX)
                    .and_then(|x| x.strip_suffix(')'))
            })
            .filter(|x| x.contains(&format!("h.{layer}.")))
            .collect();
        assert!(
            again.iter().all(|x| *x == products[1] || *x == products[3]),
            "layer {layer}: recomputed {again:?} of {products:?}"
        );
    }
    let none = planned(2, Strategy::FullShard, CheckpointPolicy::None);
    let all = planned(2, Strategy::FullShard, CheckpointPolicy::Units);
    assert!(p.memory.peak_bytes < none.memory.peak_bytes);
    assert!(p.memory.peak_bytes > all.memory.peak_bytes);
    assert!(recomputes(&p) < recomputes(&all));
}

fn policy_name(p: &CheckpointPolicy) -> String {
    p.name()
}

fn fsdpc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(args)
        .output()
        .expect("fsdpc runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const CLI_GPT: &str = "gpt:layers=4,hidden=32,heads=2,seq=8,vocab=64,batch=2";

#[test]
fn the_flag_takes_which_units() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("plan.json");
    let out_s = out.to_str().expect("utf-8 path");
    // Compiles with `extra`; on success, the compile's output is that of
    // `fsdpc inspect` of the plan.
    let inspect = |extra: &[&str]| {
        let mut args = vec!["compile", CLI_GPT, "--world", "2", "-o", out_s];
        args.extend_from_slice(extra);
        let o = fsdpc(&args);
        if o.status.success() {
            fsdpc(&["inspect", out_s])
        } else {
            o
        }
    };
    let o = inspect(&["--activation-checkpointing"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("checkpoint activations (all) of 4 of 4 non-root units"),
        "{}",
        text(&o.stdout)
    );
    let o = inspect(&["--activation-checkpointing", "every:2"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("of 2 of 4 non-root units")
            && text(&o.stdout).contains("transformer.h.0, transformer.h.2"),
        "{}",
        text(&o.stdout)
    );
    let o = inspect(&["--activation-checkpointing", "paths:transformer.h.1"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("of 1 of 4 non-root units"));
    let o = inspect(&["--activation-checkpointing", "paths:h.1"]);
    let err = text(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("`h.1` is not the module path of a unit")
            && err.contains("transformer.h.0, transformer.h.1")
            && !err.contains("panicked"),
        "{err}"
    );
    let o = inspect(&["--activation-checkpointing", "every:0"]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("every:0"), "{}", text(&o.stderr));
}

#[test]
fn the_plan_json_records_the_units_and_a_plan_refuses_the_flag() {
    let dir = tempfile::tempdir().expect("temp dir");
    let out = dir.path().join("plan.json");
    let out_s = out.to_str().expect("utf-8 path");
    let o = fsdpc(&[
        "compile",
        CLI_GPT,
        "--world",
        "2",
        "--activation-checkpointing",
        "every:2",
        "-o",
        out_s,
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let p = Plan::from_json(&std::fs::read_to_string(&out).expect("plan written")).expect("plan");
    assert_eq!(
        p.config.activation_checkpointing,
        CheckpointPolicy::Every(2)
    );
    assert_eq!(p.config.checkpointed_units, vec![UnitId(1), UnitId(3)]);
    let o = fsdpc(&[
        "train",
        out_s,
        "--steps",
        "1",
        "--activation-checkpointing",
        "paths:transformer.h.0",
    ]);
    assert!(!o.status.success());
    assert!(
        text(&o.stderr).contains("--activation-checkpointing cannot apply"),
        "{}",
        text(&o.stderr)
    );
}
