//! Language-model data: `ids` (or `input_ids`) and `labels` windows of a
//! token stream. `labels` holds the next token of every position (fsdpc's
//! zoo convention, `ids`), or the same tokens as the ids when the graph
//! shifts them before its loss (a Hugging Face causal-LM export; see
//! [`InputDesc::shifted_in_graph`]). Labels of any other model whose ids are
//! `input_ids` (nanoGPT's pre-shifted targets and BERT's masked-LM labels
//! both reach the loss unshifted, and the graph cannot tell them apart) are
//! not guessed: file data is refused for them, and synthetic data keeps
//! them generic. Under the zoo's convention `labels` may be shorter than
//! the ids (`[batch, n]`, `n < seq`: an encoder-decoder's targets, the
//! zoo's T5 with `dec_seq < seq`): they are the next tokens of the first
//! `n` positions.
//!
//! - Synthetic: each sample is a chain whose first token is drawn from
//!   (seed, step, sample) and whose every next token is a fixed random
//!   function of the previous one, keyed by the seed. Every label is that
//!   function of the token before it, so a model that learns the function
//!   drives the loss from about `ln(vocab)` toward 0.
//! - Corpus (`corpus`: a text file as bytes, or a memory-mapped nanoGPT
//!   `.bin` of u16 tokens): the window starts at a position drawn from
//!   (seed, step, sample); held-out data (`Lm::held_out`) is read in file
//!   order instead, window after window.

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

/// The names of the token-id input, in the order they are looked for: the
/// zoo's, then the one PyTorch and Hugging Face models have.
const ID_NAMES: [&str; 2] = ["ids", "input_ids"];

/// The language-model task.
#[derive(Clone, Debug)]
pub struct Lm {
    /// The token-id input's name (one of [`ID_NAMES`]).
    ids: String,
    /// How many positions `labels` lies ahead of the ids in the window: 1
    /// (the next tokens) or 0 (the graph shifts them itself).
    label_shift: usize,
    seq: usize,
    /// Positions of `labels` (`seq`, or fewer under the zoo's convention).
    label_len: usize,
    vocab: i64,
    tokens: Tokens,
    seed: u64,
    /// Held-out corpus data (`held_out`): windows in file order, `Batch::step`
    /// counting batches of this many windows, instead of drawn positions.
    sequential: Option<u64>,
}

