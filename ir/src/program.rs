//! A training program: forward graph + loss + backward graph (reverse-mode
//! autodiff) + the optimizer that updates the parameters from their gradients.

use crate::graph::{Graph, ValueId};
use crate::param::ParamId;
use serde::{Deserialize, Serialize};

/// The optimizer. It runs on flat fp32 master shards (the planner's
/// `OptimizerStep`), so it is data, not graph nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Optimizer {
    Sgd {
        lr: f64,
        momentum: f64,
        weight_decay: f64,
    },
    /// AdamW with decoupled weight decay (Loshchilov & Hutter).
    AdamW {
        lr: f64,
        beta1: f64,
        beta2: f64,
        eps: f64,
        weight_decay: f64,
    },
}

impl Optimizer {
    /// Number of fp32 state tensors per parameter element (momentum: 1, Adam: 2).
    pub fn state_slots(&self) -> usize {
        match self {
            Optimizer::Sgd { momentum, .. } => usize::from(*momentum != 0.0),
            Optimizer::AdamW { .. } => 2,
        }
    }

    pub fn adamw(lr: f64) -> Optimizer {
        Optimizer::AdamW {
            lr,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ParamGrad {
    pub param: ParamId,
    /// The value holding d loss / d param (summed over every use of a tied
    /// parameter).
    pub grad: ValueId,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TrainingProgram {
    /// Forward nodes (phase `Forward`, including the loss) and backward nodes
    /// (phase `Backward`, each in the module of the forward node it came from).
    pub graph: Graph,
    /// The scalar loss (mean over this rank's micro-batch).
    pub loss: ValueId,
    /// One entry per parameter with `requires_grad`.
    pub grads: Vec<ParamGrad>,
    pub optimizer: Optimizer,
}
