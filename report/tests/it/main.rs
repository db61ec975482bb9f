//! The views' integration tests (`inspect` text, the HTML report), in one
//! test binary (`cargo test -p fsdpc-report --test it`). `common` builds zoo
//! programs and plans them (the planner's
//! tests' helper module, shared by path).

#[path = "../../../planner/tests/it/common/mod.rs"]
mod common;

mod inspect;
mod report;
