//! ONNX import: models exported from PyTorch (`torch.onnx.export`, opsets
//! 13–21) become a forward graph with its loss. The pipeline is a list of
//! steps: decode the file and check its opset, check that every op is mapped
//! (reporting all that are not), turn initializers into parameters
//! (`Init::Data`) or folded constants, bind the inputs' symbolic dimensions,
//! convert the nodes in file order (ONNX requires topological order) through
//! the op table, and find the loss.
//!
//! Last, exported attention is fused into the IR's `Attention` op, dead nodes
//! go, and node ids are renumbered in topological order.
//!
//! Shapes are static: `Shape` yields a constant, so the shape arithmetic that
//! exporters emit (Shape -> Gather -> Concat -> Reshape, Range, masks built
//! from ConstantOfShape/Trilu/Where) folds away at import time.

mod context;
mod fuse;
mod names;
mod ops;
mod proto;
mod tensor;

use crate::error::{FrontendError, UnsupportedOp};
use context::{Importer, NodeCx, Val};
use fsdpc_ir::{DType, Graph, Init, ModuleId, Op, ParamSpec, TensorType, ValueId};
use onnx_protobuf::tensor_shape_proto::dimension::Value as Dim;
use onnx_protobuf::type_proto::Value as TypeValue;
use onnx_protobuf::{GraphProto, ValueInfoProto};
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
    let model = proto::read_model(path)?;
    let opset = proto::opset(&model, path)?;
    let Some(graph) = model.graph.0.as_deref() else {
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
    initializers(&mut imp, graph, path)?;
    inputs(&mut imp, graph, dims, path)?;
    nodes(&mut imp, graph, path)?;
    check_types(&imp, graph, dims, path)?;
    let loss = loss(&mut imp, graph, path)?;
    imp.g.outputs = vec![loss];
    let (graph, loss) = clean_up(imp.g, path)?;
    Ok(OnnxModel { name, graph, loss })
}

