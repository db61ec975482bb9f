//! fsdpc-runtime: executes a plan, on CPU thread ranks, MPI process ranks
//! or GPUs.
//!
//! - `backend` / `cpu`: the kernel set (`Backend`) and its CPU implementation;
//! - `comm`: the collective set (`Communicator`) and shared-memory collectives;
//! - `exec`: the per-rank executor of a plan's streams, events and buffers;
//! - `data`: the global data stream each rank takes its samples from;
//! - `targets`: the ways to run a plan, side by side behind one trait
//!   (`Target`): thread ranks, MPI process ranks, CUDA ranks (feature
//!   `cuda`: NVRTC kernels, cuBLAS, NCCL, one CUDA stream per plan
//!   stream; without the feature it says it was not compiled in);
//! - `train`: what a run is (options, reports, resuming); `eval`: a
//!   plan-free reference evaluator.
//! - `launch`: rank and world from torchrun, srun or mpirun, and a TCP
//!   rendezvous for what ranks exchange before a communicator exists.
//!
//! Architecture invariant: the runtime decides nothing — units, buffers,
//! offsets and the instruction order all come from the plan.

#![warn(missing_docs)]

pub mod account;
pub mod backend;
pub mod calibrate;
pub mod checkpoint;
pub mod comm;
pub mod cpu;
pub mod data;
pub mod error;
pub mod eval;
pub mod exec;
pub mod export;
pub mod fault;
pub mod init;
mod irinit;
pub mod launch;
pub mod optim;
pub mod rng;
pub mod targets;
pub mod tensor;
pub mod train;

pub use backend::{Backend, KernelCtx, OptimizerArgs, Workspace};
pub use comm::shm::{CommConfig, ShmComm, ShmWorld};
pub use comm::{Buf, BufMut, Communicator};
pub use cpu::{CpuBackend, CpuConfig};
pub use data::{Batch, DataSource, DataSpec};
pub use error::{CommError, KernelError, RuntimeError};
pub use eval::{eval_graph, init_params};
pub use exec::ExecMode;
pub use targets::threads::{train, train_with_data};
pub use targets::Target;
pub use tensor::{HostTensor, TensorMut, TensorRef};
pub use train::{EvalOptions, EvalReport, StepReport, StepScalars, TrainOptions, TrainReport};
