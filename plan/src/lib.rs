//! fsdpc-plan: the plan, the contract between fsdpc's planner and every
//! runtime. A plan is a versioned JSON document (`fsdpc.plan/v1`): the
//! training program, the FSDP units and their flat layouts, every buffer
//! with its arena offset, the streams and events, the instruction list each
//! rank executes, the memory a rank holds and the planner's estimates.
//!
//! This crate holds what both sides must agree on and nothing either side
//! decides: the schema (`document`, `config`, `unit`, `buffer`, `instr`,
//! `memory`, `eval`), what a group of ranks is (`group`), the wire formats
//! (`wire`), offload (`offload`), the cluster description (`cluster`), the
//! kernels' workspace rules (`workspace`), what a target can run (`target`)
//! and the verifier (`validate`) every plan passes on every load.
//!
//! Architecture invariant: this crate depends on `fsdpc-ir` and serde only.
//! It decides nothing, runs nothing and knows no planner pass or runtime.

pub mod buffer;
pub mod cluster;
pub mod config;
pub mod document;
pub mod error;
pub mod eval;
pub mod group;
pub mod ids;
pub mod instr;
pub mod lr;
pub mod memory;
pub mod offload;
pub mod readable;
pub mod selector;
mod serde_default;
pub mod target;
pub mod unit;
pub mod validate;
pub mod wire;
pub mod workspace;

pub use buffer::{Buffer, BufferKind, Location, Slot};
pub use cluster::{Cluster, ClusterError, Hardware};
pub use config::{
    AutoRecord, BackwardPrefetch, CheckpointPolicy, LossScaler, PlanConfig, ReshardAfterForward,
    SequenceRecord, Settings, SharedParams, Strategy, TensorRecord, VocabularyPadding, WrapPolicy,
};
pub use document::{ModelInfo, Plan, RewriteReport, RuleFired, SCHEMA};
pub use error::{ConfigError, LoadError};
pub use eval::EvalPass;
pub use group::{
    hier_gather_staging_bytes, hier_reduce_staging_bytes, hierarchical_shape, CollectiveAlgorithm,
    Geometry, Group,
};
pub use ids::{BufferId, EventId, UnitId};
pub use instr::{bucketable_gather, ChunkKind, Collective, Instr, InstrOp, Stream};
pub use lr::{LrDecay, LrSchedule};
pub use memory::{Estimates, MemorySummary, OutsideArena, OutsideKind};
pub use offload::{OffloadUnits, OffloadWhat};
pub use unit::{reshard_group, unit_reshard, FlatParam, Segment, Unit};
pub use validate::PlanViolation;
pub use wire::{Fp8Scale, Wire};
