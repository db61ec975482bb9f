//! The CLI's error: one readable line per failure.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(transparent)]
    Frontend(#[from] fsdpc_frontends::FrontendError),
    #[error(transparent)]
    Plan(#[from] fsdpc_planner::PlanError),
    /// A flag's value that does not parse (`--wrap kind:`).
    #[error(transparent)]
    Config(#[from] fsdpc_plan::ConfigError),
    /// A plan file that does not load.
    #[error(transparent)]
    Load(#[from] fsdpc_plan::LoadError),
    /// `compile --auto` found nothing that fits (or a compile failed).
    #[error(transparent)]
    Auto(#[from] fsdpc_planner::auto::AutoError),
    #[error(transparent)]
    Runtime(#[from] fsdpc_runtime::RuntimeError),
    /// Standard output is a pipe whose reader has gone (`fsdpc ... | head`).
    /// Not a failure to report: the process ends quietly, with the status a
    /// process killed by SIGPIPE shows its shell (128 + 13), as `cat` does.
    #[error("standard output closed")]
    BrokenPipe,
}

impl CliError {
    /// 2 for input the user can fix (usage, bad model or plan), 141 for a
    /// closed output pipe, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Runtime(_) => 1,
            CliError::BrokenPipe => 141,
            _ => 2,
        }
    }

    /// Whether the error ends the process without a message (a closed pipe).
    pub fn is_quiet(&self) -> bool {
        matches!(self, CliError::BrokenPipe)
    }

    /// A failed write to standard output.
    pub(crate) fn stdout(source: std::io::Error) -> CliError {
        if source.kind() == std::io::ErrorKind::BrokenPipe {
            CliError::BrokenPipe
        } else {
            CliError::Io {
                path: "standard output".into(),
                source,
            }
        }
    }
}
