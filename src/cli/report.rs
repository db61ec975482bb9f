//! `fsdpc report PLAN [--cluster FILE|PRESET] [--measured TRACE] [-o FILE]`:
//! the plan's self-contained HTML report (`fsdpc_planner::report`), with a
//! `fsdpc train --trace` file of it drawn beside the prediction.

use super::compile::plan_cluster;
use super::inspect::load_plan;
use super::{print_out, read_file, CliError};
use clap::Args;
use fsdpc_plan::readable::human_bytes;
use fsdpc_plan::Plan;
use fsdpc_report::html::render;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// A plan written by `fsdpc compile`.
    pub plan: PathBuf,
    /// Simulate on this cluster (a preset or a cluster file) instead of the
    /// one the plan was compiled for; the plan's world and ranks per node
    /// are kept.
    #[arg(long, value_name = "FILE|PRESET")]
    pub cluster: Option<String>,
    /// A measured trace of this plan (`fsdpc train PLAN --trace TRACE`):
    /// predicted against measured, its timeline and memory beside the
    /// prediction.
    #[arg(long, value_name = "TRACE")]
    pub measured: Option<PathBuf>,
    /// Where to write the HTML page (default: stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

pub fn run(a: ReportArgs) -> Result<(), CliError> {
    let plan = load_plan(&a.plan)?;
    let html = html(&plan, a.cluster.as_deref(), a.measured.as_deref())?;
    match &a.output {
        None => print_out(&html),
        Some(path) => {
            std::fs::write(path, &html).map_err(|source| CliError::Io {
                path: path.display().to_string(),
                source,
            })?;
            print_out(&format!(
                "wrote {} ({})\n",
                path.display(),
                human_bytes(html.len() as u64)
            ))
        }
    }
}

/// The HTML page of `plan` simulated on `cluster` (the plan's own by
/// default), with the measured trace at `measured` beside the prediction.
pub(crate) fn html(
    plan: &Plan,
    cluster: Option<&str>,
    measured: Option<&Path>,
) -> Result<String, CliError> {
    let cluster = plan_cluster(plan, cluster)?;
    let trace = match measured {
        None => None,
        Some(path) => {
            let text = read_file(path)?;
            Some(serde_json::from_str(&text).map_err(|e| {
                CliError::Usage(format!("{} is not a trace (not JSON: {e})", path.display()))
            })?)
        }
    };
    render(plan, &cluster, trace.as_ref()).map_err(|e| {
        let prefix = measured.map_or(String::new(), |p| format!("{}: ", p.display()));
        CliError::Usage(format!("{prefix}{e}"))
    })
}
