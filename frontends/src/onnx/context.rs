//! The importer's state while it walks the ONNX graph: the IR graph being
//! built, what each ONNX value name stands for (an IR value or a folded
//! constant), and a per-node view (`NodeCx`) that op converters use to read
//! inputs and attributes and to define outputs.

use super::tensor::HostTensor;
use fsdpc_ir::{Graph, ModuleId, Op, TensorType, ValueId};
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{AttributeProto, NodeProto, TensorProto};
use std::collections::HashMap;

/// What an ONNX value is during import.
#[derive(Clone, Debug)]
pub(crate) enum Val {
    /// A tensor computed by the IR graph.
    Ir(ValueId),
    /// A constant known at import time (folded).
    Const(HostTensor),
}

/// A tensor sequence (`SplitToSequence`'s output). Sequences never reach the
/// IR: each element is a slice of `source`, made when `SequenceAt` reads it.
#[derive(Clone, Debug)]
pub(crate) struct Sequence {
    /// The tensor that was split.
    pub source: Val,
    /// The split axis and its length.
    pub axis: usize,
    pub dim: usize,
    /// How the axis is cut.
    pub parts: Parts,
    /// True when the elements lose `axis` (`keepdims` 0 without `split`).
    pub squeeze: bool,
    /// The node that made it (for errors).
    pub made_by: String,
}

/// How a sequence cuts its axis.
#[derive(Clone, Debug)]
pub(crate) enum Parts {
    /// Parts of this length (at least 1), the last one shorter if need be.
    Every(usize),
    /// Each part's `start..end`.
    Ranges(Vec<(usize, usize)>),
}

impl Sequence {
    /// The number of elements.
    pub fn count(&self) -> usize {
        match &self.parts {
            Parts::Every(each) => self.dim.div_ceil((*each).max(1)),
            Parts::Ranges(r) => r.len(),
        }
    }

    /// Element `i`'s `start..end` along the axis.
    pub fn part(&self, i: usize) -> Option<(usize, usize)> {
        match &self.parts {
            Parts::Every(each) => {
                let start = i.checked_mul(*each).filter(|&s| s < self.dim)?;
                Some((start, start.saturating_add(*each).min(self.dim)))
            }
            Parts::Ranges(r) => r.get(i).copied(),
        }
    }
}

/// Decodes a tensor attribute (reading external data if needed).
pub(crate) type Decoder = Box<dyn Fn(&TensorProto) -> Result<HostTensor, String>>;

/// The importer's state.
pub(crate) struct Importer {
    pub g: Graph,
    pub vals: HashMap<String, Val>,
    /// The default-domain opset.
    pub opset: i64,
    /// Next dropout seed.
    pub next_seed: u64,
    /// ONNX values produced by `LogSoftmax`: their logits and axis (lets
    /// `NegativeLogLikelihoodLoss` become a cross-entropy).
    pub log_softmax_of: HashMap<String, (ValueId, usize)>,
    /// Decodes a `TENSOR` attribute (it may live in external data).
    pub decode: Decoder,
    /// Values of graph inputs that a converter may read as constants (a
    /// forward import's `input_values`: Reshape's shape given as an input).
    pub bound: HashMap<String, HostTensor>,
    /// Tensor sequences by ONNX value name (see [`Sequence`]).
    pub seqs: HashMap<String, Sequence>,
    /// The file comes from PyTorch's exporter (`producer_name`): a
    /// training-mode normalisation keeps PyTorch's unbiased running
    /// variance, not the ONNX operator's biased one.
    pub from_pytorch: bool,
    /// A forward import (evaluation, the conformance tests): running
    /// statistics are values like any other, not module buffers.
    pub forward_only: bool,
}

/// One node being converted.
pub(crate) struct NodeCx<'a> {
    pub imp: &'a mut Importer,
    pub node: &'a NodeProto,
    /// The module the node's IR nodes go to.
    pub module: ModuleId,
}

