//! ONNX import on the fixtures written by `tests/fixtures/make_fixtures.py`:
//! models load with their parameters, module tree and loss; bad files give
//! the error that says what to fix.

use fsdpc_frontends::onnx::import;
use fsdpc_frontends::{load, FrontendError, LoadOptions};
use fsdpc_ir::{Graph, Init, Op};
use std::collections::HashMap;
use std::fmt::Write;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn dims(pairs: &[(&str, usize)]) -> HashMap<String, usize> {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

fn module_of_param(g: &Graph, name: &str) -> String {
    let n = g
        .node_ids()
        .find(|&n| g.node(n).name == name && matches!(g.node(n).op, Op::Param { .. }))
        .unwrap_or_else(|| panic!("no param {name}"));
    g.module_info(g.node(n).module).path.clone()
}

#[test]
fn mlp_imports_with_torchscript_module_paths_and_a_cross_entropy_loss() {
    let m = import(&fixture("mlp.onnx"), &dims(&[("batch", 4)])).unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    assert_eq!(g.param_numel(), 16 * 32 + 32 + 32 * 4 + 4);
    assert_eq!(g.value_type(m.loss).shape.rank(), 0);
    assert_eq!(module_of_param(g, "layers.0.fc.weight"), "layers.0.fc");
    let relu = g.node_ids().find(|&n| g.node(n).op.name() == "unary.relu");
    let relu = relu.unwrap_or_else(|| panic!("no relu"));
    assert_eq!(g.module_info(g.node(relu).module).path, "layers.0.act");
    // The logits output got a `labels` input and a cross-entropy.
    let labels = g
        .node_ids()
        .find(|&n| matches!(&g.node(n).op, Op::Input { name } if name == "labels"));
    let labels = labels.unwrap_or_else(|| panic!("no labels input"));
    assert_eq!(g.node(labels).outputs[0].shape.dims(), &[4]);
    let Init::Data { data } = &g.params[0].init else {
        panic!("initializer should carry its data")
    };
    assert_eq!(data.bytes.len(), 32 * 16 * 4);
}

#[test]
fn scalar_loss_output_is_used_as_is() {
    let m =
        import(&fixture("mlp_loss.onnx"), &dims(&[("batch", 8)])).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        m.graph.node(m.loss.node).op,
        Op::CrossEntropy { ignore_index: None }
    );
}

#[test]
fn external_data_is_read_from_next_to_the_model() {
    let m = import(&fixture("mlp_external.onnx"), &dims(&[("batch", 2)]))
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.graph.param_numel(), 16 * 32 + 32 + 32 * 4 + 4);
}

#[test]
fn missing_external_data_names_the_file() {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("mlp_external.onnx");
    std::fs::copy(fixture("mlp_external.onnx"), &path).unwrap_or_else(|e| panic!("{e}"));
    match import(&path, &dims(&[("batch", 2)])) {
        Err(e @ FrontendError::OnnxExternalData { .. }) => {
            assert!(e.to_string().contains("mlp_external.onnx.data"), "{e}")
        }
        other => panic!("expected OnnxExternalData, got {other:?}"),
    }
}

#[test]
fn unbound_symbolic_dims_are_listed() {
    match import(&fixture("tiny_gpt.onnx"), &dims(&[("batch", 2)])) {
        Err(e @ FrontendError::UnboundDims { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("`seq` (input `ids`, axis 1)") && msg.contains("--dim"),
                "{msg}"
            );
        }
        other => panic!("expected UnboundDims, got {other:?}"),
    }
}

#[test]
fn truncated_file_is_a_decode_error() {
    let bytes = std::fs::read(fixture("mlp.onnx")).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("cut.onnx");
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap_or_else(|e| panic!("{e}"));
    let r = import(&path, &dims(&[("batch", 2)]));
    assert!(matches!(r, Err(FrontendError::OnnxDecode { .. })), "{r:?}");
    std::fs::write(&path, b"definitely not protobuf \xff\xff\xff")
        .unwrap_or_else(|e| panic!("{e}"));
    let r = import(&path, &dims(&[("batch", 2)]));
    assert!(matches!(r, Err(FrontendError::OnnxDecode { .. })), "{r:?}");
}

#[test]
fn unsupported_ops_are_all_listed_once() {
    match import(&fixture("unsupported.onnx"), &HashMap::new()) {
        Err(FrontendError::UnsupportedOps { ops, .. }) => {
            let shown: Vec<String> = ops.iter().map(|o| o.to_string()).collect();
            assert_eq!(
                shown,
                vec![
                    "NonZero (node `/find/NonZero`, opset 17)",
                    "com.example::FusedThing (node `/custom/FusedThing`, opset 17)"
                ]
            );
        }
        other => panic!("expected UnsupportedOps, got {other:?}"),
    }
}

