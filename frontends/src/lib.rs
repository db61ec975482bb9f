//! fsdpc-frontends: turns a model description into a training program. A model
//! is a zoo spec (`gpt2`, `gpt:layers=2,...`), an fsdpc IR JSON file (a forward
//! graph or a training program) or an ONNX file exported from PyTorch.
//!
//! Architecture invariant: frontends depend only on `fsdpc-ir`; they describe
//! parameters (`Init`) and never materialise them.

pub mod error;
pub mod hf;
pub mod ir_json;
pub mod onnx;
pub mod zoo;

pub use error::FrontendError;
pub use onnx::{LossKind, LossSpec};
pub use zoo::{ZooConfig, ZooModel};

use fsdpc_ir::{DType, Graph, Op, Optimizer, TrainingProgram, ValueId};
use std::collections::HashMap;
use std::path::Path;

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
    /// The loss of an ONNX model whose output is not a scalar loss (`None`:
    /// logits get a cross-entropy against a new `labels` input). Only ONNX
    /// models take one.
    pub loss: Option<LossSpec>,
    /// Gives every module that reads an initializer the exporter merged (see
    /// [`onnx::merged_initializers`]) its own copy. Only ONNX models have any.
    pub untie_merged_initializers: bool,
}

impl Default for LoadOptions {
    /// AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight decay 0.01).
    fn default() -> LoadOptions {
        LoadOptions {
            optimizer: Optimizer::adamw(1e-3),
            dims: HashMap::new(),
            tokens_per_sample: None,
            loss: None,
            untie_merged_initializers: false,
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

impl LoadedModel {
    /// One rank's micro-batch: the leading dimension of the first data input
    /// (1 for a model without inputs).
    pub fn batch_size(&self) -> u64 {
        let g = &self.program.graph;
        g.node_ids()
            .find_map(|n| match &g.node(n).op {
                Op::Input { .. } => g.node(n).outputs[0].shape.dims().first().map(|&d| d as u64),
                _ => None,
            })
            .unwrap_or(1)
    }

    /// Tokens (samples, for a non-sequence model) one rank processes a step.
    pub fn tokens_per_rank_step(&self) -> u64 {
        self.tokens_per_sample * self.batch_size()
    }
}

/// Loads `model`: a path ending in `.json` (fsdpc IR) or `.onnx`, or else a zoo
/// spec; then builds its training program with `opts.optimizer`.
pub fn load(model: &str, opts: &LoadOptions) -> Result<LoadedModel, FrontendError> {
    if let Some(rest) = model.strip_prefix("hf:") {
        if opts.loss.is_some() {
            return Err(FrontendError::bad_spec(
                model,
                "a loss (--loss) can be chosen only for an ONNX model; a Hugging Face model carries its own",
            ));
        }
        let (m, _) = hf::build(rest)?;
        let tokens = opts.tokens_per_sample.unwrap_or(m.tokens_per_sample);
        return finish(m.name, m.graph, m.loss, tokens, opts);
    }
    let path = Path::new(model);
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    if opts.loss.is_some() && ext.as_deref() != Some("onnx") {
        return Err(FrontendError::bad_spec(
            model,
            "a loss (--loss) can be chosen only for an ONNX model; zoo models and \
             fsdpc IR files carry their own",
        ));
    }
    match ext.as_deref() {
        Some("json") => load_ir_json(path, opts),
        Some("onnx") => {
            let io = onnx::ImportOptions {
                dims: opts.dims.clone(),
                loss: opts.loss.clone(),
            };
            let mut m = onnx::import_with(path, &io)?;
            if opts.untie_merged_initializers {
                untie(&mut m, path)?;
            }
            let tokens = opts
                .tokens_per_sample
                .unwrap_or_else(|| guess_tokens(&m.graph));
            finish(m.name, m.graph, m.loss, tokens, opts)
        }
        _ if path.is_file() => Err(FrontendError::UnsupportedFormat {
            path: path.to_path_buf(),
        }),
        _ => {
            let m = zoo::build(model)?;
            let tokens = opts.tokens_per_sample.unwrap_or(m.tokens_per_sample);
            finish(m.name, m.graph, m.loss, tokens, opts)
        }
    }
}

/// Unties the merged initializers of `m` (new parameters come last, so node
/// ids are renumbered to stay in topological order).
fn untie(m: &mut onnx::OnnxModel, path: &Path) -> Result<(), FrontendError> {
    if onnx::untie_merged(&mut m.graph).is_empty() {
        return Ok(());
    }
    let cycle = |_| FrontendError::OnnxModel {
        path: path.to_path_buf(),
        reason: "untying merged initializers left a cycle".into(),
    };
    let (g, ids) = m.graph.renumbered().map_err(cycle)?;
    let loss = ids
        .get(&m.loss.node)
        .map(|&node| ValueId { node, ..m.loss });
    m.loss = loss.ok_or_else(|| FrontendError::OnnxModel {
        path: path.to_path_buf(),
        reason: "the loss was lost untying merged initializers".into(),
    })?;
    m.graph = g;
    Ok(())
}

fn load_ir_json(path: &Path, opts: &LoadOptions) -> Result<LoadedModel, FrontendError> {
    let name = path.file_stem().map_or_else(
        || path.display().to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    match ir_json::load_json(path)? {
        ir_json::JsonModel::Graph { graph, loss } => {
            let tokens = opts
                .tokens_per_sample
                .unwrap_or_else(|| guess_tokens(&graph));
            finish(name, graph, loss, tokens, opts)
        }
        ir_json::JsonModel::Program(program) => {
            let tokens = opts
                .tokens_per_sample
                .unwrap_or_else(|| guess_tokens(&program.graph));
            Ok(LoadedModel {
                name,
                program,
                tokens_per_sample: tokens,
            })
        }
    }
}

/// Builds the training program of a forward graph.
fn finish(
    name: String,
    graph: Graph,
    loss: ValueId,
    tokens_per_sample: u64,
    opts: &LoadOptions,
) -> Result<LoadedModel, FrontendError> {
    let program = fsdpc_ir::autodiff::build_training_program(graph, loss, opts.optimizer.clone())?;
    Ok(LoadedModel {
        name,
        program,
        tokens_per_sample,
    })
}

/// Tokens per sample of an imported graph: the per-sample size of its first
/// integer input of rank >= 2 (token ids `[batch, seq]`), else 1.
fn guess_tokens(g: &Graph) -> u64 {
    g.node_ids()
        .map(|n| g.node(n))
        .filter(|n| matches!(n.op, Op::Input { .. }))
        .filter_map(|n| n.outputs.first())
        .find(|t| t.dtype == DType::I64 && t.shape.rank() >= 2)
        .map_or(1, |t| {
            t.shape.dims()[1..].iter().map(|&d| d as u64).product()
        })
}
