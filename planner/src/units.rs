//! The units pass: picks the FSDP units from the module tree with a wrap
//! policy, and decides which unit owns each parameter and each node.
//!
//! Unit 0 is always the root unit (the model's root module). It is kept even
//! when no parameter is left for it, so that `UnitId(0)` always means "root".
//! Units may nest (a size-based or path policy can wrap a module and one of its
//! descendants); a node belongs to the innermost unit containing its module.
//! A parameter belongs to the unit of its `Param` node's module. A parameter
//! that nodes of other units read too (a tied embedding and output
//! projection) is placed by `SharedParams` (`--shared-params`):
//! - `root` (the default): the innermost unit that contains all its readers,
//!   normally the root. The root is gathered once for the whole step, so
//!   the shared parameter costs no extra all-gather, but its full size is
//!   held for the whole step.
//! - `owner`: the unit of its `Param` node's module, the module that
//!   defines it (for the tied GPT embedding, `transformer.wte`, which is
//!   also where its first reader, the token lookup, lives). Every other
//!   unit's step that reads it opens a window of the owner (the schedule
//!   gathers any unit whose parameter a step reads, and `schedule::shared`
//!   splits the owner's window where other units run in between), so the
//!   owner is gathered again around the head in forward: one more
//!   all-gather of it per step, and it is not held through the blocks. Autodiff already sums the
//!   gradient contributions of every use into one value, which the owner's
//!   flat gradient receives once, before its one reduce-scatter.
//!
//! Parameters tied by `tied_to` (two storages a frontend found equal) still
//! go to one unit containing both, under either rule.

use crate::error::PlanError;
use fsdpc_ir::{Graph, ModuleId, NodeId, Op, ParamId, ValueId};
use fsdpc_plan::{SharedParams, UnitId, WrapPolicy};
use std::collections::{BTreeMap, BTreeSet};

/// One unit as the units pass decided it.
#[derive(Clone, Debug, PartialEq)]
pub struct UnitDef {
    pub module: ModuleId,
    /// The module path (empty for the root).
    pub path: String,
    pub kind: String,
    /// The enclosing unit (`None` for the root).
    pub parent: Option<UnitId>,
    /// Parameters held by this unit, in `ParamId` order.
    pub params: Vec<ParamId>,
}

/// The units and who belongs to which.
#[derive(Clone, Debug, PartialEq)]
pub struct UnitAssignment {
    pub units: Vec<UnitDef>,
    /// Unit of each parameter, indexed by `ParamId`.
    pub param_unit: Vec<UnitId>,
    /// Unit of each node, indexed by `NodeId` (ids not in the graph: root).
    pub node_unit: Vec<UnitId>,
}

impl UnitAssignment {
    /// The unit of node `n`.
    pub fn unit_of_node(&self, n: NodeId) -> UnitId {
        self.node_unit
            .get(n.0 as usize)
            .copied()
            .unwrap_or(UnitId(0))
    }
}

/// Picks units with `policy` and assigns every parameter and node to one;
/// shared parameters go to the root (`SharedParams::Root`).
pub fn assign_units(graph: &Graph, policy: &WrapPolicy) -> Result<UnitAssignment, PlanError> {
    assign_units_with(graph, policy, SharedParams::Root)
}

