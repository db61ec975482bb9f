//! A learnable classification task for models with one float input `x`
//! `[b, ...]` and integer `labels` `[b]`: a Gaussian mixture. Each sample's
//! label is uniform over the classes, drawn from (seed, step, sample); its
//! features are the label's mean plus standard normal noise drawn from
//! (seed, step, sample, feature). The class means are fixed random vectors
//! keyed by the seed, scaled so two classes' means lie `SEPARATION` apart
//! whatever the number of features: a linear model can learn the task, and
//! not in one step.
//!
//! Both inputs cost what their elements cost: a label is one hash, a
//! feature one normal draw (the means are drawn once at set-up when they
//! fit `KEPT_MEANS`), so a step's data loading is linear in its elements.

use super::{Batch, InputDesc};
use crate::error::RuntimeError;
use crate::rng::{below, hash, hash_step, normal, normal_of};
use crate::tensor::TensorMut;
use std::collections::HashMap;

const X_KEY: u64 = 0xF1EA_7E00;
const MEAN_KEY: u64 = 0x7EAC_4E50;
const LABEL_KEY: u64 = 0x1ABE_1500;

/// Expected distance between two class means.
const SEPARATION: f64 = 3.0;

/// Most mean elements (classes x features) kept in memory; a larger task
/// draws a mean element again for every feature it writes.
const KEPT_MEANS: usize = 1 << 22;

/// The mixture task.
#[derive(Clone, Debug)]
pub struct Mixture {
    x: String,
    features: usize,
    classes: u64,
    seed: u64,
    /// Scale of the means' standard normal elements.
    scale: f64,
    /// The class means, class-major, when there are at most `KEPT_MEANS`
    /// elements (drawn once, at set-up, before any rank's memory is
    /// counted); empty otherwise.
    means: Vec<f64>,
}

impl Mixture {
    /// A mixture task if there are integer `labels [b]` with a known number
    /// of classes and exactly one float input (preferring one named `x`).
    pub fn detect(inputs: &HashMap<String, InputDesc>, seed: u64) -> Option<Mixture> {
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
        // Two means differ by a normal vector of variance 2 scale^2 per
        // feature: its length is about scale * sqrt(2 features).
        let scale = SEPARATION / (2.0 * features.max(1) as f64).sqrt();
        let mut t = Mixture {
            x: x.name.clone(),
            features,
            classes,
            seed,
            scale,
            means: Vec::new(),
        };
        if (classes as usize).saturating_mul(features) <= KEPT_MEANS {
            t.means = (0..classes)
                .flat_map(|c| (0..features).map(move |f| (c, f)))
                .map(|(c, f)| t.mean(c, f))
                .collect();
        }
        Some(t)
    }

    /// Element `f` of class `c`'s mean.
    fn mean(&self, c: u64, f: usize) -> f64 {
        let kept = (c as usize)
            .checked_mul(self.features)
            .and_then(|i| self.means.get(i + f));
        match kept {
            Some(&m) => m,
            None => self.scale * normal(&[self.seed, MEAN_KEY, c, f as u64]),
        }
    }

    fn label(&self, step: u64, sample: u64) -> u64 {
        below(&[self.seed, step, sample, LABEL_KEY], self.classes)
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
                let sample = batch.first_sample + s as u64;
                let c = self.label(batch.step, sample);
                // Keys (seed, step, sample, X_KEY, feature): the prefix is
                // hashed once per sample.
                let prefix = hash(&[self.seed, batch.step, sample, X_KEY]);
                for f in 0..self.features {
                    let noise = normal_of(hash_step(prefix, f as u64));
                    out.set_f64(s * self.features + f, self.mean(c, f) + noise);
                }
            }
            return Ok(None);
        }
        if name == "labels" {
            for s in 0..b {
                let label = self.label(batch.step, batch.first_sample + s as u64);
                out.set_i64(s, label as i64);
            }
            return Ok(None);
        }
        Ok(Some(out))
    }
}
