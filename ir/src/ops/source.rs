//! Sources: `Input`, `Param`, `Constant` and `ModuleBuffer`. They have no
//! inputs; an input's, a parameter's and a buffer's type is given when it
//! is added to the graph, a constant's is that of its data. Also the one
//! sink, `WriteBuffer`: one input, no outputs.

use super::check::arity;
use super::vjp::not_differentiable;
use super::{misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct Source;

impl Family for Source {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        if let Op::WriteBuffer { .. } = op {
            arity(inputs, 1, "a buffer write")?;
            return Ok(Vec::new());
        }
        arity(inputs, 0, "a source")?;
        match op {
            Op::Constant { value } => {
                value.check()?;
                Ok(vec![value.ty.clone()])
            }
            Op::Input { .. } => {
                Err("an input's type is given when it is added (Graph::add_input)".into())
            }
            Op::Param { .. } => {
                Err("a parameter's type is its ParamSpec's (Graph::add_param)".into())
            }
            Op::ModuleBuffer { .. } => {
                Err("a module buffer's type is its spec's (Graph::add_buffer)".into())
            }
            _ => Err(misrouted(op, "source")),
        }
    }

    fn vjp(&self, op: &Op, _cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        Err(not_differentiable(op))
    }

    fn flops(&self, _op: &Op, _inputs: &[&TensorType], _outputs: &[TensorType]) -> f64 {
        0.0
    }
}
