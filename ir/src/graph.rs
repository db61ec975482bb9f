//! The dataflow graph. Nodes are operations; an edge carries one tensor from an
//! output slot of its source to an input slot of its target. petgraph's indices
//! stay inside this module: the public API speaks `NodeId` and `ValueId`.

use crate::buffer::{ModuleBufferId, ModuleBufferSpec};
use crate::op::Op;
use crate::param::{ParamId, ParamSpec};
use crate::types::TensorType;
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::fmt;

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(pub u32);

/// One output of one node.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ValueId {
    pub node: NodeId,
    pub slot: u32,
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.0)
    }
}

impl fmt::Display for ValueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.slot == 0 {
            write!(f, "{}", self.node)
        } else {
            write!(f, "{}.{}", self.node, self.slot)
        }
    }
}

/// Index into `Graph::modules`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ModuleId(pub u32);

impl ModuleId {
    pub const ROOT: ModuleId = ModuleId(0);
}

/// A module of the model's hierarchy, as PyTorch users know it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Module {
    /// Full dotted path (`transformer.h.3.mlp`); empty for the root.
    pub path: String,
    /// The module's class (`GPT2Block`, `Linear`).
    pub kind: String,
    pub parent: Option<ModuleId>,
}

/// Whether a node belongs to the forward pass (including the loss) or to the
/// backward pass produced by autodiff.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    #[default]
    Forward,
    Backward,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub op: Op,
    /// A readable name (`h.0.attn.qkv`), unique or not.
    pub name: String,
    pub module: ModuleId,
    pub phase: Phase,
    /// The type of each output, filled in when the node is added.
    pub outputs: Vec<TensorType>,
}

/// Edge weight: which output slot feeds which input slot.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
struct Edge {
    src_slot: u32,
    dst_slot: u32,
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub name: String,
    g: StableDiGraph<Node, Edge>,
    pub params: Vec<ParamSpec>,
    /// Module buffers (running statistics), read by `Op::ModuleBuffer`.
    pub buffers: Vec<ModuleBufferSpec>,
    pub modules: Vec<Module>,
    module_by_path: HashMap<String, ModuleId>,
    /// The graph's results (a forward graph's outputs; a training program's loss).
    pub outputs: Vec<ValueId>,
}

impl Graph {
    /// An empty graph named `name` with only the root module.
    pub fn new(name: impl Into<String>) -> Graph {
        let mut g = Graph {
            name: name.into(),
            ..Graph::default()
        };
        g.modules.push(Module {
            path: String::new(),
            kind: "Root".into(),
            parent: None,
        });
        g.module_by_path.insert(String::new(), ModuleId::ROOT);
        g
    }

    // ---- modules ----

    /// Interns the module at `path` (dotted) with class `kind`, creating its
    /// ancestors (with kind `Module`) if they are missing.
    pub fn module(&mut self, path: &str, kind: &str) -> ModuleId {
        if let Some(&id) = self.module_by_path.get(path) {
            return id;
        }
        let parent = match path.rfind('.') {
            Some(i) => self.module(&path[..i], "Module"),
            None => ModuleId::ROOT,
        };
        let id = ModuleId(self.modules.len() as u32);
        self.modules.push(Module {
            path: path.to_string(),
            kind: kind.to_string(),
            parent: Some(parent),
        });
        self.module_by_path.insert(path.to_string(), id);
        id
    }

    /// Sets the class of an existing module (ancestors are created as `Module`).
    pub fn set_module_kind(&mut self, id: ModuleId, kind: &str) {
        self.modules[id.0 as usize].kind = kind.to_string();
    }

    /// The module `id` (panics if it does not exist).
    pub fn module_info(&self, id: ModuleId) -> &Module {
        &self.modules[id.0 as usize]
    }

    /// The module at dotted `path`, if any.
    pub fn module_by_path(&self, path: &str) -> Option<ModuleId> {
        self.module_by_path.get(path).copied()
    }

    /// True if `m` is `ancestor` or lies below it.
    pub fn module_within(&self, mut m: ModuleId, ancestor: ModuleId) -> bool {
        loop {
            if m == ancestor {
                return true;
            }
            match self.modules[m.0 as usize].parent {
                Some(p) => m = p,
                None => return false,
            }
        }
    }

