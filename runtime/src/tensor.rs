//! Tensors as the kernels see them: typed views of bytes (`TensorRef`,
//! `TensorMut`) that borrow arena memory, and `HostTensor`, an owned, 8-byte
//! aligned tensor for feeds, the reference evaluator and tests.
//!
//! Bytes are little-endian in the layout of the dtype; `bool` is one byte
//! (0 or 1).

use crate::error::{KResult, KernelError};
use fsdpc_ir::{DType, TensorType};
use half::{bf16, f16};

/// A read-only view of one tensor.
#[derive(Copy, Clone, Debug)]
pub struct TensorRef<'a> {
    /// Element type and shape.
    pub ty: &'a TensorType,
    /// Little-endian elements, row-major.
    pub bytes: &'a [u8],
}

/// A writable view of one tensor.
#[derive(Debug)]
pub struct TensorMut<'a> {
    /// Element type and shape.
    pub ty: &'a TensorType,
    /// Little-endian elements, row-major.
    pub bytes: &'a mut [u8],
}

fn cast_err(what: &str, ty: &TensorType) -> KernelError {
    KernelError(format!(
        "{what} view of a {ty} tensor is misaligned or has the wrong size"
    ))
}

impl<'a> TensorRef<'a> {
    /// A view, checking that the byte length matches the type.
    pub fn new(ty: &'a TensorType, bytes: &'a [u8]) -> KResult<TensorRef<'a>> {
        check_len(ty, bytes.len())?;
        Ok(TensorRef { ty, bytes })
    }

    /// The shape's dimensions.
    pub fn dims(&self) -> &'a [usize] {
        self.ty.shape.dims()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.ty.numel() as usize
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// The elements as f32 (the tensor must be f32).
    pub fn f32(&self) -> KResult<&'a [f32]> {
        if self.ty.dtype != DType::F32 {
            crate::kbail!("expected an f32 tensor, got {}", self.ty);
        }
        bytemuck::try_cast_slice(self.bytes).map_err(|_| cast_err("f32", self.ty))
    }

    /// The elements of an integer tensor, read as i64 without a copy.
    pub fn ints(&self) -> KResult<Ints<'a>> {
        match self.ty.dtype {
            DType::I64 => match bytemuck::try_cast_slice(self.bytes) {
                Ok(s) => Ok(Ints::I64(s)),
                Err(_) => Ok(Ints::Other(self.ty.dtype, self.bytes)),
            },
            DType::I32 | DType::Bool => Ok(Ints::Other(self.ty.dtype, self.bytes)),
            _ => crate::kbail!("expected an integer tensor, got {}", self.ty),
        }
    }

    /// Element `i` converted to f64.
    pub fn get_f64(&self, i: usize) -> f64 {
        load_f64(self.ty.dtype, self.bytes, i)
    }

    /// Element `i` converted to i64 (floats truncate toward zero).
    pub fn get_i64(&self, i: usize) -> i64 {
        load_i64(self.ty.dtype, self.bytes, i)
    }
}

impl<'a> TensorMut<'a> {
    /// A view, checking that the byte length matches the type.
    pub fn new(ty: &'a TensorType, bytes: &'a mut [u8]) -> KResult<TensorMut<'a>> {
        check_len(ty, bytes.len())?;
        Ok(TensorMut { ty, bytes })
    }

    /// The shape's dimensions.
    pub fn dims(&self) -> &'a [usize] {
        self.ty.shape.dims()
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.ty.numel() as usize
    }

    /// Element type.
    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    /// The elements as mutable f32 (the tensor must be f32).
    pub fn f32_mut(&mut self) -> KResult<&mut [f32]> {
        if self.ty.dtype != DType::F32 {
            crate::kbail!("expected an f32 output, got {}", self.ty);
        }
        let ty = self.ty;
        bytemuck::try_cast_slice_mut(self.bytes).map_err(|_| cast_err("f32", ty))
    }

    /// Stores `v` converted to the tensor's dtype at element `i`.
    pub fn set_f64(&mut self, i: usize, v: f64) {
        store_f64(self.ty.dtype, self.bytes, i, v)
    }

    /// Stores an integer at element `i` (exact for integer dtypes).
    pub fn set_i64(&mut self, i: usize, v: i64) {
        store_i64(self.ty.dtype, self.bytes, i, v)
    }

    /// A read-only view of the same memory.
    pub fn as_ref(&self) -> TensorRef<'_> {
        TensorRef {
            ty: self.ty,
            bytes: self.bytes,
        }
    }
}

