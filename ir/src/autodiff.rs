//! Reverse-mode autodiff: from a forward graph and its scalar loss to a
//! `TrainingProgram` holding the backward nodes and each parameter's gradient.
//!
//! The backward pass walks the forward nodes in reverse topological order,
//! seeded with `d loss = 1`, and asks each node's VJP rule (`ops::vjp`) for
//! its inputs' gradients; contributions to one value are summed with `Add`.
//! Only nodes that both depend on a trainable parameter and lead to the loss
//! through floating-point values are differentiated.
//!
//! Every backward node is `Phase::Backward`, lives in the module of the
//! forward node it came from (so it falls into the same FSDP unit) and is
//! named `grad(<forward node name>)`.

use crate::error::IrError;
use crate::graph::{Graph, NodeId, Phase, ValueId};
use crate::op::{BinaryFn, Op};
use crate::param::ParamId;
use crate::program::{Optimizer, ParamGrad, TrainingProgram};
use crate::types::TensorData;
use std::collections::{BTreeMap, HashMap, HashSet};

/// Differentiates `forward` with respect to its trainable parameters.
///
/// `loss` must be a scalar floating-point value of `forward`. The result's
/// graph holds the forward nodes (renumbered in topological order only if
/// their ids were not already: holes left by removed nodes, or edges from a
/// higher id to a lower one) followed by the backward nodes, and
/// `graph.outputs == [loss]`.
///
/// `grads` has one entry per parameter with `requires_grad` that the loss
/// depends on, in `ParamId` order. Each grad is a value of its own: produced
/// by a `Backward`, non-source node, read by no other node and shared with no
/// other parameter (an explicit copy, a same-shape `Reshape`, is inserted
/// where the natural gradient would alias another value). A parameter used
/// several times gets the sum of its contributions; a parameter `b` with
/// `tied_to: Some(a)` gets, like `a`, the sum of both parameters'
/// contributions, so that tied copies stay equal.
pub fn build_training_program(
    forward: Graph,
    loss: ValueId,
    optimizer: Optimizer,
) -> Result<TrainingProgram, IrError> {
    let (mut graph, loss) = topological(forward, loss)?;
    check_loss(&graph, loss)?;
    let order = graph
        .topo_order()
        .map_err(|nodes| cycle_error(&graph, &nodes))?;
    let relevant = relevant_nodes(&graph, &order, loss);
    let mut acc = Accumulator::default();
    let seed = seed(&mut graph, loss)?;
    acc.add(loss, seed);
    for &n in order.iter().rev() {
        if relevant.contains(&n) && !graph.node(n).op.is_source() {
            backprop_node(&mut graph, &mut acc, &relevant, n)?;
        }
    }
    let grads = param_grads(&mut graph, &mut acc, &relevant)?;
    graph.outputs = vec![loss];
    Ok(TrainingProgram {
        graph,
        loss,
        grads,
        optimizer,
    })
}

/// `forward` with ids in topological order (renumbered only if needed) and
/// the loss's value in it.
fn topological(forward: Graph, loss: ValueId) -> Result<(Graph, ValueId), IrError> {
    if forward.ids_are_topological() {
        return Ok((forward, loss));
    }
    let (g, map) = forward
        .renumbered()
        .map_err(|nodes| cycle_error(&forward, &nodes))?;
    let node = map
        .get(&loss.node)
        .copied()
        .ok_or_else(|| IrError::Autodiff(format!("the loss {loss} is not a value of the graph")))?;
    Ok((g, ValueId { node, ..loss }))
}

fn cycle_error(g: &Graph, nodes: &[NodeId]) -> IrError {
    let node = nodes
        .iter()
        .min()
        .and_then(|&n| g.try_node(n))
        .map_or_else(|| "?".to_string(), |n| n.name.clone());
    IrError::Cycle { node }
}

/// The loss must be a scalar floating-point value.
fn check_loss(g: &Graph, loss: ValueId) -> Result<(), IrError> {
    let ty = g
        .try_value_type(loss)
        .ok_or_else(|| IrError::Autodiff(format!("the loss {loss} is not a value of the graph")))?;
    if ty.shape.rank() != 0 || !ty.dtype.is_float() {
        let name = &g.node(loss.node).name;
        return Err(IrError::Autodiff(format!(
            "the loss `{name}` ({loss}) must be a floating-point scalar, got {ty}"
        )));
    }
    Ok(())
}

