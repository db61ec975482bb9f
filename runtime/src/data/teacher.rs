//! A learnable classification task for models with one float input `x`
//! `[b, ...]` and integer `labels` `[b]`: features are standard normal, drawn
//! from (seed, step, sample, feature); the label is the arg-max of a fixed
//! random linear "teacher" projection of the features, keyed by the seed.

use super::{Batch, InputDesc};
use crate::error::RuntimeError;
use crate::rng::normal;
use crate::tensor::TensorMut;
use std::collections::HashMap;

const X_KEY: u64 = 0xF1EA_7E00;
const W_KEY: u64 = 0x7EAC_4E50;

/// The teacher task.
#[derive(Clone, Debug)]
pub struct Teacher {
    x: String,
    features: usize,
    classes: u64,
    seed: u64,
}

impl Teacher {
    /// A teacher task if there are integer `labels [b]` with a known number of
    /// classes and exactly one float input (preferring one named `x`).
    pub fn detect(inputs: &HashMap<String, InputDesc>, seed: u64) -> Option<Teacher> {
        let labels = inputs
            .get("labels")
            .filter(|d| d.ty.dtype.is_int() && d.ty.shape.rank() == 1)?;
        let classes = labels.range.filter(|&c| c >= 1)? as u64;
        let b = labels.ty.shape.0[0];
        let floats: Vec<&InputDesc> = inputs
            .values()
            .filter(|d| d.ty.dtype.is_float() && d.ty.shape.0.first() == Some(&b))
            .collect();
        let x = inputs
            .get("x")
            .filter(|d| floats.contains(d))
            .or(if floats.len() == 1 {
                floats.first().copied()
            } else {
                None
            })?;
        let features = (x.ty.numel() as usize) / b.max(1);
        Some(Teacher {
            x: x.name.clone(),
            features,
            classes,
            seed,
        })
    }

    fn feature(&self, step: u64, sample: u64, f: usize) -> f64 {
        normal(&[self.seed, step, sample, X_KEY, f as u64])
    }

    fn label(&self, step: u64, sample: u64) -> i64 {
        // Features are drawn again per class rather than kept: a step's
        // data loading allocates nothing.
        let score = |c: u64| {
            (0..self.features)
                .map(|f| self.feature(step, sample, f) * normal(&[self.seed, W_KEY, c, f as u64]))
                .sum::<f64>()
        };
        (0..self.classes)
            .map(|c| (score(c), c))
            .fold((f64::NEG_INFINITY, 0), |a, b| if b.0 > a.0 { b } else { a })
            .1 as i64
    }

    /// Fills the features or the labels; gives `out` back for any other input.
    pub fn fill<'a>(
        &self,
        name: &str,
        batch: Batch,
        mut out: TensorMut<'a>,
    ) -> Result<Option<TensorMut<'a>>, RuntimeError> {
        let b = out.dims().first().copied().unwrap_or(1);
        if name == self.x {
            for s in 0..b {
                for f in 0..self.features {
                    out.set_f64(
                        s * self.features + f,
                        self.feature(batch.step, batch.first_sample + s as u64, f),
                    );
                }
            }
            return Ok(None);
        }
        if name == "labels" {
            for s in 0..b {
                out.set_i64(s, self.label(batch.step, batch.first_sample + s as u64));
            }
            return Ok(None);
        }
        Ok(Some(out))
    }
}
