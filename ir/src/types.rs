//! Element types, static shapes and tensor types.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Element type of a tensor.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    F32,
    Bf16,
    F16,
    I64,
    I32,
    Bool,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::Bf16 | DType::F16 => 2,
            DType::I64 => 8,
            DType::Bool => 1,
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::Bf16 | DType::F16)
    }

    pub fn is_int(self) -> bool {
        matches!(self, DType::I64 | DType::I32)
    }

    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
            DType::I64 => "i64",
            DType::I32 => "i32",
            DType::Bool => "bool",
        }
    }

    pub fn parse(s: &str) -> Option<DType> {
        Some(match s {
            "f32" | "fp32" | "float32" => DType::F32,
            "bf16" | "bfloat16" => DType::Bf16,
            "f16" | "fp16" | "float16" => DType::F16,
            "i64" | "int64" => DType::I64,
            "i32" | "int32" => DType::I32,
            "bool" => DType::Bool,
            _ => return None,
        })
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A static shape. Batch size and sequence length are fixed when a model is
/// compiled, which is what makes a static schedule possible.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    pub fn new(dims: impl Into<Vec<usize>>) -> Shape {
        Shape(dims.into())
    }
    pub fn scalar() -> Shape {
        Shape(Vec::new())
    }
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    /// Number of elements (1 for a scalar).
    pub fn numel(&self) -> u64 {
        self.0.iter().map(|&d| d as u64).product()
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The static type of every tensor in a graph.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Shape,
}

impl TensorType {
    pub fn new(dtype: DType, shape: impl Into<Vec<usize>>) -> TensorType {
        TensorType {
            dtype,
            shape: Shape(shape.into()),
        }
    }
    pub fn numel(&self) -> u64 {
        self.shape.numel()
    }
    pub fn bytes(&self) -> u64 {
        self.numel() * self.dtype.size() as u64
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, self.shape)
    }
}

/// Small literal tensor data (constants, ONNX initializers). Bytes are
/// little-endian in the layout of `ty.dtype`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TensorData {
    pub ty: TensorType,
    #[serde(with = "crate::hexbytes")]
    pub bytes: Vec<u8>,
}

impl TensorData {
    /// A scalar of `dtype` holding `value`, converted as a cast would
    /// (rounded to the float format, truncated toward zero for integers,
    /// `value != 0` for bool).
    pub fn scalar(dtype: DType, value: f64) -> TensorData {
        TensorData {
            ty: TensorType::new(dtype, Vec::new()),
            bytes: encode(dtype, value),
        }
    }

    /// A tensor of type `ty` whose elements are `values` converted to
    /// `ty.dtype`; `None` if the number of values is not `ty.numel()`.
    pub fn from_f64s(ty: TensorType, values: &[f64]) -> Option<TensorData> {
        if values.len() as u64 != ty.numel() {
            return None;
        }
        let bytes = values.iter().flat_map(|&v| encode(ty.dtype, v)).collect();
        Some(TensorData { ty, bytes })
    }

    /// Element `i` (row-major) as f64, or `None` if it is out of range.
    pub fn get_f64(&self, i: u64) -> Option<f64> {
        let size = self.ty.dtype.size();
        let at = usize::try_from(i).ok()?.checked_mul(size)?;
        let b = self.bytes.get(at..at.checked_add(size)?)?;
        Some(decode(self.ty.dtype, b))
    }

    /// Checks that the byte length matches the type.
    pub fn check(&self) -> Result<(), String> {
        let want = self.ty.bytes();
        if self.bytes.len() as u64 == want {
            Ok(())
        } else {
            Err(format!(
                "data of type {} holds {} bytes, expected {want}",
                self.ty,
                self.bytes.len()
            ))
        }
    }
}

/// Little-endian bytes of `value` as one element of `dtype`.
fn encode(dtype: DType, value: f64) -> Vec<u8> {
    match dtype {
        DType::F32 => (value as f32).to_le_bytes().to_vec(),
        DType::Bf16 => half::bf16::from_f64(value).to_le_bytes().to_vec(),
        DType::F16 => half::f16::from_f64(value).to_le_bytes().to_vec(),
        DType::I64 => (value as i64).to_le_bytes().to_vec(),
        DType::I32 => (value as i32).to_le_bytes().to_vec(),
        DType::Bool => vec![u8::from(value != 0.0)],
    }
}

/// One element of `dtype` from exactly `dtype.size()` little-endian bytes.
fn decode(dtype: DType, b: &[u8]) -> f64 {
    let arr = |n: usize| -> [u8; 8] {
        let mut a = [0u8; 8];
        a[..n].copy_from_slice(&b[..n]);
        a
    };
    match dtype {
        DType::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::Bf16 => half::bf16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::F16 => half::f16::from_le_bytes([b[0], b[1]]).to_f64(),
        DType::I64 => i64::from_le_bytes(arr(8)) as f64,
        DType::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        DType::Bool => f64::from(u8::from(b[0] != 0)),
    }
}
