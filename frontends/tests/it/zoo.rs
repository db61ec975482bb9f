//! The model zoo: presets build with the exact parameter counts of the models
//! they name, specs are parsed and rejected with the right error, and the
//! module tree of a tiny GPT is pinned by a snapshot.

use fsdpc_frontends::zoo::{self, ZooConfig};
use fsdpc_frontends::FrontendError;
use fsdpc_ir::{Graph, Init, Op};
use std::fmt::Write;

/// Builds `spec` and checks its parameter count against `expect`, both in the
/// graph and in the config's closed form.
fn check_params(spec: &str, expect: u64) {
    let m = zoo::build(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(m.graph.param_numel(), expect, "{spec}: graph");
    let cfg = zoo::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(cfg.param_count(), expect, "{spec}: config");
    assert_eq!(m.graph.outputs, vec![m.loss]);
    assert_eq!(
        m.graph.value_type(m.loss).shape.rank(),
        0,
        "{spec}: loss is a scalar"
    );
}

#[test]
fn gpt2_family_param_counts_match_hugging_face() {
    check_params("gpt2", 124_439_808);
    check_params("gpt2-medium", 354_823_168);
    check_params("gpt2-large", 774_030_080);
    check_params("gpt2-xl", 1_557_611_200);
}

#[test]
fn small_presets_param_counts() {
    check_params("gpt-mini", 544_256);
    // 32*64+64 + 64*64+64 + 64*10+10
    check_params("mlp-mini", 6_922);
    check_params("gpt:layers=1,hidden=8,heads=2,seq=4,vocab=16", 1_048);
}

#[test]
fn gpt3_175b_builds_without_parameter_memory() {
    let m = zoo::build("gpt3-175b").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.graph.param_numel(), 174_604_259_328);
    assert_eq!(m.tokens_per_sample, 2048);
    // Every parameter is a recipe (the runtime draws each rank's shard);
    // none carries bytes. Its build time is part of each compile that
    // `cargo bench --bench plan` times.
    for p in &m.graph.params {
        assert!(!matches!(p.init, Init::Data { .. }), "{}", p.name);
    }
}

#[test]
fn preset_overrides_change_batch_and_seq_but_keep_positions() {
    let m = zoo::build("gpt2:batch=4,seq=256").unwrap_or_else(|e| panic!("{e}"));
    // GPT-2 keeps its 1024 position embeddings at a shorter sequence.
    assert_eq!(m.graph.param_numel(), 124_439_808);
    assert_eq!(m.tokens_per_sample, 256);
    let ids = input_type(&m.graph, "ids");
    assert_eq!(ids.shape.dims(), &[4, 256]);
}

#[test]
fn untied_head_adds_a_parameter() {
    let spec = "gpt:layers=1,hidden=8,heads=2,seq=4,vocab=16,tie=false";
    check_params(spec, 1_048 + 16 * 8);
    let m = zoo::build(spec).unwrap_or_else(|e| panic!("{e}"));
    assert!(m.graph.params.iter().any(|p| p.name == "lm_head.weight"));
}

#[test]
fn tied_head_reuses_the_embedding_param_node() {
    let m = zoo::build("gpt-mini").unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    let wte = g
        .params
        .iter()
        .position(|p| p.name == "transformer.wte.weight");
    let wte = wte.unwrap_or_else(|| panic!("no wte"));
    let node = g.param_nodes()[&fsdpc_ir::ParamId(wte as u32)];
    let users: Vec<String> = g
        .users(fsdpc_ir::ValueId { node, slot: 0 })
        .into_iter()
        .map(|(n, _)| g.node(n).name.clone())
        .collect();
    assert_eq!(users, vec!["transformer.wte.gather", "lm_head.matmul"]);
}

#[test]
fn dropout_sites_have_distinct_seeds() {
    let m = zoo::build("gpt:layers=2,hidden=8,heads=2,seq=4,vocab=16,dropout=0.1")
        .unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    let mut seeds: Vec<u64> = g
        .node_ids()
        .filter_map(|n| match g.node(n).op {
            Op::Dropout { p, seed, .. } => {
                assert_eq!(p, 0.1);
                Some(seed)
            }
            _ => None,
        })
        .collect();
    // Embedding dropout plus two per block.
    assert_eq!(seeds.len(), 5);
    seeds.dedup();
    assert_eq!(seeds.len(), 5);
}

#[test]
fn gelu_erf_is_used_when_asked() {
    let m = zoo::build("gpt:layers=1,hidden=8,heads=2,seq=4,vocab=16,gelu=erf")
        .unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<String> = m
        .graph
        .node_ids()
        .map(|n| m.graph.node(n).op.name())
        .collect();
    assert!(names.iter().any(|n| n == "unary.gelu_erf"), "{names:?}");
}

