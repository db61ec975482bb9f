//! Errors of the planner: bad configuration, programs it cannot lower, and
//! plans that do not fit or do not load.

use fsdpc_plan::{ClusterError, ConfigError, LoadError, PlanViolation};
use thiserror::Error;

/// Everything that can go wrong while planning.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlanError {
    /// An unknown cluster preset.
    #[error("unknown cluster preset `{name}`; known presets: {known}")]
    UnknownPreset { name: String, known: String },
    /// A cluster shape that cannot exist.
    #[error("invalid cluster: {reason}")]
    BadCluster { reason: String },
    /// A configuration string that does not parse.
    #[error("invalid {what} `{value}`: {reason}")]
    BadConfig {
        what: &'static str,
        value: String,
        reason: String,
    },
    /// A `--freeze` pattern that matches no parameter name.
    #[error(
        "freeze pattern `{pattern}` matches no parameter; the model has {params} parameters, \
         such as: {}", some_names.join(", ")
    )]
    FreezeMatchesNothing {
        pattern: String,
        /// How many parameters the model has.
        params: usize,
        /// The first few of their names.
        some_names: Vec<String>,
    },
    /// The training program cannot be lowered (a cycle, a parameter of an
    /// unsupported dtype, a gradient that is not a computed value ...).
    #[error("cannot plan program: {reason}")]
    Program { reason: String },
    /// The plan needs more memory per rank than the cluster has.
    #[error(
        "plan does not fit: needs {} per rank ({needed_bytes} bytes), capacity is {} \
         ({capacity_bytes}; over by {over_by}); {suggestion}",
        fsdpc_plan::readable::human_bytes(*needed_bytes),
        fsdpc_plan::readable::human_bytes(*capacity_bytes)
    )]
    DoesNotFit {
        needed_bytes: u64,
        capacity_bytes: u64,
        over_by: u64,
        suggestion: String,
    },
    /// A setting the target the plan is for does not run.
    #[error(transparent)]
    Unsupported(#[from] fsdpc_plan::target::Refusal),
    /// A plan document that does not load (`Plan::from_json`).
    #[error(transparent)]
    Load(#[from] LoadError),
    /// The passes made a plan that breaks invariants (a bug in a pass; all
    /// violations found, in order).
    #[error("invalid plan ({} violation(s)); first: {}", .0.len(), .0.first().map(|v| v.to_string()).unwrap_or_default())]
    Invalid(Vec<PlanViolation>),
}

impl From<ConfigError> for PlanError {
    fn from(e: ConfigError) -> PlanError {
        PlanError::BadConfig {
            what: e.what,
            value: e.value,
            reason: e.reason,
        }
    }
}

impl From<ClusterError> for PlanError {
    fn from(e: ClusterError) -> PlanError {
        PlanError::BadCluster { reason: e.reason }
    }
}
