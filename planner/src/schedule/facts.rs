//! What the schedule pass looks up about the program: the inputs of each
//! step, each value's last reader, where each parameter gradient goes in its
//! unit's flat gradient, the last step touching each unit's flat gradient,
//! and which units' parameters each step reads. Under gradient accumulation
//! the steps repeat once per micro-batch, and a value is a program value of
//! one micro-batch: `(micro-batch, ValueId)`.

use super::{LowerInput, Step};
use crate::error::PlanError;
use crate::units::UnitAssignment;
use fsdpc_ir::{DType, Graph, NodeId, Op, ValueId};
use fsdpc_plan::*;
use rustc_hash::FxHashMap as HashMap;

/// Facts about the program the lowering looks up.
pub(super) struct Facts {
    /// Inputs of each step.
    pub(super) inputs: Vec<Vec<ValueId>>,
    /// The last step reading each value of each micro-batch.
    pub(super) last_read: HashMap<(u32, ValueId), usize>,
    /// Where gradient values go: (unit, byte offset in its flat gradient).
    pub(super) grad_slot: HashMap<ValueId, (UnitId, u64)>,
    /// Byte offset of each parameter in its unit's flat parameter.
    pub(super) param_offset: Vec<u64>,
    /// Per unit and micro-batch: the last step touching its flat gradient
    /// (empty: the unit has no gradient).
    pub(super) grad_done: Vec<Vec<usize>>,
    /// Per step: the units whose parameters it reads.
    pub(super) reads_units: Vec<Vec<UnitId>>,
}

impl Facts {
    pub(super) fn gather(
        input: &LowerInput,
        steps: &[Step],
        micro: &[u32],
    ) -> Result<Facts, PlanError> {
        let graph = &input.program.graph;
        let inputs: Vec<Vec<ValueId>> = steps
            .iter()
            .map(|s| match s {
                Step::Load(_) => Vec::new(),
                Step::Kernel(n) => graph.inputs(*n),
            })
            .collect();
        let mut last_read = HashMap::default();
        for (i, ins) in inputs.iter().enumerate() {
            for v in ins {
                last_read.insert((micro[i], *v), i);
            }
        }
        let param_offset = param_offsets(graph, input.units, input.cfg.param_dtype);
        let grad_slot = grad_slots(input, &param_offset)?;
        let grad_done = grad_done(input.units.len(), steps, micro, &inputs, &grad_slot);
        let reads_units = inputs
            .iter()
            .map(|ins| param_units_read(graph, input.assign, ins))
            .collect();
        Ok(Facts {
            inputs,
            last_read,
            grad_slot,
            param_offset,
            grad_done,
            reads_units,
        })
    }
}

fn param_offsets(graph: &Graph, units: &[Unit], dtype: DType) -> Vec<u64> {
    let mut out = vec![0u64; graph.params.len()];
    for u in units {
        for p in &u.params {
            if let Some(o) = out.get_mut(p.param.0 as usize) {
                *o = p.offset * dtype.size() as u64;
            }
        }
    }
    out
}

fn grad_slots(
    input: &LowerInput,
    param_offset: &[u64],
) -> Result<HashMap<ValueId, (UnitId, u64)>, PlanError> {
    let graph = &input.program.graph;
    let mut out = HashMap::default();
    for g in &input.program.grads {
        let p = g.param.0 as usize;
        let bad = |reason: String| Err(PlanError::Program { reason });
        if p >= param_offset.len() || !graph.contains(g.grad.node) {
            return bad(format!(
                "gradient entry for parameter {p} refers to nothing"
            ));
        }
        if graph.node(g.grad.node).op.is_source()
            && !matches!(graph.node(g.grad.node).op, Op::Constant { .. })
        {
            return bad(format!(
                "the gradient of `{}` is not a computed value",
                graph.params[p].name
            ));
        }
        if g.grad == input.program.loss {
            return bad(format!(
                "the gradient of `{}` is the loss",
                graph.params[p].name
            ));
        }
        let slot = (input.assign.param_unit[p], param_offset[p]);
        if out.insert(g.grad, slot).is_some() {
            return bad(format!(
                "value {} is the gradient of two parameters",
                g.grad
            ));
        }
    }
    Ok(out)
}

fn grad_done(
    n_units: usize,
    steps: &[Step],
    micro: &[u32],
    inputs: &[Vec<ValueId>],
    grad_slot: &HashMap<ValueId, (UnitId, u64)>,
) -> Vec<Vec<usize>> {
    let mut written_by: HashMap<NodeId, Vec<UnitId>> = HashMap::default();
    for (v, &(u, _)) in grad_slot {
        written_by.entry(v.node).or_default().push(u);
    }
    let k = micro.iter().max().map_or(1, |m| *m as usize + 1);
    let mut done: Vec<Vec<Option<usize>>> = vec![vec![None; k]; n_units];
    for (i, s) in steps.iter().enumerate() {
        let read = inputs[i]
            .iter()
            .filter_map(|v| grad_slot.get(v).map(|g| g.0));
        let written = match s {
            Step::Kernel(n) => written_by.get(n).cloned().unwrap_or_default(),
            Step::Load(_) => Vec::new(),
        };
        for u in read.chain(written) {
            if let Some(d) = done.get_mut(u.index()) {
                d[micro[i] as usize] = Some(i);
            }
        }
    }
    // Every micro-batch runs the same steps: a unit has a gradient in all
    // or in none.
    done.into_iter()
        .map(|d| d.into_iter().flatten().collect())
        .collect()
}

fn param_units_read(graph: &Graph, assign: &UnitAssignment, ins: &[ValueId]) -> Vec<UnitId> {
    let mut units: Vec<UnitId> = ins
        .iter()
        .filter_map(|v| match graph.node(v.node).op {
            Op::Param { param } => assign.param_unit.get(param.0 as usize).copied(),
            _ => None,
        })
        .collect();
    units.sort();
    units.dedup();
    units
}
