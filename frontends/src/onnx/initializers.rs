//! Initializers: float tensors become trainable parameters with their data
//! (`Init::Data`), everything else folded constants; a transposed copy of a
//! parameter (a tied weight after constant folding) stays tied, a weight the
//! exporter renamed and transposed (`val_N`) gets its PyTorch name and
//! orientation back, and mask buffers, the buffers the dynamo exporter
//! marks as such (rotary `inv_freq`) and batch normalisation's running
//! statistics stay constants.

use super::context::{Importer, Val};
use super::recovered::{self, Recovered};
use super::tensor::HostTensor;
use super::{names, proto, Source};
use crate::error::FrontendError;
use fsdpc_ir::{DType, Graph, Init, ModuleId, Op, ParamSpec, TensorData, TensorType, ValueId};
use onnx_protobuf::GraphProto;
use std::collections::HashSet;

/// The metadata key under which torch's dynamo exporter records what a graph
/// value was in the exported program (`PARAMETER`, `BUFFER`, `USER_INPUT`).
const INPUT_KIND: &str = "pkg.torch.export.graph_signature.InputSpec.kind";

/// Float initializers with more than one element become trainable parameters
/// holding the file's values; the rest (shapes, scalars, masks) become
/// constants. A matrix that is exactly the transpose of an earlier parameter (the tied
/// output projection after the exporter folded its transpose) becomes a
/// `Transpose` of that parameter, so the two stay one tensor. An initializer
/// whose PyTorch name the metadata gives ([`recovered`](super::recovered):
/// `val_N`, a `Linear` weight the exporter transposed) becomes the parameter
/// of that name in PyTorch's orientation, read through a `Transpose`.
pub(super) fn initializers(
    imp: &mut Importer,
    graph: &mut GraphProto,
    from: &Source<'_>,
) -> Result<(), FrontendError> {
    let src = proto::TensorSource {
        dir: from.dir,
        model: from.path,
    };
    let mut matrices: Vec<Matrix> = Vec::new();
    let buffers = buffers(graph);
    let recovered = recovered::recovered_params(graph);
    for t in &mut graph.initializer {
        let raw = std::mem::take(&mut t.raw_data);
        let data = proto::tensor_from(t, raw, &src)?;
        let trainable = data.ty.dtype.is_float()
            && data.ty.numel() > 1
            && !is_mask(&data)
            && !buffers.contains(t.name.as_str());
        let val = if trainable {
            if let Some(v) = tied_transpose(imp, &matrices, &data, &t.name) {
                imp.vals.insert(t.name.clone(), Val::Ir(v));
                continue;
            }
            let rank = data.ty.shape.rank();
            let (m, v) = match recovered.get(&t.name) {
                Some(r) => recovered_param(imp, &t.name, data, r)
                    .map_err(|reason| tensor_error(from, &t.name, reason))?,
                None => (Matrix::plain(param(imp, &t.name, data)), None),
            };
            if rank == 2 {
                matrices.push(m);
            }
            Val::Ir(v.unwrap_or(m.param))
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

/// A 2-D parameter that later initializers may be tied to.
#[derive(Clone, Copy)]
struct Matrix {
    /// Its `Param` value.
    param: ValueId,
    /// True when the file holds it transposed (a recovered `Linear` weight).
    transposed: bool,
}

impl Matrix {
    fn plain(param: ValueId) -> Matrix {
        Matrix {
            param,
            transposed: false,
        }
    }
}

/// A trainable parameter `name` holding `data`, in the module its name gives.
fn param(imp: &mut Importer, name: &str, data: TensorData) -> ValueId {
    let module = names::param_module(&mut imp.g, name);
    let spec = ParamSpec {
        name: name.to_string(),
        ty: data.ty.clone(),
        init: Init::Data { data },
        requires_grad: true,
        tied_to: None,
        tp: None,
    };
    imp.g.add_param(spec, module)
}

/// The parameter initializer `file_name` holds under its PyTorch name `r`:
/// stored in PyTorch's orientation, the file's value a `Transpose` of it
/// when the file holds it transposed (returned second).
fn recovered_param(
    imp: &mut Importer,
    file_name: &str,
    data: TensorData,
    r: &Recovered,
) -> Result<(Matrix, Option<ValueId>), String> {
    if !r.transposed {
        return Ok((Matrix::plain(param(imp, &r.name, data)), None));
    }
    let p = param(imp, &r.name, transpose(&data)?);
    let module = imp.g.node(p.node).module;
    let op = Op::Transpose { perm: vec![1, 0] };
    let name = format!("{file_name} (file layout of {})", r.name);
    let v = imp
        .g
        .add1(op, &[p], name, module)
        .map_err(|e| e.to_string())?;
    let m = Matrix {
        param: p,
        transposed: true,
    };
    Ok((m, Some(v)))
}

/// The transpose of a 2-D tensor.
fn transpose(data: &TensorData) -> Result<TensorData, String> {
    let &[rows, cols] = data.ty.shape.dims() else {
        return Err(format!("a transposed weight must be 2-D, not {}", data.ty));
    };
    let w = data.ty.dtype.size();
    if Some(data.bytes.len()) != rows.checked_mul(cols).and_then(|n| n.checked_mul(w)) {
        return Err(format!("{} bytes for {}", data.bytes.len(), data.ty));
    }
    let mut bytes = Vec::with_capacity(data.bytes.len());
    for j in 0..cols {
        for i in 0..rows {
            bytes.extend_from_slice(&data.bytes[(i * cols + j) * w..][..w]);
        }
    }
    Ok(TensorData {
        ty: TensorType::new(data.ty.dtype, vec![cols, rows]),
        bytes,
    })
}

fn tensor_error(from: &Source<'_>, tensor: &str, reason: String) -> FrontendError {
    FrontendError::OnnxTensor {
        path: from.path.to_path_buf(),
        tensor: tensor.to_string(),
        reason,
    }
}

/// Names of the values the dynamo exporter marks as buffers of the exported
/// module (in `value_info` metadata) and the running statistics every
/// BatchNormalization reads: not parameters, so constants.
fn buffers(graph: &GraphProto) -> HashSet<String> {
    let marked = graph.value_info.iter().filter(|v| {
        v.metadata_props
            .iter()
            .any(|p| p.key == INPUT_KIND && p.value == "BUFFER")
    });
    // A BatchNormalization's running mean and variance (inputs 3 and 4).
    let running = graph
        .node
        .iter()
        .filter(|n| n.op_type == "BatchNormalization" && n.domain.is_empty())
        .flat_map(|n| n.input.iter().skip(3).take(2));
    marked
        .map(|v| v.name.clone())
        .chain(running.cloned())
        .collect()
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

/// The value `data` is tied to, if any: a `Transpose` of the earlier
/// parameter in `matrices` whose transpose `data` is, or the parameter
/// itself when the file holds that one transposed (a recovered `Linear`
/// weight) and `data` equals it. Matrices with a single repeated value never
/// match (two all-zero matrices are not a tie).
fn tied_transpose(
    imp: &mut Importer,
    matrices: &[Matrix],
    data: &TensorData,
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
    let m = matrices.iter().find(|m| {
        param_data(&imp.g, m.param).is_some_and(|p| {
            p.ty.dtype == data.ty.dtype
                && if m.transposed {
                    p.ty.shape.dims() == dims && p.bytes == data.bytes
                } else {
                    p.ty.shape.dims() == [dims[1], dims[0]]
                        && is_transpose(&p.bytes, &data.bytes, dims, w)
                }
        })
    })?;
    if m.transposed {
        return Some(m.param);
    }
    let module = imp.g.node(m.param.node).module;
    let op = Op::Transpose { perm: vec![1, 0] };
    imp.g
        .add1(op, &[m.param], format!("{name} (tied: transposed)"), module)
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