#[test]
fn too_new_opset_is_refused() {
    let r = import(&fixture("opset99.onnx"), &dims(&[("batch", 2)]));
    match r {
        Err(e @ FrontendError::OnnxOpset { version: 99, .. }) => {
            assert!(e.to_string().contains("opset_version=21"))
        }
        other => panic!("expected OnnxOpset, got {other:?}"),
    }
}

/// Modules and non-constant nodes of a graph, one per line.
fn dump(g: &Graph) -> String {
    let mut s = String::from("modules:\n");
    for m in &g.modules {
        let path = if m.path.is_empty() { "<root>" } else { &m.path };
        let _ = writeln!(s, "  {path:<34} {}", m.kind);
    }
    s.push_str("nodes:\n");
    for n in g.node_ids() {
        let node = g.node(n);
        let types: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
        let module = &g.module_info(node.module).path;
        let _ = writeln!(
            s,
            "  {:<26} {:<14} -> {:<16} in `{module}`",
            node.name,
            node.op.name(),
            types.join(", ")
        );
    }
    s
}

#[test]
fn tiny_gpt_folds_shape_subgraphs_and_keeps_the_module_tree() {
    let m = import(
        &fixture("tiny_gpt.onnx"),
        &dims(&[("batch", 2), ("seq", 4)]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    // Same parameters as the zoo's gpt:layers=1,hidden=8,heads=2,vocab=16 with 8 positions.
    assert_eq!(g.param_numel(), 1_048 + 4 * 8);
    let names: Vec<String> = g.node_ids().map(|n| g.node(n).op.name()).collect();
    for folded in ["shape", "range", "constant_of_shape"] {
        assert!(
            !names.iter().any(|n| n == folded),
            "{folded} left in the graph"
        );
    }
    insta::assert_snapshot!(dump(g));
}

#[test]
fn onnx_models_load_into_training_programs() {
    let opts = LoadOptions {
        dims: dims(&[("batch", 2), ("seq", 4)]),
        ..LoadOptions::default()
    };
    for f in ["tiny_gpt.onnx", "mlp.onnx", "mlp_loss.onnx"] {
        let path = fixture(f);
        let m =
            load(path.to_str().unwrap_or_default(), &opts).unwrap_or_else(|e| panic!("{f}: {e}"));
        assert_eq!(m.program.grads.len(), m.program.graph.params.len(), "{f}");
    }
    let path = fixture("tiny_gpt.onnx");
    let m = load(path.to_str().unwrap_or_default(), &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((m.name.as_str(), m.tokens_per_sample), ("tiny_gpt", 4));
}

#[test]
fn declared_types_are_checked_against_the_import() {
    use onnx_protobuf::Message;
    let bytes = std::fs::read(fixture("mlp.onnx")).unwrap_or_else(|e| panic!("{e}"));
    let mut m =
        onnx_protobuf::ModelProto::parse_from_bytes(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let Some(g) = m.graph.0.as_deref_mut() else {
        panic!("no graph")
    };
    // Claim the hidden activation has 33 features (it has 32).
    let mut vi = g.output[0].clone();
    vi.name = "/layers.0/act/Relu_output_0".into();
    if let Some(onnx_protobuf::type_proto::Value::TensorType(t)) =
        vi.type_.0.as_deref_mut().and_then(|t| t.value.as_mut())
    {
        if let Some(s) = t.shape.0.as_deref_mut() {
            s.dim[1].value =
                Some(onnx_protobuf::tensor_shape_proto::dimension::Value::DimValue(33));
        }
    }
    g.value_info.push(vi);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, m.write_to_bytes().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}"));
    match import(&path, &dims(&[("batch", 4)])) {
        Err(FrontendError::OnnxTypeMismatch { mismatches, .. }) => assert_eq!(
            mismatches,
            vec!["`/layers.0/act/Relu_output_0`: the file says f32[4, 33], the import gives f32[4, 32]"]
        ),
        other => panic!("expected OnnxTypeMismatch, got {other:?}"),
    }
}

#[test]
fn torchscript_gpt_at_opset_14_keeps_its_tie_and_fuses_attention() {
    let m = import(
        &fixture("gpt_torchscript.onnx"),
        &dims(&[("batch", 2), ("sequence", 4)]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    // gpt:layers=2,hidden=8,heads=2,vocab=16 with 8 positions: the folded
    // transposed copy of wte is recognised as the same tensor.
    assert_eq!(g.param_numel(), 1_952);
    assert!(!g.params.iter().any(|p| p.name.starts_with("onnx::")));
    let ops: Vec<Op> = g.node_ids().map(|n| g.node(n).op.clone()).collect();
    let fused = ops
        .iter()
        .filter(|op| {
            **op == Op::Attention {
                causal: true,
                scale: 0.5,
            }
        })
        .count();
    assert_eq!(fused, 2);
    assert!(!ops.iter().any(|op| matches!(op, Op::Softmax { .. })));
    assert_eq!(
        module_of_param(g, "transformer.h.1.mlp.c_fc.weight"),
        "transformer.h.1.mlp.c_fc"
    );
    let opts = LoadOptions {
        dims: dims(&[("batch", 2), ("sequence", 4)]),
        ..LoadOptions::default()
    };
    let path = fixture("gpt_torchscript.onnx");
    let loaded = load(path.to_str().unwrap_or_default(), &opts).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        loaded.program.grads.len(),
        loaded.program.graph.params.len()
    );
    assert_eq!(loaded.tokens_per_sample, 4);
}

#[test]
fn added_labels_input_does_not_clash_with_an_existing_one() {
    use onnx_protobuf::Message;
    let bytes = std::fs::read(fixture("mlp.onnx")).unwrap_or_else(|e| panic!("{e}"));
    let mut m =
        onnx_protobuf::ModelProto::parse_from_bytes(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let Some(g) = m.graph.0.as_deref_mut() else {
        panic!("no graph")
    };
    let mut unused = g.input[0].clone();
    unused.name = "labels".into();
    g.input.push(unused);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, m.write_to_bytes().unwrap_or_default()).unwrap_or_else(|e| panic!("{e}"));
    let m = import(&path, &dims(&[("batch", 4)])).unwrap_or_else(|e| panic!("{e}"));
    let inputs: Vec<String> = m
        .graph
        .node_ids()
        .filter_map(|n| match &m.graph.node(n).op {
            Op::Input { name } => Some(name.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(inputs, ["x", "labels", "labels_1"]);
    assert!(fsdpc_ir::validate(&m.graph).is_ok());
}

#[test]
fn decomposed_tanh_gelu_is_fused() {
    let m = import(
        &fixture("gpt_torchscript.onnx"),
        &dims(&[("batch", 1), ("sequence", 8)]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    let gelus = g
        .node_ids()
        .filter(|&n| {
            g.node(n).op
                == Op::Unary {
                    f: fsdpc_ir::UnaryFn::GeluTanh,
                }
        })
        .count();
    assert_eq!(gelus, 2);
    assert!(!g.node_ids().any(|n| g.node(n).op
        == Op::Unary {
            f: fsdpc_ir::UnaryFn::Tanh
        }));
}

#[test]
fn decomposed_layer_norm_is_fused() {
    let m = import(
        &fixture("gpt_torchscript.onnx"),
        &dims(&[("batch", 1), ("sequence", 8)]),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    let norms: Vec<(String, f64)> = g
        .node_ids()
        .filter_map(|n| match g.node(n).op {
            Op::LayerNorm { eps } => Some((g.module_info(g.node(n).module).path.clone(), eps)),
            _ => None,
        })
        .collect();
    let paths: Vec<&str> = norms.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(
        paths,
        [
            "transformer.h.0.ln_1",
            "transformer.h.0.ln_2",
            "transformer.h.1.ln_1",
            "transformer.h.1.ln_2",
            "transformer.ln_f"
        ]
    );
    assert!(norms.iter().all(|(_, eps)| (eps - 1e-5).abs() < 1e-9));
    assert!(!g
        .node_ids()
        .any(|n| matches!(g.node(n).op, Op::Reduce { .. })));
}

/// A tensor whose element count fits but whose bytes overflow (`2^62` f32)
/// is one clear error naming the tensor, in debug and release builds alike.
#[test]
fn a_tensor_whose_bytes_overflow_is_an_error() {
    use onnx_protobuf::Message;
    let bytes = std::fs::read(fixture("mlp.onnx")).unwrap_or_else(|e| panic!("{e}"));
    let mut m =
        onnx_protobuf::ModelProto::parse_from_bytes(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let Some(g) = m.graph.0.as_deref_mut() else {
        panic!("no graph")
    };
    let t = &mut g.initializer[0];
    t.dims = vec![1 << 62];
    let name = t.name.clone();
    let bytes = m.write_to_bytes().unwrap_or_default();
    let opts = fsdpc_frontends::onnx::ImportOptions {
        dims: dims(&[("batch", 4)]),
        loss: None,
    };
    match fsdpc_frontends::onnx::import_bytes(&bytes, &opts) {
        Err(e @ FrontendError::OnnxTensor { .. }) => assert_eq!(
            e.to_string(),
            format!(
                "{}",
                FrontendError::OnnxTensor {
                    path: "<bytes>".into(),
                    tensor: name,
                    reason: format!("shape [{}] of f32 overflows", 1u64 << 62),
                }
            )
        ),
        other => panic!("expected OnnxTensor, got {other:?}"),
    }
}
