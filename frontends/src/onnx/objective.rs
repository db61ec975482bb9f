//! The training objective of an imported model. A model whose first output is
//! a float scalar is its own loss. Otherwise the loss is built on an output:
//! mean cross-entropy of logits `[..., classes]` against integer labels (the
//! default for an output of rank >= 2, and `LossKind::CrossEntropy`), or the
//! mean squared error against a float target of the output's shape
//! (`LossKind::Mse`, e.g. distilling a sentence encoder's embeddings). The
//! labels or target are a model input the user names, or a new input.

use super::context::{Importer, Val};
use super::model_error;
use crate::error::FrontendError;
use fsdpc_ir::{BinaryFn, DType, ModuleId, Op, ReduceFn, TensorType, UnaryFn, ValueId};
use onnx_protobuf::GraphProto;
use std::path::Path;

/// Which loss to build on a model output.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum LossKind {
    /// Mean cross-entropy: the output is logits `[..., classes]`, reshaped to
    /// `[n, classes]`; the labels are integers `[...]` (or `[n]`), -100 ignored.
    CrossEntropy,
    /// Mean squared error between the output and a float target of its shape.
    Mse,
}

impl LossKind {
    /// Every name [`LossKind::parse`] accepts.
    pub const NAMES: [&'static str; 2] = ["cross_entropy", "mse"];

    /// `cross_entropy` or `mse`.
    pub fn parse(s: &str) -> Option<LossKind> {
        match s {
            "cross_entropy" => Some(LossKind::CrossEntropy),
            "mse" => Some(LossKind::Mse),
            _ => None,
        }
    }
}

/// The loss the user asks for when the model's output is not a scalar loss.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LossSpec {
    /// The loss.
    pub kind: LossKind,
    /// The graph output the loss reads (default: the first output).
    pub output: Option<String>,
    /// The model input holding the labels or target; a name the model has no
    /// input of becomes a new input (default: a new `labels`/`target` input).
    pub target: Option<String>,
}

/// The scalar loss of the imported graph.
pub(super) fn loss(
    imp: &mut Importer,
    graph: &GraphProto,
    spec: Option<&LossSpec>,
    path: &Path,
) -> Result<ValueId, FrontendError> {
    let err = |r: String| model_error(path, r);
    let (name, v) = output(imp, graph, spec.and_then(|s| s.output.as_deref())).map_err(err)?;
    let ty = imp.g.value_type(v).clone();
    if !ty.dtype.is_float() {
        return Err(err(format!(
            "output `{name}` ({ty}) is not a float tensor; name the output to train \
             with `--logits` (LossSpec::output); {}",
            outputs_list(imp, graph)
        )));
    }
    let kind = match spec {
        Some(s) => s.kind,
        None if ty.shape.rank() == 0 => return Ok(v),
        None if ty.shape.rank() == 1 => {
            return Err(err(format!(
                "output `{name}` ({ty}) is neither a scalar loss nor logits [..., classes]; \
                 choose a loss with `--loss` (LossSpec)"
            )))
        }
        None => LossKind::CrossEntropy,
    };
    let target = spec.and_then(|s| s.target.as_deref());
    match kind {
        LossKind::CrossEntropy => cross_entropy(imp, graph, v, &ty, target).map_err(err),
        LossKind::Mse => mse(imp, graph, v, &ty, target).map_err(err),
    }
}

/// The named graph output (default: the first) and its IR value.
fn output(
    imp: &Importer,
    graph: &GraphProto,
    want: Option<&str>,
) -> Result<(String, ValueId), String> {
    let name = match want {
        Some(w) if graph.output.iter().any(|o| o.name == w) => w.to_string(),
        Some(w) => {
            return Err(format!(
                "the model has no output `{w}`; {}",
                outputs_list(imp, graph)
            ))
        }
        None => match graph.output.first() {
            Some(o) => o.name.clone(),
            None => return Err("the graph has no outputs".into()),
        },
    };
    match imp.vals.get(&name) {
        Some(Val::Ir(v)) => Ok((name, *v)),
        Some(Val::Const(_)) => Err(format!("output `{name}` is a constant")),
        None => Err(format!("output `{name}` is not produced by any node")),
    }
}

/// "its outputs are `a` (f32[2, 3]), `b` (...)".
fn outputs_list(imp: &Importer, graph: &GraphProto) -> String {
    let items: Vec<String> = graph
        .output
        .iter()
        .map(|o| match imp.vals.get(&o.name) {
            Some(Val::Ir(v)) => format!("`{}` ({})", o.name, imp.g.value_type(*v)),
            _ => format!("`{}`", o.name),
        })
        .collect();
    format!("its outputs are {}", items.join(", "))
}

