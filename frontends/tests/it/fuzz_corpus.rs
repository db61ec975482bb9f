//! Replays the committed fuzz corpus (`fuzz/corpus/onnx/`) through the ONNX
//! import exactly as the fuzz target (`fuzz/fuzz_targets/onnx_import.rs`)
//! calls it, so every build checks the corpus even where cargo-fuzz cannot
//! run: each input must give `Ok` or `Err`, never a panic. The seeds copied
//! from the fixtures must import, and their truncations must not.

use fsdpc_frontends::onnx::{import_bytes, ImportOptions};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

/// The fuzz target's options: symbolic `batch`, `seq` and `sequence` bound.
fn fuzz_options() -> ImportOptions {
    ImportOptions {
        dims: [
            ("batch".to_string(), 2),
            ("seq".to_string(), 4),
            ("sequence".to_string(), 4),
        ]
        .into(),
        loss: None,
    }
}

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/onnx");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("directory entry").path();
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, bytes)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_input_imports_or_errs() {
    let files = corpus();
    assert!(
        files.len() >= 10,
        "the seed corpus has {} files",
        files.len()
    );
    let opts = fuzz_options();
    let mut panicked = Vec::new();
    for (name, bytes) in &files {
        let outcome = catch_unwind(AssertUnwindSafe(|| import_bytes(bytes, &opts).is_ok()));
        match (outcome, expected(name)) {
            (Err(_), _) => panicked.push(name.clone()),
            (Ok(ok), Some(want)) => assert_eq!(ok, want, "{name}: imports = {ok}"),
            (Ok(_), None) => {}
        }
    }
    assert!(panicked.is_empty(), "the import panicked on {panicked:?}");
}

/// Whether a seed must import: the valid fixtures yes, truncations and the
/// deliberately unsupported ones no; inputs a fuzzer added, either.
fn expected(name: &str) -> Option<bool> {
    if name.contains(".truncated-") {
        return Some(false);
    }
    match name {
        "mlp.onnx" | "mlp_loss.onnx" | "tiny_gpt.onnx" | "gpt_torchscript.onnx" => Some(true),
        // An unsupported op, an unknown opset, data in a file bytes lack.
        "unsupported.onnx" | "opset99.onnx" | "mlp_external.onnx" => Some(false),
        _ => None,
    }
}
