//! fsdpc-planner: decides how a training program is sharded and emits a static
//! schedule (`Plan`).

pub mod plan;

pub use plan::*;
