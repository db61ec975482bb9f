//! fsdpc: an ahead-of-time compiler for fully sharded data parallel training.
//!
//! This crate is the command-line tool and a thin facade over the workspace
//! crates; see ARCHITECTURE.md for the map.
//!
//! ```text
//! frontends (model -> ir)  ->  planner (ir -> Plan)  ->  runtime (Plan -> training)
//! ```

pub use fsdpc_frontends as frontends;
pub use fsdpc_ir as ir;
pub use fsdpc_plan as plan;
pub use fsdpc_planner as planner;
pub use fsdpc_report as report;
pub use fsdpc_runtime as runtime;

pub mod cli;