impl NodeCx<'_> {
    /// The opset of the default domain.
    pub fn opset(&self) -> i64 {
        self.imp.opset
    }

    /// Number of inputs given (trailing optional inputs may be absent).
    pub fn n_inputs(&self) -> usize {
        self.node.input.len()
    }

    /// Input `i`, or `None` when absent or given as "".
    pub fn opt(&self, i: usize) -> Result<Option<&Val>, String> {
        match self.node.input.get(i).map(String::as_str) {
            None | Some("") => Ok(None),
            Some(name) => {
                self.imp
                    .vals
                    .get(name)
                    .map(Some)
                    .ok_or_else(|| match self.imp.seqs.get(name) {
                        Some(s) => format!(
                            "input {i} `{name}` is a tensor sequence (made by node `{}`); fsdpc \
                         resolves sequences at import, so only SequenceAt with a constant \
                         position and SequenceLength may read one",
                            s.made_by
                        ),
                        None => format!(
                            "input {i} `{name}` is not produced by any earlier node, input or \
                         initializer"
                        ),
                    })
            }
        }
    }

    /// Input `i` as a tensor sequence.
    pub fn seq(&self, i: usize) -> Result<&Sequence, String> {
        let name = self.node.input.get(i).map_or("", String::as_str);
        match self.imp.seqs.get(name) {
            Some(s) => Ok(s),
            None if self.imp.vals.contains_key(name) => {
                Err(format!("input {i} `{name}` is a tensor, not a sequence"))
            }
            None => Err(format!(
                "input {i} `{name}` is not a sequence made by an earlier node"
            )),
        }
    }

    /// Input `i`, which must be present.
    pub fn val(&self, i: usize) -> Result<&Val, String> {
        self.opt(i)?.ok_or_else(|| format!("input {i} is required"))
    }

    /// Input `i` as a folded constant (or a graph input's bound value).
    pub fn konst(&self, i: usize, what: &str) -> Result<&HostTensor, String> {
        let bound = self.node.input.get(i).and_then(|n| self.imp.bound.get(n));
        match (self.val(i)?, bound) {
            (Val::Const(t), _) | (Val::Ir(_), Some(t)) => Ok(t),
            (Val::Ir(_), None) => Err(format!(
                "the {what} (input {i}) must be known when the model is compiled, but it is computed at run time"
            )),
        }
    }

    /// Optional input `i` as a folded constant.
    pub fn opt_konst(&self, i: usize, what: &str) -> Result<Option<&HostTensor>, String> {
        match self.opt(i)? {
            None => Ok(None),
            Some(_) => self.konst(i, what).map(Some),
        }
    }

    /// The static type of input `i`.
    pub fn ty(&self, i: usize) -> Result<TensorType, String> {
        Ok(match self.val(i)? {
            Val::Ir(v) => self.imp.g.value_type(*v).clone(),
            Val::Const(t) => TensorType::new(t.dtype, t.shape.clone()),
        })
    }

    /// The rank of input `i`.
    pub fn rank(&self, i: usize) -> Result<usize, String> {
        Ok(self.ty(i)?.shape.rank())
    }

    /// True when every present input is a folded constant.
    pub fn all_const(&self) -> bool {
        self.node
            .input
            .iter()
            .filter(|n| !n.is_empty())
            .all(|n| matches!(self.imp.vals.get(n), Some(Val::Const(_))))
    }

    /// Input `i` as an IR value; a constant becomes a `Constant` node.
    pub fn ir(&mut self, i: usize) -> Result<ValueId, String> {
        match self.val(i)?.clone() {
            Val::Ir(v) => Ok(v),
            Val::Const(t) => self.constant(&t),
        }
    }

    /// Input `i` as an IR value; a constant is first converted to `like`'s dtype
    /// (so `x * 0.5` keeps x's type).
    pub fn ir_like(&mut self, i: usize, like: &TensorType) -> Result<ValueId, String> {
        match self.val(i)?.clone() {
            Val::Ir(v) => Ok(v),
            Val::Const(t) => self.constant(&t.cast(like.dtype)),
        }
    }

    /// A `Constant` node holding `t`.
    pub fn constant(&mut self, t: &HostTensor) -> Result<ValueId, String> {
        let value = t.to_data();
        self.add(Op::Constant { value }, &[], "const")
    }

    /// Adds one IR node computing `op`, named after the ONNX node.
    pub fn add(&mut self, op: Op, inputs: &[ValueId], suffix: &str) -> Result<ValueId, String> {
        let name = format!("{}/{suffix}", self.label());
        self.imp
            .g
            .add1(op, inputs, name, self.module)
            .map_err(|e| e.to_string())
    }

    /// The node's name, or its first output when it has none.
    pub fn label(&self) -> String {
        if self.node.name.is_empty() {
            self.node.output.first().cloned().unwrap_or_default()
        } else {
            self.node.name.clone()
        }
    }

    /// Defines output `i` (ignored if the node does not name it).
    pub fn set(&mut self, i: usize, v: Val) {
        if let Some(name) = self.node.output.get(i).filter(|n| !n.is_empty()) {
            self.imp.vals.insert(name.clone(), v);
        }
    }

    /// True when output `i` is named (so something may read it).
    pub fn wants(&self, i: usize) -> bool {
        self.node.output.get(i).is_some_and(|n| !n.is_empty())
    }

    fn attr(&self, name: &str) -> Option<&AttributeProto> {
        self.node.attribute.iter().find(|a| a.name == name)
    }

    fn attr_typed(&self, name: &str, t: AttributeType) -> Result<Option<&AttributeProto>, String> {
        match self.attr(name) {
            None => Ok(None),
            Some(a) if a.type_.enum_value() == Ok(t) => Ok(Some(a)),
            Some(_) => Err(format!("attribute `{name}` is not of type {t:?}")),
        }
    }

    /// Integer attribute `name`, or `default`.
    pub fn attr_i(&self, name: &str, default: i64) -> Result<i64, String> {
        Ok(self
            .attr_typed(name, AttributeType::INT)?
            .map_or(default, |a| a.i))
    }

    /// Float attribute `name`, or `default`.
    pub fn attr_f(&self, name: &str, default: f64) -> Result<f64, String> {
        Ok(self
            .attr_typed(name, AttributeType::FLOAT)?
            .map_or(default, |a| f64::from(a.f)))
    }

    /// Integer-list attribute `name`, if present.
    pub fn attr_ints(&self, name: &str) -> Result<Option<Vec<i64>>, String> {
        Ok(self
            .attr_typed(name, AttributeType::INTS)?
            .map(|a| a.ints.clone()))
    }

    /// String attribute `name`, or `default`.
    pub fn attr_s(&self, name: &str, default: &str) -> Result<String, String> {
        Ok(self
            .attr_typed(name, AttributeType::STRING)?
            .map_or(default.to_string(), |a| {
                String::from_utf8_lossy(&a.s).into_owned()
            }))
    }

    /// Tensor attribute `name`, decoded, if present.
    pub fn attr_tensor(&self, name: &str) -> Result<Option<HostTensor>, String> {
        match self
            .attr_typed(name, AttributeType::TENSOR)?
            .and_then(|a| a.t.0.as_deref())
        {
            None => Ok(None),
            Some(t) => (self.imp.decode)(t).map(Some),
        }
    }

    /// Float-list attribute `name`, if present.
    pub fn attr_floats(&self, name: &str) -> Result<Option<Vec<f32>>, String> {
        Ok(self
            .attr_typed(name, AttributeType::FLOATS)?
            .map(|a| a.floats.clone()))
    }

    /// True if the node has an attribute `name`.
    pub fn has_attr(&self, name: &str) -> bool {
        self.attr(name).is_some()
    }
}

/// `axis` (possibly negative) as an index into a tensor of `rank`.
pub(crate) fn norm_axis(axis: i64, rank: usize) -> Result<usize, String> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(format!("axis {axis} is out of range for rank {rank}"))
    }
}