    // ---- parameters ----

    /// Registers a parameter without a node (see `add_param`).
    pub fn add_param_spec(&mut self, spec: ParamSpec) -> ParamId {
        self.params.push(spec);
        ParamId(self.params.len() as u32 - 1)
    }

    /// The parameter `id` (panics if it does not exist).
    pub fn param(&self, id: ParamId) -> &ParamSpec {
        &self.params[id.0 as usize]
    }

    // ---- module buffers ----

    /// Adds module buffer `spec` and the node that reads it, in `module`.
    pub fn add_buffer(&mut self, spec: ModuleBufferSpec, module: ModuleId) -> ValueId {
        let ty = spec.ty.clone();
        let name = spec.name.clone();
        self.buffers.push(spec);
        let buffer = ModuleBufferId(self.buffers.len() as u32 - 1);
        let n = self.add_node_typed(
            Node {
                op: Op::ModuleBuffer { buffer },
                name,
                module,
                phase: Phase::Forward,
                outputs: vec![ty],
            },
            &[],
        );
        ValueId { node: n, slot: 0 }
    }

    /// The module buffer `id` (panics if it does not exist).
    pub fn buffer(&self, id: ModuleBufferId) -> &ModuleBufferSpec {
        &self.buffers[id.0 as usize]
    }

    /// The node that writes each written module buffer.
    pub fn buffer_writes(&self) -> HashMap<ModuleBufferId, NodeId> {
        self.node_ids()
            .filter_map(|n| match self.node(n).op {
                Op::WriteBuffer { buffer } => Some((buffer, n)),
                _ => None,
            })
            .collect()
    }

    // ---- nodes ----

    /// Adds a node with already known output types. Builders normally call
    /// `Graph::add` (or the helpers in `crate::builder`), which infer them.
    pub fn add_node_typed(&mut self, node: Node, inputs: &[ValueId]) -> NodeId {
        let idx = self.g.add_node(node);
        for (dst_slot, v) in inputs.iter().enumerate() {
            self.g.add_edge(
                NodeIndex::new(v.node.0 as usize),
                idx,
                Edge {
                    src_slot: v.slot,
                    dst_slot: dst_slot as u32,
                },
            );
        }
        NodeId(idx.index() as u32)
    }

    /// True if node `n` exists.
    pub fn contains(&self, n: NodeId) -> bool {
        self.g.contains_node(NodeIndex::new(n.0 as usize))
    }

    /// Node `n` (panics if it does not exist; see `try_node`).
    pub fn node(&self, n: NodeId) -> &Node {
        &self.g[NodeIndex::new(n.0 as usize)]
    }

    /// Node `n`, mutably (panics if it does not exist).
    pub fn node_mut(&mut self, n: NodeId) -> &mut Node {
        &mut self.g[NodeIndex::new(n.0 as usize)]
    }

    /// Node `n`, if it exists.
    pub fn try_node(&self, n: NodeId) -> Option<&Node> {
        self.g.node_weight(NodeIndex::new(n.0 as usize))
    }

    /// The type of `v` (panics if it does not exist; see `try_value_type`).
    pub fn value_type(&self, v: ValueId) -> &TensorType {
        &self.node(v.node).outputs[v.slot as usize]
    }

    /// The type of `v`, or `None` if its node or output slot does not exist.
    pub fn try_value_type(&self, v: ValueId) -> Option<&TensorType> {
        self.try_node(v.node)?.outputs.get(v.slot as usize)
    }

    /// Number of nodes.
    pub fn node_count(&self) -> usize {
        self.g.node_count()
    }

