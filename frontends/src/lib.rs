//! fsdpc-frontends: turns a model description into a training program. A model
//! is a zoo spec (`gpt2`, `gpt:layers=2,...`), an fsdpc IR JSON file (a forward
//! graph or a training program) or, later, an ONNX file.
//!
//! Architecture invariant: frontends depend only on `fsdpc-ir`; they describe
//! parameters (`Init`) and never materialise them.

pub mod error;
pub mod ir_json;
pub mod zoo;

pub use error::FrontendError;
pub use zoo::{ZooConfig, ZooModel};

use fsdpc_ir::{Optimizer, TrainingProgram};
use std::collections::HashMap;

/// How to load a model.
#[derive(Clone, Debug, PartialEq)]
pub struct LoadOptions {
    /// The optimizer of the training program (ignored for a file that already
    /// holds a training program, which keeps its own).
    pub optimizer: Optimizer,
    /// Values of symbolic dimensions (`batch`, `seq`) of an imported model.
    pub dims: HashMap<String, usize>,
    /// Tokens per sample, overriding what the frontend derives.
    pub tokens_per_sample: Option<u64>,
}

impl Default for LoadOptions {
    /// AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01).
    fn default() -> LoadOptions {
        LoadOptions {
            optimizer: Optimizer::adamw(1e-3),
            dims: HashMap::new(),
            tokens_per_sample: None,
        }
    }
}

/// A model ready for the planner.
#[derive(Clone, Debug)]
pub struct LoadedModel {
    /// The model's name.
    pub name: String,
    /// Forward, loss, backward and optimizer.
    pub program: TrainingProgram,
    /// Tokens in one sample, for throughput figures.
    pub tokens_per_sample: u64,
}
