//! The evaluation prefix (`Plan::eval`, see `crate::eval`): it ends with
//! the kernel writing micro-batch 0's loss into the loss slot; it holds
//! only forward kernels and loads of micro-batch 0, gathers, reshards,
//! copies, frees and events, and module-buffer writes of micro-batch 0,
//! which an evaluation skips; it writes no gradient and no state that
//! outlives a step; and a bucketed all-gather's bucket closes inside it.

use crate::*;
use fsdpc_ir::Phase;

pub(crate) fn check(plan: &Plan, out: &mut Vec<PlanViolation>) {
    let Some(eval) = plan.eval else {
        return;
    };
    let mut bad = |instr: Option<usize>, reason: String| {
        out.push(PlanViolation::Eval {
            instr: instr.map(|i| i as u32),
            reason,
        })
    };
    let end = eval.instructions as usize;
    if end == 0 || end > plan.instructions.len() {
        bad(
            None,
            format!(
                "the prefix of {end} instructions is not inside the list of {}",
                plan.instructions.len()
            ),
        );
        return;
    }
    let writes_loss = matches!(
        &plan.instructions[end - 1].op,
        InstrOp::Kernel { outputs, micro_batch: 0, .. } if outputs.contains(&plan.loss)
    );
    if !writes_loss {
        bad(
            Some(end - 1),
            "the prefix's last instruction is not the kernel writing micro-batch 0's loss".into(),
        );
    }
    let graph = &plan.training.graph;
    for (i, ins) in plan.instructions[..end].iter().enumerate() {
        let what = match &ins.op {
            InstrOp::Kernel {
                node, micro_batch, ..
            } => {
                if *micro_batch != 0 {
                    Some(format!("a kernel of micro-batch {micro_batch}"))
                } else if graph.contains(*node) && graph.node(*node).phase == Phase::Backward {
                    Some(format!("the backward kernel of node {node}"))
                } else {
                    None
                }
            }
            InstrOp::LoadInput { micro_batch, .. } if *micro_batch != 0 => {
                Some(format!("a load of micro-batch {micro_batch}"))
            }
            // A forward tensor-parallel sum: part of computing the loss.
            InstrOp::TensorAllReduce {
                node, micro_batch, ..
            }
            | InstrOp::TensorChunks {
                node, micro_batch, ..
            } => {
                if *micro_batch != 0 {
                    Some(format!("a tensor sum of micro-batch {micro_batch}"))
                } else if graph.contains(*node) && graph.node(*node).phase == Phase::Backward {
                    Some(format!("the backward tensor sum of node {node}"))
                } else {
                    None
                }
            }
            InstrOp::AllGather { bucketed: true, .. } => {
                let closes = plan.instructions[i + 1..end].iter().find(|later| {
                    later.stream == ins.stream
                        && matches!(
                            later.op,
                            InstrOp::AllGather {
                                bucketed: false,
                                ..
                            }
                        )
                });
                closes
                    .is_none()
                    .then(|| "a bucketed all-gather whose bucket closes after the prefix".into())
            }
            InstrOp::WriteBuffer { micro_batch, .. } => {
                if *micro_batch != 0 {
                    Some(format!("a buffer write of micro-batch {micro_batch}"))
                } else {
                    // Skipped by an evaluation: the running statistics
                    // stay as training left them.
                    continue;
                }
            }
            InstrOp::LoadInput { .. }
            | InstrOp::AllGather { .. }
            | InstrOp::Reshard { .. }
            | InstrOp::Copy { .. }
            | InstrOp::Free { .. }
            | InstrOp::Record { .. }
            | InstrOp::Wait { .. } => None,
            other => Some(format!("a `{}` instruction", op_name(other))),
        };
        if let Some(what) = what {
            bad(Some(i), format!("the evaluation prefix holds {what}"));
            continue;
        }
        for b in ins.op.writes() {
            let kind = plan.buffers[b.index()].kind;
            if carries_state(kind) {
                bad(
                    Some(i),
                    format!("the evaluation prefix writes buffer {b} ({kind:?})"),
                );
            }
        }
    }
}

/// What a step leaves for the next one, or a gradient: the evaluation
/// prefix writes none of them.
fn carries_state(kind: BufferKind) -> bool {
    matches!(
        kind,
        BufferKind::ShardParams
            | BufferKind::ShardGrads
            | BufferKind::PartialGrads
            | BufferKind::FlatGrads
            | BufferKind::StagedGrads
            | BufferKind::OptimizerState
            | BufferKind::StagedState
            | BufferKind::ModuleBuffer
            | BufferKind::GradNorm
            | BufferKind::LossScale
            | BufferKind::FoundInf
    )
}

/// The instruction's name as the plan's JSON spells it (`op`).
fn op_name(op: &InstrOp) -> String {
    serde_json::to_value(op)
        .ok()
        .and_then(|v| v.get("op").and_then(|o| o.as_str()).map(str::to_string))
        .unwrap_or_else(|| "?".into())
}
