//! The end-to-end tests of fsdpc, one module per subject, in one test
//! binary (`cargo test --test it`; one module: `cargo test --test it
//! cli::`). `common` and `support` are their shared helpers. The binary
//! installs the counting allocator, so training runs report a measured
//! peak per rank (`fsdpc_runtime::account`; concurrent runs count apart).

#[global_allocator]
static ALLOC: fsdpc_runtime::account::CountingAlloc = fsdpc_runtime::account::CountingAlloc;

mod common;
mod support;

mod auto;
mod batch_norm;
mod checkpoint;
mod checkpoint_select;
mod cli;
mod clip;
mod conformance;
mod cost_model;
mod cuda;
mod data;
mod docs;
mod eager_kernels;
mod equivalence;
mod eval;
mod examples;
mod exec;
mod failure;
mod freeze;
mod grad_accum;
mod hf;
mod hf_lm_data;
mod layout_rewrite;
mod llama;
mod lowp_memory;
mod lr_schedule;
mod memory;
mod minilm;
mod mpi;
mod offload;
mod offload_memory;
mod onnx_conformance;
mod onnx_export;
mod onnx_fixtures;
mod onnx_loss;
mod onnx_merged;
mod onnx_names;
mod partial_offload;
mod precision;
mod precision_memory;
mod report;
mod rewrites;
mod shared_params;
mod simulate;
mod strategies;
mod t5;
mod targets;
mod tensor_parallel;
mod tidy;
mod trace_cli;
mod vision;
mod weight_decay;
mod wire;
mod zoo_vision;