/// `assign_units` with the placement rule `shared` for parameters read by
/// several units.
pub fn assign_units_with(
    graph: &Graph,
    policy: &WrapPolicy,
    shared: SharedParams,
) -> Result<UnitAssignment, PlanError> {
    let tree = ModuleTree::new(graph)?;
    let mut roots: Vec<ModuleId> = match policy {
        WrapPolicy::Blocks => blocks(graph, &tree),
        WrapPolicy::Kind { kind } => by_kind(graph, &tree, kind)?,
        WrapPolicy::Size { min_numel } => by_size(graph, &tree, *min_numel),
        WrapPolicy::Paths { paths } => by_paths(graph, paths)?,
    };
    roots.retain(|&m| m != ModuleId::ROOT);
    roots.sort();
    roots.dedup();
    roots.insert(0, ModuleId::ROOT);
    let module_unit = tree.module_units(&roots);
    let unit_parent = unit_parents(&tree, &roots, &module_unit);
    let node_unit = node_units(graph, &module_unit);
    let param_unit = param_units(graph, &unit_parent, &node_unit, shared);
    let units = roots
        .iter()
        .enumerate()
        .map(|(i, &m)| UnitDef {
            module: m,
            path: graph.modules[m.0 as usize].path.clone(),
            kind: graph.modules[m.0 as usize].kind.clone(),
            parent: unit_parent[i],
            params: (0..param_unit.len())
                .filter(|&p| param_unit[p].index() == i)
                .map(|p| ParamId(p as u32))
                .collect(),
        })
        .collect();
    Ok(UnitAssignment {
        units,
        param_unit,
        node_unit,
    })
}

/// Parents, children and depths of the module tree, checked for cycles.
struct ModuleTree {
    parent: Vec<Option<ModuleId>>,
    children: Vec<Vec<ModuleId>>,
    depth: Vec<u32>,
}

impl ModuleTree {
    fn new(graph: &Graph) -> Result<ModuleTree, PlanError> {
        let n = graph.modules.len();
        let parent: Vec<Option<ModuleId>> = graph
            .modules
            .iter()
            .enumerate()
            .map(|(i, m)| m.parent.filter(|_| i != 0))
            .collect();
        let mut depth = vec![0u32; n];
        for (i, d) in depth.iter_mut().enumerate() {
            let mut m = i;
            let mut steps = 0u32;
            while let Some(p) = parent[m] {
                m = p.0 as usize;
                steps += 1;
                if steps as usize > n || m >= n {
                    return Err(PlanError::Program {
                        reason: format!(
                            "module `{}` has a cyclic parent chain",
                            graph.modules[i].path
                        ),
                    });
                }
            }
            *d = steps;
        }
        let mut children = vec![Vec::new(); n];
        for (i, p) in parent.iter().enumerate() {
            if let Some(p) = p {
                children[p.0 as usize].push(ModuleId(i as u32));
            }
        }
        Ok(ModuleTree {
            parent,
            children,
            depth,
        })
    }

    /// The innermost unit (index into `roots`) containing each module.
    fn module_units(&self, roots: &[ModuleId]) -> Vec<UnitId> {
        let mut unit_of: Vec<Option<UnitId>> = vec![None; self.parent.len()];
        for (i, &m) in roots.iter().enumerate() {
            unit_of[m.0 as usize] = Some(UnitId(i as u32));
        }
        let mut order: Vec<usize> = (0..self.parent.len()).collect();
        order.sort_by_key(|&m| self.depth[m]);
        let mut out = vec![UnitId(0); self.parent.len()];
        for m in order {
            out[m] = match (unit_of[m], self.parent[m]) {
                (Some(u), _) => u,
                (None, Some(p)) => out[p.0 as usize],
                (None, None) => UnitId(0),
            };
        }
        out
    }

    fn is_within(&self, mut m: ModuleId, ancestor: ModuleId) -> bool {
        while self.depth[m.0 as usize] > self.depth[ancestor.0 as usize] {
            match self.parent[m.0 as usize] {
                Some(p) => m = p,
                None => return false,
            }
        }
        m == ancestor
    }
}

