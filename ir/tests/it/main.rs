//! The IR's integration tests, one module per subject, in one test
//! binary (`cargo test -p fsdpc-ir --test it`; one module: `... --test it
//! autodiff::`). `common` builds the small graphs they share.

mod common;

mod autodiff;
mod autodiff_props;
mod dump_and_json;
mod flops;
mod gpt_block;
mod init;
mod reorder;
mod shape_rules;
mod validate;
