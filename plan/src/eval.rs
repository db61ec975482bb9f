//! The evaluation pass: a forward-only prefix of the step's instruction
//! list that computes the loss of one micro-batch from the parameters and
//! changes nothing a later step reads. A runtime evaluates held-out data by
//! running only these instructions, with its evaluation batch loaded and
//! dropout off, then reading the loss buffer (`Plan::loss`); no gradient is
//! computed and no state moves: it skips the prefix's `WriteBuffer`s, so
//! module buffers (running statistics) stay as training left them. (A
//! training-mode normalisation still normalises with the evaluation
//! batch's own statistics: the graph is the one the file was exported as.)
//!
//! A prefix keeps everything the full list guarantees: every `Wait` names
//! an event recorded earlier in the list, so the prefix's events are all
//! recorded within it; each buffer's lifetime in the prefix lies inside its
//! lifetime in the full list, so the arena offsets stay disjoint; the
//! collectives are the same on every rank. What the prefix must not hold is
//! checked by `validate` (`PlanViolation::Eval`).

use serde::{Deserialize, Serialize};

/// `Plan::eval`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EvalPass {
    /// The prefix `instructions[..instructions]`: its last instruction is
    /// the kernel that writes the loss of micro-batch 0 into `Plan::loss`.
    pub instructions: u32,
}