/// `Blocks`: the numbered children of a module that share one kind,
/// outermost lists only. A child is numbered by its index (`h.0`, `h.1`,
/// ...: a `ModuleList` or `Sequential`), or by a common name with `_0`,
/// `_1`, ... appended (torchvision's ViT `encoder_layer_0`, ...: an
/// `OrderedDict`), which counts as a list only when it runs from 0 without
/// a gap and has at least two entries.
fn blocks(graph: &Graph, tree: &ModuleTree) -> Vec<ModuleId> {
    let mut found: Vec<ModuleId> = Vec::new();
    for kids in &tree.children {
        // Numbered children by the name they share ("" for bare indices).
        let mut lists: BTreeMap<&str, Vec<(u64, ModuleId)>> = BTreeMap::new();
        for &k in kids {
            if let Some((name, i)) = numbered(last_segment(&graph.modules[k.0 as usize].path)) {
                lists.entry(name).or_default().push((i, k));
            }
        }
        for (name, mut list) in lists {
            list.sort_unstable();
            let kinds: BTreeSet<&str> = list
                .iter()
                .map(|(_, k)| graph.modules[k.0 as usize].kind.as_str())
                .collect();
            let sequence = name.is_empty()
                || (list.len() >= 2 && list.iter().enumerate().all(|(j, (i, _))| *i == j as u64));
            if kinds.len() == 1 && sequence {
                found.extend(list.into_iter().map(|(_, k)| k));
            }
        }
    }
    outermost(tree, found)
}

/// `("", i)` for a bare index `i`, `(name, i)` for `name_i`.
fn numbered(segment: &str) -> Option<(&str, u64)> {
    if let Ok(i) = segment.parse::<u64>() {
        return Some(("", i));
    }
    let (name, i) = segment.rsplit_once('_')?;
    (!name.is_empty()).then_some(())?;
    Some((name, i.parse().ok()?))
}

