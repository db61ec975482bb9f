//! Write-back: the source ONNX file with its initializers replaced by trained
//! values — the same graph, nodes and names, each initializer keeping its
//! element type (f32, f16, bf16, f64). An initializer the import tied to a
//! parameter as its transpose gets the transpose of the trained values; one
//! the import named after its PyTorch parameter (see `recovered`: `val_N`,
//! a transposed `Linear` weight) gets that parameter's values in the file's
//! orientation.
//!
//! A model whose tensors were all inline is written inline; one that kept
//! data in external files gets its tensors alongside, in `<out>.data` (the
//! exporter's layout, and the only one past protobuf's 2 GiB limit). Files
//! are written atomically (`fsdpc_ir::fs::write_atomic`: a temporary file
//! in the target's directory, synced, renamed over the target, the
//! directory synced).

use super::proto;
use super::recovered::{recovered_params, Recovered};
use crate::error::FrontendError;
use fsdpc_ir::fs::write_atomic;
use onnx_protobuf::tensor_proto::{DataLocation, DataType};
use onnx_protobuf::{Message, StringStringEntryProto, TensorProto};
use protobuf::Enum;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// What [`write_with_params`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteSummary {
    /// Initializers whose data was replaced by trained values.
    pub replaced: usize,
    /// Of those, tied transposed copies of a trained parameter.
    pub tied: usize,
    /// Of those, initializers written from a parameter of another name: the
    /// PyTorch name the import recovered (`val_N` <- `lm_head.weight`).
    pub renamed: usize,
    /// The external data file written next to the model, if any.
    pub external_data: Option<PathBuf>,
}

/// Writes the ONNX model `src` to `out` with the initializer named `k` holding
/// `params[k]` (row-major f32 values, converted to the initializer's type).
/// Every name in `params` must be an initializer of the model with as many
/// elements.
pub fn write_with_params(
    src: &Path,
    params: &HashMap<String, Vec<f32>>,
    out: &Path,
) -> Result<WriteSummary, FrontendError> {
    let mut model = proto::read_model(src)?;
    let dir = src.parent().unwrap_or(Path::new(""));
    let tsrc = proto::TensorSource {
        dir: Some(dir),
        model: src,
    };
    let Some(graph) = model.graph.0.as_deref_mut() else {
        return Err(bad(src, "the file holds no graph".into()));
    };
    let recovered = recovered_params(graph);
    check_names(src, &graph.initializer, &recovered, params)?;
    let ties = ties(&graph.initializer, &recovered, params, &tsrc)?;
    let external = graph.initializer.iter().any(is_external);
    let mut data = DataFile::new(out, external);
    let mut summary = WriteSummary {
        replaced: 0,
        tied: 0,
        renamed: 0,
        external_data: None,
    };
    for t in &mut graph.initializer {
        let renamed = recovered
            .get(&t.name)
            .filter(|r| !params.contains_key(&t.name) && params.contains_key(&r.name));
        let values = match (params.get(&t.name), renamed, ties.get(&t.name)) {
            (Some(v), _, _) => Some(v.clone()),
            (None, Some(r), _) if r.transposed => transposed(&r.name, params, t),
            (None, Some(r), _) => params.get(&r.name).cloned(),
            (None, None, Some(tie)) if tie.transpose => transposed(&tie.of, params, t),
            (None, None, Some(tie)) => params.get(&tie.of).cloned(),
            (None, None, None) => None,
        };
        if let Some(v) = values {
            summary.replaced += 1;
            summary.renamed += usize::from(renamed.is_some());
            summary.tied += usize::from(!params.contains_key(&t.name) && renamed.is_none());
            let raw = encode(t, &v).map_err(|r| tensor_error(src, &t.name, r))?;
            data.place(t, raw);
        } else if is_external(t) {
            let raw = proto::external_bytes(t, &tsrc)?;
            data.place(t, raw);
        }
    }
    let bytes = model
        .write_to_bytes()
        .map_err(|e| bad(src, format!("cannot encode the model: {e}")))?;
    summary.external_data = data.finish(out)?;
    write_atomic(out, &bytes).map_err(|e| FrontendError::Io {
        path: out.to_path_buf(),
        source: e.into(),
    })?;
    Ok(summary)
}

