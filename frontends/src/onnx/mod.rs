//! ONNX import: models exported from PyTorch (`torch.onnx.export`, opsets
//! 13–21) become a forward graph with its loss. The pipeline is a list of
//! steps: decode the file and check its opset, check that every op is mapped
//! (reporting all that are not), turn initializers into parameters
//! (`Init::Data`) or folded constants, bind the inputs' symbolic dimensions,
//! convert the nodes in file order (ONNX requires topological order) through
//! the op table, and find the loss.
//!
//! Last, exported attention is fused into the IR's `Attention` op and
//! decomposed GELU and LayerNorm into single ops, dead nodes
//! go, and node ids are renumbered in topological order.
//!
//! Where things are: `proto` (decoding, tensors, external data),
//! `initializers` (parameters vs constants, ties), `types` (inputs, symbolic
//! dims, declared-type check), `context` (per-node view for converters),
//! `ops/` (the op table, one file per family), `tensor` (folding arithmetic),
//! `names` (module paths), `fuse` (attention fusion, dead code), `fuse_gelu`, `fuse_norm`
//! (decomposed ops, matched with `pattern`).
//!
//! Shapes are static: `Shape` yields a constant, so the shape arithmetic that
//! exporters emit (Shape -> Gather -> Concat -> Reshape, Range, masks built
//! from ConstantOfShape/Trilu/Where) folds away at import time.

mod context;
mod fuse;
mod fuse_gelu;
mod fuse_norm;
mod initializers;
mod names;
mod ops;
mod pattern;
mod proto;
mod tensor;
mod types;

use crate::error::{FrontendError, UnsupportedOp};
use context::{Importer, NodeCx, Val};
use fsdpc_ir::{DType, Graph, ModuleId, Op, TensorType, ValueId};
use onnx_protobuf::GraphProto;
use std::collections::{HashMap, HashSet};
use std::path::Path;
use tensor::HostTensor;

/// A model imported from ONNX.
#[derive(Clone, Debug)]
pub struct OnnxModel {
    /// The graph's name (the file stem when the graph has none).
    pub name: String,
    /// The forward graph, including the loss.
    pub graph: Graph,
    /// The scalar loss.
    pub loss: ValueId,
}

/// Imports the ONNX model at `path`; `dims` gives values to symbolic
/// dimensions (`batch`, `seq`) of its inputs.
pub fn import(path: &Path, dims: &HashMap<String, usize>) -> Result<OnnxModel, FrontendError> {
    let mut model = proto::read_model(path)?;
    let opset = proto::opset(&model, path)?;
    let Some(graph) = model.graph.0.as_deref_mut() else {
        return Err(model_error(path, "the file holds no graph"));
    };
    check_ops(graph, opset, path)?;
    let name = if graph.name.is_empty() {
        path.file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
    } else {
        graph.name.clone()
    };
    let mut imp = importer(&name, opset, path);
    initializers::initializers(&mut imp, graph, path)?;
    types::inputs(&mut imp, graph, dims, path)?;
    nodes(&mut imp, graph, path)?;
    types::check_types(&imp, graph, dims, path)?;
    let loss = loss(&mut imp, graph, path)?;
    imp.g.outputs = vec![loss];
    let (graph, loss) = clean_up(imp.g, path)?;
    Ok(OnnxModel { name, graph, loss })
}

/// Fuses attention, drops dead nodes and renumbers ids topologically.
fn clean_up(mut g: Graph, path: &Path) -> Result<(Graph, ValueId), FrontendError> {
    fuse::fuse_attention(&mut g);
    fuse_gelu::fuse_gelu(&mut g);
    fuse_norm::fuse_layer_norm(&mut g);
    fuse::remove_dead(&mut g);
    names::adopt_orphan_params(&mut g);
    let (g, _) = g
        .renumbered()
        .map_err(|_| model_error(path, "the graph has a cycle"))?;
    let loss = g.outputs.first().copied();
    let loss = loss.ok_or_else(|| model_error(path, "the loss was lost in clean-up"))?;
    Ok((g, loss))
}

