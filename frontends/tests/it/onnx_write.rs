//! ONNX write-back and user-chosen losses on the fixtures: a model written
//! with new parameter values imports with exactly those values (inline,
//! external data and tied weights), and `LossSpec` builds the loss on the
//! named output or says which outputs and inputs exist.

use fsdpc_frontends::onnx::{import, import_with, write_with_params, ImportOptions};
use fsdpc_frontends::{FrontendError, LossKind, LossSpec};
use fsdpc_ir::{DType, Graph, Init, Op};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn dims(pairs: &[(&str, usize)]) -> HashMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Every parameter's file values, as f32, by name.
fn params(g: &Graph) -> HashMap<String, Vec<f32>> {
    g.params
        .iter()
        .map(|p| match &p.init {
            Init::Data { data } => {
                assert_eq!(data.ty.dtype, DType::F32, "{}", p.name);
                let v = data
                    .bytes
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                (p.name.clone(), v)
            }
            other => panic!("{}: {other:?}", p.name),
        })
        .collect()
}

/// `p` with every value changed (as training would).
fn perturbed(p: &HashMap<String, Vec<f32>>) -> HashMap<String, Vec<f32>> {
    p.iter()
        .map(|(k, v)| {
            let w = v
                .iter()
                .enumerate()
                .map(|(i, x)| x * 0.5 + i as f32 * 1e-3 + 0.25)
                .collect();
            (k.clone(), w)
        })
        .collect()
}

/// Writes `model` with perturbed parameters to `out` and checks the re-import.
fn round_trip(model: &Path, d: &HashMap<String, usize>, out: &Path) {
    let before = import(model, d).unwrap_or_else(|e| panic!("{e}"));
    let trained = perturbed(&params(&before.graph));
    let s = write_with_params(model, &trained, out).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.replaced - s.tied, trained.len());
    let after = import(out, d).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(params(&after.graph), trained);
    assert_eq!(
        after.graph.node_ids().count(),
        before.graph.node_ids().count(),
        "the same graph"
    );
}

#[test]
fn written_models_import_with_the_new_values() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    round_trip(
        &fixture("mlp.onnx"),
        &dims(&[("batch", 4)]),
        &dir.path().join("mlp.onnx"),
    );
    round_trip(
        &fixture("tiny_gpt.onnx"),
        &dims(&[("batch", 2), ("seq", 4)]),
        &dir.path().join("gpt.onnx"),
    );
}

#[test]
fn a_tied_transposed_copy_gets_the_transposed_values() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let d = dims(&[("batch", 2), ("sequence", 4)]);
    let out = dir.path().join("gpt.onnx");
    round_trip(&fixture("gpt_torchscript.onnx"), &d, &out);
    let m = import(&fixture("gpt_torchscript.onnx"), &d).unwrap_or_else(|e| panic!("{e}"));
    let s = write_with_params(
        &fixture("gpt_torchscript.onnx"),
        &perturbed(&params(&m.graph)),
        &out,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(s.tied, 1, "the folded transpose of wte");
}

#[test]
fn external_data_is_written_alongside() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out = dir.path().join("ext.onnx");
    round_trip(&fixture("mlp_external.onnx"), &dims(&[("batch", 4)]), &out);
    assert!(dir.path().join("ext.onnx.data").is_file());
    // No temporary files are left behind.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap_or_else(|e| panic!("{e}"))
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
}

#[test]
fn unknown_parameter_names_are_an_error() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let out = dir.path().join("x.onnx");
    let p: HashMap<String, Vec<f32>> = [("no.such.weight".to_string(), vec![1.0])].into();
    match write_with_params(&fixture("mlp.onnx"), &p, &out) {
        Err(FrontendError::OnnxModel { reason, .. }) => assert!(reason.contains("no.such.weight")),
        other => panic!("expected OnnxModel, got {other:?}"),
    }
    assert!(!out.exists());
}

fn opts(kind: LossKind, output: Option<&str>, target: Option<&str>) -> ImportOptions {
    ImportOptions {
        dims: dims(&[("batch", 4)]),
        loss: Some(LossSpec {
            kind,
            output: output.map(str::to_string),
            target: target.map(str::to_string),
        }),
    }
}

fn inputs(g: &Graph) -> Vec<(String, String)> {
    g.node_ids()
        .filter_map(|n| match &g.node(n).op {
            Op::Input { name } => Some((name.clone(), g.node(n).outputs[0].to_string())),
            _ => None,
        })
        .collect()
}

#[test]
fn named_losses_build_on_the_named_output() {
    let ce = import_with(
        &fixture("mlp.onnx"),
        &opts(LossKind::CrossEntropy, None, Some("y")),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    assert!(inputs(&ce.graph)
        .iter()
        .any(|(n, t)| n == "y" && t == "i64[4]"));
    let mse = import_with(&fixture("mlp.onnx"), &opts(LossKind::Mse, None, None))
        .unwrap_or_else(|e| panic!("{e}"));
    let g = &mse.graph;
    assert!(inputs(g).iter().any(|(n, _)| n == "target"));
    assert_eq!(g.value_type(mse.loss).shape.rank(), 0);
}

#[test]
fn unknown_outputs_and_bad_targets_list_what_exists() {
    let err = import_with(
        &fixture("mlp.onnx"),
        &opts(LossKind::CrossEntropy, Some("nope"), None),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("no output `nope`"), "{err}");
    assert!(err.contains("its outputs are"), "{err}");
    // An input of the wrong type for labels.
    let m = import(&fixture("mlp.onnx"), &dims(&[("batch", 4)])).unwrap_or_else(|e| panic!("{e}"));
    let x = inputs(&m.graph)
        .into_iter()
        .map(|(n, _)| n)
        .find(|n| n != "labels")
        .unwrap_or_default();
    let err = import_with(
        &fixture("mlp.onnx"),
        &opts(LossKind::CrossEntropy, None, Some(&x)),
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    assert!(err.contains("needs integer labels"), "{err}");
}
