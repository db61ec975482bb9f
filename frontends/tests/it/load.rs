//! `load`: zoo specs and fsdpc IR files become training programs; other
//! inputs give errors that say what is accepted.

use fsdpc_frontends::{load, zoo, FrontendError, LoadOptions};
use fsdpc_ir::{Optimizer, TrainingProgram};

fn opts() -> LoadOptions {
    LoadOptions::default()
}

#[test]
fn zoo_spec_loads_into_a_training_program() {
    let m = load("gpt-mini", &opts()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.name, "gpt-mini");
    assert_eq!(m.tokens_per_sample, 128);
    assert_eq!(m.program.graph.param_numel(), 544_256);
    assert_eq!(m.program.optimizer, Optimizer::adamw(1e-3));
    // One gradient per trainable parameter.
    assert_eq!(m.program.grads.len(), m.program.graph.params.len());
}

#[test]
fn tokens_per_sample_can_be_overridden() {
    let opts = LoadOptions {
        tokens_per_sample: Some(7),
        ..opts()
    };
    let m = load("mlp-mini", &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.tokens_per_sample, 7);
}

#[test]
fn graph_json_loads_with_the_requested_optimizer() {
    let m = zoo::build("gpt:layers=1,hidden=8,heads=2,seq=4,vocab=16")
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("tiny.json");
    let text = serde_json::to_string(&m.graph).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    let sgd = Optimizer::Sgd {
        lr: 0.1,
        momentum: 0.0,
        weight_decay: 0.0,
    };
    let opts = LoadOptions {
        optimizer: sgd.clone(),
        ..opts()
    };
    let loaded = load(path.to_str().unwrap_or_default(), &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.name, "tiny");
    assert_eq!(loaded.program.optimizer, sgd);
    // Derived from the `ids` input [1, 4].
    assert_eq!(loaded.tokens_per_sample, 4);
}

#[test]
fn program_json_keeps_its_own_optimizer() {
    let m = zoo::build("mlp-mini").unwrap_or_else(|e| panic!("{e}"));
    let program = TrainingProgram {
        graph: m.graph,
        loss: m.loss,
        grads: vec![],
        optimizer: Optimizer::adamw(3e-4),
    };
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("mlp.json");
    let text = serde_json::to_string(&program).unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    let loaded = load(path.to_str().unwrap_or_default(), &opts()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.name, "mlp");
    assert_eq!(loaded.program.optimizer, Optimizer::adamw(3e-4));
    assert_eq!(loaded.tokens_per_sample, 1);
}

#[test]
fn missing_and_foreign_files_are_reported() {
    assert!(matches!(
        load("missing.onnx", &opts()),
        Err(FrontendError::Io { .. })
    ));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("weights.pt");
    std::fs::write(&path, "not a model").unwrap_or_else(|e| panic!("{e}"));
    let r = load(path.to_str().unwrap_or_default(), &opts());
    assert!(
        matches!(r, Err(FrontendError::UnsupportedFormat { .. })),
        "{r:?}"
    );
    let r = load("gpt2:layers=0", &opts());
    assert!(matches!(r, Err(FrontendError::BadSpec { .. })), "{r:?}");
}