fn model_error(path: &Path, reason: impl Into<String>) -> FrontendError {
    FrontendError::OnnxModel {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Every op type that is not in the table, with its first node.
fn check_ops(graph: &GraphProto, opset: i64, path: &Path) -> Result<(), FrontendError> {
    let table = ops::registry();
    let mut seen = HashSet::new();
    let mut bad = Vec::new();
    for n in &graph.node {
        let default = n.domain.is_empty() || n.domain == "ai.onnx";
        if default && table.contains_key(n.op_type.as_str()) {
            continue;
        }
        let op = if default {
            n.op_type.clone()
        } else {
            format!("{}::{}", n.domain, n.op_type)
        };
        if seen.insert(op.clone()) {
            let node = if n.name.is_empty() {
                n.output.first().cloned().unwrap_or_default()
            } else {
                n.name.clone()
            };
            bad.push(UnsupportedOp { op, node, opset });
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(FrontendError::UnsupportedOps {
            path: path.to_path_buf(),
            ops: bad,
        })
    }
}

fn importer(name: &str, opset: i64, path: &Path) -> Importer {
    let model = path.to_path_buf();
    let dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let decode = move |t: &onnx_protobuf::TensorProto| {
        let src = proto::TensorSource {
            dir: &dir,
            model: &model,
        };
        let data = proto::tensor(t, &src).map_err(|e| e.to_string())?;
        HostTensor::from_data(&data)
    };
    Importer {
        g: Graph::new(name),
        vals: HashMap::new(),
        opset,
        next_seed: 0,
        log_softmax_of: HashMap::new(),
        decode: Box::new(decode),
    }
}

/// Converts every node through the op table.
fn nodes(imp: &mut Importer, graph: &GraphProto, path: &Path) -> Result<(), FrontendError> {
    let table = ops::registry();
    for node in &graph.node {
        let Some(convert) = table.get(node.op_type.as_str()) else {
            continue; // check_ops already refused the model
        };
        let module = names::node_module(&mut imp.g, node);
        let mut cx = NodeCx {
            imp: &mut *imp,
            node,
            module,
        };
        convert(&mut cx).map_err(|reason| FrontendError::OnnxNode {
            path: path.to_path_buf(),
            node: cx.label(),
            op: node.op_type.clone(),
            reason,
        })?;
    }
    Ok(())
}

/// The loss: the first graph output if it is a float scalar; logits
/// `[..., C]` get a mean cross-entropy against a new i64 `labels` input.
fn loss(imp: &mut Importer, graph: &GraphProto, path: &Path) -> Result<ValueId, FrontendError> {
    let first = graph
        .output
        .first()
        .ok_or_else(|| model_error(path, "the graph has no outputs"))?;
    let v = match imp.vals.get(&first.name) {
        Some(Val::Ir(v)) => *v,
        Some(Val::Const(_)) => {
            return Err(model_error(
                path,
                format!("output `{}` is a constant", first.name),
            ))
        }
        None => {
            return Err(model_error(
                path,
                format!("output `{}` is not produced by any node", first.name),
            ))
        }
    };
    let ty = imp.g.value_type(v).clone();
    if !ty.dtype.is_float() {
        return Err(model_error(
            path,
            format!("output `{}` ({ty}) is not a float tensor", first.name),
        ));
    }
    match ty.shape.rank() {
        0 => Ok(v),
        1 => Err(model_error(
            path,
            format!(
                "output `{}` ({ty}) is neither a scalar loss nor logits [..., classes]",
                first.name
            ),
        )),
        _ => logits_loss(imp, v, &ty).map_err(|e| model_error(path, e)),
    }
}

fn logits_loss(imp: &mut Importer, logits: ValueId, ty: &TensorType) -> Result<ValueId, String> {
    let dims = ty.shape.dims();
    let (lead, classes) = dims.split_at(dims.len() - 1);
    let rows: usize = lead.iter().product();
    // A name no input of the model has.
    let name = (0..)
        .map(|i| {
            if i == 0 {
                "labels".to_string()
            } else {
                format!("labels_{i}")
            }
        })
        .find(|n| !imp.vals.contains_key(n))
        .unwrap_or_default();
    let labels = imp
        .g
        .add_input(&name, TensorType::new(DType::I64, lead.to_vec()));
    let root = ModuleId::ROOT;
    let err = |e: fsdpc_ir::IrError| e.to_string();
    let mut x = logits;
    let mut l = labels;
    if lead.len() > 1 {
        x = imp
            .g
            .add1(
                Op::Reshape {
                    shape: vec![rows, classes[0]],
                },
                &[x],
                "logits_flat",
                root,
            )
            .map_err(err)?;
        l = imp
            .g
            .add1(Op::Reshape { shape: vec![rows] }, &[l], "labels_flat", root)
            .map_err(err)?;
    }
    imp.g
        .add1(
            Op::CrossEntropy {
                ignore_index: Some(-100),
            },
            &[x, l],
            "loss",
            root,
        )
        .map_err(err)
}
