//! The CUDA backend (cargo feature `cuda`): the same plan that runs on CPU
//! threads, run by one process per GPU. The plan's streams are CUDA
//! streams, its events CUDA events, its arena one device allocation, its
//! collectives NCCL calls (one communicator per plan stream and group), its
//! kernels NVRTC-compiled CUDA C (`kernels/*.cu`) and cuBLAS products.
//!
//! - `error`: `CudaError`; `libs`: finding the libraries (pip's wheels
//!   too); `sources`: the kernel files; `geometry`: the index descriptors
//!   the kernels take; `train`: the training loop of one GPU rank (without
//!   the feature it says the backend was not compiled in);
//! - with the feature: `nvrtc` (compiling the kernels), `device` (context,
//!   loaded kernels, launches, the allocation), `ops/` (a graph node's
//!   device work: the dispatch in `ops/mod.rs`, one file per op family as
//!   in `cpu/kernels/`), `attention` and `blas` (the launches of fused
//!   attention and the cuBLAS calls of matrix products, which `ops` calls),
//!   `nccl` (communicators), `exec/` (a GPU rank: `rank` its set-up,
//!   `lower/` each instruction's device work, `comms` its communicators,
//!   `replay` a step's instructions on the streams), `single` (one node's
//!   kernel on host tensors, for tests and calibration), `calibrate` (the
//!   measurements of `fsdpc calibrate --target cuda`).

pub mod error;
pub mod geometry;
pub mod libs;
pub mod sources;
pub mod train;

#[cfg(feature = "cuda")]
pub mod attention;
#[cfg(feature = "cuda")]
pub mod blas;
#[cfg(feature = "cuda")]
pub mod calibrate;
#[cfg(feature = "cuda")]
pub mod device;
#[cfg(feature = "cuda")]
pub mod exec;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
pub mod nvrtc;
#[cfg(feature = "cuda")]
pub mod ops;
#[cfg(feature = "cuda")]
pub mod single;

pub use error::CudaError;
pub use train::{train_cuda, Cuda, CudaConfig, DeviceReport, MemoryReport, NcclMode, Overlap};
