//! Plan GPT-3 175B for 512 A100s (64 nodes of 8) with activation
//! checkpointing, and print what `fsdpc inspect` prints: units, shard sizes,
//! communication, peak memory per rank and its breakdown, simulated step.
//!
//! ```sh
//! cargo run --release --example inspect_gpt3
//! ```
//!
//! The same with the command line: `fsdpc compile gpt3-175b --world 512
//! --ranks-per-node 8 --activation-checkpointing -o plan.json` then
//! `fsdpc inspect plan.json`. Planning allocates no parameter memory: the
//! parameters are descriptions until a rank creates its own shard.

use fsdpc::frontends::{self, LoadOptions};
use fsdpc::plan::{CheckpointPolicy, ModelInfo};
use fsdpc::planner::{self, FsdpConfig};
use std::error::Error;

/// The `fsdpc inspect` table of GPT-3 175B at world 512.
pub fn run() -> Result<String, Box<dyn Error>> {
    let model = frontends::load("gpt3-175b", &LoadOptions::default())?;
    let info = ModelInfo {
        name: model.name.clone(),
        params: model.program.graph.param_numel(),
        tokens_per_rank_step: model.tokens_per_rank_step(),
    };
    let cluster = planner::preset("a100-80g-roce", 512, 8)?;
    let cfg = FsdpConfig {
        settings: fsdpc::plan::Settings {
            activation_checkpointing: CheckpointPolicy::Units,
            ..fsdpc::plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    // Fails with PlanError::DoesNotFit (and what would fit) if a rank's peak
    // exceeded 80 GB.
    let plan = planner::compile(model.program, info, &cluster, &cfg)?;
    Ok(fsdpc::report::inspect::render_text(&plan))
}

fn main() -> Result<(), Box<dyn Error>> {
    print!("{}", run()?);
    Ok(())
}
