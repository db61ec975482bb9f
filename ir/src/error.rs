//! Errors of the IR crate.

use thiserror::Error;

/// What can go wrong in the IR: a shape rule, a cycle, a malformed graph,
/// autodiff, or (de)serialisation.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum IrError {
    /// A shape or dtype rule failed; names the node.
    #[error("node `{node}` ({op}): {reason}")]
    Shape {
        node: String,
        op: String,
        reason: String,
    },
    /// The graph is not acyclic; `node` names a node on (or behind) the cycle.
    #[error("graph has a cycle through node `{node}`")]
    Cycle { node: String },
    /// A structural problem (a dangling reference, an inconsistent spec).
    #[error("invalid graph: {0}")]
    Invalid(String),
    /// Differentiation failed (bad loss, a VJP rule rejected its node).
    #[error("autodiff: {0}")]
    Autodiff(String),
    /// JSON could not be written or read.
    #[error("JSON: {0}")]
    Json(String),
}
