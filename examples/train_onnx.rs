//! Import an ONNX model exported from PyTorch and train it sharded on CPU
//! thread ranks:
//!
//! ```sh
//! cargo run --release --example train_onnx -- [MODEL.onnx [NAME=SIZE ...]]
//! ```
//!
//! `NAME=SIZE` binds a symbolic input dimension of the model (`batch=2
//! seq=16`; `batch` is each rank's micro-batch). The default model is
//! `tests/fixtures/onnx/gpt2_dynamo_eval.onnx`, a tiny Hugging Face
//! `GPT2LMHeadModel` (vocabulary 128) exported by torch's dynamo exporter
//! with its loss, with `batch=2 seq=16`, trained on the bytes of
//! `examples/data/lighthouse.txt` (ASCII, so inside the vocabulary): its
//! `input_ids` are windows of the text, its `labels` the same windows (the
//! exported loss shifts them), its `attention_mask` all ones. A model given
//! on the command line trains on synthetic data. The command line does the
//! same, and can write the trained weights back: `fsdpc train
//! tests/fixtures/onnx/gpt2_dynamo_eval.onnx --dim batch=2 --dim seq=16
//! --ranks 2 --data examples/data/lighthouse.txt --save-onnx trained.onnx`.

use fsdpc::frontends::{self, LoadOptions};
use fsdpc::plan::ModelInfo;
use fsdpc::planner::{self, FsdpConfig};
use fsdpc::runtime::{self, DataSpec, TrainOptions};
use std::collections::HashMap;
use std::error::Error;
use std::path::{Path, PathBuf};

/// The model the example trains when given none, its dimensions and its
/// data.
pub fn default_model() -> (PathBuf, HashMap<String, usize>, DataSpec) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let path = root.join("tests/fixtures/onnx/gpt2_dynamo_eval.onnx");
    let dims = [("batch".to_string(), 2), ("seq".to_string(), 16)];
    let text = DataSpec::TextFile(root.join("examples/data/lighthouse.txt"));
    (path, dims.into(), text)
}

/// Imports `model` with `dims` bound, plans it for `ranks` rank threads and
/// trains it for `steps` steps on `data`; returns the loss of every step.
pub fn run(
    model: &Path,
    dims: HashMap<String, usize>,
    data: DataSpec,
    ranks: u32,
    steps: u64,
) -> Result<Vec<f32>, Box<dyn Error>> {
    let opts = LoadOptions {
        dims,
        ..LoadOptions::default()
    };
    let model = frontends::load(&model.display().to_string(), &opts)?;
    let info = ModelInfo {
        name: model.name.clone(),
        params: model.program.graph.param_numel(),
        tokens_per_rank_step: model.tokens_per_rank_step(),
    };
    let cluster = planner::preset("cpu-local", ranks, ranks)?;
    let plan = planner::compile(model.program, info, &cluster, &FsdpConfig::default())?;
    println!(
        "{}: {} parameters in {} units",
        plan.model.name,
        plan.model.params,
        plan.units.len()
    );
    let opts = TrainOptions {
        steps,
        data,
        ..TrainOptions::default()
    };
    Ok(runtime::train(&plan, &opts, &mut |_| {})?.losses)
}

/// `NAME=SIZE` arguments as a map.
fn parse_dims(args: &[String]) -> Result<HashMap<String, usize>, Box<dyn Error>> {
    args.iter()
        .map(|a| {
            let (name, size) = a
                .split_once('=')
                .ok_or_else(|| format!("`{a}`: expected NAME=SIZE"))?;
            Ok((name.to_string(), size.parse()?))
        })
        .collect()
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (model, dims, data) = match args.split_first() {
        Some((model, dims)) => (PathBuf::from(model), parse_dims(dims)?, DataSpec::Synthetic),
        None => default_model(),
    };
    let losses = run(&model, dims, data, 2, 60)?;
    if let (Some(first), Some(last)) = (losses.first(), losses.last()) {
        println!(
            "{} steps on 2 ranks: loss {first:.3} -> {last:.3}",
            losses.len()
        );
    }
    Ok(())
}
