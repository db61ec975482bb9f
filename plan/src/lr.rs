//! The learning-rate schedule a plan trains with: linear warmup, then a
//! cosine or linear decay to a floor, as Hugging Face's
//! `get_cosine_with_min_lr_schedule_with_warmup` and
//! `get_linear_schedule_with_warmup` compute it, held at the floor after the
//! decay (nanoGPT's `get_lr`). A rank asks it for the rate of each step; a
//! resumed run asks with the checkpoint's step and continues exactly.

use crate::error::ConfigError;
use serde::{Deserialize, Serialize};

/// How the rate decays after the warmup.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LrDecay {
    /// The optimizer's `lr` at every step (warmup and floor do not apply).
    #[default]
    Constant,
    /// Half a cosine from `lr` down to `min_lr`.
    Cosine,
    /// A straight line from `lr` down to `min_lr`.
    Linear,
}

impl LrDecay {
    /// The values `LrDecay::parse` accepts.
    pub const ALLOWED: &'static str = "constant, cosine, linear";

    pub fn name(self) -> &'static str {
        match self {
            LrDecay::Constant => "constant",
            LrDecay::Cosine => "cosine",
            LrDecay::Linear => "linear",
        }
    }

    pub fn parse(s: &str) -> Result<LrDecay, ConfigError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "constant" => Ok(LrDecay::Constant),
            "cosine" => Ok(LrDecay::Cosine),
            "linear" => Ok(LrDecay::Linear),
            _ => Err(ConfigError {
                what: "learning-rate schedule (--lr-schedule)",
                value: s.to_string(),
                reason: format!("expected one of {}", LrDecay::ALLOWED),
            }),
        }
    }
}

/// The schedule (absent from a plan: constant).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LrSchedule {
    pub decay: LrDecay,
    /// Steps of linear warmup from 0 to `lr` (step s, 0-based, trains at
    /// `lr * s / warmup_steps`, as Hugging Face's schedulers).
    #[serde(default)]
    pub warmup_steps: u64,
    /// The step at which the decay reaches `min_lr` (Hugging Face's
    /// `num_training_steps`, nanoGPT's `lr_decay_iters`); later steps train
    /// at `min_lr`.
    #[serde(default)]
    pub decay_steps: u64,
    /// The floor of the decay, an absolute rate (<= the optimizer's `lr`).
    #[serde(default)]
    pub min_lr: f64,
}

impl LrSchedule {
    /// Whether every step trains at the optimizer's own `lr`.
    pub fn is_constant(&self) -> bool {
        self.decay == LrDecay::Constant
    }

    /// The rate of 0-based optimizer step `step`, for an optimizer whose
    /// `lr` is `lr`.
    pub fn lr_at(&self, lr: f64, step: u64) -> f64 {
        if self.is_constant() {
            return lr;
        }
        if step < self.warmup_steps {
            return lr * step as f64 / self.warmup_steps.max(1) as f64;
        }
        let span = self.decay_steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
        let factor = match self.decay {
            LrDecay::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
            LrDecay::Linear | LrDecay::Constant => 1.0 - progress,
        };
        self.min_lr + (lr - self.min_lr) * factor
    }

    /// Checks the schedule against the optimizer's `lr`: each problem names
    /// the setting and the flag that gives it.
    pub fn check(&self, lr: f64) -> Result<(), ConfigError> {
        let bad = |what: &'static str, value: String, reason: String| {
            Err(ConfigError {
                what,
                value,
                reason,
            })
        };
        if self.is_constant() {
            if self.warmup_steps != 0 || self.min_lr != 0.0 {
                return bad(
                    "learning-rate schedule (--lr-schedule)",
                    "constant".into(),
                    "warmup steps and a minimum rate need a decay (cosine or linear)".into(),
                );
            }
            return Ok(());
        }
        if !(self.min_lr.is_finite() && self.min_lr >= 0.0 && self.min_lr <= lr) {
            return bad(
                "minimum learning rate (--min-lr)",
                self.min_lr.to_string(),
                format!("must be a finite rate from 0 to the learning rate {lr}"),
            );
        }
        if self.decay_steps <= self.warmup_steps {
            return bad(
                "decay end (--lr-decay-steps; with train, --steps by default)",
                self.decay_steps.to_string(),
                format!(
                    "the decay must end after the {} warmup steps",
                    self.warmup_steps
                ),
            );
        }
        Ok(())
    }

    /// One line: `cosine, warmup 100, to 1e-5 at step 5000`.
    pub fn describe(&self) -> String {
        if self.is_constant() {
            return "constant".into();
        }
        format!(
            "{}, warmup {}, to {} at step {}",
            self.decay.name(),
            self.warmup_steps,
            self.min_lr,
            self.decay_steps
        )
    }
}