fn bad(path: &Path, reason: String) -> FrontendError {
    FrontendError::OnnxModel {
        path: path.to_path_buf(),
        reason,
    }
}

fn tensor_error(path: &Path, tensor: &str, reason: String) -> FrontendError {
    FrontendError::OnnxTensor {
        path: path.to_path_buf(),
        tensor: tensor.to_string(),
        reason,
    }
}

/// Every name in `params` must be an initializer of the model, or the
/// PyTorch name the import recovered for one.
fn check_names(
    src: &Path,
    inits: &[TensorProto],
    recovered: &HashMap<String, Recovered>,
    params: &HashMap<String, Vec<f32>>,
) -> Result<(), FrontendError> {
    let mut unknown: Vec<&str> = params
        .keys()
        .filter(|k| !inits.iter().any(|t| &t.name == *k))
        .filter(|k| !recovered.values().any(|r| &r.name == *k))
        .map(String::as_str)
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    unknown.sort_unstable();
    Err(bad(
        src,
        format!(
            "parameters with no initializer of that name (was the model trained from \
             another file?): {}",
            unknown.join(", ")
        ),
    ))
}

fn is_external(t: &TensorProto) -> bool {
    t.data_location.enum_value() == Ok(DataLocation::EXTERNAL)
}

/// An initializer the import tied to a trained parameter.
struct Tie {
    /// The parameter's name.
    of: String,
    /// True when the initializer holds the parameter's values transposed.
    transpose: bool,
}

/// Initializers not in `params` that are the transpose of one that is (the
/// import's tied weights), each with that parameter. The transpose of an
/// initializer the import recovered transposed (`val_N` of `lm_head.weight`)
/// is the parameter itself.
fn ties(
    inits: &[TensorProto],
    recovered: &HashMap<String, Recovered>,
    params: &HashMap<String, Vec<f32>>,
    src: &proto::TensorSource<'_>,
) -> Result<HashMap<String, Tie>, FrontendError> {
    let matrix = |t: &TensorProto| t.dims.len() == 2 && is_float(t);
    let param_of = |t: &TensorProto| -> Option<(String, bool)> {
        if params.contains_key(&t.name) {
            return Some((t.name.clone(), false));
        }
        let r = recovered.get(&t.name)?;
        params
            .contains_key(&r.name)
            .then(|| (r.name.clone(), r.transposed))
    };
    let mut trained = Vec::new();
    for t in inits.iter().filter(|t| matrix(t)) {
        if let Some((name, transposed)) = param_of(t) {
            trained.push((name, transposed, proto::tensor(t, src)?));
        }
    }
    let mut out = HashMap::new();
    for t in inits.iter().filter(|t| matrix(t) && param_of(t).is_none()) {
        let data = proto::tensor(t, src)?;
        let dims = data.ty.shape.dims();
        let w = data.ty.dtype.size();
        let hit = trained.iter().find(|(_, _, m)| {
            m.ty.dtype == data.ty.dtype
                && m.ty.shape.dims() == [dims[1], dims[0]]
                && is_transpose(&m.bytes, &data.bytes, dims, w)
        });
        if let Some((name, transposed, _)) = hit {
            let tie = Tie {
                of: name.clone(),
                transpose: !transposed,
            };
            out.insert(t.name.clone(), tie);
        }
    }
    Ok(out)
}

/// True if `t` (`[rows, cols]`, elements of `w` bytes) is the transpose of `m`.
fn is_transpose(m: &[u8], t: &[u8], dims: &[usize], w: usize) -> bool {
    let (rows, cols) = (dims[0], dims[1]);
    m.len() == t.len()
        && t.len() == rows * cols * w
        && (0..rows).all(|i| {
            (0..cols).all(|j| t[(i * cols + j) * w..][..w] == m[(j * rows + i) * w..][..w])
        })
}

