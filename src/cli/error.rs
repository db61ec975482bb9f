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
    #[error(transparent)]
    Runtime(#[from] fsdpc_runtime::RuntimeError),
}

impl CliError {
    /// 2 for input the user can fix (usage, bad model or plan), 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Runtime(_) => 1,
            _ => 2,
        }
    }
}