/// True if `v` carries a floating-point tensor (only those have gradients).
fn is_float(g: &Graph, v: ValueId) -> bool {
    g.try_value_type(v).is_some_and(|t| t.dtype.is_float())
}

/// The nodes on a floating-point path from a trainable parameter to the loss.
fn relevant_nodes(g: &Graph, order: &[NodeId], loss: ValueId) -> HashSet<NodeId> {
    let mut from_param = HashSet::new();
    for &n in order {
        let hit = match g.node(n).op {
            Op::Param { param } => g
                .params
                .get(param.0 as usize)
                .is_some_and(|p| p.requires_grad),
            _ => g
                .inputs(n)
                .iter()
                .any(|&v| from_param.contains(&v.node) && is_float(g, v)),
        };
        if hit {
            from_param.insert(n);
        }
    }
    let mut to_loss = HashSet::from([loss.node]);
    for &n in order.iter().rev() {
        if to_loss.contains(&n) && from_param.contains(&n) {
            let inputs = g.inputs(n);
            to_loss.extend(
                inputs
                    .into_iter()
                    .filter(|&v| is_float(g, v))
                    .map(|v| v.node),
            );
        }
    }
    to_loss.retain(|n| from_param.contains(n));
    to_loss
}

/// `d loss / d loss = 1`, a backward constant in the loss's module.
fn seed(g: &mut Graph, loss: ValueId) -> Result<ValueId, IrError> {
    let node = g.node(loss.node).clone();
    let dtype = g.value_type(loss).dtype;
    let value = TensorData::scalar(dtype, 1.0);
    let n = g.add(
        Op::Constant { value },
        &[],
        format!("grad({})", node.name),
        node.module,
    )?;
    g.node_mut(n).phase = Phase::Backward;
    Ok(ValueId { node: n, slot: 0 })
}

/// Gradient contributions per value, summed when the value's producer is
/// reached (every consumer has been differentiated by then).
#[derive(Default)]
struct Accumulator {
    parts: HashMap<ValueId, Vec<ValueId>>,
}

impl Accumulator {
    fn add(&mut self, v: ValueId, g: ValueId) {
        self.parts.entry(v).or_default().push(g);
    }

    /// The total gradient of the values `vs` (see `sum`), or `None` if none
    /// has any contribution.
    fn total(
        &mut self,
        g: &mut Graph,
        vs: &[ValueId],
        at: NodeId,
    ) -> Result<Option<ValueId>, IrError> {
        let parts: Vec<ValueId> = vs
            .iter()
            .flat_map(|v| self.parts.remove(v).unwrap_or_default())
            .collect();
        sum(g, &parts, at)
    }
}

/// The sum of `parts` as a chain of backward `Add`s in `at`'s module, named
/// after `at` (`None` for no parts; the part itself for one).
fn sum(g: &mut Graph, parts: &[ValueId], at: NodeId) -> Result<Option<ValueId>, IrError> {
    let Some((&first, rest)) = parts.split_first() else {
        return Ok(None);
    };
    let node = g.node(at).clone();
    let mut total = first;
    for &p in rest {
        let add = Op::Binary { f: BinaryFn::Add };
        let n = g.add(
            add,
            &[total, p],
            format!("grad({})", node.name),
            node.module,
        )?;
        g.node_mut(n).phase = Phase::Backward;
        total = ValueId { node: n, slot: 0 };
    }
    Ok(Some(total))
}

/// Applies the VJP of forward node `n` to its output's total gradient.
fn backprop_node(
    g: &mut Graph,
    acc: &mut Accumulator,
    relevant: &HashSet<NodeId>,
    n: NodeId,
) -> Result<(), IrError> {
    let outputs: Vec<ValueId> = (0..g.node(n).outputs.len() as u32)
        .map(|slot| ValueId { node: n, slot })
        .collect();
    if outputs.len() != 1 {
        let name = &g.node(n).name;
        return Err(IrError::Autodiff(format!(
            "`{name}` ({}) has {} outputs; only single-output ops are differentiable",
            g.node(n).op.name(),
            outputs.len()
        )));
    }
    let Some(dy) = acc.total(g, &outputs, n)? else {
        return Ok(());
    };
    let inputs = g.inputs(n);
    let needs: Vec<bool> = inputs
        .iter()
        .map(|&v| relevant.contains(&v.node) && is_float(g, v))
        .collect();
    let grads = crate::ops::vjp(g, n, dy, &needs)?;
    for (v, dv) in inputs.into_iter().zip(grads) {
        if let Some(dv) = dv {
            acc.add(v, dv);
        }
    }
    Ok(())
}

