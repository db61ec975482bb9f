//! Initializers merged by the dynamo exporter's optimiser, on real exports of
//! a freshly initialised GPT-2 (tests/fixtures/onnx, made by
//! scripts/export-fixtures.sh): the default export merges every LayerNorm's
//! all-ones weight and all-zeros bias into one tensor each. Detection names
//! them (and not the genuine tie of the embedding and `lm_head`); untying
//! gives each LayerNorm its own weight and bias, which then train apart.

use fsdpc_frontends::onnx::{merged_initializers, MergedInitializer};
use fsdpc_frontends::{load, LoadOptions, LoadedModel};
use fsdpc_plan::ModelInfo;
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::TrainOptions;
use std::path::PathBuf;

fn fixture(name: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/onnx")
        .join(name)
        .display()
        .to_string()
}

fn load_fixture(name: &str, untie: bool) -> LoadedModel {
    let opts = LoadOptions {
        dims: [("batch".to_string(), 2), ("seq".to_string(), 16)].into(),
        untie_merged_initializers: untie,
        ..LoadOptions::default()
    };
    load(&fixture(name), &opts).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// (name, numel) of every parameter, sorted by name.
fn params(m: &LoadedModel) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = m
        .program
        .graph
        .params
        .iter()
        .map(|p| (p.name.clone(), p.ty.numel()))
        .collect();
    v.sort();
    v
}

const LN_MODULES: [&str; 5] = [
    "model.transformer.h.0.ln_1",
    "model.transformer.h.0.ln_2",
    "model.transformer.h.1.ln_1",
    "model.transformer.h.1.ln_2",
    "model.transformer.ln_f",
];

#[test]
fn the_merged_layer_norm_weight_and_bias_are_found() {
    let fresh = load_fixture("gpt2_dynamo_fresh.onnx", false);
    let found = merged_initializers(&fresh.program.graph);
    let modules: Vec<String> = LN_MODULES.iter().map(|m| m.to_string()).collect();
    let want = [("weight", 1.0), ("bias", 0.0)].map(|(what, value)| MergedInitializer {
        name: format!("model.transformer.h.0.ln_1.{what}"),
        value,
        modules: modules.clone(),
    });
    assert_eq!(found, want);
    // The tied embedding (`lm_head` read by the embedding and, as the folded
    // transpose `val_253`, by the output projection) is a tie, not a merge.
    assert!(params(&fresh)
        .iter()
        .any(|(n, _)| n == "model.lm_head.weight"));
    assert!(!params(&fresh).iter().any(|(n, _)| n.starts_with("val_")));
}

#[test]
fn untied_every_layer_norm_has_its_own_weight_and_bias_and_trains() {
    let fresh = load_fixture("gpt2_dynamo_fresh.onnx", false);
    let untied = load_fixture("gpt2_dynamo_fresh.onnx", true);
    assert_eq!(merged_initializers(&untied.program.graph), []);
    let before: Vec<(String, u64)> = params(&fresh);
    let after = params(&untied);
    let mut want = before.clone();
    for m in &LN_MODULES[1..] {
        want.push((format!("{m}.weight"), 32));
        want.push((format!("{m}.bias"), 32));
    }
    want.sort();
    assert_eq!(after, want);
    // Trained, the copies move apart: they are separate parameters.
    let cluster = fsdpc_planner::preset("cpu-local", 1, 1).unwrap_or_else(|e| panic!("{e}"));
    let info = ModelInfo {
        tokens_per_rank_step: untied.tokens_per_rank_step(),
        params: untied.program.graph.param_numel(),
        name: untied.name,
    };
    let plan = fsdpc_planner::compile(untied.program, info, &cluster, &FsdpConfig::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let opts = TrainOptions {
        steps: 2,
        seed: 3,
        ..TrainOptions::default()
    };
    let report = fsdpc_runtime::train(&plan, &opts, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    let value = |name: &str| {
        let p = report.final_params.iter().find(|(n, _)| n == name);
        p.unwrap_or_else(|| panic!("no parameter {name}")).1.clone()
    };
    let weights: Vec<Vec<f32>> = LN_MODULES
        .iter()
        .map(|m| value(&format!("{m}.weight")))
        .collect();
    for (m, w) in LN_MODULES.iter().zip(&weights).skip(1) {
        assert_ne!(
            w, &weights[0],
            "{m}.weight trained as the same tensor as h.0.ln_1's"
        );
        assert!(w.iter().all(|x| x.is_finite()));
    }
}
