//! `CudaError`: everything the CUDA backend can report, from a library
//! that is not installed to a kernel that found a bad index. Built with and
//! without the `cuda` feature, so callers match on one type either way.

use thiserror::Error;

/// Errors of the CUDA backend.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CudaError {
    /// This build has no CUDA backend.
    #[error("the cuda target was not compiled in; rebuild with `--features cuda`")]
    NotCompiled,
    /// A CUDA library could not be found or loaded.
    #[error("{library} was not found (looked in: {}); {hint}", looked_in.join(", "))]
    LibraryMissing {
        /// The library (`libnvrtc`, `libnccl`, ...).
        library: &'static str,
        /// Where fsdpc looked besides the loader's own search path.
        looked_in: Vec<String>,
        /// How to point fsdpc at it.
        hint: String,
    },
    /// The driver loaded but there is no usable GPU.
    #[error("no CUDA device: {reason}")]
    NoDevice {
        /// What the driver said.
        reason: String,
    },
    /// A CUDA driver call failed.
    #[cfg(feature = "cuda")]
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// A cuBLAS call failed.
    #[cfg(feature = "cuda")]
    #[error("cuBLAS: {0}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),
    /// An NVRTC call failed (other than a compile error, `Compile`).
    #[cfg(feature = "cuda")]
    #[error("NVRTC: {0}")]
    Nvrtc(#[from] cudarc::nvrtc::result::NvrtcError),
    /// An NCCL call failed (cudarc's `NcclError` is not a `std` error, so
    /// its code is kept as text).
    #[error("NCCL: {call} failed with {code}")]
    Nccl {
        /// The NCCL function.
        call: &'static str,
        /// The `ncclResult_t` it returned.
        code: String,
    },
    /// NVRTC rejected a kernel file.
    #[error("NVRTC could not compile {file} for {arch}: {log}")]
    Compile {
        /// The kernel file (`attention.cu`).
        file: String,
        /// The target (`sm_90`, `compute_80`).
        arch: String,
        /// NVRTC's log.
        log: String,
    },
    /// A plan instruction the CUDA executor does not run.
    #[error("instruction {instr} ({what}) is not supported by the cuda backend: {reason}")]
    Unsupported {
        /// The instruction index.
        instr: usize,
        /// The instruction or op.
        what: String,
        /// Why, or what to do instead.
        reason: String,
    },
    /// A kernel's operands do not fit what it computes.
    #[error("cuda kernel of node {node} ({op}): {reason}")]
    Kernel {
        /// The node (id and name).
        node: String,
        /// The op's short name.
        op: String,
        /// What is wrong.
        reason: String,
    },
    /// A kernel reported a bad value in its input during a step (an index
    /// or label out of range, an integer division by zero).
    #[error("step {step}: a cuda kernel on stream {stream} found {what}")]
    DeviceFault {
        /// The training step.
        step: u64,
        /// The plan stream.
        stream: String,
        /// What it found.
        what: String,
    },
}

#[cfg(feature = "cuda")]
impl CudaError {
    /// An NCCL error of `call`.
    pub fn nccl(call: &'static str, e: cudarc::nccl::result::NcclError) -> CudaError {
        CudaError::Nccl {
            call,
            code: format!("{:?}", e.0),
        }
    }
}