    /// Node ids in insertion order (which builders keep topological).
    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.g.node_indices().map(|i| NodeId(i.index() as u32))
    }

    /// The inputs of `n`, in slot order.
    pub fn inputs(&self, n: NodeId) -> Vec<ValueId> {
        let mut ins: Vec<(u32, ValueId)> = self
            .g
            .edges_directed(NodeIndex::new(n.0 as usize), Direction::Incoming)
            .map(|e| {
                let w = e.weight();
                (
                    w.dst_slot,
                    ValueId {
                        node: NodeId(e.source().index() as u32),
                        slot: w.src_slot,
                    },
                )
            })
            .collect();
        ins.sort_by_key(|(s, _)| *s);
        ins.into_iter().map(|(_, v)| v).collect()
    }

    /// Every (consumer node, input slot) that reads `v`.
    pub fn users(&self, v: ValueId) -> Vec<(NodeId, u32)> {
        let mut out: Vec<(NodeId, u32)> = self
            .g
            .edges_directed(NodeIndex::new(v.node.0 as usize), Direction::Outgoing)
            .filter(|e| e.weight().src_slot == v.slot)
            .map(|e| (NodeId(e.target().index() as u32), e.weight().dst_slot))
            .collect();
        out.sort();
        out
    }

    /// Replaces input `slot` of `n` with `v`.
    pub fn set_input(&mut self, n: NodeId, slot: u32, v: ValueId) {
        let idx = NodeIndex::new(n.0 as usize);
        let old: Vec<_> = self
            .g
            .edges_directed(idx, Direction::Incoming)
            .filter(|e| e.weight().dst_slot == slot)
            .map(|e| e.id())
            .collect();
        for e in old {
            self.g.remove_edge(e);
        }
        self.g.add_edge(
            NodeIndex::new(v.node.0 as usize),
            idx,
            Edge {
                src_slot: v.slot,
                dst_slot: slot,
            },
        );
    }

    /// Points every reader of `from` at `to` instead, the graph's outputs
    /// too; `to`'s own node keeps reading `from` (a value inserted after
    /// `from` that reads it, such as a cast or a sum, takes its place).
    pub fn replace_uses(&mut self, from: ValueId, to: ValueId) {
        for (user, slot) in self.users(from) {
            if user != to.node {
                self.set_input(user, slot, to);
            }
        }
        for o in self.outputs.iter_mut().filter(|o| **o == from) {
            *o = to;
        }
    }

    /// Removes node `n` and its edges; other ids are unchanged.
    pub fn remove_node(&mut self, n: NodeId) -> Option<Node> {
        self.g.remove_node(NodeIndex::new(n.0 as usize))
    }

    /// A topological order of all nodes (ties broken by node id, so the order is
    /// deterministic). Returns the nodes of a cycle if there is one.
    pub fn topo_order(&self) -> Result<Vec<NodeId>, Vec<NodeId>> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let mut indeg: HashMap<NodeIndex, usize> = HashMap::new();
        let mut heap = BinaryHeap::new();
        for i in self.g.node_indices() {
            let d = self.g.edges_directed(i, Direction::Incoming).count();
            indeg.insert(i, d);
            if d == 0 {
                heap.push(Reverse(i.index()));
            }
        }
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(Reverse(i)) = heap.pop() {
            let i = NodeIndex::new(i);
            order.push(NodeId(i.index() as u32));
            for e in self.g.edges_directed(i, Direction::Outgoing) {
                let d = indeg.get_mut(&e.target()).expect("node of an edge exists");
                *d -= 1;
                if *d == 0 {
                    heap.push(Reverse(e.target().index()));
                }
            }
        }
        if order.len() == self.g.node_count() {
            Ok(order)
        } else {
            Err(indeg
                .into_iter()
                .filter(|(_, d)| *d > 0)
                .map(|(i, _)| NodeId(i.index() as u32))
                .collect())
        }
    }

    /// The `Param` node of each parameter, if any.
    pub fn param_nodes(&self) -> HashMap<ParamId, NodeId> {
        self.node_ids()
            .filter_map(|n| match self.node(n).op {
                Op::Param { param } => Some((param, n)),
                _ => None,
            })
            .collect()
    }

    /// Total number of parameter elements.
    pub fn param_numel(&self) -> u64 {
        self.params.iter().map(|p| p.ty.numel()).sum()
    }
}

