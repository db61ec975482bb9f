//! The planner's integration tests, one module per subject, in one test
//! binary (`cargo test -p fsdpc-planner --test it`; one module: `... --test
//! it units::`). `common` builds zoo programs and plans them.

mod common;

mod freeze;
mod passes;
mod prefetch;
mod props;
mod recompute;
mod recompute_select;
mod scale;
mod smoke;
mod snapshots;
mod units;
mod validate;
