//! fsdpc-ir: tensor types, the dataflow graph, the op set with shape, gradient
//! and cost rules, reverse-mode autodiff and training programs; and, as the
//! crate every other one depends on, the one atomic file write (`fs`).
//!
//! Architecture invariant: this crate depends on nothing else of fsdpc and
//! knows nothing about sharding, devices or kernels.

pub mod autodiff;
pub mod buffer;
mod builder;
mod display;
pub mod error;
pub mod freeze;
pub mod fs;
pub mod graph;
mod hexbytes;
pub mod init;
pub mod op;
pub mod ops;
pub mod param;
pub mod program;
mod serial;
pub mod types;
pub mod validate;

pub use autodiff::build_training_program;
pub use buffer::{ModuleBufferId, ModuleBufferSpec};
pub use error::IrError;
pub use freeze::freeze;
pub use graph::{Graph, Module, ModuleId, Node, NodeId, Phase, ValueId};
pub use op::{BinaryFn, CompareFn, LogicalFn, Op, ReduceFn, UnaryFn, Window2d};
pub use param::{Init, ParamId, ParamSpec, TpSlice};
pub use program::{BadHyperparameter, Optimizer, ParamGrad, TrainingProgram};
pub use types::{DType, Shape, TensorData, TensorType};
pub use validate::{validate, Problems};
