//! The evaluation pass (`fsdpc_plan::eval`): the forward-only prefix of
//! the finished instruction list that ends with the kernel writing
//! micro-batch 0's loss. Everything before that kernel in list order is
//! what the loss needs (gathers, loads, forward kernels, their events and
//! frees) or harmless to run without it (an early gather for backward);
//! the verifier checks that the prefix holds no gradient and writes no
//! state (`PlanViolation::Eval`).

use fsdpc_plan::{EvalPass, InstrOp, Plan};

/// The plan's evaluation prefix; `None` when no kernel of micro-batch 0
/// writes the loss slot (a plan without a loss kernel is refused earlier).
pub(crate) fn prefix(plan: &Plan) -> Option<EvalPass> {
    let last = plan.instructions.iter().position(|i| {
        matches!(
            &i.op,
            InstrOp::Kernel { outputs, micro_batch: 0, .. } if outputs.contains(&plan.loss)
        )
    })?;
    Some(EvalPass {
        instructions: last as u32 + 1,
    })
}