fn last_segment(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

/// Drops modules that lie inside another module of the list.
fn outermost(tree: &ModuleTree, mut mods: Vec<ModuleId>) -> Vec<ModuleId> {
    mods.sort_by_key(|m| tree.depth[m.0 as usize]);
    let mut kept: Vec<ModuleId> = Vec::new();
    for m in mods {
        if !kept.iter().any(|&k| tree.is_within(m, k)) {
            kept.push(m);
        }
    }
    kept
}

/// `Kind`: every outermost module of class `kind`.
fn by_kind(graph: &Graph, tree: &ModuleTree, kind: &str) -> Result<Vec<ModuleId>, PlanError> {
    let found: Vec<ModuleId> = (1..graph.modules.len())
        .filter(|&i| graph.modules[i].kind == kind)
        .map(|i| ModuleId(i as u32))
        .collect();
    if found.is_empty() {
        let kinds: BTreeSet<&str> = graph.modules.iter().map(|m| m.kind.as_str()).collect();
        return Err(PlanError::BadConfig {
            what: "wrap policy",
            value: format!("kind:{kind}"),
            reason: format!(
                "no module of that class; the model has: {}",
                kinds.into_iter().collect::<Vec<_>>().join(", ")
            ),
        });
    }
    Ok(outermost(tree, found))
}

/// `Size`: bottom-up, a module becomes a unit when the parameter elements in
/// its subtree that no smaller unit took reach `min_numel` (PyTorch's
/// `size_based_auto_wrap_policy`). The root is never wrapped by this rule.
fn by_size(graph: &Graph, tree: &ModuleTree, min_numel: u64) -> Vec<ModuleId> {
    let mut own = vec![0u64; graph.modules.len()];
    for n in graph.node_ids() {
        let node = graph.node(n);
        if let Op::Param { param } = node.op {
            if let (Some(spec), Some(o)) = (
                graph.params.get(param.0 as usize),
                own.get_mut(node.module.0 as usize),
            ) {
                *o += spec.ty.numel();
            }
        }
    }
    let mut order: Vec<usize> = (0..graph.modules.len()).collect();
    order.sort_by_key(|&m| std::cmp::Reverse(tree.depth[m]));
    let mut left = own;
    let mut wrapped = Vec::new();
    for m in order {
        if m != 0 && left[m] >= min_numel {
            wrapped.push(ModuleId(m as u32));
            left[m] = 0;
        }
        if let Some(p) = tree.parent[m] {
            left[p.0 as usize] += left[m];
        }
    }
    wrapped
}

/// `Paths`: exactly these modules.
fn by_paths(graph: &Graph, paths: &[String]) -> Result<Vec<ModuleId>, PlanError> {
    paths
        .iter()
        .map(|p| {
            graph.module_by_path(p).ok_or_else(|| PlanError::BadConfig {
                what: "wrap policy",
                value: format!("paths:{}", paths.join(",")),
                reason: format!("the model has no module `{p}`"),
            })
        })
        .collect()
}

fn unit_parents(
    tree: &ModuleTree,
    roots: &[ModuleId],
    module_unit: &[UnitId],
) -> Vec<Option<UnitId>> {
    roots
        .iter()
        .map(|&m| tree.parent[m.0 as usize].map(|p| module_unit[p.0 as usize]))
        .collect()
}

fn node_units(graph: &Graph, module_unit: &[UnitId]) -> Vec<UnitId> {
    let len = graph
        .node_ids()
        .map(|n| n.0 as usize + 1)
        .max()
        .unwrap_or(0);
    let mut out = vec![UnitId(0); len];
    for n in graph.node_ids() {
        let m = graph.node(n).module.0 as usize;
        out[n.0 as usize] = module_unit.get(m).copied().unwrap_or(UnitId(0));
    }
    out
}

/// Each parameter's unit: with `Root`, the innermost unit containing its
/// `Param` node and every node that reads it; with `Owner`, its `Param`
/// node's unit. Either way also containing the parameter it is tied to.
fn param_units(
    graph: &Graph,
    unit_parent: &[Option<UnitId>],
    node_unit: &[UnitId],
    shared: SharedParams,
) -> Vec<UnitId> {
    let mut out = vec![UnitId(0); graph.params.len()];
    let mut seen: BTreeMap<usize, UnitId> = BTreeMap::new();
    for n in graph.node_ids() {
        let Op::Param { param } = graph.node(n).op else {
            continue;
        };
        let p = param.0 as usize;
        if p >= out.len() {
            continue;
        }
        let mut u = node_unit[n.0 as usize];
        if shared == SharedParams::Root {
            for (reader, _) in graph.users(ValueId { node: n, slot: 0 }) {
                u = common_unit(unit_parent, u, node_unit[reader.0 as usize]);
            }
        }
        let u = match seen.get(&p) {
            Some(&prev) => common_unit(unit_parent, prev, u),
            None => u,
        };
        seen.insert(p, u);
        out[p] = u;
    }
    for p in 0..out.len() {
        if let Some(t) = graph.params[p]
            .tied_to
            .map(|t| t.0 as usize)
            .filter(|&t| t < out.len())
        {
            let u = common_unit(unit_parent, out[p], out[t]);
            out[p] = u;
            out[t] = u;
        }
    }
    out
}

/// The innermost unit containing both `a` and `b`.
fn common_unit(unit_parent: &[Option<UnitId>], a: UnitId, b: UnitId) -> UnitId {
    let chain = |mut u: UnitId| {
        let mut c = vec![u];
        while let Some(p) = unit_parent.get(u.index()).copied().flatten() {
            if c.len() > unit_parent.len() {
                break;
            }
            c.push(p);
            u = p;
        }
        c
    };
    let ca = chain(a);
    let cb = chain(b);
    ca.into_iter().find(|u| cb.contains(u)).unwrap_or(UnitId(0))
}

#[cfg(test)]
mod tests {
    use super::numbered;

    /// Bare indices and `name_i` are numbered; other names are not.
    #[test]
    fn numbered_children() {
        assert_eq!(numbered("3"), Some(("", 3)));
        assert_eq!(numbered("encoder_layer_11"), Some(("encoder_layer", 11)));
        assert_eq!(numbered("relu_1"), Some(("relu", 1)));
        assert_eq!(numbered("relu"), None);
        assert_eq!(numbered("_2"), None);
        assert_eq!(numbered("layer_norm"), None);
    }
}
