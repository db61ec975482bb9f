//! The verifier: checks a graph or a training program and *collects* every
//! problem it finds, each naming its node (as cranelift's verifier does),
//! rather than stopping at the first.

use crate::buffer::ModuleBufferId;
use crate::error::IrError;
use crate::graph::{Graph, NodeId, Phase, ValueId};
use crate::op::Op;
use crate::param::Init;
use crate::program::TrainingProgram;
use crate::types::{DType, TensorType};
use std::collections::{HashMap, HashSet};
use std::fmt;

/// Every problem a verifier found, in the order it found them.
#[derive(Clone, Debug, PartialEq)]
pub struct Problems(pub Vec<IrError>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} problem(s):", self.0.len())?;
        for p in &self.0 {
            writeln!(f, "  - {p}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Problems {}

impl From<Problems> for IrError {
    fn from(p: Problems) -> IrError {
        let all: Vec<String> = p.0.iter().map(ToString::to_string).collect();
        IrError::Invalid(all.join("; "))
    }
}

/// Checks `graph`: no cycle; every node in an existing module, with input
/// slots `0..k` that refer to existing values; `Param` nodes naming existing
/// parameters and typed as them; every other node's stored output types equal
/// to the ones its shape rule infers; no two `Input`s of one name; graph
/// outputs that exist; parameter specs that are consistent (ties, init data).
pub fn validate(graph: &Graph) -> Result<(), Problems> {
    let mut out = Vec::new();
    if let Err(nodes) = graph.topo_order() {
        out.push(cycle(graph, &nodes));
    }
    for n in graph.node_ids() {
        check_node(graph, n, &mut out);
    }
    check_input_names(graph, &mut out);
    check_params(graph, &mut out);
    check_buffers(graph, &mut out);
    for v in &graph.outputs {
        if graph.try_value_type(*v).is_none() {
            out.push(IrError::Invalid(format!("graph output {v} does not exist")));
        }
    }
    finish(out)
}

fn finish(problems: Vec<IrError>) -> Result<(), Problems> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(Problems(problems))
    }
}

fn cycle(g: &Graph, nodes: &[NodeId]) -> IrError {
    let mut names: Vec<String> = nodes
        .iter()
        .map(|&n| format!("{n} {}", g.node(n).name))
        .collect();
    names.sort();
    IrError::Cycle {
        node: names.join(", "),
    }
}

/// A problem at node `n`.
fn at(g: &Graph, n: NodeId, reason: String) -> IrError {
    let node = g.node(n);
    IrError::Shape {
        node: format!("{} ({n})", node.name),
        op: node.op.name(),
        reason,
    }
}

fn check_node(g: &Graph, n: NodeId, out: &mut Vec<IrError>) {
    let node = g.node(n);
    if node.module.0 as usize >= g.modules.len() {
        out.push(at(g, n, format!("module {} does not exist", node.module.0)));
    }
    let slots = g.raw_input_slots(n);
    if slots.iter().enumerate().any(|(i, &s)| s as usize != i) {
        out.push(at(
            g,
            n,
            format!("input slots are {slots:?}, not 0..{}", slots.len()),
        ));
        return;
    }
    let mut types: Vec<&TensorType> = Vec::new();
    for (i, v) in g.inputs(n).into_iter().enumerate() {
        match g.try_value_type(v) {
            Some(t) => types.push(t),
            None => out.push(at(
                g,
                n,
                format!("input {i} refers to {v}, which does not exist"),
            )),
        }
    }
    if types.len() == slots.len() {
        if let Err(reason) = check_types(g, &node.op, &types, &node.outputs) {
            out.push(at(g, n, reason));
        }
    }
}

