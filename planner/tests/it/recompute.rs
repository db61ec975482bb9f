//! Activation checkpointing: the rewritten program, and the plans built on it.
use crate::common::*;
use fsdpc_ir::{NodeId, Op, Phase};
use fsdpc_plan::ConfigError;
use fsdpc_plan::*;
use fsdpc_planner::*;
use std::collections::BTreeMap;

/// `TINY_GPT` with dropout, so recomputation has a mask to reproduce.
const DROPOUT_GPT: &str = "gpt:layers=3,hidden=64,heads=4,seq=16,vocab=128,batch=2,dropout=0.1";

fn cfg(policy: CheckpointPolicy) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            activation_checkpointing: policy,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

fn rewrite(spec: &str) -> (fsdpc_ir::TrainingProgram, fsdpc_ir::TrainingProgram) {
    let (p, _) = program(spec);
    let assign = units::assign_units(&p.graph, &WrapPolicy::Blocks).unwrap();
    let out = recompute::apply(p.clone(), &assign, CheckpointPolicy::Units).unwrap();
    (p, out)
}

fn gathers(plan: &Plan) -> usize {
    plan.instructions
        .iter()
        .filter(|i| matches!(i.op, InstrOp::AllGather { .. }))
        .count()
}

#[test]
fn checkpointed_plan_validates_with_a_lower_peak() {
    for world in [1, 2, 4] {
        let plain = plan(TINY_GPT, world, &cfg(CheckpointPolicy::None)).unwrap();
        let ckpt = plan(TINY_GPT, world, &cfg(CheckpointPolicy::Units)).unwrap();
        assert_eq!(ckpt.validate(), Ok(()));
        assert_eq!(ckpt.training.validate(), Ok(()));
        eprintln!(
            "{TINY_GPT} world {world}: peak {} -> {} bytes",
            plain.memory.peak_bytes, ckpt.memory.peak_bytes
        );
        assert!(ckpt.memory.peak_bytes < plain.memory.peak_bytes);
        // One gather per unit and phase: recompute shares the backward window.
        assert_eq!(gathers(&ckpt), gathers(&plain));
        assert_eq!(
            ckpt.config.activation_checkpointing,
            CheckpointPolicy::Units
        );
        let back = Plan::from_json(&ckpt.to_json_pretty().unwrap()).unwrap();
        assert_eq!(back.config, ckpt.config);
    }
}

#[test]
fn clones_are_backward_copies_placed_just_in_time() {
    let (before, after) = rewrite(DROPOUT_GPT);
    let g = &after.graph;
    assert!(g.ids_are_topological());
    assert_eq!(after.validate(), Ok(()));
    let clones: Vec<NodeId> = g
        .node_ids()
        .filter(|&n| recompute::is_recompute(g.node(n)))
        .collect();
    assert!(!clones.is_empty());
    assert_eq!(
        g.node_count(),
        before.graph.node_count() + clones.len(),
        "only clones are added"
    );
    let forward: Vec<_> = before
        .graph
        .node_ids()
        .map(|n| before.graph.node(n))
        .collect();
    for &c in &clones {
        let node = g.node(c);
        assert_eq!(node.phase, Phase::Backward);
        assert!(!node.op.is_source(), "sources are shared, not cloned");
        let name = &node.name["recompute(".len()..node.name.len() - 1];
        let orig = forward
            .iter()
            .find(|f| f.name == name && f.phase == Phase::Forward)
            .expect("a clone copies a forward node");
        assert_eq!(orig.op, node.op, "same op (a dropout keeps its seed)");
        assert_eq!(orig.module, node.module);
    }
    let dropouts = clones
        .iter()
        .filter(|&&c| matches!(g.node(c).op, Op::Dropout { .. }))
        .count();
    assert!(dropouts > 0, "dropout is recomputed too");
    // Each unit's clones form one contiguous run of ids, after the forward,
    // right before the first backward node that reads them.
    let last_forward = g
        .node_ids()
        .filter(|&n| g.node(n).phase == Phase::Forward)
        .max()
        .unwrap();
    let assign = units::assign_units(g, &WrapPolicy::Blocks).unwrap();
    let mut by_unit: BTreeMap<UnitId, Vec<NodeId>> = BTreeMap::new();
    for &c in &clones {
        assert!(c > last_forward);
        by_unit.entry(assign.unit_of_node(c)).or_default().push(c);
    }
    assert_eq!(by_unit.len(), 3, "one run per block");
    for (u, run) in &by_unit {
        let (first, last) = (run[0], run[run.len() - 1]);
        assert_eq!(
            last.0 - first.0 + 1,
            run.len() as u32,
            "unit {u} recomputes in one run"
        );
        let next = g.node(NodeId(last.0 + 1));
        assert!(!recompute::is_recompute(next) && next.phase == Phase::Backward);
        let reads: Vec<NodeId> = g
            .inputs(NodeId(last.0 + 1))
            .iter()
            .map(|v| v.node)
            .collect();
        assert!(
            reads.iter().any(|n| run.contains(n)),
            "unit {u}: just in time"
        );
    }
}

