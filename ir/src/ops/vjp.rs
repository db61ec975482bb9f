//! The context a family's vector-Jacobian rule adds backward nodes in, and
//! the public `vjp` entry point that autodiff calls once per forward node.

use super::family;
use crate::error::IrError;
use crate::graph::{Graph, ModuleId, NodeId, Phase, ValueId};
use crate::op::Op;
use crate::types::{DType, TensorData, TensorType};

/// What a VJP rule sees: the forward node, its inputs and output, the incoming
/// gradient of its output, and which inputs need a gradient. Every node it
/// adds is a `Backward` node in the forward node's module, named
/// `grad(<forward name>)`.
pub(crate) struct VjpCtx<'a> {
    graph: &'a mut Graph,
    node: NodeId,
    inputs: Vec<ValueId>,
    dy: ValueId,
    needs: Vec<bool>,
    module: ModuleId,
    name: String,
}

impl VjpCtx<'_> {
    /// Forward input `i`.
    pub(crate) fn x(&self, i: usize) -> Result<ValueId, String> {
        self.inputs
            .get(i)
            .copied()
            .ok_or_else(|| format!("the forward node has no input {i}"))
    }

    /// The forward node's (first) output.
    pub(crate) fn y(&self) -> ValueId {
        ValueId {
            node: self.node,
            slot: 0,
        }
    }

    /// The gradient of the forward node's output.
    pub(crate) fn dy(&self) -> ValueId {
        self.dy
    }

    /// Whether input `i` needs a gradient.
    pub(crate) fn needs(&self, i: usize) -> bool {
        self.needs.get(i).copied().unwrap_or(false)
    }

    /// The type of `v`.
    pub(crate) fn ty(&self, v: ValueId) -> Result<TensorType, String> {
        self.graph
            .try_value_type(v)
            .cloned()
            .ok_or_else(|| format!("value {v} does not exist"))
    }

    /// The shape of `v`.
    pub(crate) fn shape(&self, v: ValueId) -> Result<Vec<usize>, String> {
        Ok(self.ty(v)?.shape.0)
    }

    /// Adds a backward node computing `op` and returns its node.
    pub(crate) fn emit_node(&mut self, op: Op, inputs: &[ValueId]) -> Result<NodeId, String> {
        let n = self
            .graph
            .add(op, inputs, self.name.clone(), self.module)
            .map_err(|e| e.to_string())?;
        self.graph.node_mut(n).phase = Phase::Backward;
        Ok(n)
    }

    /// Adds a single-output backward node computing `op`.
    pub(crate) fn emit(&mut self, op: Op, inputs: &[ValueId]) -> Result<ValueId, String> {
        let node = self.emit_node(op, inputs)?;
        Ok(ValueId { node, slot: 0 })
    }

    /// A backward scalar constant of `dtype`.
    pub(crate) fn scalar(&mut self, dtype: DType, value: f64) -> Result<ValueId, String> {
        let value = TensorData::scalar(dtype, value);
        self.emit(Op::Constant { value }, &[])
    }

    /// `g` summed back to `shape` (nothing added when it already has it).
    pub(crate) fn sum_to(&mut self, g: ValueId, shape: &[usize]) -> Result<ValueId, String> {
        if self.shape(g)? == shape {
            return Ok(g);
        }
        let shape = shape.to_vec();
        self.emit(Op::SumTo { shape }, &[g])
    }
}

/// Adds the backward nodes of forward node `node` to `graph`, given the
/// gradient `dy` of its (single) output, and returns the gradient of each of
/// its inputs: `None` where `needs[i]` is false or the input is not
/// differentiable (integer indices, bool conditions). Nodes are added at the
/// end of the graph, `Backward` phase, in the forward node's module, named
/// `grad(<forward name>)`.
pub fn vjp(
    graph: &mut Graph,
    node: NodeId,
    dy: ValueId,
    needs: &[bool],
) -> Result<Vec<Option<ValueId>>, IrError> {
    let fwd = graph
        .try_node(node)
        .ok_or_else(|| IrError::Autodiff(format!("node {node} does not exist")))?
        .clone();
    let fail =
        |reason: String| IrError::Autodiff(format!("`{}` ({}): {reason}", fwd.name, fwd.op.name()));
    if fwd.outputs.len() != 1 {
        return Err(fail(format!(
            "not differentiable: it has {} outputs",
            fwd.outputs.len()
        )));
    }
    let inputs = graph.inputs(node);
    if needs.len() != inputs.len() {
        return Err(fail(format!(
            "{} `needs` flags for {} inputs",
            needs.len(),
            inputs.len()
        )));
    }
    let mut cx = VjpCtx {
        graph,
        node,
        inputs,
        dy,
        needs: needs.to_vec(),
        module: fwd.module,
        name: format!("grad({})", fwd.name),
    };
    let mut grads = family(&fwd.op).vjp(&fwd.op, &mut cx).map_err(fail)?;
    grads.resize(needs.len(), None);
    for (g, need) in grads.iter_mut().zip(needs) {
        if !need {
            *g = None;
        }
    }
    Ok(grads)
}

/// The error of a rule asked for the gradient of an op that has none.
pub(crate) fn not_differentiable(op: &Op) -> String {
    format!(
        "`{}` is not differentiable (its VJP is not defined)",
        op.name()
    )
}
