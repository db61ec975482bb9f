//! fsdpc IR JSON files: graphs and training programs round-trip through
//! serde and back through the loader; bad files give errors naming the file
//! and the position.

use fsdpc_frontends::ir_json::{self, JsonModel};
use fsdpc_frontends::{zoo, FrontendError};
use fsdpc_ir::autodiff::build_training_program;
use fsdpc_ir::Optimizer;
use std::path::{Path, PathBuf};

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap_or_else(|e| panic!("{e}"));
    path
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
}

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn graph_round_trips() {
    let m = zoo::build("gpt:layers=1,hidden=8,heads=2,seq=4,vocab=16")
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = tmp();
    let path = write(dir.path(), "tiny.json", &json(&m.graph));
    let (g, loss) = ir_json::load_graph(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loss, m.loss);
    assert_eq!(json(&g), json(&m.graph));
    assert!(matches!(
        ir_json::load_json(&path),
        Ok(JsonModel::Graph { .. })
    ));
}

#[test]
fn program_round_trips() {
    let m = zoo::build("mlp-mini").unwrap_or_else(|e| panic!("{e}"));
    let program = build_training_program(m.graph, m.loss, Optimizer::adamw(3e-4));
    let program = program.unwrap_or_else(|e| panic!("{e}"));
    let dir = tmp();
    let path = write(dir.path(), "mlp.json", &json(&program));
    let back = ir_json::load_program(&path).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(json(&back), json(&program));
    assert!(matches!(
        ir_json::load_json(&path),
        Ok(JsonModel::Program(_))
    ));
}

#[test]
fn syntax_error_names_file_line_and_column() {
    let dir = tmp();
    let path = write(
        dir.path(),
        "bad.json",
        "{\n  \"name\": \"x\",\n  \"modules\": [,]\n}",
    );
    match ir_json::load_graph(&path) {
        Err(
            e @ FrontendError::Json {
                line: 3,
                column: 15,
                ..
            },
        ) => {
            let msg = e.to_string();
            assert!(msg.contains("bad.json") && msg.contains(":3:15:"), "{msg}");
        }
        other => panic!("expected a Json error at 3:15, got {other:?}"),
    }
}

#[test]
fn truncated_file_is_a_json_error() {
    let m = zoo::build("mlp-mini").unwrap_or_else(|e| panic!("{e}"));
    let text = json(&m.graph);
    let dir = tmp();
    let path = write(dir.path(), "cut.json", &text[..text.len() / 2]);
    assert!(matches!(
        ir_json::load_graph(&path),
        Err(FrontendError::Json { .. })
    ));
}

#[test]
fn missing_file_is_an_io_error() {
    let r = ir_json::load_graph("/nonexistent/model.json");
    assert!(matches!(r, Err(FrontendError::Io { .. })), "{r:?}");
}

#[test]
fn graph_without_scalar_loss_is_rejected() {
    let m = zoo::build("mlp-mini").unwrap_or_else(|e| panic!("{e}"));
    let mut g = m.graph;
    let dir = tmp();
    g.outputs.clear();
    let path = write(dir.path(), "none.json", &json(&g));
    match ir_json::load_graph(&path) {
        Err(FrontendError::BadGraph { problems, .. }) => {
            assert!(problems[0].contains("no outputs"))
        }
        other => panic!("expected BadGraph, got {other:?}"),
    }
    // The first input (`x`, [16, 32]) is not a scalar.
    let x = fsdpc_ir::ValueId {
        node: g.node_ids().next().unwrap_or(fsdpc_ir::NodeId(0)),
        slot: 0,
    };
    g.outputs = vec![x];
    let path = write(dir.path(), "vector.json", &json(&g));
    match ir_json::load_graph(&path) {
        Err(FrontendError::BadGraph { problems, .. }) => {
            assert!(
                problems[0].contains("must be a floating-point scalar"),
                "{problems:?}"
            )
        }
        other => panic!("expected BadGraph, got {other:?}"),
    }
}

#[test]
fn stored_types_are_checked_by_the_verifier() {
    let m = zoo::build("mlp-mini").unwrap_or_else(|e| panic!("{e}"));
    let mut v = serde_json::to_value(&m.graph).unwrap_or_else(|e| panic!("{e}"));
    // Node 4 is the first matmul, [16, 64]; claim it is [16, 65].
    v["nodes"][4]["outputs"][0]["shape"] = serde_json::json!([16, 65]);
    let dir = tmp();
    let path = write(dir.path(), "tampered.json", &json(&v));
    match ir_json::load_graph(&path) {
        Err(FrontendError::BadGraph { problems, .. }) => {
            assert!(
                problems.iter().any(|p| p.contains("layers.0.fc.matmul")),
                "{problems:?}"
            )
        }
        other => panic!("expected BadGraph, got {other:?}"),
    }
}