fn check_len(ty: &TensorType, len: usize) -> KResult<()> {
    if ty.bytes() != len as u64 {
        crate::kbail!(
            "a {ty} tensor needs {} bytes, the view has {len}",
            ty.bytes()
        );
    }
    Ok(())
}

fn arr<const N: usize>(bytes: &[u8], i: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&bytes[i * N..(i + 1) * N]);
    a
}

/// Element `i` of little-endian `bytes` of dtype `dt`, as f64.
pub fn load_f64(dt: DType, bytes: &[u8], i: usize) -> f64 {
    match dt {
        DType::F32 => f32::from_le_bytes(arr(bytes, i)) as f64,
        DType::Bf16 => bf16::from_le_bytes(arr(bytes, i)).to_f64(),
        DType::F16 => f16::from_le_bytes(arr(bytes, i)).to_f64(),
        DType::I64 => i64::from_le_bytes(arr(bytes, i)) as f64,
        DType::I32 => i32::from_le_bytes(arr(bytes, i)) as f64,
        DType::Bool => f64::from(u8::from(bytes[i] != 0)),
    }
}

/// Element `i` as i64; floats truncate toward zero (NaN gives 0).
pub fn load_i64(dt: DType, bytes: &[u8], i: usize) -> i64 {
    match dt {
        DType::I64 => i64::from_le_bytes(arr(bytes, i)),
        DType::I32 => i32::from_le_bytes(arr(bytes, i)) as i64,
        DType::Bool => i64::from(bytes[i] != 0),
        _ => load_f64(dt, bytes, i) as i64,
    }
}

/// Stores `v` at element `i` converted to `dt` (round to nearest for floats,
/// truncation toward zero for integers, nonzero is true for bool).
pub fn store_f64(dt: DType, bytes: &mut [u8], i: usize, v: f64) {
    match dt {
        DType::F32 => put(bytes, i, &(v as f32).to_le_bytes()),
        DType::Bf16 => put(bytes, i, &bf16::from_f64(v).to_le_bytes()),
        DType::F16 => put(bytes, i, &f16::from_f64(v).to_le_bytes()),
        DType::I64 => put(bytes, i, &(v as i64).to_le_bytes()),
        DType::I32 => put(bytes, i, &(v as i32).to_le_bytes()),
        DType::Bool => bytes[i] = u8::from(v != 0.0),
    }
}

/// Stores an integer at element `i`, exactly for integer dtypes.
pub fn store_i64(dt: DType, bytes: &mut [u8], i: usize, v: i64) {
    match dt {
        DType::I64 => put(bytes, i, &v.to_le_bytes()),
        DType::I32 => put(bytes, i, &(v as i32).to_le_bytes()),
        DType::Bool => bytes[i] = u8::from(v != 0),
        _ => store_f64(dt, bytes, i, v as f64),
    }
}

fn put(bytes: &mut [u8], i: usize, v: &[u8]) {
    let n = v.len();
    bytes[i * n..(i + 1) * n].copy_from_slice(v);
}

/// An owned tensor in 8-byte aligned storage.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Element type and shape.
    pub ty: TensorType,
    words: Vec<u64>,
}

