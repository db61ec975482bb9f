//! Forward-only import: an ONNX graph as it is, every graph output an output
//! of the IR graph and no loss added. Used to run the ONNX backend node tests
//! (`tests/it/onnx_conformance.rs`) and to check an export's forward pass.
//!
//! The caller may give values of graph inputs: their types fix the inputs'
//! shapes (binding symbolic and unknown dimensions), and a converter that
//! needs an input when the model is compiled (Reshape's shape, Slice's starts,
//! Pad's value — attributes in the IR) reads its value; every input stays an
//! input fed at run time for its other readers. The same
//! pipeline as [`import`](super::import) runs, fusions included (they are
//! exact rewrites).

use super::context::{Importer, Val};
use super::tensor::HostTensor;
use super::{check_ops, importer, initializers, model_error, nodes, proto, tidy, types, Source};
use crate::error::FrontendError;
use fsdpc_ir::{Graph, ModuleId, Op, TensorData, ValueId};
use onnx_protobuf::tensor_proto::DataType;
use onnx_protobuf::{GraphProto, Message, ModelProto, TensorProto};
use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::path::Path;

/// How to import a graph for forward evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct ForwardOptions {
    /// Values of symbolic dimensions of the inputs.
    pub dims: HashMap<String, usize>,
    /// Values of graph inputs: their types are the inputs' types, and a
    /// converter that needs an input as a constant reads its value.
    pub input_values: HashMap<String, TensorData>,
    /// The default-domain opsets accepted. The default is what
    /// [`import`](super::import) reads; a conformance run may widen it to
    /// opsets whose changes to the mapped ops only add element types.
    pub opsets: RangeInclusive<i64>,
}

impl Default for ForwardOptions {
    fn default() -> ForwardOptions {
        ForwardOptions {
            dims: HashMap::new(),
            input_values: HashMap::new(),
            opsets: proto::MIN_OPSET..=proto::MAX_OPSET,
        }
    }
}

/// A forward graph imported from ONNX.
#[derive(Clone, Debug)]
pub struct OnnxForward {
    /// The graph's name (the file stem when the graph has none).
    pub name: String,
    /// The forward graph; its outputs are the ONNX graph's, in order.
    pub graph: Graph,
    /// The run-time inputs, in the file's order: ONNX name and `Input` value.
    pub inputs: Vec<(String, ValueId)>,
    /// The ONNX graph outputs, in order, and their values.
    pub outputs: Vec<(String, ValueId)>,
}

/// Imports the ONNX graph at `path` for forward evaluation. Unmapped ops are
/// reported (all of them) before the opset is checked.
pub fn import_forward(path: &Path, opts: &ForwardOptions) -> Result<OnnxForward, FrontendError> {
    let mut model = proto::read_model(path)?;
    let src = Source {
        path,
        dir: Some(path.parent().unwrap_or(Path::new(""))),
    };
    let opset = default_opset(&model);
    let Some(graph) = model.graph.0.as_deref_mut() else {
        return Err(model_error(path, "the file holds no graph"));
    };
    check_ops(graph, opset.unwrap_or(0), path)?;
    let opset = opset.ok_or_else(|| FrontendError::OnnxDecode {
        path: path.to_path_buf(),
        reason: "the model imports no default-domain (ai.onnx) opset".into(),
    })?;
    if !opts.opsets.contains(&opset) {
        return Err(FrontendError::OnnxOpset {
            path: path.to_path_buf(),
            version: opset,
            min: *opts.opsets.start(),
            max: *opts.opsets.end(),
        });
    }
    let name = graph_name(graph, path);
    let mut imp = importer(&name, opset, &src);
    imp.from_pytorch = model.producer_name == "pytorch";
    imp.forward_only = true;
    imp.bound = bound_inputs(graph, &opts.input_values, path)?;
    initializers::initializers(&mut imp, graph, &src)?;
    typed_inputs(&mut imp, graph, &opts.input_values);
    types::inputs(&mut imp, graph, &opts.dims, path)?;
    nodes(&mut imp, graph, path)?;
    types::check_types(&imp, graph, &opts.dims, path)?;
    imp.g.outputs = outputs(&mut imp, graph, path)?;
    let graph_proto = &*graph;
    let g = tidy(imp.g, path)?;
    Ok(OnnxForward {
        inputs: input_values(&g, graph_proto),
        outputs: graph_proto
            .output
            .iter()
            .map(|o| o.name.clone())
            .zip(g.outputs.iter().copied())
            .collect(),
        name,
        graph: g,
    })
}

