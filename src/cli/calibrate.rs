//! `fsdpc calibrate [--ranks-per-node R] [-o cluster.json]`: measures this
//! machine (`fsdpc_runtime::calibrate`, from the `cpu-local` preset) and
//! writes the cluster file, with a progress bar and the table of what was
//! measured on stderr. `--target cuda` measures this machine's GPUs
//! instead (`targets::cuda::calibrate`, from the preset of their kind or
//! `--cluster`'s).

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
    /// What to measure: `threads` (this CPU's cores, for thread ranks) or
    /// `cuda` (this machine's GPUs: products, attention and kernels on the
    /// first, NCCL over all of them).
    #[arg(long, default_value = "threads", value_parser = ["threads", "cuda"])]
    pub target: String,
    /// With `--target cuda`: the preset whose figures stand where nothing
    /// is measured (default: the preset of the GPU's kind).
    #[arg(long, value_name = "PRESET")]
    pub cluster: Option<String>,
}

/// The preset of a GPU named `device` by its driver (`NVIDIA H200`,
/// `NVIDIA A100-SXM4-80GB`, ...), if one is of its kind.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub fn preset_for_device(device: &str) -> Option<&'static str> {
    let d = device.to_ascii_uppercase();
    let has = |s: &str| d.contains(s);
    Some(if has("H200") {
        "h200-141g-ib"
    } else if has("H100") {
        "h100-80g-ib"
    } else if has("A100") && has("80G") {
        "a100-80g-roce"
    } else if has("A100") {
        "a100-40g-efa"
    } else if has("L40S") {
        "l40s-48g-eth"
    } else if has("A10") && !has("A100") {
        "a10-24g-eth"
    } else {
        return None;
    })
}

/// Today's date (UTC) as `YYYY-MM-DD`, for the cluster file's sources.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn today() -> String {
    utc(std::time::SystemTime::now())[..10].to_string()
}

/// `t` as `YYYY-MM-DD HH:MM UTC` (the civil date from the days since
/// 1970-01-01, Howard Hinnant's algorithm); the benches date their
/// figures with it too.
pub fn utc(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02} UTC",
        rem / 3_600,
        rem % 3_600 / 60
    )
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
    if a.target == "cuda" {
        return run_cuda(&a);
    }
    if a.cluster.is_some() {
        return Err(CliError::Usage(
            "calibrate: --cluster names the base preset of --target cuda; the CPU's is cpu-local"
                .into(),
        ));
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
    write(&file, a.output.as_deref())
}

/// Writes `file` to `output`, or stdout.
fn write(file: &fsdpc_plan::cluster::Cluster, output: Option<&Path>) -> Result<(), CliError> {
    let text = file.to_file(false);
    match output {
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

/// `--target cuda`: the GPUs' measurements over the preset of their kind.
#[cfg(feature = "cuda")]
fn run_cuda(a: &CalibrateArgs) -> Result<(), CliError> {
    use fsdpc_runtime::targets::cuda::calibrate;
    let cuda = |e: fsdpc_runtime::targets::cuda::CudaError| CliError::Runtime(e.into());
    let device = calibrate::device_name().map_err(cuda)?;
    let name = match (&a.cluster, preset_for_device(&device)) {
        (Some(c), _) => c.clone(),
        (None, Some(p)) => p.to_string(),
        (None, None) => {
            return Err(CliError::Usage(format!(
                "calibrate --target cuda: no preset is of the kind of {device}; name the one whose figures stand where nothing is measured with --cluster ({})",
                fsdpc_planner::presets::PRESETS.map(|(n, _)| n).join(", ")
            )))
        }
    };
    let base = fsdpc_planner::presets::described(&name, 8, None)?;
    let bar = ProgressBar::new_spinner();
    let m = calibrate::measure(&mut |what| bar.set_message(what.to_string())).map_err(cuda)?;
    bar.finish_and_clear();
    let (file, table) = fsdpc_runtime::calibrate::gpu::cluster_file(base, &m, &today());
    eprint!("{table}");
    write(&file, a.output.as_deref())
}

#[cfg(not(feature = "cuda"))]
fn run_cuda(_: &CalibrateArgs) -> Result<(), CliError> {
    Err(CliError::Runtime(
        fsdpc_runtime::targets::cuda::CudaError::NotCompiled.into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_find_the_preset_of_their_kind() {
        for (name, preset) in [
            ("NVIDIA H200", Some("h200-141g-ib")),
            ("NVIDIA H100 80GB HBM3", Some("h100-80g-ib")),
            ("NVIDIA A100-SXM4-80GB", Some("a100-80g-roce")),
            ("NVIDIA A100-SXM4-40GB", Some("a100-40g-efa")),
            ("NVIDIA L40S", Some("l40s-48g-eth")),
            ("NVIDIA A10", Some("a10-24g-eth")),
            ("NVIDIA GeForce RTX 4090", None),
        ] {
            assert_eq!(preset_for_device(name), preset, "{name}");
        }
    }

    #[test]
    fn dates_are_civil() {
        let at = |secs: u64| utc(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01 00:00 UTC");
        // 2024-02-29 12:34 UTC, a leap day.
        assert_eq!(at(1_709_210_040), "2024-02-29 12:34 UTC");
    }

    #[test]
    fn today_is_a_date() {
        let t = today();
        assert_eq!(t.len(), 10, "{t}");
        assert!(t.starts_with("20"), "{t}");
        assert_eq!(&t[4..5], "-");
    }
}
