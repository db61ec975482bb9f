//! Errors of the plan crate: a plan document that does not load, and a
//! configuration value that does not parse.

use crate::validate::PlanViolation;
use thiserror::Error;

/// A plan document that cannot be used.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum LoadError {
    /// Not valid JSON of the plan schema.
    #[error("plan JSON: {0}")]
    Json(String),
    /// A plan of another schema version.
    #[error("plan schema `{found}` is not supported; this planner reads `{expected}`")]
    Schema { found: String, expected: String },
    /// A plan that breaks invariants (all violations found, in order).
    #[error("invalid plan ({} violation(s)); first: {}", .0.len(), .0.first().map(|v| v.to_string()).unwrap_or_default())]
    Invalid(Vec<PlanViolation>),
}

/// A configuration string that does not parse (`--cpu-offload every:x`).
#[derive(Debug, Error, Clone, PartialEq)]
#[error("invalid {what} `{value}`: {reason}")]
pub struct ConfigError {
    /// What the value configures (`wire format`, `cpu offload`).
    pub what: &'static str,
    pub value: String,
    pub reason: String,
}
