//! Recomputation (activation checkpointing): rewrites the training program
//! so that a checkpointed unit re-runs its forward in backward (PyTorch's
//! `apply_activation_checkpointing`), and everything after it (schedule,
//! memory plan, verifier, runtime) sees an ordinary program.
//!
//! For each checkpointed unit U:
//! - the forward values of U that U's backward nodes read are *needed*; the
//!   forward, non-source nodes of U that produce them, transitively inside U,
//!   are cloned into the backward phase (same op, so a dropout keeps its seed
//!   and its mask; same module, so the clone falls into U; named
//!   `recompute(<name>)`). Sources (`Param`, `Input`, `Constant`) are shared.
//! - a clone reads the clones of its inputs produced inside U, and the
//!   original value of inputs from outside U (the saved unit input);
//! - U's backward nodes read the clones instead of U's forward values, so
//!   those die at the end of forward. Backward nodes of other units keep
//!   reading U's forward values (U's output is the next unit's saved input).
//!
//! Node ids decide the schedule (`topo_order` breaks ties by id), so the
//! result is renumbered with U's clones immediately before the first backward
//! node of U that reads one: each unit recomputes just in time, inside the
//! backward window in which its parameters are gathered anyway.
//!
//! Under `CheckpointPolicy::Ops` some forward nodes of each unit are kept
//! (`kept_by_op`): they are never cloned, and clones and backward nodes
//! read their values as they read values from outside the unit.
//!
//! The pass is idempotent: in a rewritten program no backward node of a
//! checkpointed unit reads that unit's forward values but the kept ones.

use crate::error::PlanError;
use crate::units::UnitAssignment;
use fsdpc_ir::{Graph, Node, NodeId, Phase, TrainingProgram, ValueId};
use fsdpc_plan::{CheckpointPolicy, UnitId};
use std::collections::{BTreeSet, HashMap};

/// Prefix of the name of every clone the pass adds.
pub const RECOMPUTE_PREFIX: &str = "recompute(";

/// True if `node` is a forward node's recomputation added by this pass (a
/// backward node named `recompute(<name>)`; autodiff names backward nodes
/// `grad(<name>)`).
pub fn is_recompute(node: &Node) -> bool {
    node.phase == Phase::Backward && node.name.starts_with(RECOMPUTE_PREFIX)
}

/// The rewritten program: `program` itself when `policy` checkpoints nothing
/// or no unit's backward reads its own forward values.
pub fn apply(
    program: TrainingProgram,
    assign: &UnitAssignment,
    policy: CheckpointPolicy,
) -> Result<TrainingProgram, PlanError> {
    let units = selected_units(assign, &policy)?;
    if units.is_empty() {
        return Ok(program);
    }
    let order = program
        .graph
        .topo_order()
        .map_err(|cycle| PlanError::Program {
            reason: format!("the graph has a cycle through {} nodes", cycle.len()),
        })?;
    let saved = match policy {
        CheckpointPolicy::Ops => kept_by_op(&program.graph, assign, &units, &order),
        _ => BTreeSet::new(),
    };
    let scope = Scope {
        graph: &program.graph,
        assign,
        units: &units,
        saved: &saved,
    };
    let marked = scope.marked(&order);
    if marked.is_empty() {
        return Ok(program);
    }
    let mut graph = program.graph.clone();
    let clones = add_clones(&mut graph, &scope, &order, &marked);
    rewire(&mut graph, &scope, &order, &clones.of);
    let new_order = emission_order(&graph, &scope, &order, &clones);
    renumber(program, graph, &new_order)
}

/// The units `policy` checkpoints, in unit order: never the root unit
/// (unit 0). `Every(k)` counts non-root units from the first; `Paths` must
/// each name a unit's module path and `Kind` must match at least one unit,
/// else `PlanError::BadConfig` names what was asked for and lists the units.
pub fn selected_units(
    assign: &UnitAssignment,
    policy: &CheckpointPolicy,
) -> Result<BTreeSet<UnitId>, PlanError> {
    let non_root = || {
        assign
            .units
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, u)| (UnitId(i as u32), u))
    };
    let bad = |reason: String| PlanError::BadConfig {
        what: "activation checkpointing",
        value: policy.name(),
        reason,
    };
    match policy {
        CheckpointPolicy::None => Ok(BTreeSet::new()),
        CheckpointPolicy::Units | CheckpointPolicy::Ops => {
            Ok(non_root().map(|(id, _)| id).collect())
        }
        CheckpointPolicy::Every(0) => Err(bad("K must be at least 1".to_string())),
        CheckpointPolicy::Every(k) => {
            let k = *k as usize;
            Ok(non_root()
                .enumerate()
                .filter(|(i, _)| i % k == 0)
                .map(|(_, (id, _))| id)
                .collect())
        }
        CheckpointPolicy::Paths(paths) => paths
            .iter()
            .map(|p| {
                non_root()
                    .find(|(_, u)| u.path == *p)
                    .map(|(id, _)| id)
                    .ok_or_else(|| {
                        bad(format!(
                            "`{p}` is not the module path of a unit; the units are: {}",
                            unit_list(assign, |u| u.path.clone())
                        ))
                    })
            })
            .collect(),
        CheckpointPolicy::Kind(kind) => {
            let out: BTreeSet<UnitId> = non_root()
                .filter(|(_, u)| u.kind == *kind)
                .map(|(id, _)| id)
                .collect();
            if out.is_empty() {
                let kinds: BTreeSet<&str> = non_root().map(|(_, u)| u.kind.as_str()).collect();
                let kinds: Vec<&str> = kinds.into_iter().collect();
                return Err(bad(format!(
                    "no unit is a `{kind}`; the units' classes are: {}",
                    if kinds.is_empty() {
                        "(no unit but the root)".to_string()
                    } else {
                        kinds.join(", ")
                    }
                )));
            }
            Ok(out)
        }
    }
}

