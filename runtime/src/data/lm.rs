//! Language-model data: `ids` and `labels` windows of a token stream.
//!
//! - Synthetic: each sample is a chain whose first token is drawn from
//!   (seed, step, sample) and whose every next token is a fixed random
//!   function of the previous one, keyed by the seed. Every label is that
//!   function of the token before it, so a model that learns the function
//!   drives the loss from about `ln(vocab)` toward 0.
//! - Corpus (`corpus`: a text file as bytes, or a memory-mapped nanoGPT
//!   `.bin` of u16 tokens): the window starts at a position drawn from
//!   (seed, step, sample).

mod corpus;

use super::{Batch, DataSpec, InputDesc};
use crate::error::RuntimeError;
use crate::rng::below;
use crate::tensor::TensorMut;
use corpus::Corpus;
use std::collections::HashMap;
use std::sync::Arc;

const START_KEY: u64 = 0x5EED_57A7;
const TABLE_KEY: u64 = 0x7AB1_E000;

#[derive(Clone, Debug)]
enum Tokens {
    /// `next[t]` is the token after `t`.
    Synthetic {
        next: Arc<Vec<u32>>,
    },
    Corpus(Arc<Corpus>),
}

/// The language-model task.
#[derive(Clone, Debug)]
pub struct Lm {
    seq: usize,
    vocab: i64,
    tokens: Tokens,
    seed: u64,
}

impl Lm {
    /// An LM task if the graph has an integer `ids` input of rank 2.
    pub fn detect(
        inputs: &HashMap<String, InputDesc>,
        spec: &DataSpec,
        seed: u64,
    ) -> Result<Option<Lm>, RuntimeError> {
        let Some(ids) = inputs
            .get("ids")
            .filter(|d| d.ty.dtype.is_int() && d.ty.shape.rank() == 2)
        else {
            return Ok(None);
        };
        if let Some(l) = inputs.get("labels") {
            if l.ty.shape != ids.ty.shape || !l.ty.dtype.is_int() {
                return Err(RuntimeError::data(
                    "labels",
                    format!(
                        "expected integer labels shaped like ids {}, got {}",
                        ids.ty, l.ty
                    ),
                ));
            }
        }
        let vocab = [ids.range, inputs.get("labels").and_then(|l| l.range)]
            .into_iter()
            .flatten()
            .min();
        let Some(vocab) = vocab.filter(|&v| v > 0) else {
            return Err(RuntimeError::data(
                "ids",
                "cannot determine the vocabulary: `ids` feeds no embedding and `labels` no loss",
            ));
        };
        let seq = ids.ty.shape.0[1];
        let tokens = match spec {
            DataSpec::Synthetic => Tokens::Synthetic {
                next: Arc::new(
                    (0..vocab as u64)
                        .map(|t| below(&[seed, TABLE_KEY, t], vocab as u64) as u32)
                        .collect(),
                ),
            },
            DataSpec::TextFile(p) => Tokens::Corpus(Arc::new(corpus::read_text(p)?)),
            DataSpec::TokenBin(p) => Tokens::Corpus(Arc::new(corpus::open_bin(p)?)),
        };
        if let Tokens::Corpus(c) = &tokens {
            check_corpus(c, vocab, seq, spec)?;
        }
        Ok(Some(Lm {
            seq,
            vocab,
            tokens,
            seed,
        }))
    }

    /// Passes token `i` (0..=seq) of the window of global sample `sample`
    /// to `emit(i, token)`; a mapped corpus's token outside the vocabulary
    /// is an error here, where it is read (a mapped file is not scanned up
    /// front: that would read all of it).
    fn window(
        &self,
        step: u64,
        sample: u64,
        mut emit: impl FnMut(usize, i64),
    ) -> Result<(), RuntimeError> {
        match &self.tokens {
            Tokens::Synthetic { next } => {
                let mut t = below(&[self.seed, step, sample, START_KEY], next.len() as u64) as u32;
                for i in 0..=self.seq {
                    emit(i, t as i64);
                    t = next[t as usize];
                }
            }
            Tokens::Corpus(c) => {
                let start = below(
                    &[self.seed, step, sample, START_KEY],
                    (c.len() - self.seq) as u64,
                ) as usize;
                for (i, &t) in c[start..].iter().take(self.seq + 1).enumerate() {
                    if t as i64 >= self.vocab {
                        return Err(RuntimeError::data(
                            "ids",
                            format!(
                                "token {t} at position {} of the data is outside the model's vocabulary of {}",
                                start + i,
                                self.vocab
                            ),
                        ));
                    }
                    emit(i, t as i64);
                }
            }
        }
        Ok(())
    }

    /// Fills `ids` or `labels`; gives `out` back for any other input.
    pub fn fill<'a>(
        &self,
        name: &str,
        batch: Batch,
        mut out: TensorMut<'a>,
    ) -> Result<Option<TensorMut<'a>>, RuntimeError> {
        let shift = match name {
            "ids" => 0,
            "labels" => 1,
            _ => return Ok(Some(out)),
        };
        let b = out.dims()[0];
        for s in 0..b {
            self.window(batch.step, batch.first_sample + s as u64, |i, t| {
                if (shift..shift + self.seq).contains(&i) {
                    out.set_i64(s * self.seq + i - shift, t);
                }
            })?;
        }
        Ok(None)
    }
}

fn check_corpus(
    c: &corpus::Corpus,
    vocab: i64,
    seq: usize,
    spec: &DataSpec,
) -> Result<(), RuntimeError> {
    let what = format!("{spec:?}");
    if c.len() <= seq {
        return Err(RuntimeError::data(
            "ids",
            format!("{what} has {} tokens, a window needs {}", c.len(), seq + 1),
        ));
    }
    // Tokens read into memory are checked now, at no extra I/O; a mapped
    // file's tokens are checked as each window is read.
    let in_memory = matches!(c, corpus::Corpus::Owned(_));
    if let Some(&t) = c
        .iter()
        .take_while(|_| in_memory)
        .find(|&&t| t as i64 >= vocab)
    {
        return Err(RuntimeError::data(
            "ids",
            format!("{what} contains token {t}, the model's vocabulary is {vocab}"),
        ));
    }
    Ok(())
}