impl Lm {
    /// An LM task if the graph has an integer `ids` or `input_ids` input of
    /// rank 2 and its `labels` (if any) relate to the ids in a known way;
    /// `None` for synthetic data when they do not, an error for file data.
    pub fn detect(
        inputs: &HashMap<String, InputDesc>,
        spec: &DataSpec,
        seed: u64,
    ) -> Result<Option<Lm>, RuntimeError> {
        let Some(ids) = ID_NAMES
            .iter()
            .filter_map(|n| inputs.get(*n))
            .find(|d| d.ty.dtype.is_int() && d.ty.shape.rank() == 2)
        else {
            return Ok(None);
        };
        let label_shift = match inputs.get("labels") {
            Some(l) => match label_shift(ids, l, spec)? {
                Some(shift) => shift,
                None => return Ok(None),
            },
            None => 1,
        };
        let vocab = [ids.range, inputs.get("labels").and_then(|l| l.range)]
            .into_iter()
            .flatten()
            .min();
        let Some(vocab) = vocab.filter(|&v| v > 0) else {
            return Err(RuntimeError::data(
                &ids.name,
                format!(
                    "cannot determine the vocabulary: `{}` feeds no embedding and `labels` no loss",
                    ids.name
                ),
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
            check_corpus(c, vocab, seq, spec)
                .map_err(|reason| RuntimeError::data(&ids.name, reason))?;
        }
        let label_len = inputs
            .get("labels")
            .map_or(seq, |l| l.ty.shape.dims().get(1).copied().unwrap_or(seq));
        Ok(Some(Lm {
            ids: ids.name.clone(),
            label_shift,
            seq,
            label_len,
            vocab,
            tokens,
            seed,
            sequential: None,
        }))
    }

    /// The same task reading held-out data `spec` in evaluation batches of
    /// `global_batch` windows: a corpus in file order, window `step *
    /// global_batch + sample` starting at token `window * seq` (so every
    /// token after the first is a label once), with `Some` of the batches
    /// to run: `asked`, or every whole batch the corpus holds (too few
    /// tokens for one, or more asked for than it holds, is an error);
    /// synthetic data as it is (`None`: the caller keys its held-out
    /// samples apart).
    pub fn held_out(
        mut self,
        spec: &DataSpec,
        global_batch: u64,
        asked: Option<u64>,
    ) -> Result<(Lm, Option<u64>), RuntimeError> {
        let Tokens::Corpus(c) = &self.tokens else {
            return Ok((self, None));
        };
        let seq = self.seq.max(1) as u64;
        let whole = (c.len() as u64 - 1) / seq / global_batch.max(1);
        if whole == 0 {
            return Err(RuntimeError::data(
                &self.ids,
                format!(
                    "the held-out {spec} has {} tokens; one evaluation batch is {global_batch} \
                     windows of {seq} tokens (+1), {} tokens",
                    c.len(),
                    global_batch * seq + 1
                ),
            ));
        }
        if let Some(k) = asked.filter(|&k| k > whole) {
            return Err(RuntimeError::data(
                &self.ids,
                format!(
                    "{k} evaluation batches asked for; the held-out {spec} holds {whole} batches \
                     of {global_batch} windows of {seq} tokens"
                ),
            ));
        }
        self.sequential = Some(global_batch);
        Ok((self, Some(asked.unwrap_or(whole))))
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
                let start = match self.sequential {
                    None => below(
                        &[self.seed, step, sample, START_KEY],
                        (c.len() - self.seq) as u64,
                    ) as usize,
                    Some(global) => {
                        let window = step.saturating_mul(global).saturating_add(sample);
                        let start = window.saturating_mul(self.seq as u64);
                        if start.saturating_add(self.seq as u64) >= c.len() as u64 {
                            return Err(RuntimeError::data(
                                &self.ids,
                                format!(
                                    "held-out window {window} (tokens {start}..) is past the end of the \
                                     data's {} tokens",
                                    c.len()
                                ),
                            ));
                        }
                        start as usize
                    }
                };
                for (i, &t) in c[start..].iter().take(self.seq + 1).enumerate() {
                    if t as i64 >= self.vocab {
                        return Err(RuntimeError::data(
                            &self.ids,
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

    /// Fills the ids or `labels`; gives `out` back for any other input.
    pub fn fill<'a>(
        &self,
        name: &str,
        batch: Batch,
        mut out: TensorMut<'a>,
    ) -> Result<Option<TensorMut<'a>>, RuntimeError> {
        let (shift, len) = if name == self.ids {
            (0, self.seq)
        } else if name == "labels" {
            (self.label_shift, self.label_len)
        } else {
            return Ok(Some(out));
        };
        let b = out.dims()[0];
        for s in 0..b {
            self.window(batch.step, batch.first_sample + s as u64, |i, t| {
                if (shift..shift + len).contains(&i) {
                    out.set_i64(s * len + i - shift, t);
                }
            })?;
        }
        Ok(None)
    }
}

/// How far `labels` lies ahead of `ids` in a window: the same tokens when
/// the graph shifts them, the next ones under the zoo's convention (`ids`;
/// then `labels` may also be shorter than the ids, the next tokens of the
/// first positions). Otherwise `None` for synthetic data (the labels stay
/// generic) and an error for file data, which would otherwise feed them a
/// guess.
fn label_shift(
    ids: &InputDesc,
    labels: &InputDesc,
    spec: &DataSpec,
) -> Result<Option<usize>, RuntimeError> {
    let (l, d) = (labels.ty.shape.dims(), ids.ty.shape.dims());
    let shorter = l.len() == 2 && l[0] == d[0] && l[1] < d[1] && ids.name == "ids";
    if shorter && labels.ty.dtype.is_int() && !labels.shifted_in_graph {
        return Ok(Some(1));
    }
    if labels.ty.shape != ids.ty.shape || !labels.ty.dtype.is_int() {
        return Err(RuntimeError::data(
            "labels",
            format!(
                "expected integer labels shaped like `{}` {} (or, beside `ids`, shorter: \
                 [batch, n] with n < seq), got {}",
                ids.name, ids.ty, labels.ty
            ),
        ));
    }
    if labels.shifted_in_graph {
        return Ok(Some(0));
    }
    if ids.name == "ids" {
        return Ok(Some(1));
    }
    if *spec == DataSpec::Synthetic {
        return Ok(None);
    }
    Err(RuntimeError::data(
        "labels",
        format!(
            "cannot tell what these labels are from the graph: its loss reads them where they \
             are (not shifted by one position, as a Hugging Face causal LM shifts them), so \
             they could be the next tokens after `{}` (nanoGPT's targets) or masked-LM targets \
             (BERT); file data is fed only to a model whose loss shifts `labels` itself or \
             whose token input is named `ids` (labels = the next tokens)",
            ids.name
        ),
    ))
}

/// Whether corpus `c` holds a window and, if read into memory, only tokens
/// inside the vocabulary; the reason if not.
fn check_corpus(c: &corpus::Corpus, vocab: i64, seq: usize, spec: &DataSpec) -> Result<(), String> {
    let what = format!("{spec:?}");
    if c.len() <= seq {
        return Err(format!(
            "{what} has {} tokens, a window needs {}",
            c.len(),
            seq + 1
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
        return Err(format!(
            "{what} contains token {t}, the model's vocabulary is {vocab}"
        ));
    }
    Ok(())
}
