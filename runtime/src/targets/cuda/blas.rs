//! Matrix products through cuBLAS (`cublasGemmStridedBatchedEx`): f32
//! operands with f32 compute (no TF32), bf16/f16 operands with f32
//! accumulation. A row-major `C = op(A) op(B)` is cuBLAS's column-major
//! `C^T = op(B)^T op(A)^T`, so B goes first. Leading (batch) dimensions
//! broadcast: one strided-batched call when each operand's batch is either
//! whole or absent, else one call per output matrix. Kernels that multiply
//! parts of their operands (convolution) state their calls with
//! `Gemm::row_major`, which may also add the product to the output.

use super::error::CudaError;
use super::geometry::{broadcast_strides, strides};
use super::ops::Operand;
use cudarc::cublas::result as cb;
use cudarc::cublas::sys;
use cudarc::driver::CudaStream;
use fsdpc_ir::ops::matmul::Geometry;
use fsdpc_ir::DType;
use std::ffi::c_void;

/// One `cublasGemmStridedBatchedEx` call, in cuBLAS's (column-major) terms.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Gemm {
    /// Transpose the first operand (our B).
    pub trans1: bool,
    /// Transpose the second operand (our A).
    pub trans2: bool,
    /// cuBLAS m, n, k.
    pub m: i32,
    /// cuBLAS n.
    pub n: i32,
    /// cuBLAS k.
    pub k: i32,
    /// First operand, its leading dimension and batch stride (elements).
    pub x1: (u64, i32, i64),
    /// Second operand.
    pub x2: (u64, i32, i64),
    /// Output.
    pub c: (u64, i32, i64),
    /// Matrices in the batch.
    pub batch: i32,
    /// Element type of the operands and of the output.
    pub dtype: (DType, DType),
    /// Add the product to the output (cuBLAS's `beta = 1`) instead of
    /// overwriting it (`beta = 0`).
    pub accumulate: bool,
}

/// One operand of a row-major product: a matrix stored row-major as
/// `rows x cols` at `ptr`, `stride` elements apart in a batch (0: the same
/// matrix for every product), used transposed when `trans`.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    /// Device address.
    pub ptr: u64,
    /// Rows as stored.
    pub rows: u64,
    /// Columns as stored (its leading dimension).
    pub cols: u64,
    /// Used transposed.
    pub trans: bool,
    /// Elements between consecutive matrices of a batch.
    pub stride: u64,
}