/// The gradient of every trainable parameter the loss depends on, in
/// `ParamId` order, each an owned value (see `build_training_program`).
fn param_grads(
    g: &mut Graph,
    acc: &mut Accumulator,
    relevant: &HashSet<NodeId>,
) -> Result<Vec<ParamGrad>, IrError> {
    let mut nodes: BTreeMap<ParamId, Vec<NodeId>> = BTreeMap::new();
    for n in g.node_ids() {
        if let Op::Param { param } = g.node(n).op {
            if relevant.contains(&n) {
                nodes.entry(param).or_default().push(n);
            }
        }
    }
    let ties = tie_groups(g, &nodes);
    let mut totals: HashMap<ParamId, ValueId> = HashMap::new();
    for (&param, ns) in &nodes {
        let values: Vec<ValueId> = ns.iter().map(|&node| ValueId { node, slot: 0 }).collect();
        if let Some(t) = acc.total(g, &values, ns[0])? {
            totals.insert(param, t);
        }
    }
    let mut natural = Vec::new();
    for (&param, ns) in &nodes {
        if let Some(grad) = tied_total(g, &ties, &totals, param, ns[0])? {
            natural.push((param, grad, ns[0]));
        }
    }
    let mut wanted: HashMap<ValueId, usize> = HashMap::new();
    for (_, grad, _) in &natural {
        *wanted.entry(*grad).or_default() += 1;
    }
    let mut out = Vec::new();
    for (param, grad, at) in natural {
        let grad = owned(g, grad, wanted[&grad] > 1, at)?;
        out.push(ParamGrad { param, grad });
    }
    Ok(out)
}

/// For each differentiated parameter, the parameters tied with it (itself
/// included): a `tied_to` link joins both ends.
fn tie_groups(g: &Graph, nodes: &BTreeMap<ParamId, Vec<NodeId>>) -> HashMap<ParamId, Vec<ParamId>> {
    let mut groups: HashMap<ParamId, Vec<ParamId>> = HashMap::new();
    for &p in nodes.keys() {
        groups.entry(p).or_default().push(p);
    }
    for (i, spec) in g.params.iter().enumerate() {
        let p = ParamId(i as u32);
        let Some(t) = spec.tied_to.filter(|t| *t != p) else {
            continue;
        };
        if nodes.contains_key(&p) && nodes.contains_key(&t) {
            groups.entry(p).or_default().push(t);
            groups.entry(t).or_default().push(p);
        }
    }
    groups
}

/// The sum of the totals of `param`'s tie group (just its own total when it
/// is tied to nothing).
fn tied_total(
    g: &mut Graph,
    ties: &HashMap<ParamId, Vec<ParamId>>,
    totals: &HashMap<ParamId, ValueId>,
    param: ParamId,
    at: NodeId,
) -> Result<Option<ValueId>, IrError> {
    let mut group = ties.get(&param).cloned().unwrap_or_else(|| vec![param]);
    group.sort();
    group.dedup();
    let parts: Vec<ValueId> = group
        .iter()
        .filter_map(|p| totals.get(p).copied())
        .collect();
    sum(g, &parts, at)
}

/// `grad` itself if it is a value of its own (produced by a backward,
/// non-source node, read by nothing, not `shared` with another parameter),
/// else an explicit copy of it in `param_node`'s module. Decided for every
/// parameter before any copy is added, so a copy never makes another
/// parameter's grad a value that is read.
fn owned(
    g: &mut Graph,
    grad: ValueId,
    shared: bool,
    param_node: NodeId,
) -> Result<ValueId, IrError> {
    let node = g.node(grad.node);
    let own = node.phase == Phase::Backward
        && !node.op.is_source()
        && g.users(grad).is_empty()
        && !shared;
    if own {
        return Ok(grad);
    }
    let shape = g.value_type(grad).shape.0.clone();
    let p = g.node(param_node).clone();
    let n = g.add(
        Op::Reshape { shape },
        &[grad],
        format!("grad({})", p.name),
        p.module,
    )?;
    g.node_mut(n).phase = Phase::Backward;
    Ok(ValueId { node: n, slot: 0 })
}
