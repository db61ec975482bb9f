//! A learnable classification task for models with one float input `x`
//! `[b, ...]` and integer `labels` `[b]`: features are standard normal, drawn
//! from (seed, step, sample, feature); the label is the arg-max of a fixed
//! random linear "teacher" projection of the features, keyed by the seed.

use super::{Batch, InputDesc};
use crate::error::RuntimeError;
use crate::rng::{hash, hash_step, normal, normal_of};
use crate::tensor::TensorMut;
use std::collections::HashMap;

const X_KEY: u64 = 0xF1EA_7E00;
const W_KEY: u64 = 0x7EAC_4E50;

/// Most teacher weights kept in memory (classes x features); a larger
/// teacher draws its weights again for every label.
const KEPT_WEIGHTS: usize = 1 << 22;

/// Classes scored together per pass over the features: their running sums
/// live on the stack, so a step's data loading allocates nothing.
const CLASS_CHUNK: usize = 64;

/// The teacher task.
#[derive(Clone, Debug)]
pub struct Teacher {
    x: String,
    features: usize,
    classes: u64,
    seed: u64,
    /// The teacher's weights, class-major, when there are at most
    /// `KEPT_WEIGHTS` (drawn once, at set-up, before any rank's memory is
    /// counted); empty otherwise.
    weights: Vec<f64>,
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
        let mut t = Teacher {
            x: x.name.clone(),
            features,
            classes,
            seed,
            weights: Vec::new(),
        };
        if (classes as usize).saturating_mul(features) <= KEPT_WEIGHTS {
            t.weights = (0..classes)
                .flat_map(|c| (0..features).map(move |f| (c, f)))
                .map(|(c, f)| t.weight(c, f))
                .collect();
        }
        Some(t)
    }

    /// The hash of a sample's feature keys without the feature index:
    /// feature `f` is `normal_of(hash_step(prefix, f))`, the value of
    /// `normal(&[seed, step, sample, X_KEY, f])`.
    fn sample_prefix(&self, step: u64, sample: u64) -> u64 {
        hash(&[self.seed, step, sample, X_KEY])
    }

    fn feature(prefix: u64, f: usize) -> f64 {
        normal_of(hash_step(prefix, f as u64))
    }

    fn weight(&self, class: u64, f: usize) -> f64 {
        let kept = (class as usize)
            .checked_mul(self.features)
            .and_then(|i| self.weights.get(i + f));
        match kept {
            Some(&w) => w,
            None => normal(&[self.seed, W_KEY, class, f as u64]),
        }
    }

    /// The arg-max over classes of the teacher's score (the first class on
    /// ties). Each score sums feature x weight over the features in order;
    /// classes are scored `CLASS_CHUNK` at a time, each feature drawn once
    /// per chunk.
    fn label(&self, step: u64, sample: u64) -> i64 {
        let mut best = (f64::NEG_INFINITY, 0u64);
        let prefix = self.sample_prefix(step, sample);
        let mut first = 0u64;
        while first < self.classes {
            let n = (self.classes - first).min(CLASS_CHUNK as u64) as usize;
            let mut score = [0f64; CLASS_CHUNK];
            for f in 0..self.features {
                let x = Self::feature(prefix, f);
                for (k, s) in score[..n].iter_mut().enumerate() {
                    *s += x * self.weight(first + k as u64, f);
                }
            }
            for (k, &s) in score[..n].iter().enumerate() {
                if s > best.0 {
                    best = (s, first + k as u64);
                }
            }
            first += n as u64;
        }
        best.1 as i64
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
                let prefix = self.sample_prefix(batch.step, batch.first_sample + s as u64);
                for f in 0..self.features {
                    out.set_f64(s * self.features + f, Self::feature(prefix, f));
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
