//! A real PyTorch export: the MiniLM-L3 sentence encoder
//! (paraphrase-MiniLM-L3-v2, 17.2 M parameters, TorchScript exporter, opset
//! 17) imports with bound `batch_size`/`sequence_length`, trains against an
//! MSE loss on its sentence embedding (output `461`), plans for 4 ranks, and
//! the `blocks` wrap policy finds its three BERT layers as units.
//!
//! The model comes from `scripts/fetch-minilm.sh` (into `target/minilm/`) or
//! the path in `FSDPC_MINILM`; without it the test prints why it skips.

use fsdpc_frontends::{LoadOptions, LoadedModel, LossKind, LossSpec};
use fsdpc_plan::ModelInfo;
use fsdpc_planner::FsdpConfig;
use std::path::PathBuf;

fn model_path() -> Option<PathBuf> {
    let p = match std::env::var_os("FSDPC_MINILM") {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("target/minilm/paraphrase-MiniLM-L3-v2.onnx"),
    };
    p.is_file().then_some(p)
}

#[test]
fn minilm_imports_and_plans_with_its_layers_as_units() {
    let Some(path) = model_path() else {
        eprintln!(
            "SKIP minilm: no model at $FSDPC_MINILM or target/minilm/paraphrase-MiniLM-L3-v2.onnx \
             (run scripts/fetch-minilm.sh)"
        );
        return;
    };
    let opts = LoadOptions {
        dims: [
            ("batch_size".to_string(), 8),
            ("sequence_length".to_string(), 128),
        ]
        .into(),
        loss: Some(LossSpec {
            kind: LossKind::Mse,
            output: Some("461".into()),
            target: None,
        }),
        ..LoadOptions::default()
    };
    let LoadedModel {
        name,
        program,
        tokens_per_sample,
    } = fsdpc_frontends::load(&path.display().to_string(), &opts).expect("MiniLM imports");
    assert_eq!(program.graph.param_numel(), 17_241_984);
    assert_eq!(tokens_per_sample, 128);
    let cluster = fsdpc_planner::preset("a100-80g-roce", 4, 4).expect("preset");
    let info = ModelInfo {
        name,
        params: program.graph.param_numel(),
        tokens_per_rank_step: tokens_per_sample * 8,
    };
    let plan = fsdpc_planner::compile(program, info, &cluster, &FsdpConfig::default())
        .expect("MiniLM plans");
    plan.validate().expect("the plan validates");
    let units: Vec<&str> = plan.units.iter().map(|u| u.module.as_str()).collect();
    for i in 0..3 {
        let layer = format!("model.0.auto_model.encoder.layer.{i}");
        assert!(units.contains(&layer.as_str()), "{layer} in {units:?}");
    }
}

/// `fsdpc train` on the encoder: synthetic `input_ids` inside the vocabulary,
/// an all-ones `attention_mask`, standard-normal MSE targets; sharded over 2
/// ranks it trains like 1 rank.
#[test]
fn minilm_trains_sharded_like_unsharded() {
    let Some(path) = model_path() else {
        eprintln!("SKIP minilm training: no model (run scripts/fetch-minilm.sh)");
        return;
    };
    let run = |world: u32, batch: usize| {
        let opts = LoadOptions {
            dims: [
                ("batch_size".to_string(), batch),
                ("sequence_length".to_string(), 16),
            ]
            .into(),
            loss: Some(LossSpec {
                kind: LossKind::Mse,
                output: Some("461".into()),
                target: None,
            }),
            ..LoadOptions::default()
        };
        let m = fsdpc_frontends::load(&path.display().to_string(), &opts).expect("MiniLM imports");
        let cluster = fsdpc_planner::preset("cpu-local", world, world).expect("preset");
        let info = ModelInfo {
            name: m.name,
            params: m.program.graph.param_numel(),
            tokens_per_rank_step: 16,
        };
        let plan = fsdpc_planner::compile(m.program, info, &cluster, &FsdpConfig::default())
            .expect("plans");
        let opts = fsdpc_runtime::TrainOptions {
            steps: 3,
            ..fsdpc_runtime::TrainOptions::default()
        };
        fsdpc_runtime::train(&plan, &opts, &mut |_| {}).expect("MiniLM trains")
    };
    let one = run(1, 4);
    let two = run(2, 2);
    for (a, b) in one.losses.iter().zip(&two.losses) {
        assert!(
            a.is_finite() && (a - b).abs() <= 1e-4 * a.abs().max(1.0),
            "losses {a} vs {b}"
        );
    }
}