impl Graph {
    /// Rebuilds a graph from its parts, keeping node ids. Used by
    /// deserialisation; checks that ids are unique and inputs refer to nodes
    /// and output slots that exist.
    pub fn from_parts(
        name: String,
        modules: Vec<Module>,
        params: Vec<ParamSpec>,
        buffers: Vec<ModuleBufferSpec>,
        nodes: impl IntoIterator<Item = (NodeId, Node, Vec<ValueId>)>,
        outputs: Vec<ValueId>,
    ) -> Result<Graph, String> {
        if modules.first().is_none_or(|m| !m.path.is_empty()) {
            return Err("module 0 must be the root module (empty path)".into());
        }
        for (i, m) in modules.iter().enumerate() {
            if m.parent.is_some_and(|p| p.0 as usize >= modules.len()) {
                return Err(format!(
                    "module {i} ({}) has a parent that does not exist",
                    m.path
                ));
            }
        }
        let mut g = Graph::new(name);
        g.modules = modules;
        g.module_by_path = g
            .modules
            .iter()
            .enumerate()
            .map(|(i, m)| (m.path.clone(), ModuleId(i as u32)))
            .collect();
        g.params = params;
        g.buffers = buffers;
        let nodes: Vec<(NodeId, Node, Vec<ValueId>)> = nodes.into_iter().collect();
        let max = nodes
            .iter()
            .map(|(id, _, _)| id.0 as usize + 1)
            .max()
            .unwrap_or(0);
        if max > nodes.len().saturating_mul(4).max(1 << 20) {
            return Err(format!(
                "node id {} is implausibly large for {} nodes",
                max - 1,
                nodes.len()
            ));
        }
        let mut present = vec![false; max];
        for (id, node, _) in &nodes {
            if present[id.0 as usize] {
                return Err(format!("node id {id} appears twice"));
            }
            present[id.0 as usize] = true;
            if node.module.0 as usize >= g.modules.len() {
                return Err(format!(
                    "node {id} ({}) refers to module {} which does not exist",
                    node.name, node.module.0
                ));
            }
        }
        // Fill holes with placeholders so indices line up, then remove them.
        let mut slots: Vec<Option<Node>> = vec![None; max];
        for (id, node, _) in &nodes {
            slots[id.0 as usize] = Some(node.clone());
        }
        let placeholder = Node {
            op: crate::op::Op::Input {
                name: String::new(),
            },
            name: String::new(),
            module: ModuleId::ROOT,
            phase: crate::graph::Phase::Forward,
            outputs: vec![],
        };
        for s in &slots {
            g.g.add_node(s.clone().unwrap_or_else(|| placeholder.clone()));
        }
        let check = |v: &ValueId, what: &str| -> Result<(), String> {
            match slots.get(v.node.0 as usize).and_then(|s| s.as_ref()) {
                Some(n) if (v.slot as usize) < n.outputs.len() => Ok(()),
                Some(_) => Err(format!(
                    "{what} refers to {v}, an output slot that node does not have"
                )),
                None => Err(format!("{what} refers to {v}, a node that does not exist")),
            }
        };
        for (id, node, inputs) in &nodes {
            for (slot, v) in inputs.iter().enumerate() {
                check(v, &format!("input {slot} of node {id} ({})", node.name))?;
                g.g.add_edge(
                    NodeIndex::new(v.node.0 as usize),
                    NodeIndex::new(id.0 as usize),
                    Edge {
                        src_slot: v.slot,
                        dst_slot: slot as u32,
                    },
                );
            }
        }
        for v in &outputs {
            check(v, "a graph output")?;
        }
        for (i, s) in slots.iter().enumerate() {
            if s.is_none() {
                g.g.remove_node(NodeIndex::new(i));
            }
        }
        g.outputs = outputs;
        Ok(g)
    }
}

impl Graph {
    /// Adds a node, inferring its output types from its inputs. `Input` and
    /// `Param` nodes are added with `add_input` and `add_param`.
    pub fn add(
        &mut self,
        op: Op,
        inputs: &[ValueId],
        name: impl Into<String>,
        module: ModuleId,
    ) -> Result<NodeId, crate::IrError> {
        let name = name.into();
        let types = inputs
            .iter()
            .enumerate()
            .map(|(i, v)| {
                self.try_value_type(*v)
                    .ok_or_else(|| crate::IrError::Shape {
                        node: name.clone(),
                        op: op.name(),
                        reason: format!("input {i} refers to {v}, which does not exist"),
                    })
            })
            .collect::<Result<Vec<&TensorType>, _>>()?;
        let outputs = crate::ops::infer(&op, &types).map_err(|reason| crate::IrError::Shape {
            node: name.clone(),
            op: op.name(),
            reason,
        })?;
        Ok(self.add_node_typed(
            Node {
                op,
                name,
                module,
                phase: Phase::Forward,
                outputs,
            },
            inputs,
        ))
    }

