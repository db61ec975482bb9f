//! Reading the ONNX protobuf (onnx.proto3, IR version 7+): the model file,
//! its opset imports, element types, and tensors, whose bytes live in the file
//! (`raw_data` or the typed `*_data` fields) or in an external data file next
//! to it (`data_location = EXTERNAL`, keys `location`, `offset`, `length`).
//!
//! The `onnx-protobuf` helpers (`as_value`) panic on some types, so fields are
//! read directly.

use crate::error::FrontendError;
use fsdpc_ir::{DType, TensorData, TensorType};
use onnx_protobuf::tensor_proto::{DataLocation, DataType};
use onnx_protobuf::{Message, ModelProto, TensorProto};
use protobuf::Enum;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// Oldest and newest default-domain opsets the importer reads.
pub(crate) const MIN_OPSET: i64 = 13;
/// See [`MIN_OPSET`].
pub(crate) const MAX_OPSET: i64 = 21;

/// Reads and decodes `path`.
pub(crate) fn read_model(path: &Path) -> Result<ModelProto, FrontendError> {
    let bytes = std::fs::read(path).map_err(|source| FrontendError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    decode_model(&bytes, path)
}

/// Decodes the bytes of an ONNX model file; `path` names it in errors.
pub(crate) fn decode_model(bytes: &[u8], path: &Path) -> Result<ModelProto, FrontendError> {
    let model = ModelProto::parse_from_bytes(bytes).map_err(|e| FrontendError::OnnxDecode {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if model.graph.0.is_none() {
        return Err(FrontendError::OnnxDecode {
            path: path.to_path_buf(),
            reason: "the file holds no graph (is it an ONNX model?)".into(),
        });
    }
    Ok(model)
}

/// The default-domain opset of `model`, checked against what the importer reads.
pub(crate) fn opset(model: &ModelProto, path: &Path) -> Result<i64, FrontendError> {
    let version = model
        .opset_import
        .iter()
        .find(|o| o.domain.is_empty() || o.domain == "ai.onnx")
        .map(|o| o.version)
        .ok_or_else(|| FrontendError::OnnxDecode {
            path: path.to_path_buf(),
            reason: "the model imports no default-domain (ai.onnx) opset".into(),
        })?;
    if !(MIN_OPSET..=MAX_OPSET).contains(&version) {
        return Err(FrontendError::OnnxOpset {
            path: path.to_path_buf(),
            version,
            min: MIN_OPSET,
            max: MAX_OPSET,
        });
    }
    Ok(version)
}

/// The IR element type of ONNX element type `t`, for values of the graph.
pub(crate) fn dtype(t: i32) -> Result<DType, String> {
    match DataType::from_i32(t) {
        Some(DataType::FLOAT) => Ok(DType::F32),
        Some(DataType::FLOAT16) => Ok(DType::F16),
        Some(DataType::BFLOAT16) => Ok(DType::Bf16),
        Some(DataType::INT64) => Ok(DType::I64),
        Some(DataType::INT32) => Ok(DType::I32),
        Some(DataType::BOOL) => Ok(DType::Bool),
        Some(other) => Err(format!("element type {other:?} is not supported")),
        None => Err(format!("unknown element type {t}")),
    }
}

/// Where a tensor's external data file is looked for.
pub(crate) struct TensorSource<'a> {
    /// The directory of the model file (`None`: a model read from bytes,
    /// which cannot have external data).
    pub dir: Option<&'a Path>,
    /// The model file, for errors.
    pub model: &'a Path,
}

/// The bytes of `t` in IR layout. Doubles become f32; other types keep theirs.
pub(crate) fn tensor(t: &TensorProto, src: &TensorSource<'_>) -> Result<TensorData, FrontendError> {
    tensor_from(t, Vec::new(), src)
}

/// [`tensor`] for a tensor whose `raw_data` the caller moved out into `raw`
/// (so a large initializer is never held twice).
pub(crate) fn tensor_from(
    t: &TensorProto,
    raw: Vec<u8>,
    src: &TensorSource<'_>,
) -> Result<TensorData, FrontendError> {
    let bad = |reason: String| FrontendError::OnnxTensor {
        path: src.model.to_path_buf(),
        tensor: t.name.clone(),
        reason,
    };
    let shape: Vec<usize> = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| bad(format!("negative dimension {d}"))))
        .collect::<Result<_, _>>()?;
    let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    let numel = numel.ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
    let is_double = t.data_type == DataType::DOUBLE as i32;
    let dt = if is_double {
        DType::F32
    } else {
        dtype(t.data_type).map_err(bad)?
    };
    let raw = if t.data_location.enum_value() == Ok(DataLocation::EXTERNAL) {
        let width = if is_double { 8 } else { dt.size() };
        let len = numel
            .checked_mul(width)
            .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
        external(t, src, len)?
    } else if !raw.is_empty() {
        raw
    } else if !t.raw_data.is_empty() || numel == 0 {
        t.raw_data.clone()
    } else {
        typed_fields(t, dt, is_double)
    };
    let bytes = if is_double { doubles_to_f32(&raw) } else { raw };
    let want = numel
        .checked_mul(dt.size())
        .ok_or_else(|| bad(format!("shape {shape:?} of {dt} overflows")))?;
    if bytes.len() != want {
        return Err(bad(format!(
            "{} bytes of data for {numel} elements of {dt}",
            bytes.len()
        )));
    }
    Ok(TensorData {
        ty: TensorType::new(dt, shape),
        bytes,
    })
}

