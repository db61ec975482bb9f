//! Plan checks of mixed precision (`precision`) and the fp16 loss scaler
//! (`scaler`): the dtypes every buffer and collective must have under the
//! plan's policy, and the scaler's instructions in their order.

use super::hb::Clocks;
use super::PlanViolation;
use crate::*;
use fsdpc_ir::DType;

/// Appends every violation of the precision policy and the loss scaler.
pub fn check(p: &Plan, clocks: &Clocks, out: &mut Vec<PlanViolation>) {
    dtypes(p, out);
    scaler(p, clocks, out);
}

fn at(instr: Option<usize>, reason: String) -> PlanViolation {
    PlanViolation::Precision {
        instr: instr.map(|i| i as u32),
        reason,
    }
}

/// Masters and optimizer state f32; gathered parameters and flat gradients
/// in `param_dtype`; gathers in `param_dtype`, reductions in `reduce_dtype`;
/// parameters read in `param_dtype`.
fn dtypes(p: &Plan, out: &mut Vec<PlanViolation>) {
    let (pd, rd) = (p.config.param_dtype, p.config.reduce_dtype);
    for b in &p.buffers {
        let want = match b.kind {
            BufferKind::ShardParams
            | BufferKind::ShardGrads
            | BufferKind::OptimizerState
            | BufferKind::GradNorm
            | BufferKind::LossScale
            | BufferKind::FoundInf => DType::F32,
            BufferKind::GatheredParams | BufferKind::FlatGrads => pd,
            _ => continue,
        };
        if b.dtype != want {
            out.push(at(
                None,
                format!(
                    "buffer {} ({:?}) is {}, the policy gives {want}",
                    b.id, b.kind, b.dtype
                ),
            ));
        }
    }
    for (i, ins) in p.instructions.iter().enumerate() {
        match ins.op {
            InstrOp::AllGather {
                c: Collective {
                    dtype, src, dst, ..
                },
                ..
            } => {
                let into = p.buffers.get(dst.index()).map(|b| b.dtype);
                let from = p.buffers.get(src.index()).map(|b| b.dtype);
                // Cast before gathering (the param dtype on the wire), or
                // the shard sent as it is and converted on receipt.
                if !(dtype == pd || Some(dtype) == from) || into != Some(pd) {
                    out.push(at(
                        Some(i),
                        format!("all-gather in {dtype} into {into:?}, the param dtype is {pd}"),
                    ));
                }
            }
            InstrOp::ReduceScatter {
                c: Collective { dtype, .. },
            }
            | InstrOp::AllReduce { dtype, .. }
                if dtype != rd =>
            {
                out.push(at(
                    Some(i),
                    format!("reduction in {dtype}, the reduce dtype is {rd}"),
                ));
            }
            _ => {}
        }
    }
    for s in &p.training.graph.params {
        if s.ty.dtype.is_float() && s.ty.dtype != pd {
            out.push(at(
                None,
                format!(
                    "parameter `{}` is read as {}, the param dtype is {pd}",
                    s.name, s.ty.dtype
                ),
            ));
        }
    }
}

/// The scaler's instructions, where the plan's `loss_scaler` asks for
/// them, in the order `scaler` documents; none without it.
fn scaler(p: &Plan, clocks: &Clocks, out: &mut Vec<PlanViolation>) {
    let mut seeds = Vec::new();
    let mut unscales = Vec::new();
    let mut flags = Vec::new();
    let mut updates = Vec::new();
    let mut steps = Vec::new();
    let mut reductions = Vec::new();
    for (i, ins) in p.instructions.iter().enumerate() {
        match &ins.op {
            InstrOp::ScaleSeed { .. } => seeds.push(i),
            InstrOp::UnscaleGrads { .. } => unscales.push(i),
            InstrOp::FoundInfAllReduce { group, .. } => flags.push((i, *group)),
            InstrOp::UpdateScale { .. } => updates.push(i),
            InstrOp::OptimizerStep { grads, skip_if, .. } => steps.push((i, *grads, *skip_if)),
            InstrOp::ReduceScatter { .. } | InstrOp::AllReduce { .. } => reductions.push(i),
            _ => {}
        }
    }
    if p.config.loss_scaler.is_none() {
        let any = seeds
            .iter()
            .chain(&unscales)
            .chain(flags.iter().map(|f| &f.0))
            .chain(&updates)
            .chain(steps.iter().filter(|s| s.2.is_some()).map(|s| &s.0))
            .next();
        if let Some(&i) = any {
            out.push(at(
                Some(i),
                "loss scaling in a plan without a loss scaler".into(),
            ));
        }
        return;
    }
    if steps.is_empty() {
        return;
    }
    let one = |what: &str, v: &[usize], out: &mut Vec<PlanViolation>| match v {
        [i] => Some(*i),
        _ => {
            out.push(at(
                v.get(1).copied(),
                format!("{} {what}, expected one", v.len()),
            ));
            None
        }
    };
    let (Some(seed), Some(unscale), Some(update)) = (
        one("scale seeds", &seeds, out),
        one("unscale instructions", &unscales, out),
        one("scale updates", &updates, out),
    ) else {
        return;
    };
    let InstrOp::UnscaleGrads {
        grads, found_inf, ..
    } = &p.instructions[unscale].op
    else {
        return;
    };
    let stepped: Vec<BufferId> = steps.iter().map(|s| s.1).collect();
    if *grads != stepped {
        out.push(at(
            Some(unscale),
            "the unscale does not cover exactly the optimizer steps' gradients".into(),
        ));
    }
    let mut before = |a: usize, b: usize, what: &str| {
        if !clocks.hb(a, b) {
            out.push(at(
                Some(b),
                format!("does not follow {what} at instruction {a}"),
            ));
        }
    };
    before(seed, unscale, "the scale seed");
    for &r in &reductions {
        before(r, unscale, "the reduction");
    }
    for &(f, _) in &flags {
        before(unscale, f, "the unscale");
    }
    for &(s, _, _) in &steps {
        before(unscale, s, "the unscale");
        for &(f, _) in &flags {
            before(f, s, "the found-inf all-reduce");
        }
        before(s, update, "the optimizer step");
    }
    let world = p.geometry().data_world();
    let f = p.config.shard_factor.max(1);
    let want: Vec<Group> = [
        (Group::Shard, f),
        (Group::Replicate, world / f),
        (Group::Tensor, p.geometry().t()),
    ]
    .into_iter()
    .filter(|&(_, n)| n > 1)
    .map(|(g, _)| g)
    .collect();
    let got: Vec<Group> = flags.iter().map(|f| f.1).collect();
    if got != want {
        out.push(at(
            flags.first().map(|f| f.0),
            format!(
                "the found-inf flag is all-reduced over {got:?}, expected {want:?} (every rank)"
            ),
        ));
    }
    for &(s, _, skip) in &steps {
        if skip != Some(*found_inf) {
            out.push(at(
                Some(s),
                format!("the optimizer step skips on {skip:?}, not the found-inf flag {found_inf}"),
            ));
        }
    }
}
