//! A training program: forward graph + loss + backward graph (reverse-mode
//! autodiff) + the optimizer that updates the parameters from their gradients.

use crate::graph::{Graph, ValueId};
use crate::param::ParamId;
use serde::{Deserialize, Serialize};
use thiserror::Error;

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

    /// Checks every hyperparameter against the range where the update is
    /// meaningful: finite; `lr`, `weight_decay` >= 0; `momentum`, `beta1`,
    /// `beta2` in [0, 1); `eps` > 0. Returns the first one outside.
    pub fn check(&self) -> Result<(), BadHyperparameter> {
        let (lr, weight_decay) = match self {
            Optimizer::Sgd {
                lr, weight_decay, ..
            }
            | Optimizer::AdamW {
                lr, weight_decay, ..
            } => (*lr, *weight_decay),
        };
        let mut checks = vec![
            ("lr", lr, Range::NonNegative),
            ("weight_decay", weight_decay, Range::NonNegative),
        ];
        match self {
            Optimizer::Sgd { momentum, .. } => checks.push(("momentum", *momentum, Range::Unit)),
            Optimizer::AdamW {
                beta1, beta2, eps, ..
            } => checks.extend([
                ("beta1", *beta1, Range::Unit),
                ("beta2", *beta2, Range::Unit),
                ("eps", *eps, Range::Positive),
            ]),
        }
        for (name, value, range) in checks {
            if !range.contains(value) {
                return Err(BadHyperparameter {
                    name,
                    value,
                    expected: range.describe(),
                });
            }
        }
        Ok(())
    }

    /// The learning rate.
    pub fn lr(&self) -> f64 {
        match self {
            Optimizer::Sgd { lr, .. } | Optimizer::AdamW { lr, .. } => *lr,
        }
    }

    /// The weight decay.
    pub fn weight_decay(&self) -> f64 {
        match self {
            Optimizer::Sgd { weight_decay, .. } | Optimizer::AdamW { weight_decay, .. } => {
                *weight_decay
            }
        }
    }

    /// The same optimizer without weight decay (for the parameters it does
    /// not apply to).
    pub fn without_decay(&self) -> Optimizer {
        let mut o = self.clone();
        match &mut o {
            Optimizer::Sgd { weight_decay, .. } | Optimizer::AdamW { weight_decay, .. } => {
                *weight_decay = 0.0
            }
        }
        o
    }

    /// The same optimizer at learning rate `rate` (a schedule's step).
    pub fn with_lr(&self, rate: f64) -> Optimizer {
        let mut o = self.clone();
        match &mut o {
            Optimizer::Sgd { lr, .. } | Optimizer::AdamW { lr, .. } => *lr = rate,
        }
        o
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

/// An optimizer hyperparameter outside the range where it means anything
/// (`Optimizer::check`).
#[derive(Clone, Debug, PartialEq, Error)]
#[error("optimizer {name} = {value}: {expected}")]
pub struct BadHyperparameter {
    /// The hyperparameter's field name (`lr`, `beta1`, ...).
    pub name: &'static str,
    /// Its value.
    pub value: f64,
    /// The range it must lie in, in words.
    pub expected: &'static str,
}

/// The ranges of `Optimizer::check`.
#[derive(Copy, Clone)]
enum Range {
    /// Finite, >= 0.
    NonNegative,
    /// Finite, > 0.
    Positive,
    /// In [0, 1).
    Unit,
}

impl Range {
    fn contains(self, v: f64) -> bool {
        match self {
            Range::NonNegative => v.is_finite() && v >= 0.0,
            Range::Positive => v.is_finite() && v > 0.0,
            Range::Unit => (0.0..1.0).contains(&v),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Range::NonNegative => "must be a finite number >= 0",
            Range::Positive => "must be a finite number > 0",
            Range::Unit => "must lie in [0, 1)",
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

#[cfg(test)]
mod tests {
    use super::*;

    fn adamw(lr: f64, beta1: f64, beta2: f64, eps: f64, weight_decay: f64) -> Optimizer {
        Optimizer::AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        }
    }

    fn bad(o: &Optimizer) -> &'static str {
        o.check().expect_err("out of range").name
    }

    #[test]
    fn hyperparameters_in_range_pass() {
        assert_eq!(Optimizer::adamw(1e-3).check(), Ok(()));
        assert_eq!(adamw(0.0, 0.0, 0.0, 1e-12, 0.0).check(), Ok(()));
        let sgd = Optimizer::Sgd {
            lr: 0.1,
            momentum: 0.9,
            weight_decay: 0.0,
        };
        assert_eq!(sgd.check(), Ok(()));
    }

    #[test]
    fn each_out_of_range_hyperparameter_is_named() {
        for lr in [f64::NAN, f64::INFINITY, -1.0] {
            assert_eq!(bad(&adamw(lr, 0.9, 0.999, 1e-8, 0.0)), "lr");
        }
        assert_eq!(bad(&adamw(1e-3, 0.9, 0.999, 1e-8, -0.1)), "weight_decay");
        assert_eq!(bad(&adamw(1e-3, 1.0, 0.999, 1e-8, 0.0)), "beta1");
        assert_eq!(bad(&adamw(1e-3, 0.9, -0.5, 1e-8, 0.0)), "beta2");
        assert_eq!(bad(&adamw(1e-3, 0.9, 0.999, 0.0, 0.0)), "eps");
        let sgd = Optimizer::Sgd {
            lr: 0.1,
            momentum: f64::NAN,
            weight_decay: 0.0,
        };
        let e = sgd.check().expect_err("NaN momentum");
        assert_eq!(e.name, "momentum");
        assert_eq!(
            e.to_string(),
            "optimizer momentum = NaN: must lie in [0, 1)"
        );
    }
}