/// The bytes of external tensor `t` as they are in its data file (its own
/// element type, doubles included).
pub(crate) fn external_bytes(
    t: &TensorProto,
    src: &TensorSource<'_>,
) -> Result<Vec<u8>, FrontendError> {
    let bad = |reason: String| FrontendError::OnnxTensor {
        path: src.model.to_path_buf(),
        tensor: t.name.clone(),
        reason,
    };
    let width = if t.data_type == DataType::DOUBLE as i32 {
        8
    } else {
        dtype(t.data_type).map_err(bad)?.size()
    };
    let len = t
        .dims
        .iter()
        .try_fold(width, |a, &d| a.checked_mul(usize::try_from(d).ok()?))
        .ok_or_else(|| bad(format!("shape {:?} is invalid", t.dims)))?;
    external(t, src, len)
}

/// Bytes from the typed repeated fields (`float_data`, `int64_data`, ...).
fn typed_fields(t: &TensorProto, dt: DType, is_double: bool) -> Vec<u8> {
    if is_double {
        return t.double_data.iter().flat_map(|x| x.to_le_bytes()).collect();
    }
    match dt {
        DType::F32 => t.float_data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::I64 => t.int64_data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        DType::I32 => t.int32_data.iter().flat_map(|x| x.to_le_bytes()).collect(),
        // f16/bf16 bit patterns and bools travel in int32_data.
        DType::F16 | DType::Bf16 => t
            .int32_data
            .iter()
            .flat_map(|&x| (x as u16).to_le_bytes())
            .collect(),
        DType::Bool => t.int32_data.iter().map(|&x| u8::from(x != 0)).collect(),
    }
}

fn doubles_to_f32(raw: &[u8]) -> Vec<u8> {
    raw.chunks_exact(8)
        .flat_map(|c| {
            let mut a = [0u8; 8];
            a.copy_from_slice(c);
            (f64::from_le_bytes(a) as f32).to_le_bytes()
        })
        .collect()
}

/// Reads `len` bytes of `t` from its external data file.
fn external(t: &TensorProto, src: &TensorSource<'_>, len: usize) -> Result<Vec<u8>, FrontendError> {
    let key = |k: &str| {
        t.external_data
            .iter()
            .find(|e| e.key == k)
            .map(|e| e.value.as_str())
    };
    let missing = |file: PathBuf, reason: String| FrontendError::OnnxExternalData {
        path: src.model.to_path_buf(),
        tensor: t.name.clone(),
        file,
        reason,
    };
    let location =
        key("location").ok_or_else(|| missing(PathBuf::new(), "no `location` key".into()))?;
    let rel = Path::new(location);
    if rel.is_absolute()
        || rel
            .components()
            .any(|c| matches!(c, std::path::Component::ParentDir))
    {
        return Err(missing(
            rel.to_path_buf(),
            "the location must be a path inside the model's directory".into(),
        ));
    }
    let Some(dir) = src.dir else {
        return Err(missing(
            rel.to_path_buf(),
            "a model imported from bytes has no directory to read external data from".into(),
        ));
    };
    let file = dir.join(rel);
    let num = |k: &str| -> Result<Option<u64>, FrontendError> {
        key(k)
            .map(|v| {
                v.parse::<u64>()
                    .map_err(|_| missing(file.clone(), format!("`{k}` is `{v}`, not a number")))
            })
            .transpose()
    };
    let offset = num("offset")?.unwrap_or(0);
    let length = num("length")?.map_or(len, |l| l as usize);
    if length != len {
        return Err(missing(
            file.clone(),
            format!("length {length} but the tensor needs {len} bytes"),
        ));
    }
    let read = || -> std::io::Result<Vec<u8>> {
        let mut f = std::fs::File::open(&file)?;
        let size = f.metadata()?.len();
        if offset.saturating_add(len as u64) > size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("the file has {size} bytes; the tensor needs {len} at offset {offset}"),
            ));
        }
        f.seek(SeekFrom::Start(offset))?;
        let mut buf = vec![0u8; len];
        f.read_exact(&mut buf)?;
        Ok(buf)
    };
    read().map_err(|e| missing(file.clone(), e.to_string()))
}
