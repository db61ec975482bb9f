//! The global data stream. Step `s` has a global batch of `world x b`
//! samples; rank `r` takes samples `[r*b, (r+1)*b)`. Every value is a pure
//! function of (seed, step, global sample index, ...), so `--ranks 1` with
//! batch 32 and `--ranks 4` with batch 8 see the same data.
//!
//! Inputs are fed by name. Language models have `ids` (or `input_ids`) and
//! `labels`, integers `[b, seq]` from the same token window: `labels` is the
//! ids shifted by one position, or equal to them when the graph shifts the
//! labels itself (a Hugging Face causal LM; `lm` says which labels it will
//! not guess). Classifiers (an `x` float input and `labels` i64 `[b]`) get
//! a learnable Gaussian-mixture task (`mixture`). Any other input gets standard normal floats or
//! uniform integers in the range its consumer (an embedding, a loss) allows.
//!
//! `GivenData` instead feeds tensors the caller gives (recorded inputs), for
//! `train_with_data`.

mod given;
mod inputs;
mod lm;
mod mixture;

pub use given::GivenData;
pub use inputs::{analyse, InputDesc};

use crate::error::RuntimeError;
use crate::tensor::TensorMut;
use fsdpc_ir::Graph;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Where training data comes from.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum DataSpec {
    /// A deterministic synthetic task a small model can learn.
    #[default]
    Synthetic,
    /// A byte-level text file (vocabulary 256).
    TextFile(PathBuf),
    /// nanoGPT-style `.bin`: little-endian u16 tokens.
    TokenBin(PathBuf),
}

impl std::fmt::Display for DataSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataSpec::Synthetic => write!(f, "the synthetic task"),
            DataSpec::TextFile(p) => write!(f, "text file {}", p.display()),
            DataSpec::TokenBin(p) => write!(f, "token file {}", p.display()),
        }
    }
}

/// Which of a rank's samples an input request covers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    /// The training step.
    pub step: u64,
    /// Global index of the first sample.
    pub first_sample: u64,
}

