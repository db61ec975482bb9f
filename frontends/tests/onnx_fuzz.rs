//! Corrupted ONNX files give errors, never panics: random byte changes and
//! truncations of the fixtures are imported and must return `Ok` or `Err`.

use fsdpc_frontends::onnx::import;
use proptest::prelude::*;
use std::collections::HashMap;
use std::path::PathBuf;

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(p).unwrap_or_else(|e| panic!("{e}"))
}

fn try_import(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{e}"));
    let dims: HashMap<String, usize> = [("batch".to_string(), 2), ("seq".to_string(), 4)].into();
    let _ = import(&path, &dims);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn mutated_models_do_not_panic(
        which in 0usize..3,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let name = ["tiny_gpt.onnx", "mlp.onnx", "mlp_loss.onnx"][which];
        let mut bytes = fixture(name);
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        try_import(&bytes);
    }
}
