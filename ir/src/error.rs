//! Errors of the IR crate.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum IrError {
    /// A shape or dtype rule failed; names the node.
    #[error("node `{node}` ({op}): {reason}")]
    Shape {
        node: String,
        op: String,
        reason: String,
    },
    #[error("graph has a cycle through node `{node}`")]
    Cycle { node: String },
    #[error("invalid graph: {0}")]
    Invalid(String),
    #[error("autodiff: {0}")]
    Autodiff(String),
    #[error("JSON: {0}")]
    Json(String),
}