/// Fuses attention, drops dead nodes and renumbers ids topologically.
fn clean_up(mut g: Graph, path: &Path) -> Result<(Graph, ValueId), FrontendError> {
    fuse::fuse_attention(&mut g);
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

/// Float initializers with more than one element become trainable parameters
/// holding the file's values; the rest (shapes, scalars, masks) become
/// constants. A
/// matrix that is exactly the transpose of an earlier parameter (the tied
/// output projection after the exporter folded its transpose) becomes a
/// `Transpose` of that parameter, so the two stay one tensor.
fn initializers(imp: &mut Importer, graph: &GraphProto, path: &Path) -> Result<(), FrontendError> {
    let dir = path.parent().unwrap_or(Path::new(""));
    let src = proto::TensorSource { dir, model: path };
    let mut matrices: Vec<ValueId> = Vec::new();
    for t in &graph.initializer {
        let data = proto::tensor(t, &src)?;
        let val = if data.ty.dtype.is_float() && data.ty.numel() > 1 && !is_mask(&data) {
            if let Some(v) = tied_transpose(imp, &matrices, &data, &t.name) {
                imp.vals.insert(t.name.clone(), Val::Ir(v));
                continue;
            }
            let module = names::param_module(&mut imp.g, &t.name);
            let spec = ParamSpec {
                name: t.name.clone(),
                ty: data.ty.clone(),
                init: Init::Data { data },
                requires_grad: true,
                tied_to: None,
            };
            let rank = spec.ty.shape.rank();
            let v = imp.g.add_param(spec, module);
            if rank == 2 {
                matrices.push(v);
            }
            Val::Ir(v)
        } else {
            match HostTensor::from_data(&data) {
                Ok(h) => Val::Const(h),
                Err(_) => constant_node(imp, &t.name, data),
            }
        };
        imp.vals.insert(t.name.clone(), val);
    }
    Ok(())
}

/// True for a float tensor that only holds 0 and very negative values (down
/// to -inf): an attention mask or bias buffer, not a weight. Stops at
/// the first element that says otherwise, so weights cost one look.
fn is_mask(data: &fsdpc_ir::TensorData) -> bool {
    let w = data.ty.dtype.size();
    let value = |c: &[u8]| -> f64 {
        match (data.ty.dtype, c) {
            (DType::F32, &[a, b, c, d]) => f64::from(f32::from_le_bytes([a, b, c, d])),
            (DType::F16, &[a, b]) => half::f16::from_le_bytes([a, b]).to_f64(),
            (DType::Bf16, &[a, b]) => half::bf16::from_le_bytes([a, b]).to_f64(),
            _ => 1.0,
        }
    };
    let mut any_masked = false;
    for c in data.bytes.chunks_exact(w) {
        let v = value(c);
        if v <= -1e4 {
            any_masked = true;
        } else if v != 0.0 {
            return false;
        }
    }
    any_masked
}

/// A `Transpose` of the earlier parameter in `matrices` whose transpose `data`
/// is, if any. Matrices with a single repeated value never match (two
/// all-zero matrices are not a tie).
fn tied_transpose(
    imp: &mut Importer,
    matrices: &[ValueId],
    data: &fsdpc_ir::TensorData,
    name: &str,
) -> Option<ValueId> {
    let dims = data.ty.shape.dims();
    if dims.len() != 2 {
        return None;
    }
    let w = data.ty.dtype.size();
    let first = data.bytes.get(..w)?;
    if data.bytes.chunks_exact(w).all(|c| c == first) {
        return None;
    }
    let p = matrices.iter().find(|v| {
        param_data(&imp.g, **v).is_some_and(|m| {
            m.ty.dtype == data.ty.dtype
                && m.ty.shape.dims() == [dims[1], dims[0]]
                && is_transpose(&m.bytes, &data.bytes, dims, w)
        })
    })?;
    let module = imp.g.node(p.node).module;
    let op = Op::Transpose { perm: vec![1, 0] };
    imp.g
        .add1(op, &[*p], format!("{name} (tied: transposed)"), module)
        .ok()
}

/// The file's values of the parameter whose `Param` node is `v`.
fn param_data(g: &Graph, v: ValueId) -> Option<&fsdpc_ir::TensorData> {
    match g.try_node(v.node)?.op {
        Op::Param { param } => match &g.params.get(param.0 as usize)?.init {
            Init::Data { data } => Some(data),
            _ => None,
        },
        _ => None,
    }
}

/// True if `t` (`[rows, cols]`, elements of `w` bytes) is the transpose of `m`.
fn is_transpose(m: &[u8], t: &[u8], dims: &[usize], w: usize) -> bool {
    let (rows, cols) = (dims[0], dims[1]);
    (0..rows)
        .all(|i| (0..cols).all(|j| t[(i * cols + j) * w..][..w] == m[(j * rows + i) * w..][..w]))
}

/// A constant whose type the folder does not handle (f16 scalars) as a node.
fn constant_node(imp: &mut Importer, name: &str, value: fsdpc_ir::TensorData) -> Val {
    let ty = value.ty.clone();
    let node = fsdpc_ir::Node {
        op: Op::Constant { value },
        name: name.to_string(),
        module: ModuleId::ROOT,
        phase: fsdpc_ir::Phase::Forward,
        outputs: vec![ty],
    };
    Val::Ir(ValueId {
        node: imp.g.add_node_typed(node, &[]),
        slot: 0,
    })
}

/// Graph inputs (those that are not initializers) with their dimensions bound.
fn inputs(
    imp: &mut Importer,
    graph: &GraphProto,
    dims: &HashMap<String, usize>,
    path: &Path,
) -> Result<(), FrontendError> {
    let mut unbound = Vec::new();
    let mut typed = Vec::new();
    for vi in graph
        .input
        .iter()
        .filter(|vi| !imp.vals.contains_key(&vi.name))
    {
        let (dtype, shape) =
            input_type(vi, dims, &mut unbound).map_err(|r| model_error(path, r))?;
        typed.push((vi.name.clone(), TensorType::new(dtype, shape)));
    }
    if !unbound.is_empty() {
        return Err(FrontendError::UnboundDims {
            path: path.to_path_buf(),
            dims: unbound,
        });
    }
    for (name, ty) in typed {
        let v = imp.g.add_input(&name, ty);
        imp.vals.insert(name, Val::Ir(v));
    }
    Ok(())
}

/// The dtype and static shape of input `vi`; unbound symbols are pushed to `unbound`.
fn input_type(
    vi: &ValueInfoProto,
    dims: &HashMap<String, usize>,
    unbound: &mut Vec<String>,
) -> Result<(DType, Vec<usize>), String> {
    let Some(TypeValue::TensorType(t)) = vi.type_.0.as_ref().and_then(|t| t.value.as_ref()) else {
        return Err(format!("input `{}` is not a tensor", vi.name));
    };
    let dtype = proto::dtype(t.elem_type).map_err(|e| format!("input `{}`: {e}", vi.name))?;
    let Some(shape) = t.shape.0.as_deref() else {
        return Err(format!("input `{}` has no shape (unknown rank)", vi.name));
    };
    let mut out = Vec::with_capacity(shape.dim.len());
    for (axis, d) in shape.dim.iter().enumerate() {
        out.push(match &d.value {
            Some(Dim::DimValue(v)) if *v > 0 => *v as usize,
            Some(Dim::DimParam(p)) if dims.contains_key(p) => dims[p],
            Some(Dim::DimParam(p)) => {
                unbound.push(format!("`{p}` (input `{}`, axis {axis})", vi.name));
                1
            }
            _ => {
                unbound.push(format!(
                    "an unnamed dimension (input `{}`, axis {axis})",
                    vi.name
                ));
                1
            }
        });
    }
    tensor::check_numel(&out).map_err(|e| format!("input `{}`: {e}", vi.name))?;
    Ok((dtype, out))
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

/// Compares the types the import derived with those the file declares
/// (`value_info` and graph outputs) wherever the file knows them fully; a
/// difference is an importer bug, caught here rather than in training.
fn check_types(
    imp: &Importer,
    graph: &GraphProto,
    dims: &HashMap<String, usize>,
    path: &Path,
) -> Result<(), FrontendError> {
    let mut mismatches = Vec::new();
    for vi in graph.value_info.iter().chain(&graph.output) {
        let Some(declared) = declared_type(vi, dims) else {
            continue;
        };
        let ours = match imp.vals.get(&vi.name) {
            Some(Val::Ir(v)) => imp.g.value_type(*v).clone(),
            Some(Val::Const(t)) => TensorType::new(t.dtype, t.shape.clone()),
            None => continue,
        };
        if ours != declared {
            mismatches.push(format!(
                "`{}`: the file says {declared}, the import gives {ours}",
                vi.name
            ));
        }
    }
    if mismatches.is_empty() {
        Ok(())
    } else {
        Err(FrontendError::OnnxTypeMismatch {
            path: path.to_path_buf(),
            mismatches,
        })
    }
}

/// The declared type of `vi`, if its element type and every dimension are known.
fn declared_type(vi: &ValueInfoProto, dims: &HashMap<String, usize>) -> Option<TensorType> {
    let Some(TypeValue::TensorType(t)) = vi.type_.0.as_ref()?.value.as_ref() else {
        return None;
    };
    let dtype = proto::dtype(t.elem_type).ok()?;
    let shape = t.shape.0.as_deref()?;
    let d: Option<Vec<usize>> = shape
        .dim
        .iter()
        .map(|d| match &d.value {
            Some(Dim::DimValue(v)) => usize::try_from(*v).ok(),
            Some(Dim::DimParam(p)) => dims.get(p).copied(),
            _ => None,
        })
        .collect();
    Some(TensorType::new(dtype, d?))
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
