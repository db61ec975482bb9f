//! Plan checks of the flat-parameter layout (see `flat`) and of the sizes of
//! the per-unit buffers that follow from it: segments are multiples of F,
//! parameters lie inside their segment without overlapping, a parameter's
//! `requires_grad` agrees with the program and its segment, and the shard,
//! gathered, gradient and optimizer-state buffers have the sizes the layout
//! gives — in particular no gradient, gradient-shard or optimizer-state
//! byte covers the frozen segment.

use super::PlanViolation;
use crate::*;

/// Appends a violation for every layout or buffer-size problem of `plan`.
pub(crate) fn check(plan: &Plan, out: &mut Vec<PlanViolation>) {
    let f = u64::from(plan.config.shard_factor.max(1));
    for unit in &plan.units {
        for reason in unit_problems(plan, unit, f) {
            out.push(PlanViolation::Layout {
                unit: unit.id,
                reason,
            });
        }
    }
    for b in &plan.buffers {
        let Some(unit) = b.unit.and_then(|u| plan.units.get(u.index())) else {
            continue;
        };
        let elems = match b.kind {
            BufferKind::ShardParams => unit.shard_numel,
            BufferKind::GatheredParams => unit.padded_numel,
            BufferKind::FlatGrads => unit.trainable_numel(),
            BufferKind::ShardGrads | BufferKind::OptimizerState => unit.trainable_shard_numel(),
            _ => continue,
        };
        let expected = elems * b.dtype.size() as u64;
        if b.bytes != expected || elems == 0 {
            out.push(PlanViolation::BufferSize {
                buffer: b.id,
                unit: unit.id,
                kind: b.kind,
                bytes: b.bytes,
                expected,
            });
        }
    }
}

/// The layout problems of one unit, in words.
fn unit_problems(plan: &Plan, unit: &Unit, f: u64) -> Vec<String> {
    let mut out = Vec::new();
    let t = unit.trainable_numel();
    if unit.frozen_numel > unit.padded_numel {
        out.push(format!(
            "frozen segment of {} elements exceeds the padded {}",
            unit.frozen_numel, unit.padded_numel
        ));
        return out;
    }
    if !t.is_multiple_of(f)
        || !unit.frozen_numel.is_multiple_of(f)
        || unit.shard_numel * f != unit.padded_numel
    {
        out.push(format!(
            "segments {t} + {} and shard {} do not divide by F = {f}",
            unit.frozen_numel, unit.shard_numel
        ));
    }
    let mut ranges: Vec<(u64, u64, &str)> = Vec::new();
    for p in &unit.params {
        let end = p.offset.saturating_add(p.numel);
        let (lo, hi) = if p.requires_grad {
            (0, t)
        } else {
            (t, unit.padded_numel)
        };
        if p.offset < lo || end > hi {
            out.push(format!(
                "parameter `{}` at [{}, {end}) lies outside its {} segment [{lo}, {hi})",
                p.name,
                p.offset,
                if p.requires_grad {
                    "trainable"
                } else {
                    "frozen"
                }
            ));
        }
        let program = plan.training.graph.params.get(p.param.0 as usize);
        if program.is_some_and(|s| s.requires_grad != p.requires_grad) {
            out.push(format!(
                "parameter `{}`: requires_grad {} in the layout, {} in the program",
                p.name, p.requires_grad, !p.requires_grad
            ));
        }
        if let Some(why) = program.and_then(|s| tp_problem(plan, s)) {
            out.push(format!("parameter `{}`: {why}", p.name));
        }
        ranges.push((p.offset, end, &p.name));
    }
    ranges.sort();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            out.push(format!("parameters `{}` and `{}` overlap", w[0].2, w[1].2));
        }
    }
    out
}

/// What is wrong with a tensor-parallel part (`ParamSpec::tp`): its
/// shape must be `parts` = T chunks of `ceil(segment / T)` of its
/// segments along its axis (padding included).
fn tp_problem(plan: &Plan, spec: &fsdpc_ir::ParamSpec) -> Option<String> {
    let tp = spec.tp.as_ref()?;
    let local = &spec.ty.shape.0;
    let t = plan.geometry().t();
    if tp.parts != t || tp.segments.is_empty() {
        return Some(format!(
            "split into {} parts of {:?}, the plan's T is {t}",
            tp.parts, tp.segments
        ));
    }
    match local.get(tp.axis) {
        Some(&n) if n == tp.local_len() => None,
        _ => Some(format!(
            "a part of shape {local:?} is not {t} chunks of {:?} on axis {} (each {})",
            tp.segments,
            tp.axis,
            tp.local_len()
        )),
    }
}
