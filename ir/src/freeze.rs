//! Freezing parameters of a training program (`requires_grad = false`,
//! PyTorch's `param.requires_grad_(False)`) after autodiff built it.
//!
//! A frozen parameter keeps its forward uses but gets no gradient: its
//! `ParamSpec::requires_grad` is cleared, its `ParamGrad` entry is dropped,
//! and every backward node that no remaining gradient (nor the loss) depends
//! on is removed, so the weight-gradient products of frozen matrices are not
//! computed at all. Backward nodes that carry gradients *through* a frozen
//! parameter's consumers to earlier trainable parameters stay: they are what
//! the remaining gradients read. The nodes that are left are exactly the
//! ones that computed the remaining gradients before, so those gradients are
//! bit-identical to the unfrozen program's.
//!
//! Tied parameters (`tied_to`) are frozen together: autodiff gives tied
//! copies one summed gradient so that they stay equal, and a half-frozen
//! pair would drift apart.

use crate::error::IrError;
use crate::graph::{NodeId, Phase};
use crate::param::ParamId;
use crate::program::TrainingProgram;
use std::collections::{BTreeSet, HashSet};

/// `program` with the parameters `frozen` (and the parameters tied to them)
/// frozen, and the backward nodes only they needed removed. Returns the
/// parameters actually frozen (ties included), in `ParamId` order.
pub fn freeze(
    mut program: TrainingProgram,
    frozen: &BTreeSet<ParamId>,
) -> Result<(TrainingProgram, BTreeSet<ParamId>), IrError> {
    let n_params = program.graph.params.len();
    if let Some(p) = frozen.iter().find(|p| p.0 as usize >= n_params) {
        return Err(IrError::Invalid(format!(
            "cannot freeze parameter {}: the graph has {n_params} parameters",
            p.0
        )));
    }
    let all = with_ties(&program, frozen);
    for p in &all {
        program.graph.params[p.0 as usize].requires_grad = false;
    }
    program.grads.retain(|g| !all.contains(&g.param));
    remove_dead_backward(&mut program);
    Ok((program, all))
}

/// `frozen` closed under `tied_to` links (in both directions).
fn with_ties(program: &TrainingProgram, frozen: &BTreeSet<ParamId>) -> BTreeSet<ParamId> {
    let mut all = frozen.clone();
    loop {
        let before = all.len();
        for (i, spec) in program.graph.params.iter().enumerate() {
            let p = ParamId(i as u32);
            if let Some(t) = spec.tied_to {
                if all.contains(&p) || all.contains(&t) {
                    all.insert(p);
                    all.insert(t);
                }
            }
        }
        if all.len() == before {
            return all;
        }
    }
}

/// Removes the backward nodes that neither a remaining gradient nor the
/// loss depends on. Forward nodes are all kept.
fn remove_dead_backward(program: &mut TrainingProgram) {
    let g = &program.graph;
    let mut live: HashSet<NodeId> = HashSet::new();
    let mut work: Vec<NodeId> = program
        .grads
        .iter()
        .map(|pg| pg.grad.node)
        .chain(std::iter::once(program.loss.node))
        .collect();
    while let Some(n) = work.pop() {
        if !g.contains(n) || !live.insert(n) {
            continue;
        }
        work.extend(
            g.inputs(n)
                .into_iter()
                .map(|v| v.node)
                .filter(|m| !live.contains(m)),
        );
    }
    let dead: Vec<NodeId> = g
        .node_ids()
        .filter(|&n| g.node(n).phase == Phase::Backward && !live.contains(&n))
        .collect();
    for n in dead {
        program.graph.remove_node(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::autodiff::build_training_program;
    use crate::graph::{Graph, ValueId};
    use crate::op::{BinaryFn, Op, ReduceFn};
    use crate::param::{Init, ParamSpec};
    use crate::program::Optimizer;
    use crate::types::{DType, TensorType};

    fn param(g: &mut Graph, name: &str, shape: &[usize]) -> ValueId {
        let spec = ParamSpec {
            name: name.into(),
            ty: TensorType::new(DType::F32, shape.to_vec()),
            init: Init::Ones,
            requires_grad: true,
            tied_to: None,
            tp: None,
        };
        let m = g.module(name, "Linear");
        g.add_param(spec, m)
    }

    fn mm() -> Op {
        Op::MatMul {
            trans_a: false,
            trans_b: false,
        }
    }

    /// loss = sum((x @ a) @ b): b frozen keeps the backward through b's
    /// product (a needs it) and drops b's weight gradient.
    fn two_layer() -> TrainingProgram {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::new(DType::F32, vec![2, 3]));
        let a = param(&mut g, "a", &[3, 4]);
        let b = param(&mut g, "b", &[4, 5]);
        let m = g.module("", "Root");
        let h = g.add1(mm(), &[x, a], "h", m).expect("h");
        let y = g.add1(mm(), &[h, b], "y", m).expect("y");
        let add = Op::Binary { f: BinaryFn::Add };
        let y2 = g.add1(add, &[y, y], "y2", m).expect("y2");
        let reduce = Op::Reduce {
            f: ReduceFn::Sum,
            axes: vec![0, 1],
            keepdims: false,
        };
        let loss = g.add1(reduce, &[y2], "loss", m).expect("loss");
        build_training_program(g, loss, Optimizer::adamw(1e-3)).expect("autodiff")
    }

    #[test]
    fn frozen_parameter_loses_its_gradient_and_its_backward_nodes() {
        let p = two_layer();
        let before = p.graph.node_count();
        let grad_a = p.grads[0].grad;
        let (q, all) = freeze(p, &BTreeSet::from([ParamId(1)])).expect("freeze");
        assert_eq!(all, BTreeSet::from([ParamId(1)]));
        assert!(!q.graph.params[1].requires_grad);
        assert!(q.graph.params[0].requires_grad);
        assert_eq!(q.grads.len(), 1);
        assert_eq!(q.grads[0].param, ParamId(0));
        assert_eq!(q.grads[0].grad, grad_a, "a's gradient is the same value");
        assert!(q.graph.node_count() < before, "b's weight gradient removed");
        q.validate().expect("valid program");
    }

    #[test]
    fn freezing_everything_keeps_only_the_forward() {
        let p = two_layer();
        let set = BTreeSet::from([ParamId(0), ParamId(1)]);
        let (q, _) = freeze(p, &set).expect("freeze");
        assert!(q.grads.is_empty());
        assert!(q
            .graph
            .node_ids()
            .all(|n| q.graph.node(n).phase == Phase::Forward));
    }

    #[test]
    fn unknown_parameter_is_an_error() {
        let e = freeze(two_layer(), &BTreeSet::from([ParamId(9)])).expect_err("out of range");
        assert!(e.to_string().contains("2 parameters"), "{e}");
    }
}
