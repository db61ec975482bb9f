//! Fuzz target: arbitrary bytes as an ONNX model. The import must return `Ok`
//! or `Err`, never panic, overflow or run out of memory. Symbolic dimensions
//! of the fixtures (`batch`, `seq`, `sequence`) are bound so that valid mutants get past
//! the input types into the op converters.

#![no_main]

use fsdpc_frontends::onnx::{import_bytes, ImportOptions};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let opts = ImportOptions {
        dims: [
            ("batch".to_string(), 2),
            ("seq".to_string(), 4),
            ("sequence".to_string(), 4),
        ]
        .into(),
        loss: None,
    };
    let _ = import_bytes(data, &opts);
});
