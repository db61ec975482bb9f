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
//! `names` (module paths), `recovered` (PyTorch names of initializers the
//! exporter renamed), `merged` (initializers the exporter merged, and
//! untying them), `fuse` (attention fusion, dead code), `fuse_gelu`, `fuse_norm`
//! (decomposed ops, matched with `pattern`), `forward` (the forward-only
//! import the ONNX node-test conformance run uses).
//!
//! Shapes are static: `Shape` yields a constant, so the shape arithmetic that
//! exporters emit (Shape -> Gather -> Concat -> Reshape, Range, masks built
//! from ConstantOfShape/Trilu/Where) folds away at import time.

mod context;
mod forward;
mod fuse;
mod fuse_gelu;
mod fuse_norm;
mod initializers;
mod merged;
mod names;
mod objective;
mod ops;
mod pattern;
mod proto;
mod recovered;
mod rewrite;
mod tensor;
mod types;
mod write;

use crate::error::{FrontendError, UnsupportedOp};
use context::{Importer, NodeCx};
use fsdpc_ir::{Graph, ValueId};
use onnx_protobuf::{GraphProto, ModelProto};
use std::collections::{HashMap, HashSet};
use std::path::Path;
use tensor::HostTensor;

pub use forward::{import_forward, read_tensor_proto, ForwardOptions, OnnxForward};
pub use merged::{merged_initializers, untie_merged, MergedInitializer};
pub use rewrite::simplify_layout;

pub use objective::{LossKind, LossSpec};
pub use write::{write_with_params, WriteSummary};

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

/// How to import an ONNX model.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImportOptions {
    /// Values of symbolic dimensions (`batch`, `seq`) of the inputs.
    pub dims: HashMap<String, usize>,
    /// The loss to build when the first output is not a scalar loss (see
    /// [`objective`](LossSpec)); `None` keeps the automatic choice.
    pub loss: Option<LossSpec>,
}

/// Imports the ONNX model at `path`; `dims` gives values to symbolic
/// dimensions (`batch`, `seq`) of its inputs.
pub fn import(path: &Path, dims: &HashMap<String, usize>) -> Result<OnnxModel, FrontendError> {
    let opts = ImportOptions {
        dims: dims.clone(),
        loss: None,
    };
    import_with(path, &opts)
}

/// Imports the ONNX model at `path` with `opts`.
pub fn import_with(path: &Path, opts: &ImportOptions) -> Result<OnnxModel, FrontendError> {
    let model = proto::read_model(path)?;
    let src = Source {
        path,
        dir: Some(path.parent().unwrap_or(Path::new(""))),
    };
    import_model(model, &src, opts)
}

/// Imports an ONNX model from its bytes (errors name the file `<bytes>`).
/// Tensors kept in external data files are refused: there is no directory to
/// look for them in.
pub fn import_bytes(bytes: &[u8], opts: &ImportOptions) -> Result<OnnxModel, FrontendError> {
    let path = Path::new("<bytes>");
    let model = proto::decode_model(bytes, path)?;
    let src = Source { path, dir: None };
    import_model(model, &src, opts)
}

/// Where a model came from: its path (for errors and its name) and the
/// directory of its external data, if it has one.
pub(crate) struct Source<'a> {
    pub path: &'a Path,
    pub dir: Option<&'a Path>,
}

fn import_model(
    mut model: ModelProto,
    src: &Source<'_>,
    opts: &ImportOptions,
) -> Result<OnnxModel, FrontendError> {
    let path = src.path;
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
    let mut imp = importer(&name, opset, src);
    imp.from_pytorch = model.producer_name == "pytorch";
    initializers::initializers(&mut imp, graph, src)?;
    types::inputs(&mut imp, graph, &opts.dims, path)?;
    nodes(&mut imp, graph, path)?;
    types::check_types(&imp, graph, &opts.dims, path)?;
    let loss = objective::loss(&mut imp, graph, opts.loss.as_ref(), path)?;
    imp.g.outputs = vec![loss];
    let (graph, loss) = clean_up(imp.g, path)?;
    Ok(OnnxModel { name, graph, loss })
}

/// Fuses attention, drops dead nodes and renumbers ids topologically.
fn clean_up(g: Graph, path: &Path) -> Result<(Graph, ValueId), FrontendError> {
    let g = tidy(g, path)?;
    let loss = g.outputs.first().copied();
    let loss = loss.ok_or_else(|| model_error(path, "the loss was lost in clean-up"))?;
    Ok((g, loss))
}

/// The clean-up steps of [`clean_up`], keeping every output.
fn tidy(mut g: Graph, path: &Path) -> Result<Graph, FrontendError> {
    fuse::fuse_attention(&mut g);
    fuse_gelu::fuse_gelu(&mut g);
    fuse_norm::fuse_layer_norm(&mut g);
    rewrite::simplify_layout(&mut g);
    fuse::remove_dead(&mut g);
    names::adopt_orphan_params(&mut g);
    names::structural_kinds(&mut g);
    let (g, _) = g
        .renumbered()
        .map_err(|_| model_error(path, "the graph has a cycle"))?;
    Ok(g)
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

fn importer(name: &str, opset: i64, src: &Source<'_>) -> Importer {
    let model = src.path.to_path_buf();
    let dir = src.dir.map(Path::to_path_buf);
    let decode = move |t: &onnx_protobuf::TensorProto| {
        let src = proto::TensorSource {
            dir: dir.as_deref(),
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
        bound: HashMap::new(),
        seqs: HashMap::new(),
        from_pytorch: false,
        forward_only: false,
    }
}

/// Converts every node through the op table.
fn nodes(imp: &mut Importer, graph: &GraphProto, path: &Path) -> Result<(), FrontendError> {
    let table = ops::registry();
    let skip = names::node_path_skip(graph);
    for node in &graph.node {
        let Some(convert) = table.get(node.op_type.as_str()) else {
            continue; // check_ops already refused the model
        };
        let module = names::node_module(&mut imp.g, node, skip);
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
