//! The frontends' integration tests (the model zoo, ONNX import and
//! write-back, the IR file format, the fuzz corpus), one module per subject,
//! in one test binary (`cargo test -p fsdpc-frontends --test it`).

mod fuzz_corpus;
mod ir_json;
mod llama;
mod load;
mod onnx;
mod onnx_fuzz;
mod onnx_write;
mod t5;
mod vision;
mod zoo;