/// A global data stream; shared read-only by all ranks.
pub trait DataSource: Send + Sync {
    /// Writes input `name` for `batch` into `out` (its type is the input's
    /// type; axis 0 is the batch).
    fn fill(&self, name: &str, batch: Batch, out: TensorMut<'_>) -> Result<(), RuntimeError>;
}

/// What the model's inputs ask for.
#[derive(Clone, Debug)]
enum Task {
    /// `ids`/`labels` windows of a token stream.
    Lm(lm::Lm),
    /// Gaussian features around their label's mean.
    Mixture(mixture::Mixture),
    /// Only generic inputs.
    Generic,
}

/// The data source for a graph's inputs.
#[derive(Clone, Debug)]
pub struct GraphData {
    inputs: HashMap<String, InputDesc>,
    task: Task,
    seed: u64,
    /// Held-out samples drawn from the training distribution (synthetic
    /// data): `Batch::step` is keyed apart from every training step.
    held_out: bool,
}

/// The bit that keys held-out synthetic samples apart from training steps.
const HELD_OUT: u64 = 1 << 63;

/// Evaluation batches of synthetic held-out data when none are asked for.
pub const SYNTHETIC_EVAL_BATCHES: u64 = 4;

/// Opens the data source `spec` for the inputs of `graph`.
pub fn open(
    spec: &DataSpec,
    graph: &Graph,
    seed: u64,
) -> Result<Arc<dyn DataSource>, RuntimeError> {
    Ok(Arc::new(open_graph(spec, graph, seed)?))
}

/// Opens held-out data `spec` for the inputs of `graph`, for evaluation
/// batches of `global_batch` samples (every rank's, `Batch::step` counting
/// batches): a corpus is read in file order, window after window, and
/// holds as many whole batches as fit; synthetic data draws samples no
/// training step draws. Returns the source and the number of batches an
/// evaluation runs: `asked`, or all the corpus holds, or
/// `SYNTHETIC_EVAL_BATCHES`; asking for more than the corpus holds is an
/// error, as is a corpus too short for one batch.
pub fn open_eval(
    spec: &DataSpec,
    graph: &Graph,
    seed: u64,
    global_batch: u64,
    asked: Option<u64>,
) -> Result<(Arc<dyn DataSource>, u64), RuntimeError> {
    let mut d = open_graph(spec, graph, seed)?;
    let mut counted = None;
    if let Task::Lm(l) = d.task {
        let (l, n) = l.held_out(spec, global_batch, asked)?;
        d.task = Task::Lm(l);
        counted = n;
    }
    // Data without a corpus: held-out samples keyed apart from training.
    d.held_out = counted.is_none();
    let batches = counted.or(asked).unwrap_or(SYNTHETIC_EVAL_BATCHES);
    if batches == 0 {
        return Err(RuntimeError::plan("0 evaluation batches asked for"));
    }
    Ok((Arc::new(d), batches))
}

fn open_graph(spec: &DataSpec, graph: &Graph, seed: u64) -> Result<GraphData, RuntimeError> {
    let inputs: HashMap<String, InputDesc> = analyse(graph)
        .into_iter()
        .map(|d| (d.name.clone(), d))
        .collect();
    let task = if let Some(l) = lm::Lm::detect(&inputs, spec, seed)? {
        Task::Lm(l)
    } else if *spec != DataSpec::Synthetic {
        return Err(RuntimeError::data(
            "ids",
            "file data needs a language model with an integer `ids` or `input_ids` input \
             [batch, seq]",
        ));
    } else if let Some(t) = mixture::Mixture::detect(&inputs, seed) {
        Task::Mixture(t)
    } else {
        Task::Generic
    };
    Ok(GraphData {
        inputs,
        task,
        seed,
        held_out: false,
    })
}

impl DataSource for GraphData {
    fn fill(&self, name: &str, batch: Batch, out: TensorMut<'_>) -> Result<(), RuntimeError> {
        let desc = self
            .inputs
            .get(name)
            .ok_or_else(|| RuntimeError::data(name, "the model has no input of this name"))?;
        if desc.ty != *out.ty {
            return Err(RuntimeError::data(
                name,
                format!(
                    "the model declares {}, the buffer holds {}",
                    desc.ty, out.ty
                ),
            ));
        }
        let batch = match self.held_out {
            true => Batch {
                step: HELD_OUT | batch.step,
                ..batch
            },
            false => batch,
        };
        let handled = match &self.task {
            Task::Lm(l) => l.fill(name, batch, out)?,
            Task::Mixture(t) => t.fill(name, batch, out)?,
            Task::Generic => Some(out),
        };
        match handled {
            None => Ok(()),
            Some(out) => generic(desc, self.seed, batch, out),
        }
    }
}

/// Standard normal floats or uniform integers in the input's range.
fn generic(
    desc: &InputDesc,
    seed: u64,
    batch: Batch,
    mut out: TensorMut<'_>,
) -> Result<(), RuntimeError> {
    let per = per_sample(out.dims());
    let key = name_key(&desc.name);
    if desc.ty.dtype.is_float() {
        // Keys (seed, step, sample, name, element): the prefix is hashed
        // once per sample (`rng::normal_of`).
        let mut prefix = (u64::MAX, 0);
        for i in 0..out.numel() {
            let (s, e) = ((i / per) as u64 + batch.first_sample, (i % per) as u64);
            if prefix.0 != s {
                prefix = (s, crate::rng::hash(&[seed, batch.step, s, key]));
            }
            let h = crate::rng::hash_step(prefix.1, e);
            out.set_f64(i, crate::rng::normal_of(h));
        }
        return Ok(());
    }
    if desc.range.is_none() && is_mask(&desc.name) {
        // An attention mask (`attention_mask` of a BERT export): every position
        // is a real token, as in a batch of sequences that fill the window.
        for i in 0..out.numel() {
            out.set_i64(i, 1);
        }
        return Ok(());
    }
    let range =
        match (desc.ty.dtype, desc.range) {
            (fsdpc_ir::DType::Bool, _) => 2,
            (_, Some(r)) if r > 0 => r as u64,
            _ => return Err(RuntimeError::data(
                &desc.name,
                "cannot determine the range of this integer input (it feeds no embedding or loss, and is not a mask)",
            )),
        };
    for i in 0..out.numel() {
        let (s, e) = ((i / per) as u64 + batch.first_sample, (i % per) as u64);
        out.set_i64(
            i,
            crate::rng::below(&[seed, batch.step, s, key, e], range) as i64,
        );
    }
    Ok(())
}

/// An integer input that is a mask by name (`attention_mask`, `mask`).
fn is_mask(name: &str) -> bool {
    name.as_bytes()
        .windows(4)
        .any(|w| w.eq_ignore_ascii_case(b"mask"))
}

/// Elements per sample (axis 0 is the batch).
fn per_sample(dims: &[usize]) -> usize {
    match dims.split_first() {
        Some((&b, rest)) if b > 0 => rest.iter().product::<usize>().max(1),
        _ => 1,
    }
}

/// A key for an input name.
fn name_key(name: &str) -> u64 {
    // `rng::hash` of the bytes as u64 counters, folded without a copy.
    name.bytes().fold(crate::rng::HASH_SEED, |h, b| {
        crate::rng::hash_step(h, u64::from(b))
    })
}