/// "its inputs are `a` (i64[2, 3]), ...".
fn inputs_list(imp: &Importer, graph: &GraphProto) -> String {
    let items: Vec<String> = graph
        .input
        .iter()
        .filter_map(|i| match imp.vals.get(&i.name) {
            Some(Val::Ir(v)) if is_input(imp, *v) => {
                Some(format!("`{}` ({})", i.name, imp.g.value_type(*v)))
            }
            _ => None,
        })
        .collect();
    format!("its inputs are {}", items.join(", "))
}

fn is_input(imp: &Importer, v: ValueId) -> bool {
    matches!(imp.g.node(v.node).op, Op::Input { .. })
}

/// The labels or target: the model input `want` if it has one, else a new
/// input of type `ty` named `want` (or `default`, made unique).
fn target_input(
    imp: &mut Importer,
    graph: &GraphProto,
    want: Option<&str>,
    default: &str,
    ty: TensorType,
) -> Result<ValueId, String> {
    let name = match want {
        Some(w) => match imp.vals.get(w) {
            Some(Val::Ir(v)) if is_input(imp, *v) => return Ok(*v),
            Some(_) => {
                return Err(format!(
                    "`{w}` is a value of the model, not one of its inputs; name an input \
                     or a new name; {}",
                    inputs_list(imp, graph)
                ))
            }
            None => w.to_string(),
        },
        None => fresh_name(imp, default),
    };
    let v = imp.g.add_input(&name, ty);
    imp.vals.insert(name, Val::Ir(v));
    Ok(v)
}

/// `base`, or `base_1`, `base_2`, ... : a name no value of the model has.
fn fresh_name(imp: &Importer, base: &str) -> String {
    (0..)
        .map(|i| {
            if i == 0 {
                base.to_string()
            } else {
                format!("{base}_{i}")
            }
        })
        .find(|n| !imp.vals.contains_key(n))
        .unwrap_or_default()
}

/// Mean cross-entropy of `logits [..., C]` against integer labels.
fn cross_entropy(
    imp: &mut Importer,
    graph: &GraphProto,
    logits: ValueId,
    ty: &TensorType,
    want: Option<&str>,
) -> Result<ValueId, String> {
    let dims = ty.shape.dims();
    if dims.len() < 2 {
        return Err(format!(
            "cross-entropy needs logits [..., classes] of rank >= 2, but the output is {ty}"
        ));
    }
    let (lead, classes) = dims.split_at(dims.len() - 1);
    let rows: usize = lead.iter().product();
    let labels_ty = TensorType::new(DType::I64, lead.to_vec());
    let labels = target_input(imp, graph, want, "labels", labels_ty)?;
    let lty = imp.g.value_type(labels).clone();
    if !matches!(lty.dtype, DType::I64 | DType::I32) || lty.numel() as usize != rows {
        return Err(format!(
            "the labels input {} is {lty}; cross-entropy on logits {ty} needs integer \
             labels of shape {lead:?} ({rows} elements)",
            want.unwrap_or("labels")
        ));
    }
    let root = ModuleId::ROOT;
    let err = |e: fsdpc_ir::IrError| e.to_string();
    let x = reshaped(imp, logits, vec![rows, classes[0]], "logits_flat")?;
    let l = reshaped(imp, labels, vec![rows], "labels_flat")?;
    let op = Op::CrossEntropy {
        ignore_index: Some(-100),
    };
    imp.g.add1(op, &[x, l], "loss", root).map_err(err)
}

/// Mean over every element of `(output - target)^2`.
fn mse(
    imp: &mut Importer,
    graph: &GraphProto,
    out: ValueId,
    ty: &TensorType,
    want: Option<&str>,
) -> Result<ValueId, String> {
    let target = target_input(imp, graph, want, "target", ty.clone())?;
    let tty = imp.g.value_type(target).clone();
    if tty != *ty {
        return Err(format!(
            "the target input {} is {tty}; the mean squared error on an output {ty} \
             needs a target of the same type",
            want.unwrap_or("target")
        ));
    }
    let root = ModuleId::ROOT;
    let g = &mut imp.g;
    let err = |e: fsdpc_ir::IrError| e.to_string();
    let sub = Op::Binary { f: BinaryFn::Sub };
    let d = g
        .add1(sub, &[out, target], "loss_diff", root)
        .map_err(err)?;
    let sq = Op::Unary { f: UnaryFn::Square };
    let s = g.add1(sq, &[d], "loss_square", root).map_err(err)?;
    let mean = Op::Reduce {
        f: ReduceFn::Mean,
        axes: Vec::new(),
        keepdims: false,
    };
    g.add1(mean, &[s], "loss", root).map_err(err)
}

/// `v` with shape `dims` (itself when it has it already).
fn reshaped(
    imp: &mut Importer,
    v: ValueId,
    dims: Vec<usize>,
    name: &str,
) -> Result<ValueId, String> {
    if imp.g.value_type(v).shape.dims() == dims.as_slice() {
        return Ok(v);
    }
    imp.g
        .add1(Op::Reshape { shape: dims }, &[v], name, ModuleId::ROOT)
        .map_err(|e| e.to_string())
}
