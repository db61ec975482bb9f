//! The readable text dump of graphs and training programs: one line per
//! parameter, one line per node in topological order,
//!
//! ```text
//! %12 = mat_mul{trans_b}(%10, %3) : f32[8, 128, 384]  # h.0.attn.qkv [fwd]
//! ```
//!
//! with the op's attributes in braces (`true` flags by name, `None` omitted),
//! the output types, the node's name and phase, and its module when the name
//! does not already say it.

use crate::graph::{Graph, NodeId, Phase, ValueId};
use crate::op::Op;
use crate::param::{Init, ParamSpec};
use crate::program::TrainingProgram;
use serde_json::Value;
use std::fmt;

impl fmt::Display for Graph {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "graph {}", self.name)?;
        for (i, p) in self.params.iter().enumerate() {
            writeln!(f, "  p{i} {}", param_line(p))?;
        }
        let order = self
            .topo_order()
            .unwrap_or_else(|_| self.node_ids().collect());
        for n in order {
            writeln!(f, "  {}", node_line(self, n))?;
        }
        writeln!(f, "  outputs: {}", values(&self.outputs))
    }
}

impl fmt::Display for TrainingProgram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.graph)?;
        writeln!(f, "loss: {}", self.loss)?;
        writeln!(f, "grads:")?;
        for pg in &self.grads {
            let name = self
                .graph
                .params
                .get(pg.param.0 as usize)
                .map_or("?", |p| p.name.as_str());
            writeln!(f, "  p{} {name} <- {}", pg.param.0, pg.grad)?;
        }
        let opt = serde_json::to_value(&self.optimizer).unwrap_or(Value::Null);
        writeln!(f, "optimizer: {}", attrs_of(&opt, "kind"))
    }
}

fn values(vs: &[ValueId]) -> String {
    let v: Vec<String> = vs.iter().map(ToString::to_string).collect();
    v.join(", ")
}

/// `fc1.weight : f32[3, 5] = normal(std=0.02)` (+ `frozen`, `tied_to p0`).
fn param_line(p: &ParamSpec) -> String {
    let init = match &p.init {
        Init::Normal { std } => format!("normal(std={std})"),
        Init::Uniform { low, high } => format!("uniform({low}, {high})"),
        Init::Zeros => "zeros".into(),
        Init::Ones => "ones".into(),
        Init::Constant { value } => format!("constant({value})"),
        Init::Data { data } => format!("data({})", data.ty),
        Init::File { path, tensor, .. } => format!("file({path}: {tensor})"),
    };
    let mut line = format!("{} : {} = {init}", p.name, p.ty);
    if !p.requires_grad {
        line.push_str(" frozen");
    }
    if let Some(t) = p.tied_to {
        line.push_str(&format!(" tied_to p{}", t.0));
    }
    line
}

/// One node: results, op with attributes and arguments, types, comment.
fn node_line(g: &Graph, n: NodeId) -> String {
    let node = g.node(n);
    let results: Vec<String> = (0..node.outputs.len().max(1) as u32)
        .map(|slot| ValueId { node: n, slot }.to_string())
        .collect();
    let types: Vec<String> = node.outputs.iter().map(ToString::to_string).collect();
    let phase = match node.phase {
        Phase::Forward => "fwd",
        Phase::Backward => "bwd",
    };
    let path = g
        .modules
        .get(node.module.0 as usize)
        .map_or("?", |m| m.path.as_str());
    let mut comment = format!("{} [{phase}]", node.name);
    if !path.is_empty() && node.name != path && node.name != format!("grad({path})") {
        comment.push_str(&format!(" @{path}"));
    }
    format!(
        "{} = {}({}) : {}  # {comment}",
        results.join(", "),
        op_head(&node.op),
        op_args(g, n),
        types.join(", ")
    )
}

/// The op's name and attributes: `mat_mul{trans_b}`, `reshape{shape=[4,2]}`.
fn op_head(op: &Op) -> String {
    match op {
        Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } => op.name(),
        _ => attrs_of(&serde_json::to_value(op).unwrap_or(Value::Null), "op"),
    }
}

/// The arguments: input values, or a source's own reference (an input's
/// name, a parameter's id, a scalar constant's value).
fn op_args(g: &Graph, n: NodeId) -> String {
    match &g.node(n).op {
        Op::Input { name } => format!("{name:?}"),
        Op::Param { param } => format!("p{}", param.0),
        Op::Constant { value } => match (value.ty.numel(), value.get_f64(0)) {
            (1, Some(x)) => format!("{x}"),
            (n, _) => format!("<{n} elements>"),
        },
        _ => values(&g.inputs(n)),
    }
}

/// `name{attr=value, flag}` from a tagged JSON object whose tag is `tag` (a
/// sub-function `f` is appended to the name with a dot).
fn attrs_of(v: &Value, tag: &str) -> String {
    let Some(obj) = v.as_object() else {
        return "?".into();
    };
    let mut name = obj
        .get(tag)
        .and_then(Value::as_str)
        .unwrap_or("?")
        .to_string();
    if let Some(f) = obj.get("f").and_then(Value::as_str) {
        name = format!("{name}.{f}");
    }
    let attrs: Vec<String> = obj
        .iter()
        .filter(|(k, _)| *k != tag && *k != "f")
        .filter_map(|(k, v)| match v {
            Value::Null | Value::Bool(false) => None,
            Value::Bool(true) => Some(k.clone()),
            _ => Some(format!("{k}={v}")),
        })
        .collect();
    if attrs.is_empty() {
        name
    } else {
        format!("{name}{{{}}}", attrs.join(", "))
    }
}
