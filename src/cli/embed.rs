//! The commands as functions that return values instead of printing them:
//! what a host embedding fsdpc calls (the Python module, `python/`). Each
//! takes what the command line takes and fails with the same one-line
//! errors.

pub use super::compile::{AutoSearch, Compiled};
use super::{Cli, CliError, Command};
use clap::{ArgAction, CommandFactory, Parser};
use fsdpc_plan::Plan;
use fsdpc_planner::simulate::Simulation;
use std::ffi::OsString;
use std::path::Path;

/// Parses `args` (without the program name) as `fsdpc ARGS...` would. A
/// flag that does not parse is a usage error: clap's message, its first
/// line and its tip.
pub fn parse(args: &[String]) -> Result<Cli, CliError> {
    try_parse(args).map_err(|e| CliError::Usage(clap_message(&e)))
}

fn try_parse<T: Into<OsString> + Clone>(args: &[T]) -> Result<Cli, clap::Error> {
    Cli::try_parse_from(
        std::iter::once(OsString::from("fsdpc")).chain(args.iter().cloned().map(Into::into)),
    )
}

/// clap's error without its styling, usage block and `--help` hint.
fn clap_message(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut lines = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more"));
    let first = lines
        .next()
        .unwrap_or("invalid arguments")
        .trim_start_matches("error: ")
        .to_string();
    lines
        .filter(|l| l.starts_with("tip:"))
        .fold(first, |acc, tip| format!("{acc} ({tip})"))
}

/// `fsdpc compile ARGS...` (`args` start with the model; no `-o`): the plan
/// and, with `--auto`, the search.
pub fn compile(args: &[String]) -> Result<Compiled, CliError> {
    let argv: Vec<String> = std::iter::once("compile".to_string())
        .chain(args.iter().cloned())
        .chain(["-o".to_string(), "-".to_string()])
        .collect();
    match parse(&argv)?.command {
        Command::Compile(a) => super::compile::compile(&a),
        _ => unreachable!("parsed as compile"),
    }
}

/// `fsdpc inspect`'s reading of a plan file: parsed and validated, and an
/// IR model or other JSON named as what it is.
pub fn load_plan(path: &Path) -> Result<Plan, CliError> {
    super::inspect::load_plan(path)
}

/// `fsdpc simulate [--kernels K]`: the simulated step of `plan` on
/// `cluster` (the plan's own by default), its operators priced as
/// `kernels` (`fsdpc`, `pytorch-eager`; the cluster's by default), and the
/// text the command prints.
pub fn simulate(
    plan: &Plan,
    cluster: Option<&str>,
    kernels: Option<&str>,
) -> Result<(Simulation, String), CliError> {
    let kernels = kernels
        .map(|k| {
            <super::simulate::KernelsArg as clap::ValueEnum>::from_str(k, false).map_err(|_| {
                CliError::Usage(format!("kernels `{k}` is not one of: fsdpc, pytorch-eager"))
            })
        })
        .transpose()?;
    super::simulate::simulated(plan, cluster, kernels.map(Into::into))
}

/// `fsdpc report`: the HTML page of `plan`, simulated on `cluster`, with
/// the measured trace at `measured` beside the prediction.
pub fn report(
    plan: &Plan,
    cluster: Option<&str>,
    measured: Option<&Path>,
) -> Result<String, CliError> {
    super::report::html(plan, cluster, measured)
}

/// How a flag takes its value.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FlagKind {
    /// Present or absent (`--no-sync`).
    Switch,
    /// One value (`--world 8`).
    Value,
    /// Alone, or with one value (`--activation-checkpointing[=every:2]`).
    OptionalValue,
    /// Repeatable, one value each (`--freeze A --freeze B`).
    Repeated,
}

/// One flag of a command.
#[derive(Clone, Debug)]
pub struct Flag {
    /// The long name, without the dashes (`mixed-precision`).
    pub long: String,
    pub kind: FlagKind,
    /// The first line of its help.
    pub help: String,
}

/// The flags of `fsdpc COMMAND` (`compile`, `train`, ...), in the order
/// `--help` lists them; `None` for an unknown command.
pub fn flags(command: &str) -> Option<Vec<Flag>> {
    let cli = Cli::command();
    let sub = cli.find_subcommand(command)?;
    Some(
        sub.get_arguments()
            .filter_map(|a| {
                let long = a.get_long()?.to_string();
                if long == "help" || long == "version" {
                    return None;
                }
                let kind = match a.get_action() {
                    ArgAction::SetTrue | ArgAction::SetFalse | ArgAction::Count => FlagKind::Switch,
                    ArgAction::Append => FlagKind::Repeated,
                    _ if a.get_num_args().is_some_and(|n| n.min_values() == 0) => {
                        FlagKind::OptionalValue
                    }
                    _ => FlagKind::Value,
                };
                let help = a
                    .get_help()
                    .map(|h| h.to_string().lines().next().unwrap_or("").to_string())
                    .unwrap_or_default();
                Some(Flag { long, kind, help })
            })
            .collect(),
    )
}

/// Runs `fsdpc ARGS...`, printing what the command prints; returns the
/// exit status. The binary is this function.
pub fn main<T: Into<OsString> + Clone>(args: &[T]) -> i32 {
    let cli = match try_parse(args) {
        Ok(cli) => cli,
        Err(e) => {
            // clap's own message (or --help, --version) and status.
            let _ = e.print();
            return e.exit_code();
        }
    };
    match super::run(cli) {
        Ok(()) => 0,
        Err(e) => {
            if !e.is_quiet() {
                eprintln!("error: {e}");
            }
            e.exit_code()
        }
    }
}
