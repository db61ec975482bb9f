//! Train a small GPT on a text file, byte by byte (vocabulary 256), on CPU
//! thread ranks that each hold 1/N of every parameter (`full_shard`):
//!
//! ```sh
//! cargo run --release --example train_gpt_on_text -- [TEXT] [STEPS] [RANKS]
//! ```
//!
//! Defaults: `examples/data/lighthouse.txt`, 300 steps, 2 ranks. The same
//! with the command line: `fsdpc train gpt:layers=2,... --ranks 2 --data TEXT`.

use fsdpc::frontends::{self, LoadOptions};
use fsdpc::plan::ModelInfo;
use fsdpc::planner::{self, FsdpConfig};
use fsdpc::runtime::{self, DataSpec, TrainOptions};
use std::error::Error;
use std::path::{Path, PathBuf};

/// A 2-layer GPT over bytes: 64 bytes of context, 8 sequences per rank.
pub const MODEL: &str = "gpt:layers=2,hidden=64,heads=4,seq=64,vocab=256,batch=8";

/// The text the example trains on when given none.
pub fn default_text() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/lighthouse.txt")
}

/// Trains `MODEL` on the bytes of `text` for `steps` steps on `ranks` rank
/// threads; returns the loss of every step.
pub fn run(text: &Path, steps: u64, ranks: u32) -> Result<Vec<f32>, Box<dyn Error>> {
    // The model: the zoo builds the forward graph; loading adds the loss's
    // backward (autodiff) and the optimizer (AdamW).
    let model = frontends::load(MODEL, &LoadOptions::default())?;
    let info = ModelInfo {
        name: model.name.clone(),
        params: model.program.graph.param_numel(),
        tokens_per_rank_step: model.tokens_per_rank_step(),
    };
    // The plan: units, flat shards, the instruction list of every stream and
    // the memory of each rank, for `ranks` ranks of this machine.
    let cluster = planner::preset("cpu-local", ranks, ranks)?;
    let plan = planner::compile(model.program, info, &cluster, &FsdpConfig::default())?;
    // The run: each rank is a thread that creates only its own shards.
    let opts = TrainOptions {
        steps,
        data: DataSpec::TextFile(text.to_path_buf()),
        ..TrainOptions::default()
    };
    let report = runtime::train(&plan, &opts, &mut |r| {
        if r.step % 50 == 0 || r.step + 1 == steps {
            println!("step {:4}  loss {:.3}", r.step, r.loss);
        }
    })?;
    Ok(report.losses)
}

fn main() -> Result<(), Box<dyn Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let text = args.first().map_or_else(default_text, PathBuf::from);
    let steps = args.get(1).map_or(Ok(300), |s| s.parse())?;
    let ranks = args.get(2).map_or(Ok(2), |s| s.parse())?;
    let losses = run(&text, steps, ranks)?;
    if let (Some(first), Some(last)) = (losses.first(), losses.last()) {
        println!(
            "{} on {}: loss {first:.3} -> {last:.3} (ln 256 = 5.545 is a uniform guess)",
            MODEL,
            text.display()
        );
    }
    Ok(())
}
