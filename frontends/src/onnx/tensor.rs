//! Host tensors: the values of constants and of shape computations that the
//! importer folds (Shape -> Gather -> Concat -> Reshape, Range, masks), kept as
//! f64 or i64 so that one small set of routines serves every element type.

use fsdpc_ir::{DType, TensorData, TensorType};

/// The most elements a folded constant may have (a 8192 x 8192 mask).
pub(crate) const MAX_FOLD: usize = 1 << 26;

/// Element values: floats as f64, integers and booleans (0/1) as i64.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum HostData {
    F(Vec<f64>),
    I(Vec<i64>),
}

/// A constant tensor known at import time.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HostTensor {
    pub dtype: DType,
    pub shape: Vec<usize>,
    pub data: HostData,
}

impl HostTensor {
    /// A tensor of `dtype` and `shape` from integer values.
    pub fn ints(dtype: DType, shape: Vec<usize>, v: Vec<i64>) -> HostTensor {
        let data = if dtype.is_float() {
            HostData::F(v.into_iter().map(|x| x as f64).collect())
        } else {
            HostData::I(v)
        };
        HostTensor { dtype, shape, data }
    }

    /// A tensor of `dtype` and `shape` from float values (truncated for
    /// integer types, `!= 0` for bool).
    pub fn floats(dtype: DType, shape: Vec<usize>, v: Vec<f64>) -> HostTensor {
        let data = match dtype {
            DType::Bool => HostData::I(v.into_iter().map(|x| i64::from(x != 0.0)).collect()),
            d if d.is_int() => HostData::I(v.into_iter().map(|x| x as i64).collect()),
            _ => HostData::F(v),
        };
        HostTensor { dtype, shape, data }
    }

    /// A 1-D i64 tensor.
    pub fn vec_i64(v: Vec<i64>) -> HostTensor {
        HostTensor::ints(DType::I64, vec![v.len()], v)
    }

    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Every element as i64 (floats truncated).
    pub fn as_i64(&self) -> Vec<i64> {
        match &self.data {
            HostData::I(v) => v.clone(),
            HostData::F(v) => v.iter().map(|&x| x as i64).collect(),
        }
    }

    /// Every element as f64.
    pub fn as_f64(&self) -> Vec<f64> {
        match &self.data {
            HostData::I(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::F(v) => v.clone(),
        }
    }

    /// The same values converted to `dtype`.
    pub fn cast(&self, dtype: DType) -> HostTensor {
        match (&self.data, dtype.is_float()) {
            (HostData::F(v), _) => HostTensor::floats(dtype, self.shape.clone(), v.clone()),
            (HostData::I(v), true) => HostTensor::ints(dtype, self.shape.clone(), v.clone()),
            (HostData::I(v), false) if dtype == DType::Bool => HostTensor::ints(
                dtype,
                self.shape.clone(),
                v.iter().map(|&x| i64::from(x != 0)).collect(),
            ),
            (HostData::I(v), false) => HostTensor::ints(dtype, self.shape.clone(), v.clone()),
        }
    }

    /// The same values in `shape` (same element count).
    pub fn reshaped(&self, shape: Vec<usize>) -> HostTensor {
        HostTensor {
            dtype: self.dtype,
            shape,
            data: self.data.clone(),
        }
    }

    /// Elements at `idx` (flat indices into self), same dtype.
    pub fn pick(&self, idx: &[usize], shape: Vec<usize>) -> HostTensor {
        let data = match &self.data {
            HostData::F(v) => HostData::F(idx.iter().map(|&i| v[i]).collect()),
            HostData::I(v) => HostData::I(idx.iter().map(|&i| v[i]).collect()),
        };
        HostTensor {
            dtype: self.dtype,
            shape,
            data,
        }
    }

    /// Little-endian bytes in the layout of `dtype`, for a `Constant` node.
    pub fn to_data(&self) -> TensorData {
        let bytes: Vec<u8> = match self.dtype {
            DType::F32 => self
                .as_f64()
                .iter()
                .flat_map(|&x| (x as f32).to_le_bytes())
                .collect(),
            DType::I64 => self
                .as_i64()
                .iter()
                .flat_map(|&x| x.to_le_bytes())
                .collect(),
            DType::I32 => self
                .as_i64()
                .iter()
                .flat_map(|&x| (x as i32).to_le_bytes())
                .collect(),
            DType::Bool => self.as_i64().iter().map(|&x| u8::from(x != 0)).collect(),
            DType::F16 => self
                .as_f64()
                .iter()
                .flat_map(|&x| half::f16::from_f64(x).to_le_bytes())
                .collect(),
            DType::Bf16 => self
                .as_f64()
                .iter()
                .flat_map(|&x| half::bf16::from_f64(x).to_le_bytes())
                .collect(),
        };
        TensorData {
            ty: TensorType::new(self.dtype, self.shape.clone()),
            bytes,
        }
    }

    /// Reads a constant from its bytes.
    pub fn from_data(d: &TensorData) -> Result<HostTensor, String> {
        let shape = d.ty.shape.dims().to_vec();
        let b = &d.bytes;
        let t = match d.ty.dtype {
            DType::F32 => HostTensor::floats(
                DType::F32,
                shape,
                chunks::<4>(b)
                    .map(|c| f32::from_le_bytes(c) as f64)
                    .collect(),
            ),
            DType::I64 => HostTensor::ints(
                DType::I64,
                shape,
                chunks::<8>(b).map(i64::from_le_bytes).collect(),
            ),
            DType::I32 => HostTensor::ints(
                DType::I32,
                shape,
                chunks::<4>(b)
                    .map(|c| i32::from_le_bytes(c) as i64)
                    .collect(),
            ),
            DType::Bool => HostTensor::ints(
                DType::Bool,
                shape,
                b.iter().map(|&x| i64::from(x != 0)).collect(),
            ),
            DType::F16 => HostTensor::floats(
                DType::F16,
                shape,
                chunks::<2>(b)
                    .map(|c| half::f16::from_le_bytes(c).to_f64())
                    .collect(),
            ),
            DType::Bf16 => HostTensor::floats(
                DType::Bf16,
                shape,
                chunks::<2>(b)
                    .map(|c| half::bf16::from_le_bytes(c).to_f64())
                    .collect(),
            ),
        };
        if t.numel()
            != match &t.data {
                HostData::F(v) => v.len(),
                HostData::I(v) => v.len(),
            }
        {
            return Err(format!("constant of type {} has {} bytes", d.ty, b.len()));
        }
        Ok(t)
    }
}

fn chunks<const N: usize>(b: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    b.chunks_exact(N).map(|c| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        a
    })
}

