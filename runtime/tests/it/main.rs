//! The runtime's integration tests (kernels against finite differences,
//! communicators, the matrix-product heap bound, the cuda target's kernels
//! and emulated lowering), one module per subject, in one test binary
//! (`cargo test -p fsdpc-runtime --test it`; the cuda modules need
//! `--features cuda`). `gemm_heap` installs the binary's allocator, which
//! counts only while a test asks it to.

mod support;

mod comm;
mod conv;
mod cuda_emulate;
mod cuda_ptx;
mod gemm_heap;
mod gradcheck;
mod kernels;
