//! `fsdpc compare PREDICTED MEASURED [--json]`: the error of the simulated
//! step (`fsdpc trace`) against a measured one (`fsdpc train --trace`), by
//! instruction class and for the whole step (`fsdpc_report::compare`).

use super::{print_out, read_file, CliError};
use clap::Args;
use fsdpc_report::compare::{compare, Row};
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct CompareArgs {
    /// The predicted trace: `fsdpc trace plan.json -o predicted.json`.
    pub predicted: PathBuf,
    /// The measured trace: `fsdpc train plan.json --trace measured.json`.
    pub measured: PathBuf,
    /// Print the comparison as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: CompareArgs) -> Result<(), CliError> {
    let p = parse(&a.predicted)?;
    let m = parse(&a.measured)?;
    let c = compare(&p, &m).map_err(|e| CliError::Usage(e.to_string()))?;
    if a.json {
        let text = serde_json::to_string_pretty(&c)
            .map_err(|e| CliError::Usage(format!("cannot write the comparison: {e}")))?;
        return print_out(&format!("{text}\n"));
    }
    let mut out = format!(
        "predicted vs measured ({} rank(s), mean of {} traced step(s) per rank)\n{:<16} {:>12} {:>12} {:>9}\n",
        c.ranks, c.steps, "class", "predicted s", "measured s", "error"
    );
    for r in c.classes.iter().chain(std::iter::once(&c.step)) {
        out.push_str(&line(r));
    }
    print_out(&out)
}

fn line(r: &Row) -> String {
    let err = r
        .error_pct
        .map_or_else(|| "-".to_string(), |e| format!("{e:+.1}%"));
    format!(
        "{:<16} {:>12.6} {:>12.6} {:>9}\n",
        r.class, r.predicted_s, r.measured_s, err
    )
}

fn parse(path: &Path) -> Result<serde_json::Value, CliError> {
    let text = read_file(path)?;
    serde_json::from_str(&text)
        .map_err(|e| CliError::Usage(format!("{} is not a trace (not JSON: {e})", path.display())))
}