/// The forward nodes of the checkpointed `units` whose outputs the `Ops`
/// policy keeps: every attention, and the first, third, ... matrix product
/// of each unit in forward order (torchtitan's selective op policy, which
/// recomputes every second `mm`).
fn kept_by_op(
    graph: &Graph,
    assign: &UnitAssignment,
    units: &BTreeSet<UnitId>,
    order: &[NodeId],
) -> BTreeSet<NodeId> {
    let mut products: HashMap<UnitId, usize> = HashMap::new();
    let mut kept = BTreeSet::new();
    for &n in order {
        let node = graph.node(n);
        let u = assign.unit_of_node(n);
        if node.phase != Phase::Forward || !units.contains(&u) {
            continue;
        }
        match node.op {
            fsdpc_ir::Op::Attention { .. } => {
                kept.insert(n);
            }
            fsdpc_ir::Op::MatMul { .. } => {
                let count = products.entry(u).or_insert(0);
                *count += 1;
                if *count % 2 == 1 {
                    kept.insert(n);
                }
            }
            _ => {}
        }
    }
    kept
}

/// The non-root units of `assign`, each as `show` names it, comma-separated.
fn unit_list(assign: &UnitAssignment, show: impl Fn(&crate::units::UnitDef) -> String) -> String {
    let names: Vec<String> = assign.units.iter().skip(1).map(show).collect();
    if names.is_empty() {
        "(no unit but the root)".to_string()
    } else {
        names.join(", ")
    }
}

/// Which nodes the pass looks at.
struct Scope<'a> {
    graph: &'a Graph,
    assign: &'a UnitAssignment,
    units: &'a BTreeSet<UnitId>,
    /// Forward nodes of checkpointed units whose outputs are kept, read by
    /// the backward and the clones as values from outside the unit are
    /// (`CheckpointPolicy::Ops`).
    saved: &'a BTreeSet<NodeId>,
}

impl Scope<'_> {
    /// The unit of `n` if it is checkpointed.
    fn checkpointed_unit(&self, n: NodeId) -> Option<UnitId> {
        Some(self.assign.unit_of_node(n)).filter(|u| self.units.contains(u))
    }

    /// The unit of `n` if `n` is a forward, non-source node of a
    /// checkpointed unit (a node that may be recomputed).
    fn forward_unit(&self, n: NodeId) -> Option<UnitId> {
        let node = self.graph.node(n);
        if node.phase != Phase::Forward || node.op.is_source() || self.saved.contains(&n) {
            return None;
        }
        self.checkpointed_unit(n)
    }

    /// The unit of `n` if `n` is a backward node of a checkpointed unit.
    fn backward_unit(&self, n: NodeId) -> Option<UnitId> {
        if self.graph.node(n).phase != Phase::Backward {
            return None;
        }
        self.checkpointed_unit(n)
    }

    /// True if input `v` of a node in unit `u` is recomputed in `u`.
    fn recomputed_in(&self, v: ValueId, u: UnitId) -> bool {
        self.forward_unit(v.node) == Some(u)
    }

    /// The forward nodes to clone: those whose values their unit's backward
    /// reads, and (walking `order` backwards) their producers in that unit.
    fn marked(&self, order: &[NodeId]) -> BTreeSet<NodeId> {
        let mut marked = BTreeSet::new();
        for &n in order {
            let Some(u) = self.backward_unit(n) else {
                continue;
            };
            let inputs = self.graph.inputs(n);
            marked.extend(
                inputs
                    .into_iter()
                    .filter(|&v| self.recomputed_in(v, u))
                    .map(|v| v.node),
            );
        }
        for &n in order.iter().rev() {
            let Some(u) = self.forward_unit(n).filter(|_| marked.contains(&n)) else {
                continue;
            };
            let inputs = self.graph.inputs(n);
            marked.extend(
                inputs
                    .into_iter()
                    .filter(|&v| self.recomputed_in(v, u))
                    .map(|v| v.node),
            );
        }
        marked
    }
}