#[test]
fn checkpointing_is_idempotent_and_keeps_grads_and_loss() {
    let (before, after) = rewrite(TINY_GPT);
    assert_eq!(after.grads.len(), before.grads.len());
    assert_eq!(
        after.graph.node(after.loss.node).name,
        before.graph.node(before.loss.node).name
    );
    for (a, b) in after.grads.iter().zip(&before.grads) {
        assert_eq!(a.param, b.param);
        assert_eq!(
            after.graph.node(a.grad.node).name,
            before.graph.node(b.grad.node).name
        );
    }
    let assign = units::assign_units(&after.graph, &WrapPolicy::Blocks).unwrap();
    let again = recompute::apply(after.clone(), &assign, CheckpointPolicy::Units).unwrap();
    assert_eq!(again.graph.node_count(), after.graph.node_count());
    assert_eq!(again.loss, after.loss);
}

#[test]
fn no_policy_leaves_the_program_alone() {
    let (p, _) = program(TINY_GPT);
    let assign = units::assign_units(&p.graph, &WrapPolicy::Blocks).unwrap();
    let out = recompute::apply(p.clone(), &assign, CheckpointPolicy::None).unwrap();
    assert_eq!(out.graph.node_count(), p.graph.node_count());
}

#[test]
fn does_not_fit_suggests_checkpointing_when_it_fits() {
    let plain = plan(TINY_GPT, 2, &cfg(CheckpointPolicy::None)).unwrap();
    let ckpt = plan(TINY_GPT, 2, &cfg(CheckpointPolicy::Units)).unwrap();
    let (p, info) = program(TINY_GPT);
    let cluster = Cluster {
        memory_bytes: (plain.memory.peak_bytes + ckpt.memory.peak_bytes) / 2,
        ..fsdpc_planner::preset("cpu-local", 2, 2).unwrap()
    };
    match compile(p, info, &cluster, &cfg(CheckpointPolicy::None)) {
        Err(PlanError::DoesNotFit { suggestion, .. }) => {
            eprintln!("{suggestion}");
            assert!(
                suggestion.contains("activation checkpointing")
                    && suggestion.contains(&format!("peak {}", ckpt.memory.peak_bytes)),
                "{suggestion}"
            );
        }
        r => panic!(
            "expected DoesNotFit, got {:?}",
            r.map(|p| p.memory.peak_bytes)
        ),
    }
}

#[test]
fn bad_policy_names_are_errors() {
    assert_eq!(
        CheckpointPolicy::parse("units").unwrap(),
        CheckpointPolicy::Units
    );
    assert_eq!(
        CheckpointPolicy::parse(" None ").unwrap(),
        CheckpointPolicy::None
    );
    assert!(matches!(
        CheckpointPolicy::parse("blocks"),
        Err(ConfigError { .. })
    ));
}

#[test]
fn older_plans_without_the_field_still_load() {
    let plan = plan(TINY_MLP, 2, &FsdpConfig::default()).unwrap();
    let mut v = serde_json::to_value(&plan).unwrap();
    v["config"]
        .as_object_mut()
        .unwrap()
        .remove("activation_checkpointing");
    let back = Plan::from_json(&v.to_string()).unwrap();
    assert_eq!(back.config.activation_checkpointing, CheckpointPolicy::None);
}
