//! The fp16 dynamic loss scaler (PyTorch's `ShardedGradScaler`): a pass
//! after `clip` that adds the scaler's instructions to a lowered schedule
//! when the policy computes or reduces in fp16 (`precision::needs_scaler`).
//!
//! Conventions (the runtime and `Plan::validate` rely on them):
//! - State lives in two persistent f32 buffers: `LossScale` (the scale, then
//!   the count of good steps since it last changed; the runtime sets them to
//!   `init_scale` and 0 before the first step) and `FoundInf` (the flag).
//! - Backward is seeded with the scale: the `Kernel` of the constant that
//!   autodiff seeds backward with (`d loss = 1`, named `grad(<loss>)`)
//!   becomes a `ScaleSeed` writing the current scale into the same slot, so
//!   every gradient is `scale` times the true one.
//! - The optimizer tail (what `schedule` and `clip` emit after the last
//!   kernel) gets, after every compute `Wait` on a reduction: one
//!   `UnscaleGrads` over every optimizer step's gradient buffer (in step
//!   order), which also sets the flag; then, for each group of more than
//!   one rank (the shard group, then the replicate group), compute
//!   `Record`s, the reduce stream `Wait`s, `FoundInfAllReduce`s the flag
//!   and `Record`s, and compute `Wait`s: the flag is the sum over all
//!   ranks, one scalar. Clipping (if any) then sees unscaled gradients.
//! - Every `OptimizerStep` gets `skip_if: FoundInf`; the tail ends with one
//!   `UpdateScale`.

use crate::error::PlanError;
use crate::schedule::Schedule;
use fsdpc_ir::{DType, Op, Phase, TrainingProgram};
use fsdpc_plan::{
    Buffer, BufferId, BufferKind, EventId, Group, Instr, InstrOp, LossScaler, Stream,
};
use std::collections::HashSet;

/// PyTorch's `ShardedGradScaler` defaults, with `init_scale` given.
pub fn torch_defaults(init_scale: Option<f64>) -> LossScaler {
    LossScaler {
        init_scale: init_scale.unwrap_or(65536.0),
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 2000,
    }
}

/// The group sizes the flag is summed over: the shard factor F, the data
/// ranks / F and the tensor-parallel degree T.
pub struct Groups {
    pub shard: u32,
    pub replicate: u32,
    pub tensor: u32,
}

/// Adds the loss scaler `s` to `sched` (see the module header).
pub fn insert(
    sched: &mut Schedule,
    program: &TrainingProgram,
    s: &LossScaler,
    groups: Groups,
) -> Result<(), PlanError> {
    let bad = |reason: &str| PlanError::Program {
        reason: format!("loss scaler: {reason}"),
    };
    let Some(first) = sched.instructions.iter().position(|i| {
        matches!(
            i.op,
            InstrOp::OptimizerStep { .. } | InstrOp::GradNormSq { .. }
        )
    }) else {
        // Nothing is trained: nothing to scale.
        return Ok(());
    };
    let scale = new_scalar(sched, BufferKind::LossScale, 8);
    let found_inf = new_scalar(sched, BufferKind::FoundInf, 4);
    seed_with_scale(sched, program, scale).map_err(|r| bad(&r))?;
    let mut start = first;
    while start > 0 && is_compute_wait(&sched.instructions[start - 1]) {
        start -= 1;
    }
    let recorded: HashSet<EventId> = sched.instructions[..start]
        .iter()
        .filter_map(|i| match i.op {
            InstrOp::Record { event } => Some(event),
            _ => None,
        })
        .collect();
    let tail = sched.instructions.split_off(start);
    let (hoisted, rest): (Vec<Instr>, Vec<Instr>) = tail.into_iter().partition(|i| {
        is_compute_wait(i) && matches!(i.op, InstrOp::Wait { event } if recorded.contains(&event))
    });
    let grads: Vec<BufferId> = rest
        .iter()
        .filter_map(|i| match i.op {
            InstrOp::OptimizerStep { grads, .. } => Some(grads),
            _ => None,
        })
        .collect();
    sched.instructions.extend(hoisted);
    sched.instructions.push(compute(InstrOp::UnscaleGrads {
        grads,
        scale,
        found_inf,
    }));
    for (group, n) in [
        (Group::Shard, groups.shard),
        (Group::Replicate, groups.replicate),
        (Group::Tensor, groups.tensor),
    ] {
        if n > 1 {
            all_reduce_flag(sched, found_inf, group);
        }
    }
    for mut i in rest {
        if let InstrOp::OptimizerStep { skip_if, .. } = &mut i.op {
            *skip_if = Some(found_inf);
        }
        sched.instructions.push(i);
    }
    sched.instructions.push(compute(InstrOp::UpdateScale {
        scale,
        found_inf,
        growth_factor: s.growth_factor,
        backoff_factor: s.backoff_factor,
        growth_interval: s.growth_interval,
    }));
    Ok(())
}

fn compute(op: InstrOp) -> Instr {
    Instr {
        stream: Stream::Compute,
        op,
    }
}

fn is_compute_wait(i: &Instr) -> bool {
    i.stream == Stream::Compute && matches!(i.op, InstrOp::Wait { .. })
}

/// A persistent f32 buffer of `bytes` for the scaler's state.
fn new_scalar(sched: &mut Schedule, kind: BufferKind, bytes: u64) -> BufferId {
    Buffer::add(&mut sched.buffers, kind, DType::F32, bytes).id
}

/// Replaces the kernel of backward's seed constant by a `ScaleSeed`.
fn seed_with_scale(
    sched: &mut Schedule,
    program: &TrainingProgram,
    scale: BufferId,
) -> Result<(), String> {
    let g = &program.graph;
    let loss_name = &g.node(program.loss.node).name;
    let seed_name = format!("grad({loss_name})");
    let seed = g
        .node_ids()
        .find(|&n| {
            let node = g.node(n);
            node.phase == Phase::Backward
                && matches!(node.op, Op::Constant { .. })
                && node.name == seed_name
                && g.inputs(n).is_empty()
        })
        .ok_or("backward has no seed constant")?;
    let at = sched
        .instructions
        .iter()
        .position(|i| matches!(&i.op, InstrOp::Kernel { node, .. } if *node == seed))
        .ok_or("the seed constant has no kernel")?;
    let InstrOp::Kernel { outputs, .. } = &sched.instructions[at].op else {
        return Err("the seed constant has no kernel".into());
    };
    let dst = *outputs.first().ok_or("the seed constant has no output")?;
    sched.instructions[at].op = InstrOp::ScaleSeed {
        node: seed,
        scale,
        dst,
    };
    Ok(())
}

/// Sums the flag over `group` on the reduce stream, between events.
fn all_reduce_flag(sched: &mut Schedule, flag: BufferId, group: Group) {
    let ready = EventId(sched.events);
    let done = EventId(sched.events + 1);
    sched.events += 2;
    let reduce = |op| Instr {
        stream: Stream::Reduce,
        op,
    };
    let out = &mut sched.instructions;
    out.push(compute(InstrOp::Record { event: ready }));
    out.push(reduce(InstrOp::Wait { event: ready }));
    out.push(reduce(InstrOp::FoundInfAllReduce {
        buffer: flag,
        group,
    }));
    out.push(reduce(InstrOp::Record { event: done }));
    out.push(compute(InstrOp::Wait { event: done }));
}