/// The clones the pass added.
struct Clones {
    /// The clone of each marked forward node.
    of: HashMap<NodeId, NodeId>,
    /// Each unit's clones, in the forward's topological order.
    by_unit: HashMap<UnitId, Vec<NodeId>>,
}

/// Appends a backward clone of every marked node (in `order`, so a clone's
/// inputs exist before it), reading clones of inputs recomputed in its unit
/// and the original values of the rest.
fn add_clones(
    graph: &mut Graph,
    scope: &Scope,
    order: &[NodeId],
    marked: &BTreeSet<NodeId>,
) -> Clones {
    let mut clones = Clones {
        of: HashMap::new(),
        by_unit: HashMap::new(),
    };
    for &n in order.iter().filter(|n| marked.contains(n)) {
        let Some(u) = scope.forward_unit(n) else {
            continue;
        };
        let inputs: Vec<ValueId> = scope
            .graph
            .inputs(n)
            .into_iter()
            .map(|v| clone_value(&clones.of, scope, v, u))
            .collect();
        let node = scope.graph.node(n);
        let clone = Node {
            name: format!("{RECOMPUTE_PREFIX}{})", node.name),
            phase: Phase::Backward,
            ..node.clone()
        };
        let c = graph.add_node_typed(clone, &inputs);
        clones.of.insert(n, c);
        clones.by_unit.entry(u).or_default().push(c);
    }
    clones
}

/// What a node of unit `u` reads in place of `v`: its clone when `v` is
/// recomputed in `u`, else `v`.
fn clone_value(of: &HashMap<NodeId, NodeId>, scope: &Scope, v: ValueId, u: UnitId) -> ValueId {
    match of.get(&v.node) {
        Some(&node) if scope.recomputed_in(v, u) => ValueId { node, ..v },
        _ => v,
    }
}

/// Points every backward node of a checkpointed unit at the clones of the
/// unit's forward values it reads.
fn rewire(graph: &mut Graph, scope: &Scope, order: &[NodeId], of: &HashMap<NodeId, NodeId>) {
    for &n in order {
        let Some(u) = scope.backward_unit(n) else {
            continue;
        };
        for (slot, v) in scope.graph.inputs(n).into_iter().enumerate() {
            let c = clone_value(of, scope, v, u);
            if c != v {
                graph.set_input(n, slot as u32, c);
            }
        }
    }
}

/// `order` with each unit's clones inserted just before the first node that
/// reads one of them.
fn emission_order(graph: &Graph, scope: &Scope, order: &[NodeId], clones: &Clones) -> Vec<NodeId> {
    let clone_unit: HashMap<NodeId, UnitId> = clones
        .by_unit
        .iter()
        .flat_map(|(&u, cs)| cs.iter().map(move |&c| (c, u)))
        .collect();
    let mut out = Vec::with_capacity(order.len() + clone_unit.len());
    let mut emitted: BTreeSet<UnitId> = BTreeSet::new();
    for &n in order {
        if scope.backward_unit(n).is_some() {
            for v in graph.inputs(n) {
                let Some(&u) = clone_unit.get(&v.node) else {
                    continue;
                };
                if emitted.insert(u) {
                    out.extend(clones.by_unit.get(&u).into_iter().flatten().copied());
                }
            }
        }
        out.push(n);
    }
    out
}

/// The program on `graph` renumbered in `order`, its loss and grads moved
/// with it.
fn renumber(
    program: TrainingProgram,
    graph: Graph,
    order: &[NodeId],
) -> Result<TrainingProgram, PlanError> {
    let (graph, map) = graph
        .reordered(order)
        .map_err(|reason| PlanError::Program {
            reason: format!("activation checkpointing: {reason}"),
        })?;
    let moved = |v: ValueId| -> Result<ValueId, PlanError> {
        map.get(&v.node)
            .map(|&node| ValueId { node, ..v })
            .ok_or_else(|| PlanError::Program {
                reason: format!("activation checkpointing lost value {v}"),
            })
    };
    let loss = moved(program.loss)?;
    let grads = program
        .grads
        .iter()
        .map(|g| {
            Ok(fsdpc_ir::ParamGrad {
                param: g.param,
                grad: moved(g.grad)?,
            })
        })
        .collect::<Result<Vec<_>, PlanError>>()?;
    Ok(TrainingProgram {
        graph,
        loss,
        grads,
        optimizer: program.optimizer,
    })
}