/// Row-major strides of `shape`.
pub(crate) fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// The numpy broadcast of two shapes.
pub(crate) fn broadcast(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let n = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y || y == 1 => Ok(x),
            (1, y) => Ok(y),
            _ => Err(format!("shapes {a:?} and {b:?} do not broadcast")),
        })
        .collect()
}

/// For each element of `out` (row-major), the flat index into a tensor of
/// shape `src` broadcast to `out`.
pub(crate) fn broadcast_indices(src: &[usize], out: &[usize]) -> Vec<usize> {
    let n = out.len();
    let st = strides(src);
    let total: usize = out.iter().product();
    let mut res = Vec::with_capacity(total);
    let mut idx = vec![0usize; n];
    for _ in 0..total {
        let mut off = 0;
        for (i, &x) in idx.iter().enumerate() {
            if i + src.len() >= n {
                let j = i + src.len() - n;
                if src[j] != 1 {
                    off += x * st[j];
                }
            }
        }
        res.push(off);
        for i in (0..n).rev() {
            idx[i] += 1;
            if idx[i] < out[i] {
                break;
            }
            idx[i] = 0;
        }
    }
    res
}

/// Elementwise `f` on two broadcast tensors, with the result in `dtype`.
pub(crate) fn zip(
    a: &HostTensor,
    b: &HostTensor,
    dtype: DType,
    fi: impl Fn(i64, i64) -> i64,
    ff: impl Fn(f64, f64) -> f64,
) -> Result<HostTensor, String> {
    let shape = broadcast(&a.shape, &b.shape)?;
    check_size(&shape)?;
    let ia = broadcast_indices(&a.shape, &shape);
    let ib = broadcast_indices(&b.shape, &shape);
    Ok(match (&a.data, &b.data) {
        (HostData::I(x), HostData::I(y)) if !dtype.is_float() => HostTensor::ints(
            dtype,
            shape,
            ia.iter().zip(&ib).map(|(&i, &j)| fi(x[i], y[j])).collect(),
        ),
        _ => {
            let (x, y) = (a.as_f64(), b.as_f64());
            HostTensor::floats(
                dtype,
                shape,
                ia.iter().zip(&ib).map(|(&i, &j)| ff(x[i], y[j])).collect(),
            )
        }
    })
}

/// Fails if a folded tensor of `shape` would be unreasonably large.
pub(crate) fn check_size(shape: &[usize]) -> Result<(), String> {
    let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match n {
        Some(n) if n <= MAX_FOLD => Ok(()),
        _ => Err(format!(
            "a constant of shape {shape:?} is too large to fold"
        )),
    }
}

/// The most elements any tensor of an imported graph may have (2^40).
pub(crate) const MAX_NUMEL: usize = 1 << 40;

/// Fails if a graph tensor of `shape` would be implausibly large (and keeps
/// every later product of its dimensions from overflowing).
pub(crate) fn check_numel(shape: &[usize]) -> Result<(), String> {
    let n = shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match n {
        Some(n) if n <= MAX_NUMEL => Ok(()),
        _ => Err(format!("a tensor of shape {shape:?} is implausibly large")),
    }
}