/// The stored output types of a node against its op's rule.
fn check_types(
    g: &Graph,
    op: &Op,
    inputs: &[&TensorType],
    stored: &[TensorType],
) -> Result<(), String> {
    let expected = match op {
        Op::Input { .. } => {
            return match (inputs.len(), stored.len()) {
                (0, 1) => Ok(()),
                (i, o) => Err(format!(
                    "an input has 0 inputs and 1 output, not {i} and {o}"
                )),
            }
        }
        Op::ModuleBuffer { buffer } => match g.buffers.get(buffer.0 as usize) {
            Some(spec) => vec![spec.ty.clone()],
            None => {
                return Err(format!(
                    "module buffer {} does not exist ({} buffers)",
                    buffer.0,
                    g.buffers.len()
                ))
            }
        },
        Op::WriteBuffer { buffer } => match g.buffers.get(buffer.0 as usize) {
            Some(spec) if inputs.len() == 1 && *inputs[0] != spec.ty => {
                return Err(format!(
                    "writes {} into module buffer `{}` of type {}",
                    inputs[0], spec.name, spec.ty
                ))
            }
            Some(_) => crate::ops::infer(op, inputs)?,
            None => {
                return Err(format!(
                    "module buffer {} does not exist ({} buffers)",
                    buffer.0,
                    g.buffers.len()
                ))
            }
        },
        Op::Param { param } => match g.params.get(param.0 as usize) {
            Some(spec) => vec![spec.ty.clone()],
            None => {
                return Err(format!(
                    "parameter {} does not exist ({} parameters)",
                    param.0,
                    g.params.len()
                ))
            }
        },
        _ => crate::ops::infer(op, inputs)?,
    };
    if expected.as_slice() == stored {
        Ok(())
    } else {
        Err(format!(
            "stored output types {} differ from the inferred {}",
            list(stored),
            list(&expected)
        ))
    }
}

fn list(ts: &[TensorType]) -> String {
    let v: Vec<String> = ts.iter().map(ToString::to_string).collect();
    format!("[{}]", v.join(", "))
}

fn check_input_names(g: &Graph, out: &mut Vec<IrError>) {
    let mut seen: HashMap<&str, NodeId> = HashMap::new();
    for n in g.node_ids() {
        if let Op::Input { name } = &g.node(n).op {
            if let Some(first) = seen.insert(name, n) {
                out.push(at(
                    g,
                    n,
                    format!("input name `{name}` is also used by {first}"),
                ));
            }
        }
    }
}

fn check_params(g: &Graph, out: &mut Vec<IrError>) {
    for (i, p) in g.params.iter().enumerate() {
        let bad =
            |reason: String| IrError::Invalid(format!("parameter {i} `{}`: {reason}", p.name));
        if let Some(t) = p.tied_to {
            if t.0 as usize >= g.params.len() || t.0 as usize == i {
                out.push(bad(format!("tied_to {} is not another parameter", t.0)));
            }
        }
        if let Err(reason) = check_init(&p.init, &p.ty) {
            out.push(bad(reason));
        }
    }
}

/// Each module buffer: a valid initial value, at most one writer, and every
/// reader an ancestor of the writer's input (so a read never sees the
/// value written in the same step).
fn check_buffers(g: &Graph, out: &mut Vec<IrError>) {
    for (i, b) in g.buffers.iter().enumerate() {
        if b.ty.dtype != DType::F32 {
            out.push(IrError::Invalid(format!(
                "module buffer {i} `{}`: type {}, module buffers are f32",
                b.name, b.ty
            )));
        }
        if matches!(b.init, Init::File { .. }) {
            out.push(IrError::Invalid(format!(
                "module buffer {i} `{}`: initial values come with the model, not from a file",
                b.name
            )));
        }
        if let Err(reason) = check_init(&b.init, &b.ty) {
            out.push(IrError::Invalid(format!(
                "module buffer {i} `{}`: {reason}",
                b.name
            )));
        }
    }
    let mut writer: HashMap<ModuleBufferId, NodeId> = HashMap::new();
    let mut readers: HashMap<ModuleBufferId, Vec<NodeId>> = HashMap::new();
    for n in g.node_ids() {
        match g.node(n).op {
            Op::WriteBuffer { buffer } => {
                if let Some(first) = writer.insert(buffer, n) {
                    out.push(at(
                        g,
                        n,
                        format!("module buffer {} is also written by {first}", buffer.0),
                    ));
                }
            }
            Op::ModuleBuffer { buffer } => {
                let users = g.users(ValueId { node: n, slot: 0 });
                readers
                    .entry(buffer)
                    .or_default()
                    .extend(users.into_iter().map(|(u, _)| u));
            }
            _ => {}
        }
    }
    for (buffer, w) in writer {
        let ancestors = ancestors(g, w);
        for r in readers.get(&buffer).into_iter().flatten() {
            if *r != w && !ancestors.contains(r) {
                out.push(at(
                    g,
                    *r,
                    format!(
                        "reads module buffer {} but does not feed its write {w}: \
                         the read could see the new value",
                        buffer.0
                    ),
                ));
            }
        }
    }
}

