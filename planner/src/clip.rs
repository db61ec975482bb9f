//! Gradient clipping (`FsdpConfig::clip_grad_norm`): rewrites the optimizer
//! tail of a lowered schedule so every optimizer step reads gradients scaled
//! to the global L2 norm, as PyTorch's `FSDP.clip_grad_norm_(max_norm)`.
//!
//! Conventions (the runtime and `Plan::validate` rely on them):
//! - The optimizer tail is what `schedule::lower` emits after the last
//!   kernel: compute-stream `Wait`s on each unit's reduction, the
//!   `OptimizerStep`s and (no_shard) the `Free`s of flat gradients.
//! - Rewritten, the tail first `Wait`s on every reduction, then runs one
//!   `GradNormSq` over every optimizer step's gradient buffer, in the order
//!   of the steps, into a persistent `GradNorm` scalar.
//! - full_shard: compute `Record`s, the reduce stream `Wait`s, runs one
//!   `NormAllReduce` of that scalar over the shard group (summed in rank
//!   order, like every collective) and `Record`s; compute `Wait`s on it.
//!   no_shard: every rank already holds the whole reduced gradient, so its
//!   sum of squares is the global one and no collective is needed.
//! - Tensor parallelism: a member off tensor position 0 counts only the
//!   elements of split parameters (`split_only_off_first`), and a second
//!   `NormAllReduce` sums the scalar over the tensor group: every element
//!   of the whole model counted once.
//! - Each `OptimizerStep` is preceded by a `ClipGrads` of its gradient
//!   buffer; the frees keep their place after the step.

use crate::error::PlanError;
use crate::schedule::Schedule;
use fsdpc_ir::DType;
use fsdpc_plan::{Buffer, BufferKind, Group, Instr, InstrOp, Stream};

/// Inserts the clipping instructions into `sched` for a total norm of at
/// most `max_norm`; `sharded`: gradient shards differ between ranks (the
/// norm is all-reduced over the shard group); `tensor`: the model is split
/// over tensor groups (the norm counts replicated parameters at tensor
/// position 0 only and is then all-reduced over the tensor group).
pub fn insert(
    sched: &mut Schedule,
    max_norm: f64,
    sharded: bool,
    tensor: bool,
) -> Result<(), PlanError> {
    let bad = |reason: &str| PlanError::Program {
        reason: format!("gradient clipping: {reason}"),
    };
    let Some(first_step) = sched
        .instructions
        .iter()
        .position(|i| matches!(i.op, InstrOp::OptimizerStep { .. }))
    else {
        // Nothing is trained: nothing to clip.
        return Ok(());
    };
    let start = match first_step.checked_sub(1).map(|p| &sched.instructions[p]) {
        Some(Instr {
            stream: Stream::Compute,
            op: InstrOp::Wait { .. },
        }) => first_step - 1,
        _ => first_step,
    };
    let tail = sched.instructions.split_off(start);
    if tail.iter().any(|i| {
        i.stream != Stream::Compute
            || !matches!(
                i.op,
                InstrOp::Wait { .. } | InstrOp::OptimizerStep { .. } | InstrOp::Free { .. }
            )
    }) {
        return Err(bad("the optimizer tail holds other instructions"));
    }
    let grads: Vec<_> = tail
        .iter()
        .filter_map(|i| match i.op {
            InstrOp::OptimizerStep { grads, .. } => Some(grads),
            _ => None,
        })
        .collect();
    let norm = Buffer::add(&mut sched.buffers, BufferKind::GradNorm, DType::F32, 4).id;
    let out = &mut sched.instructions;
    let compute = |op| Instr {
        stream: Stream::Compute,
        op,
    };
    out.extend(
        tail.iter()
            .filter(|i| matches!(i.op, InstrOp::Wait { .. }))
            .cloned(),
    );
    out.push(compute(InstrOp::GradNormSq {
        grads,
        dst: norm,
        split_only_off_first: tensor,
    }));
    let groups = [(Group::Shard, sharded), (Group::Tensor, tensor)];
    if groups.iter().any(|g| g.1) {
        let summed = fsdpc_plan::EventId(sched.events);
        let reduced = fsdpc_plan::EventId(sched.events + 1);
        sched.events += 2;
        out.push(compute(InstrOp::Record { event: summed }));
        let reduce = |op| Instr {
            stream: Stream::Reduce,
            op,
        };
        out.push(reduce(InstrOp::Wait { event: summed }));
        for (group, _) in groups.into_iter().filter(|g| g.1) {
            out.push(reduce(InstrOp::NormAllReduce {
                buffer: norm,
                group,
            }));
        }
        out.push(reduce(InstrOp::Record { event: reduced }));
        out.push(compute(InstrOp::Wait { event: reduced }));
    }
    for i in tail {
        match i.op {
            InstrOp::Wait { .. } => {}
            InstrOp::OptimizerStep { unit, grads, .. } => {
                out.push(compute(InstrOp::ClipGrads {
                    unit,
                    norm,
                    grads,
                    max_norm,
                }));
                out.push(i);
            }
            _ => out.push(i),
        }
    }
    Ok(())
}
