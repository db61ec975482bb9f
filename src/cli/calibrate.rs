//! `fsdpc calibrate [--ranks-per-node R] [-o cluster.json]`: measures this
//! machine (`fsdpc_runtime::calibrate`, from the `cpu-local` preset) and
//! writes the cluster file, with a progress bar and the table of what was
//! measured on stderr.

use super::{print_out, CliError};
use clap::Args;
use fsdpc_runtime::calibrate::{measure, steps, Progress};
use indicatif::{ProgressBar, ProgressStyle};
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Ranks per node the figures are for (they share the cores).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..))]
    pub ranks_per_node: u32,
    /// Where to write the cluster file (default: stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// The graph of a zoo model spec, for the data source's timing.
pub fn model_graph(spec: &str) -> Result<fsdpc_ir::Graph, String> {
    fsdpc_frontends::load(spec, &fsdpc_frontends::LoadOptions::default())
        .map(|m| m.program.graph)
        .map_err(|e| e.to_string())
}

pub fn run(a: CalibrateArgs) -> Result<(), CliError> {
    // Refused before the measurement, not after it.
    if let Some(path) = &a.output {
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        if path.is_dir() || !dir.is_dir() {
            return Err(CliError::Usage(format!(
                "calibrate: cannot write the cluster file to {}: {}",
                path.display(),
                if path.is_dir() {
                    "it is a directory".to_string()
                } else {
                    format!("there is no directory {}", dir.display())
                }
            )));
        }
    }
    let rpn = a.ranks_per_node;
    let base = fsdpc_planner::presets::described("cpu-local", rpn, rpn)?;
    let bar = ProgressBar::new(steps(rpn) as u64);
    if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]") {
        bar.set_style(style);
    }
    let (file, table) = measure(base, rpn, &model_graph, &mut |p| match p {
        Progress::Measuring(what) => bar.set_message(what),
        Progress::Done => bar.inc(1),
    })
    .map_err(|e| CliError::Usage(e.to_string()))?;
    bar.finish_and_clear();
    eprint!("{table}");
    let text = file.to_file(false);
    match &a.output {
        None => print_out(&text),
        Some(path) => {
            std::fs::write(path, text).map_err(|source| CliError::Io {
                path: path.display().to_string(),
                source,
            })?;
            eprintln!("wrote {}", path.display());
            Ok(())
        }
    }
}
