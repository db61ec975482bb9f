//! The verifier accepts real plans and rejects broken ones with the right
//! violation.
use crate::common::*;
use fsdpc_plan::LoadError;
use fsdpc_plan::*;
use fsdpc_planner::*;

fn tiny() -> Plan {
    plan(TINY_GPT, 2, &FsdpConfig::default()).unwrap()
}

fn violations(plan: &Plan) -> Vec<PlanViolation> {
    plan.validate()
        .expect_err("the broken plan must be rejected")
}

fn position(plan: &Plan, pred: impl Fn(&InstrOp) -> bool) -> usize {
    plan.instructions.iter().position(|i| pred(&i.op)).unwrap()
}

#[test]
fn real_plans_validate() {
    assert_eq!(tiny().validate(), Ok(()));
}

#[test]
fn removed_all_gather_is_missing() {
    let mut p = tiny();
    let i = position(
        &p,
        |op| matches!(op, InstrOp::AllGather { c: Collective { unit, .. }, .. } if unit.0 == 1),
    );
    p.instructions.remove(i);
    let v = violations(&p);
    assert!(
        v.iter()
            .any(|v| matches!(v, PlanViolation::MissingAllGather { unit, .. } if unit.0 == 1)),
        "{v:#?}"
    );
}

#[test]
fn duplicated_free_is_a_double_free() {
    let mut p = tiny();
    let i = position(&p, |op| matches!(op, InstrOp::Free { .. }));
    let dup = p.instructions[i].clone();
    p.instructions.insert(i + 1, dup);
    let v = violations(&p);
    assert!(
        v.iter()
            .any(|v| matches!(v, PlanViolation::DoubleFree { .. })),
        "{v:#?}"
    );
}

#[test]
fn dropped_reduce_scatter_leaves_gradients_unreduced() {
    let mut p = tiny();
    let i = position(
        &p,
        |op| matches!(op, InstrOp::ReduceScatter { c: Collective { unit, .. } } if unit.0 == 2),
    );
    p.instructions.remove(i);
    let v = violations(&p);
    assert!(
        v.iter()
            .any(|v| matches!(v, PlanViolation::GradientNotReduced { unit } if unit.0 == 2)),
        "{v:#?}"
    );
}

#[test]
fn swapped_all_gathers_are_out_of_order() {
    let mut p = tiny();
    let gathers: Vec<usize> = (0..p.instructions.len())
        .filter(|&i| matches!(p.instructions[i].op, InstrOp::AllGather { .. }))
        .collect();
    let (a, b) = (gathers[1], gathers[2]);
    let op_a = p.instructions[a].op.clone();
    p.instructions[a].op = p.instructions[b].op.clone();
    p.instructions[b].op = op_a;
    let v = violations(&p);
    assert!(
        v.iter()
            .any(|v| matches!(v, PlanViolation::CollectiveOrder { .. })),
        "{v:#?}"
    );
}

#[test]
fn wait_before_its_record_is_rejected() {
    let mut p = tiny();
    let w = position(&p, |op| matches!(op, InstrOp::Wait { .. }));
    let InstrOp::Wait { event } = p.instructions[w].op else {
        unreachable!()
    };
    let r = position(&p, |op| *op == InstrOp::Record { event });
    let wait = p.instructions.remove(w);
    p.instructions.insert(r, wait);
    let v = violations(&p);
    assert!(
        v.iter()
            .any(|v| matches!(v, PlanViolation::WaitBeforeRecord { event: e, .. } if *e == event)),
        "{v:#?}"
    );
}

#[test]
fn overlapping_live_buffers_are_rejected() {
    let mut p = tiny();
    // Two persistent buffers are live together.
    let off = p.buffers[0].offset;
    p.buffers[1].offset = off;
    let v = violations(&p);
    assert!(
        v.iter()
            .any(|v| matches!(v, PlanViolation::ArenaOverlap { .. })),
        "{v:#?}"
    );
}

#[test]
fn changed_peak_is_rejected() {
    let mut p = tiny();
    p.memory.peak_bytes += 64;
    let v = violations(&p);
    assert_eq!(
        v,
        vec![PlanViolation::PeakMismatch {
            planned: p.memory.peak_bytes,
            recomputed: p.memory.peak_bytes - 64
        }]
    );
}

#[test]
fn meaningless_optimizer_hyperparameters_are_rejected() {
    let mut p = tiny();
    std::sync::Arc::make_mut(&mut p.training).optimizer = fsdpc_ir::Optimizer::Sgd {
        lr: -1.0,
        momentum: 0.0,
        weight_decay: 0.0,
    };
    let v = violations(&p);
    assert!(
        matches!(v.as_slice(), [PlanViolation::Optimizer(e)] if e.name == "lr"),
        "{v:#?}"
    );
}

#[test]
fn json_round_trip_and_schema_check() {
    let p = tiny();
    let text = p.to_json_pretty().unwrap();
    let back = Plan::from_json(&text).unwrap();
    assert_eq!(back.instructions, p.instructions);
    let other = text.replacen(SCHEMA, "fsdpc.plan/v0", 1);
    match Plan::from_json(&other) {
        Err(LoadError::Schema { found, expected }) => {
            assert_eq!(found, "fsdpc.plan/v0");
            assert_eq!(expected, SCHEMA);
        }
        r => panic!("expected a schema error, got {r:?}"),
    }
}

#[test]
fn tampered_ids_are_errors_not_panics() {
    let mut p = tiny();
    let i = position(&p, |op| matches!(op, InstrOp::Kernel { .. }));
    if let InstrOp::Kernel { inputs, .. } = &mut p.instructions[i].op {
        inputs[0].buffer = BufferId(1_000_000);
    }
    p.instructions.push(Instr {
        stream: Stream::Compute,
        op: InstrOp::Wait {
            event: EventId(999_999),
        },
    });
    let text = p.to_json_pretty().unwrap();
    match Plan::from_json(&text) {
        Err(LoadError::Invalid(v)) => {
            assert!(
                v.iter()
                    .any(|v| matches!(v, PlanViolation::BadId { what: "buffer", .. })),
                "{v:#?}"
            );
            assert!(
                v.iter()
                    .any(|v| matches!(v, PlanViolation::BadId { what: "event", .. })),
                "{v:#?}"
            );
        }
        r => panic!("expected violations, got {r:?}"),
    }
}

/// An evaluation prefix that reaches past the loss into backward, or past
/// the list, is rejected; one that stops before the loss kernel too.
#[test]
fn an_evaluation_prefix_holds_forward_only_and_ends_at_the_loss() {
    let eval_violation = |p: &Plan, needle: &str| {
        let v = violations(p);
        assert!(
            v.iter().any(
                |v| matches!(v, PlanViolation::Eval { reason, .. } if reason.contains(needle))
            ),
            "{needle}: {v:#?}"
        );
    };
    let plan = tiny();
    let end = plan.eval.expect("the planner writes one").instructions;
    let mut p = plan.clone();
    let rs = position(&p, |op| matches!(op, InstrOp::ReduceScatter { .. }));
    p.eval = Some(EvalPass {
        instructions: rs as u32 + 1,
    });
    eval_violation(&p, "last instruction is not the kernel");
    eval_violation(&p, "reduce_scatter");
    let mut p = plan.clone();
    p.eval = Some(EvalPass {
        instructions: end - 1,
    });
    eval_violation(&p, "last instruction is not the kernel");
    let mut p = plan;
    p.eval = Some(EvalPass {
        instructions: p.instructions.len() as u32 + 1,
    });
    eval_violation(&p, "not inside the list");
}