    /// `add` for a single-output op: returns its value.
    pub fn add1(
        &mut self,
        op: Op,
        inputs: &[ValueId],
        name: impl Into<String>,
        module: ModuleId,
    ) -> Result<ValueId, crate::IrError> {
        Ok(ValueId {
            node: self.add(op, inputs, name, module)?,
            slot: 0,
        })
    }

    /// A data input of type `ty`.
    pub fn add_input(&mut self, name: &str, ty: TensorType) -> ValueId {
        let n = self.add_node_typed(
            Node {
                op: Op::Input {
                    name: name.to_string(),
                },
                name: name.to_string(),
                module: ModuleId::ROOT,
                phase: Phase::Forward,
                outputs: vec![ty],
            },
            &[],
        );
        ValueId { node: n, slot: 0 }
    }

    /// A parameter and its `Param` node, in `module`.
    pub fn add_param(&mut self, spec: ParamSpec, module: ModuleId) -> ValueId {
        let ty = spec.ty.clone();
        let name = spec.name.clone();
        let param = self.add_param_spec(spec);
        let n = self.add_node_typed(
            Node {
                op: Op::Param { param },
                name,
                module,
                phase: Phase::Forward,
                outputs: vec![ty],
            },
            &[],
        );
        ValueId { node: n, slot: 0 }
    }
}

impl Graph {
    /// True if node ids are `0..node_count()` with no holes and every edge goes
    /// from a lower id to a higher one, so that appending nodes keeps id order
    /// a topological order (`topo_order` then equals id order).
    pub fn ids_are_topological(&self) -> bool {
        let dense = self
            .g
            .node_indices()
            .enumerate()
            .all(|(i, idx)| idx.index() == i);
        dense
            && self
                .g
                .edge_indices()
                .filter_map(|e| self.g.edge_endpoints(e))
                .all(|(s, t)| s.index() < t.index())
    }

    /// A copy of the graph with node ids renumbered densely in topological
    /// order, and the map from old to new ids. Fails with the nodes of a cycle.
    pub fn renumbered(&self) -> Result<(Graph, HashMap<NodeId, NodeId>), Vec<NodeId>> {
        let order = self.topo_order()?;
        self.reordered(&order).map_err(|_| order)
    }

    /// A copy renumbered in topological order with every node not in `kept`
    /// (the nodes a pass inserted) moved to run right before the first node
    /// that reads it, and the map from old to new ids. The planner
    /// schedules in id order among ready nodes: an inserted node ready from
    /// the start (a cast of a constant, a tensor-parallel copy of a norm's
    /// weight) would otherwise run wherever its id falls, and a node that
    /// blocks the forward pulls every ready node with a smaller id before it,
    /// and their gradients to the end of backward.
    pub fn reordered_just_in_time(
        &self,
        kept: &HashSet<NodeId>,
    ) -> Result<(Graph, HashMap<NodeId, NodeId>), crate::IrError> {
        let g = self;
        // The kept nodes in topological order by id, as if no node had been
        // inserted: each waits for the kept nodes it reads through inserted
        // ones (an inserted node that blocks must not pull kept ones forward).
        let kept_inputs = |n: NodeId| -> Vec<NodeId> {
            let mut out = Vec::new();
            let mut stack: Vec<NodeId> = g.inputs(n).iter().map(|v| v.node).collect();
            let mut seen = HashSet::new();
            while let Some(m) = stack.pop() {
                if !seen.insert(m) {
                    continue;
                }
                if kept.contains(&m) {
                    out.push(m);
                } else {
                    stack.extend(g.inputs(m).iter().map(|v| v.node));
                }
            }
            out
        };
        let mut indeg: HashMap<NodeId, usize> = HashMap::new();
        let mut readers: HashMap<NodeId, Vec<NodeId>> = HashMap::new();
        for n in g.node_ids().filter(|n| kept.contains(n)) {
            let ins = kept_inputs(n);
            indeg.insert(n, ins.len());
            for m in ins {
                readers.entry(m).or_default().push(n);
            }
        }
        let mut heap: std::collections::BinaryHeap<std::cmp::Reverse<NodeId>> = indeg
            .iter()
            .filter(|(_, &d)| d == 0)
            .map(|(&n, _)| std::cmp::Reverse(n))
            .collect();
        let mut order = Vec::with_capacity(indeg.len());
        while let Some(std::cmp::Reverse(n)) = heap.pop() {
            order.push(n);
            for &r in readers.get(&n).map_or(&[][..], |v| v.as_slice()) {
                if let Some(d) = indeg.get_mut(&r) {
                    *d -= 1;
                    if *d == 0 {
                        heap.push(std::cmp::Reverse(r));
                    }
                }
            }
        }
        if order.len() != indeg.len() {
            return Err(crate::IrError::Invalid("the graph has a cycle".into()));
        }
        let mut placed: HashSet<NodeId> = HashSet::with_capacity(g.node_count());
        let mut out = Vec::with_capacity(g.node_count());
        // Places `n` after the inserted nodes it reads, depth first (every
        // kept input is placed already: kept nodes go in topological order).
        fn place(
            g: &Graph,
            n: NodeId,
            kept: &HashSet<NodeId>,
            placed: &mut HashSet<NodeId>,
            out: &mut Vec<NodeId>,
        ) {
            if placed.contains(&n) {
                return;
            }
            for v in g.inputs(n) {
                if !kept.contains(&v.node) {
                    place(g, v.node, kept, placed, out);
                }
            }
            placed.insert(n);
            out.push(n);
        }
        for &n in &order {
            place(g, n, kept, &mut placed, &mut out);
        }
        // Inserted nodes no kept node reads, at the end.
        let rest = g
            .topo_order()
            .map_err(|_| crate::IrError::Invalid("the graph has a cycle".into()))?;
        for n in rest {
            place(g, n, kept, &mut placed, &mut out);
        }
        g.reordered(&out).map_err(crate::IrError::Invalid)
    }