impl Stored {
    /// Rows and columns as used (after the transpose).
    fn used(&self) -> (u64, u64) {
        if self.trans {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }
}

impl Gemm {
    /// `batch` products `c = a b` (`accumulate`: `c += a b`) of row-major
    /// matrices, the operands of `dtype.0` and `c` of `dtype.1`; `c` is
    /// `(address, stride)`: dense `m x n` matrices `stride` elements apart.
    /// cuBLAS's column-major `c^T = b^T a^T`, so `b` goes first. An error
    /// when the matrices do not chain or a size exceeds cuBLAS's 32 bits.
    pub fn row_major(
        a: Stored,
        b: Stored,
        c: (u64, u64),
        batch: u64,
        dtype: (DType, DType),
        accumulate: bool,
    ) -> Result<Gemm, String> {
        let ((m, k), (kb, n)) = (a.used(), b.used());
        if k != kb {
            return Err(format!(
                "matmul: inner dimensions {k} and {kb} differ ({m} x {k} by {kb} x {n})"
            ));
        }
        let stride = |v: u64, what: &str| -> Result<i64, String> {
            i64::try_from(v).map_err(|_| format!("matmul: {what} stride {v} too large"))
        };
        Ok(Gemm {
            trans1: b.trans,
            trans2: a.trans,
            m: to_i32(n, "n")?,
            n: to_i32(m, "m")?,
            k: to_i32(k, "k")?,
            x1: (b.ptr, to_i32(b.cols.max(1), "ldb")?, stride(b.stride, "b")?),
            x2: (a.ptr, to_i32(a.cols.max(1), "lda")?, stride(a.stride, "a")?),
            c: (c.0, to_i32(n.max(1), "ldc")?, stride(c.1, "c")?),
            batch: to_i32(batch, "batch")?,
            dtype,
            accumulate,
        })
    }
}

fn to_i32(v: u64, what: &str) -> Result<i32, String> {
    i32::try_from(v).map_err(|_| format!("matmul: {what} {v} exceeds cuBLAS's 32-bit sizes"))
}

/// The calls of `y = op(a) op(b)`.
pub fn plan_matmul(
    a: &Operand,
    b: &Operand,
    y: &Operand,
    trans_a: bool,
    trans_b: bool,
) -> Result<Vec<Gemm>, String> {
    let (ad, bd) = (&a.ty.shape.0, &b.ty.shape.0);
    let Some(g) = Geometry::of(ad, bd, trans_a, trans_b) else {
        return Err(format!(
            "matmul needs operands of rank >= 1, got {ad:?} and {bd:?}"
        ));
    };
    if a.ty.dtype != b.ty.dtype || !a.ty.dtype.is_float() {
        return Err(format!(
            "matmul of {} and {}: the operands must share one float dtype",
            a.ty, b.ty
        ));
    }
    let (m, ka, kb, n) = (g.m, g.k, g.k_b, g.n);
    if ka != kb {
        return Err(format!(
            "matmul: inner dimensions {ka} and {kb} differ ({} x {})",
            a.ty, b.ty
        ));
    }
    let k = ka;
    // The output batch: a's and b's batches broadcast together.
    let (ba, bb) = (&g.batch_a, &g.batch_b);
    let Ok(batch) = g.batch() else {
        return Err(format!(
            "matmul: batch dimensions {ba:?} and {bb:?} do not broadcast"
        ));
    };
    let (fa, fb) = g.padded_batches();
    let nb = batch.len();
    let count: u64 = batch.iter().map(|&x| x as u64).product();
    if y.numel() != count * (m * n) as u64 {
        return Err(format!(
            "matmul output {} does not match ({} x {})",
            y.ty, a.ty, b.ty
        ));
    }
    if y.ty.dtype != a.ty.dtype && y.ty.dtype != DType::F32 {
        return Err(format!("matmul of {} into {} is not supported", a.ty, y.ty));
    }
    let sa = broadcast_strides(&fa, &batch)?;
    let sb = broadcast_strides(&fb, &batch)?;
    let (ma, mb, mc) = ((m * k) as u64, (k * n) as u64, (m * n) as u64);
    let (ea, ec) = (a.ty.dtype.size() as u64, y.ty.dtype.size() as u64);
    let base = Gemm {
        trans1: trans_b,
        trans2: trans_a,
        m: to_i32(n as u64, "n")?,
        n: to_i32(m as u64, "m")?,
        k: to_i32(k as u64, "k")?,
        x1: (b.ptr, to_i32(if trans_b { k } else { n } as u64, "ldb")?, 0),
        x2: (a.ptr, to_i32(if trans_a { m } else { k } as u64, "lda")?, 0),
        c: (y.ptr, to_i32(n as u64, "ldc")?, mc as i64),
        batch: 1,
        dtype: (a.ty.dtype, y.ty.dtype),
        accumulate: false,
    };
    // One strided call when each operand's batch is whole or absent.
    let full = strides(&batch);
    let whole = |s: &[usize]| {
        s.iter()
            .zip(&full)
            .zip(&batch)
            .all(|((&x, &w), &d)| d == 1 || x == w)
    };
    let absent = |s: &[usize]| s.iter().all(|&x| x == 0);
    let a_ok = absent(&sa) || whole(&sa);
    let b_ok = absent(&sb) || whole(&sb);
    if a_ok && b_ok && count <= i32::MAX as u64 {
        let mut g = base;
        g.batch = count as i32;
        g.x1.2 = if absent(&sb) { 0 } else { mb as i64 };
        g.x2.2 = if absent(&sa) { 0 } else { ma as i64 };
        return Ok(vec![g]);
    }
    let st = strides(&batch);
    let mut calls = Vec::new();
    for o in 0..count as usize {
        let (mut oa, mut ob) = (0u64, 0u64);
        for d in 0..nb {
            let c = (o / st[d]) % batch[d];
            oa += (c * sa[d]) as u64;
            ob += (c * sb[d]) as u64;
        }
        let mut g = base;
        g.x2.0 = a.ptr + oa * ma * ea;
        g.x1.0 = b.ptr + ob * mb * ea;
        g.c.0 = y.ptr + o as u64 * mc * ec;
        calls.push(g);
    }
    Ok(calls)
}

fn cuda_type(dt: DType) -> sys::cudaDataType {
    match dt {
        DType::Bf16 => sys::cudaDataType::CUDA_R_16BF,
        DType::F16 => sys::cudaDataType::CUDA_R_16F,
        _ => sys::cudaDataType::CUDA_R_32F,
    }
}

/// A cuBLAS handle bound to one stream, with its workspace in the arena.
pub struct Blas {
    handle: sys::cublasHandle_t,
}

// SAFETY: a handle is used by the one host thread that issues its stream's
// work.
unsafe impl Send for Blas {}

impl Blas {
    /// A handle on `stream` using `workspace` (device address, bytes) as its
    /// scratch instead of allocating its own.
    pub fn new(stream: &CudaStream, workspace: (u64, usize)) -> Result<Blas, CudaError> {
        stream.context().bind_to_thread()?;
        let handle = cb::create_handle()?;
        let blas = Blas { handle };
        // SAFETY: live handle and stream; the workspace lies in the arena
        // allocation, which outlives the handle.
        unsafe {
            cb::set_stream(handle, stream.cu_stream() as _)?;
            sys::cublasSetWorkspace_v2(handle, workspace.0 as *mut c_void, workspace.1).result()?;
        }
        Ok(blas)
    }

    /// Issues `g` on the handle's stream.
    pub fn run(&self, g: &Gemm) -> Result<(), CudaError> {
        let (alpha, beta) = (1.0f32, if g.accumulate { 1.0f32 } else { 0.0 });
        let op = |t: bool| {
            if t {
                sys::cublasOperation_t::CUBLAS_OP_T
            } else {
                sys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let compute = sys::cublasComputeType_t::CUBLAS_COMPUTE_32F;
        let (dt, ct) = (cuda_type(g.dtype.0), cuda_type(g.dtype.1));
        // SAFETY: the pointers are arena regions `plan_matmul` (or the
        // lowering that called `Gemm::row_major`) sized from the operands'
        // types; alpha and beta are host f32 (compute 32F).
        unsafe {
            cb::gemm_strided_batched_ex(
                self.handle,
                op(g.trans1),
                op(g.trans2),
                g.m,
                g.n,
                g.k,
                &alpha as *const f32 as *const c_void,
                g.x1.0 as *const c_void,
                dt,
                g.x1.1,
                g.x1.2,
                g.x2.0 as *const c_void,
                dt,
                g.x2.1,
                g.x2.2,
                &beta as *const f32 as *const c_void,
                g.c.0 as *mut c_void,
                ct,
                g.c.1,
                g.c.2,
                g.batch,
                compute,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )?;
        }
        Ok(())
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        let _ = unsafe { cb::destroy_handle(self.handle) };
    }
}