/// The default-domain opset, unchecked.
fn default_opset(model: &ModelProto) -> Option<i64> {
    model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
}

fn graph_name(graph: &GraphProto, path: &Path) -> String {
    if graph.name.is_empty() {
        path.file_stem()
            .map_or_else(String::new, |s| s.to_string_lossy().into_owned())
    } else {
        graph.name.clone()
    }
}

/// The bound values of `graph`'s inputs (names that are no graph input are
/// ignored).
fn bound_inputs(
    graph: &GraphProto,
    given: &HashMap<String, TensorData>,
    path: &Path,
) -> Result<HashMap<String, HostTensor>, FrontendError> {
    let mut out = HashMap::new();
    for vi in &graph.input {
        if let Some(data) = given.get(&vi.name) {
            let t = HostTensor::from_data(data)
                .map_err(|e| model_error(path, format!("input `{}`: {e}", vi.name)))?;
            out.insert(vi.name.clone(), t);
        }
    }
    Ok(out)
}

/// Graph inputs with a given value (and no initializer) become inputs of the
/// value's type; `types::inputs` then types the rest from the file.
fn typed_inputs(imp: &mut Importer, graph: &GraphProto, given: &HashMap<String, TensorData>) {
    for vi in &graph.input {
        if let (Some(data), false) = (given.get(&vi.name), imp.vals.contains_key(&vi.name)) {
            let v = imp.g.add_input(&vi.name, data.ty.clone());
            imp.vals.insert(vi.name.clone(), Val::Ir(v));
        }
    }
}

/// The value of every graph output; a folded constant becomes a `Constant`.
fn outputs(
    imp: &mut Importer,
    graph: &GraphProto,
    path: &Path,
) -> Result<Vec<ValueId>, FrontendError> {
    let mut vals = Vec::with_capacity(graph.output.len());
    for o in &graph.output {
        let v = match imp.vals.get(&o.name) {
            Some(Val::Ir(v)) => *v,
            Some(Val::Const(t)) => {
                let op = Op::Constant { value: t.to_data() };
                imp.g
                    .add1(op, &[], o.name.clone(), ModuleId::ROOT)
                    .map_err(|e| model_error(path, e.to_string()))?
            }
            None => {
                return Err(model_error(
                    path,
                    format!("output `{}` is not produced by any node", o.name),
                ))
            }
        };
        vals.push(v);
    }
    Ok(vals)
}

/// The `Input` nodes of `g` in the order of the file's inputs.
fn input_values(g: &Graph, graph: &GraphProto) -> Vec<(String, ValueId)> {
    let by_name: HashMap<&str, ValueId> = g
        .node_ids()
        .filter_map(|n| match &g.node(n).op {
            Op::Input { name } => Some((name.as_str(), ValueId { node: n, slot: 0 })),
            _ => None,
        })
        .collect();
    graph
        .input
        .iter()
        .filter_map(|vi| Some((vi.name.clone(), *by_name.get(vi.name.as_str())?)))
        .collect()
}

/// Reads a serialized `TensorProto` file (the ONNX test data's `input_*.pb`,
/// `output_*.pb`): its name (possibly empty) and its data. Element types the
/// IR lacks are an error; doubles are refused too, not narrowed, so a
/// comparison never mistakes f32 for the file's type.
pub fn read_tensor_proto(path: &Path) -> Result<(String, TensorData), FrontendError> {
    let bytes = std::fs::read(path).map_err(|source| FrontendError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let t = TensorProto::parse_from_bytes(&bytes).map_err(|e| FrontendError::OnnxDecode {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if t.data_type == DataType::DOUBLE as i32 {
        return Err(FrontendError::OnnxTensor {
            path: path.to_path_buf(),
            tensor: t.name.clone(),
            reason: "element type DOUBLE is not supported".into(),
        });
    }
    let src = proto::TensorSource {
        dir: path.parent(),
        model: path,
    };
    let data = proto::tensor(&t, &src)?;
    Ok((t.name, data))
}