    /// A copy of the graph whose node ids are `0..` in the order of `order`,
    /// and the map from old to new ids. `order` must name every node exactly
    /// once, each after the producers of its inputs; then the new ids are
    /// topological (`ids_are_topological`) and `topo_order` is `order`.
    /// Passes use this to decide where new nodes run (the planner schedules
    /// in `topo_order`, ties broken by id).
    pub fn reordered(&self, order: &[NodeId]) -> Result<(Graph, HashMap<NodeId, NodeId>), String> {
        let mut map: HashMap<NodeId, NodeId> = HashMap::with_capacity(order.len());
        for (i, &n) in order.iter().enumerate() {
            if !self.contains(n) {
                return Err(format!("the order names {n}, which does not exist"));
            }
            if map.insert(n, NodeId(i as u32)).is_some() {
                return Err(format!("the order names {n} twice"));
            }
        }
        if map.len() != self.node_count() {
            return Err(format!(
                "the order names {} of {} nodes",
                map.len(),
                self.node_count()
            ));
        }
        let remap = |v: ValueId| ValueId {
            node: map.get(&v.node).copied().unwrap_or(v.node),
            slot: v.slot,
        };
        let mut nodes = Vec::with_capacity(order.len());
        for (i, &n) in order.iter().enumerate() {
            let inputs: Vec<ValueId> = self.inputs(n).into_iter().map(remap).collect();
            if let Some(v) = inputs.iter().find(|v| v.node.0 as usize >= i) {
                let name = &self.node(n).name;
                return Err(format!(
                    "{n} (`{name}`) comes before the producer of its input {v}"
                ));
            }
            nodes.push((NodeId(i as u32), self.node(n).clone(), inputs));
        }
        let outputs = self.outputs.iter().map(|&v| remap(v)).collect();
        let g = Graph::from_parts(
            self.name.clone(),
            self.modules.clone(),
            self.params.clone(),
            self.buffers.clone(),
            nodes,
            outputs,
        )?;
        Ok((g, map))
    }

    /// The input slots of `n` as stored, in slot order, duplicates and gaps
    /// included (validation uses this to find malformed edges).
    pub(crate) fn raw_input_slots(&self, n: NodeId) -> Vec<u32> {
        let mut slots: Vec<u32> = self
            .g
            .edges_directed(NodeIndex::new(n.0 as usize), Direction::Incoming)
            .map(|e| e.weight().dst_slot)
            .collect();
        slots.sort();
        slots
    }
}