fn input_type(g: &Graph, name: &str) -> fsdpc_ir::TensorType {
    g.node_ids()
        .map(|n| g.node(n))
        .find(|n| matches!(&n.op, Op::Input { name: x } if x == name))
        .map(|n| n.outputs[0].clone())
        .unwrap_or_else(|| panic!("no input {name}"))
}

/// Asserts that `spec` is rejected as a bad spec whose reason contains `needle`.
fn check_bad_spec(spec: &str, needle: &str) {
    match zoo::build(spec) {
        Err(FrontendError::BadSpec { reason, .. }) => {
            assert!(
                reason.contains(needle),
                "{spec}: reason `{reason}` lacks `{needle}`"
            )
        }
        other => panic!("{spec}: expected BadSpec, got {other:?}"),
    }
}

#[test]
fn bad_specs_are_rejected_with_a_reason() {
    check_bad_spec("gpt2:layers=0", "layers must be between 1 and");
    check_bad_spec("gpt2:hidden=abc", "hidden must be a whole number");
    check_bad_spec("gpt2:hidden=-4", "hidden must be a whole number");
    check_bad_spec("gpt2:hidden=770", "not divisible by heads=12");
    check_bad_spec("gpt2:colour=blue", "unknown key `colour`");
    check_bad_spec("gpt2:batch", "not of the form key=value");
    check_bad_spec("gpt2:batch=2,batch=3", "given twice");
    check_bad_spec("gpt:layers=2,hidden=8,heads=2,seq=4", "missing `vocab=`");
    check_bad_spec("gpt2:dropout=1.5", "0 <= dropout < 1");
    check_bad_spec("gpt2:tie=maybe", "true or false");
    check_bad_spec("gpt2:gelu=relu", "one of tanh, erf");
    check_bad_spec(
        "gpt:layers=1,hidden=8,heads=2,seq=8,positions=4,vocab=16",
        "positions=8",
    );
    check_bad_spec("mlp:layers=1,in=4,hidden=8", "missing `classes=`");
    check_bad_spec("mlp-mini:heads=2", "unknown key `heads`");
    check_bad_spec("", "empty model name");
}

#[test]
fn unknown_preset_lists_the_known_ones() {
    match zoo::build("gpt5") {
        Err(e @ FrontendError::UnknownPreset { .. }) => {
            let msg = e.to_string();
            assert!(
                msg.contains("gpt2-medium") && msg.contains("mlp-mini"),
                "{msg}"
            );
        }
        other => panic!("expected UnknownPreset, got {other:?}"),
    }
}

#[test]
fn mlp_spec_builds_the_requested_shape() {
    let cfg = zoo::parse("mlp:layers=3,in=64,hidden=256,classes=10,batch=32");
    let Ok(ZooConfig::Mlp(cfg)) = cfg else {
        panic!("{cfg:?}")
    };
    assert_eq!(
        (cfg.layers, cfg.input, cfg.hidden, cfg.classes, cfg.batch),
        (3, 64, 256, 10, 32)
    );
    check_params(
        "mlp:layers=3,in=64,hidden=256,classes=10,batch=32",
        (64 * 256 + 256) + 2 * (256 * 256 + 256) + (256 * 10 + 10),
    );
}

/// Modules, parameters and nodes of a graph, one per line.
fn dump(g: &Graph) -> String {
    let mut s = String::from("modules:\n");
    for m in &g.modules {
        let _ = writeln!(
            s,
            "  {:<28} {}",
            if m.path.is_empty() { "<root>" } else { &m.path },
            m.kind
        );
    }
    s.push_str("params:\n");
    for p in &g.params {
        let _ = writeln!(s, "  {:<38} {:<14} {:?}", p.name, p.ty.to_string(), p.init);
    }
    s.push_str("nodes:\n");
    for n in g.node_ids() {
        let node = g.node(n);
        let types: Vec<String> = node.outputs.iter().map(|t| t.to_string()).collect();
        let inputs: Vec<String> = g.inputs(n).iter().map(|v| v.to_string()).collect();
        let module = &g.module_info(node.module).path;
        let _ = writeln!(
            s,
            "  {:<5} {:<46} {:<18} ({}) -> {} in `{module}`",
            n.to_string(),
            node.name,
            node.op.name(),
            inputs.join(", "),
            types.join(", ")
        );
    }
    s
}

#[test]
fn tiny_gpt_module_tree_snapshot() {
    let m = zoo::build("gpt:layers=1,hidden=8,heads=2,seq=4,vocab=16")
        .unwrap_or_else(|e| panic!("{e}"));
    insta::assert_snapshot!(dump(&m.graph));
}

#[test]
fn tiny_mlp_module_tree_snapshot() {
    let m = zoo::build("mlp:layers=2,in=4,hidden=8,classes=3,batch=2")
        .unwrap_or_else(|e| panic!("{e}"));
    insta::assert_snapshot!(dump(&m.graph));
}
