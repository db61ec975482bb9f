//! `fsdpc inspect plan.json [--json]`

use super::json_kind::{sniff, JsonKind};
use super::{print_out, read_file, CliError};
use clap::Args;
use fsdpc_plan::Plan;
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
        let s = serde_json::to_string_pretty(&fsdpc_report::inspect::summary(&plan))
            .map_err(|e| CliError::Usage(format!("cannot print summary: {e}")))?;
        print_out(&format!("{s}\n"))
    } else {
        print_out(&fsdpc_report::inspect::render_text(&plan))
    }
}

/// Reads, parses and validates a plan file; an IR model or any other JSON
/// is an error saying what the file is.
pub(crate) fn load_plan(path: &Path) -> Result<Plan, CliError> {
    let text = read_file(path)?;
    match sniff(path, &text)? {
        JsonKind::Plan => parse_plan(path, &text),
        JsonKind::Model => Err(CliError::Usage(format!(
            "{}: an fsdpc IR model, not a plan; compile it first (fsdpc compile {} --world N -o plan.json)",
            path.display(),
            path.display()
        ))),
    }
}

/// Parses and validates the text of the plan file at `path`.
pub(crate) fn parse_plan(path: &Path, text: &str) -> Result<Plan, CliError> {
    Plan::from_json(text).map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))
}
