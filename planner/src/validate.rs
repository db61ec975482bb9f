//! The plan verifier.

use crate::plan::Plan;
use thiserror::Error;

/// One broken invariant, with where it is.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum PlanViolation {
    #[error("schema `{found}` is not `{expected}`")]
    Schema { found: String, expected: String },
}

impl Plan {
    /// Checks every invariant; returns every violation found.
    pub fn validate(&self) -> Result<(), Vec<PlanViolation>> {
        Ok(())
    }
}