impl HostTensor {
    /// A zero-filled tensor of type `ty`.
    pub fn zeros(ty: TensorType) -> HostTensor {
        let words = vec![0u64; (ty.bytes() as usize).div_ceil(8)];
        HostTensor { ty, words }
    }

    /// An f32 tensor; errors if `data` does not have `shape`'s element count.
    pub fn from_f32(shape: &[usize], data: &[f32]) -> KResult<HostTensor> {
        let mut t = HostTensor::zeros(TensorType::new(DType::F32, shape.to_vec()));
        let len = t.bytes().len();
        if len != data.len() * 4 {
            crate::kbail!(
                "shape {shape:?} needs {} values, got {}",
                len / 4,
                data.len()
            );
        }
        t.bytes_mut().copy_from_slice(bytemuck::cast_slice(data));
        Ok(t)
    }

    /// An i64 tensor; errors if `data` does not have `shape`'s element count.
    pub fn from_i64(shape: &[usize], data: &[i64]) -> KResult<HostTensor> {
        let mut t = HostTensor::zeros(TensorType::new(DType::I64, shape.to_vec()));
        let len = t.bytes().len();
        if len != data.len() * 8 {
            crate::kbail!(
                "shape {shape:?} needs {} values, got {}",
                len / 8,
                data.len()
            );
        }
        t.bytes_mut().copy_from_slice(bytemuck::cast_slice(data));
        Ok(t)
    }

    /// A tensor from raw little-endian bytes (a literal).
    pub fn from_bytes(ty: TensorType, bytes: &[u8]) -> KResult<HostTensor> {
        let mut t = HostTensor::zeros(ty);
        if t.bytes().len() != bytes.len() {
            crate::kbail!(
                "a {} tensor needs {} bytes, got {}",
                t.ty,
                t.bytes().len(),
                bytes.len()
            );
        }
        t.bytes_mut().copy_from_slice(bytes);
        Ok(t)
    }

    /// The elements' bytes.
    pub fn bytes(&self) -> &[u8] {
        let b: &[u8] = bytemuck::cast_slice(&self.words);
        &b[..self.ty.bytes() as usize]
    }

    /// The elements' bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let n = self.ty.bytes() as usize;
        let b: &mut [u8] = bytemuck::cast_slice_mut(&mut self.words);
        &mut b[..n]
    }

    /// The elements converted to f32.
    pub fn to_f32(&self) -> Vec<f32> {
        let r = self.view();
        (0..r.numel()).map(|i| r.get_f64(i) as f32).collect()
    }

    /// The elements converted to i64.
    pub fn to_i64(&self) -> Vec<i64> {
        let r = self.view();
        (0..r.numel()).map(|i| r.get_i64(i)).collect()
    }

    /// A kernel input view.
    pub fn view(&self) -> TensorRef<'_> {
        TensorRef {
            ty: &self.ty,
            bytes: self.bytes(),
        }
    }

    /// A kernel output view.
    pub fn view_mut(&mut self) -> TensorMut<'_> {
        let n = self.ty.bytes() as usize;
        let b: &mut [u8] = bytemuck::cast_slice_mut(&mut self.words);
        TensorMut {
            ty: &self.ty,
            bytes: &mut b[..n],
        }
    }
}

/// An integer tensor's elements as i64: borrowed when they are aligned i64,
/// converted one element at a time otherwise (no copy either way).
#[derive(Copy, Clone, Debug)]
pub enum Ints<'a> {
    /// Aligned i64 elements.
    I64(&'a [i64]),
    /// Elements of another integer dtype (or unaligned i64).
    Other(DType, &'a [u8]),
}

impl Ints<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Ints::I64(s) => s.len(),
            Ints::Other(dt, b) => b.len() / dt.size(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` (`i < len()`).
    #[inline]
    pub fn get(&self, i: usize) -> i64 {
        match self {
            Ints::I64(s) => s[i],
            Ints::Other(dt, b) => load_i64(*dt, b, i),
        }
    }

    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = i64> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }
}