/// Every node `n` depends on.
fn ancestors(g: &Graph, n: NodeId) -> HashSet<NodeId> {
    let mut seen = HashSet::new();
    let mut stack = vec![n];
    while let Some(m) = stack.pop() {
        for v in g.inputs(m) {
            if seen.insert(v.node) {
                stack.push(v.node);
            }
        }
    }
    seen
}

fn check_init(init: &Init, ty: &TensorType) -> Result<(), String> {
    match init {
        Init::Normal { std } if !(std.is_finite() && *std >= 0.0) => {
            Err(format!("normal init with std {std}"))
        }
        Init::Uniform { low, high } if !(low.is_finite() && high.is_finite() && low <= high) => {
            Err(format!("uniform init on [{low}, {high})"))
        }
        Init::File { dtype, .. } if !matches!(dtype, DType::F32 | DType::F16 | DType::Bf16) => Err(
            format!("a checkpoint tensor of dtype {dtype}; parameters load from f32, f16 or bf16"),
        ),
        Init::Data { data } => {
            data.check()?;
            if data.ty.numel() != ty.numel() {
                return Err(format!(
                    "init data {} for a parameter of type {ty}",
                    data.ty
                ));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

impl TrainingProgram {
    /// Checks the graph (see `validate`) and the program around it: the loss
    /// is a floating-point scalar among the graph's outputs; backward nodes
    /// all come after forward ones; `grads` are in strictly increasing
    /// `ParamId` order, of trainable parameters, typed as them, and each is
    /// produced by a backward non-source node and shared with no other
    /// parameter.
    pub fn validate(&self) -> Result<(), Problems> {
        let mut out = match validate(&self.graph) {
            Ok(()) => Vec::new(),
            Err(p) => p.0,
        };
        check_loss(self, &mut out);
        check_phases(&self.graph, &mut out);
        check_grads(self, &mut out);
        finish(out)
    }
}

fn check_loss(p: &TrainingProgram, out: &mut Vec<IrError>) {
    let bad = |r: String| IrError::Invalid(format!("loss {}: {r}", p.loss));
    match p.graph.try_value_type(p.loss) {
        None => out.push(bad("does not exist".into())),
        Some(t) if t.shape.rank() != 0 || !t.dtype.is_float() => {
            out.push(bad(format!("must be a floating-point scalar, got {t}")))
        }
        Some(_) if !p.graph.outputs.contains(&p.loss) => {
            out.push(bad("is not among the graph's outputs".into()))
        }
        Some(_) => {}
    }
}

fn check_phases(g: &Graph, out: &mut Vec<IrError>) {
    let last_fwd = g
        .node_ids()
        .filter(|&n| g.node(n).phase == Phase::Forward)
        .max();
    let first_bwd = g
        .node_ids()
        .filter(|&n| g.node(n).phase == Phase::Backward)
        .min();
    if let (Some(f), Some(b)) = (last_fwd, first_bwd) {
        if b < f {
            out.push(at(
                g,
                b,
                format!("backward node comes before forward node {f}"),
            ));
        }
    }
}

fn check_grads(p: &TrainingProgram, out: &mut Vec<IrError>) {
    let g = &p.graph;
    let mut seen: HashSet<ValueId> = HashSet::new();
    let mut prev = None;
    for (i, pg) in p.grads.iter().enumerate() {
        let bad =
            |r: String| IrError::Invalid(format!("grads[{i}] (parameter {}): {r}", pg.param.0));
        if prev.is_some_and(|q| q >= pg.param) {
            out.push(bad("not in increasing ParamId order".into()));
        }
        prev = Some(pg.param);
        if !seen.insert(pg.grad) {
            out.push(bad(format!("{} is also another parameter's grad", pg.grad)));
        }
        if let Err(r) = check_grad(g, pg.param.0 as usize, pg.grad) {
            out.push(bad(r));
        }
    }
}

fn check_grad(g: &Graph, param: usize, grad: ValueId) -> Result<(), String> {
    let spec = g.params.get(param).ok_or("the parameter does not exist")?;
    if !spec.requires_grad {
        return Err(format!("`{}` does not require a gradient", spec.name));
    }
    let ty = g
        .try_value_type(grad)
        .ok_or(format!("{grad} does not exist"))?;
    if *ty != spec.ty {
        return Err(format!("{grad} has type {ty}, the parameter {}", spec.ty));
    }
    let node = g.node(grad.node);
    if node.phase != Phase::Backward || node.op.is_source() {
        return Err(format!("{grad} is not computed by a backward node"));
    }
    Ok(())
}
