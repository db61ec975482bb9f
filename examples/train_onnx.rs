//! Import an ONNX model exported from PyTorch and train it sharded on CPU
//! thread ranks:
//!
//! ```sh
//! cargo run --release --example train_onnx -- [MODEL.onnx [NAME=SIZE ...]]
//! ```
//!
//! `NAME=SIZE` binds a symbolic input dimension (`batch=8 seq=128`). The
//! default model is `frontends/tests/fixtures/gpt_torchscript.onnx`, a 2-block
//! GPT in the form `torch.onnx.export`'s TorchScript exporter writes, with
//! `batch=2 sequence=4`. Its output is logits, so it trains with a
//! cross-entropy against a new `labels` input; inputs are synthetic (ids
//! inside the vocabulary). The command line does the same, and can write the
//! trained weights back: `fsdpc train MODEL.onnx --dim batch=2 --dim
//! sequence=4 --ranks 2 --save-onnx trained.onnx`.

use fsdpc::frontends::{self, LoadOptions};
use fsdpc::planner::{self, Cluster, FsdpConfig, ModelInfo};
use fsdpc::runtime::{self, TrainOptions};
use std::collections::HashMap;
use std::error::Error;
use std::path::{Path, PathBuf};

/// The model the example trains when given none, and its dimensions.
pub fn default_model() -> (PathBuf, HashMap<String, usize>) {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("frontends/tests/fixtures/gpt_torchscript.onnx");
    let dims = [("batch".to_string(), 2), ("sequence".to_string(), 4)];
    (path, dims.into())
}

/// Imports `model` with `dims` bound, plans it for `ranks` rank threads and
/// trains it for `steps` steps; returns the loss of every step.
pub fn run(
    model: &Path,
    dims: HashMap<String, usize>,
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
    let cluster = Cluster::preset("cpu-local", ranks, ranks)?;
    let plan = planner::compile(model.program, info, &cluster, &FsdpConfig::default())?;
    println!(
        "{}: {} parameters in {} units",
        plan.model.name,
        plan.model.params,
        plan.units.len()
    );
    let opts = TrainOptions {
        steps,
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
    let (model, dims) = match args.split_first() {
        Some((model, dims)) => (PathBuf::from(model), parse_dims(dims)?),
        None => default_model(),
    };
    let losses = run(&model, dims, 2, 50)?;
    if let (Some(first), Some(last)) = (losses.first(), losses.last()) {
        println!(
            "{} steps on 2 ranks: loss {first:.3} -> {last:.3}",
            losses.len()
        );
    }
    Ok(())
}