/// The trained values of parameter `params[of]`, transposed to `t`'s shape.
fn transposed(of: &str, params: &HashMap<String, Vec<f32>>, t: &TensorProto) -> Option<Vec<f32>> {
    let p = params.get(of)?;
    let rows = usize::try_from(*t.dims.first()?).ok()?;
    let cols = usize::try_from(*t.dims.get(1)?).ok()?;
    if Some(p.len()) != rows.checked_mul(cols) {
        return None;
    }
    let mut out = Vec::with_capacity(p.len());
    for i in 0..rows {
        out.extend((0..cols).map(|j| p[j * rows + i]));
    }
    Some(out)
}

fn is_float(t: &TensorProto) -> bool {
    [
        DataType::FLOAT,
        DataType::FLOAT16,
        DataType::BFLOAT16,
        DataType::DOUBLE,
    ]
    .iter()
    .any(|d| t.data_type == *d as i32)
}

/// `values` as little-endian bytes of `t`'s element type.
fn encode(t: &TensorProto, values: &[f32]) -> Result<Vec<u8>, String> {
    let numel = t
        .dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(usize::try_from(d).ok()?));
    if numel != Some(values.len()) {
        return Err(format!(
            "{} trained values for an initializer of shape {:?}",
            values.len(),
            t.dims
        ));
    }
    let le = |f: fn(f32) -> Vec<u8>| values.iter().flat_map(|&x| f(x)).collect();
    match DataType::from_i32(t.data_type) {
        Some(DataType::FLOAT) => Ok(le(|x| x.to_le_bytes().to_vec())),
        Some(DataType::DOUBLE) => Ok(le(|x| f64::from(x).to_le_bytes().to_vec())),
        Some(DataType::FLOAT16) => Ok(le(|x| half::f16::from_f32(x).to_le_bytes().to_vec())),
        Some(DataType::BFLOAT16) => Ok(le(|x| half::bf16::from_f32(x).to_le_bytes().to_vec())),
        _ => Err(format!(
            "element type {} cannot hold trained values",
            t.data_type
        )),
    }
}

/// Where tensor data goes: inline (`raw_data`), or appended to `<out>.data`.
struct DataFile {
    /// The external file's name (relative to the model) and its bytes.
    external: Option<(String, Vec<u8>)>,
}

impl DataFile {
    fn new(out: &Path, external: bool) -> DataFile {
        let name = out
            .file_name()
            .map_or_else(|| "model.onnx".into(), |n| n.to_string_lossy().into_owned());
        DataFile {
            external: external.then(|| (format!("{name}.data"), Vec::new())),
        }
    }

    /// Gives `t` the data `raw` (its typed fields cleared).
    fn place(&mut self, t: &mut TensorProto, raw: Vec<u8>) {
        t.float_data.clear();
        t.double_data.clear();
        t.int32_data.clear();
        t.int64_data.clear();
        t.external_data.clear();
        let Some((name, buf)) = self.external.as_mut() else {
            t.raw_data = raw;
            t.data_location = DataLocation::DEFAULT.into();
            return;
        };
        let entry = |key: &str, value: String| StringStringEntryProto {
            key: key.into(),
            value,
            ..Default::default()
        };
        t.external_data.push(entry("location", name.clone()));
        t.external_data.push(entry("offset", buf.len().to_string()));
        t.external_data.push(entry("length", raw.len().to_string()));
        t.data_location = DataLocation::EXTERNAL.into();
        t.raw_data.clear();
        buf.extend_from_slice(&raw);
    }

    /// Writes the external file, if any, and returns its path.
    fn finish(self, out: &Path) -> Result<Option<PathBuf>, FrontendError> {
        let Some((name, buf)) = self.external else {
            return Ok(None);
        };
        let path = out.with_file_name(name);
        write_atomic(&path, &buf).map_err(|e| FrontendError::Io {
            path: path.clone(),
            source: e.into(),
        })?;
        Ok(Some(path))
    }
}
