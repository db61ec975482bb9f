//! `fsdpc trace plan.json -o trace.json`: the simulated step as a Perfetto /
//! Chrome trace (one track per stream, a live-memory counter).

use super::inspect::load_plan;
use super::CliError;
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// A plan written by `fsdpc compile`.
    pub plan: PathBuf,
    /// Where to write the trace (open it in ui.perfetto.dev).
    #[arg(short, long)]
    pub output: PathBuf,
}

pub fn run(a: TraceArgs) -> Result<(), CliError> {
    let plan = load_plan(&a.plan)?;
    let trace = fsdpc_report::trace::chrome_trace(&plan);
    std::fs::write(&a.output, trace.to_string()).map_err(|source| CliError::Io {
        path: a.output.display().to_string(),
        source,
    })?;
    eprintln!(
        "wrote {}: {} instructions over a simulated step of {:.3} ms",
        a.output.display(),
        plan.instructions.len(),
        plan.estimates.step_time_s * 1e3
    );
    Ok(())
}
