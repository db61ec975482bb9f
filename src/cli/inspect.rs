//! `fsdpc inspect plan.json [--json]`

use super::{read_file, CliError};
use clap::Args;
use fsdpc_planner::Plan;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// A plan written by `fsdpc compile`.
    pub plan: PathBuf,
    /// Print the summary as JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: InspectArgs) -> Result<(), CliError> {
    let plan = load_plan(&a.plan)?;
    if a.json {
        let s = serde_json::to_string_pretty(&fsdpc_planner::inspect::summary(&plan))
            .map_err(|e| CliError::Usage(format!("cannot print summary: {e}")))?;
        println!("{s}");
    } else {
        print!("{}", fsdpc_planner::inspect::render_text(&plan));
    }
    Ok(())
}

/// Reads, parses and validates a plan file.
pub(crate) fn load_plan(path: &PathBuf) -> Result<Plan, CliError> {
    parse_plan(path, &read_file(path)?)
}

/// Parses and validates the text of the plan file at `path`.
pub(crate) fn parse_plan(path: &Path, text: &str) -> Result<Plan, CliError> {
    Plan::from_json(text).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))
}
