//! The graph's typed interface: inputs with their symbolic dimensions bound,
//! and the check of the import against every type the file declares.

use super::context::{Importer, Val};
use super::{model_error, proto, tensor};
use crate::error::FrontendError;
use fsdpc_ir::{DType, TensorType};
use onnx_protobuf::tensor_shape_proto::dimension::Value as Dim;
use onnx_protobuf::type_proto::Value as TypeValue;
use onnx_protobuf::{GraphProto, ValueInfoProto};
use std::collections::HashMap;
use std::path::Path;

/// Graph inputs (those that are not initializers) with their dimensions bound.
pub(super) fn inputs(
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

/// Compares the types the import derived with those the file declares
/// (`value_info` and graph outputs) wherever the file knows them fully; a
/// difference is an importer bug, caught here rather than in training.
pub(super) fn check_types(
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
pub(super) fn declared_type(
    vi: &ValueInfoProto,
    dims: &HashMap<String, usize>,
) -> Option<TensorType> {
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
