//! Hugging Face model directories (`hf:PATH`) against `transformers`: the
//! fixtures in `tests/fixtures/hf/` (made by `scripts/hf-fixtures.sh`, tiny
//! random Llama, Llama 3.1, Qwen2, Qwen2 with YaRN, Qwen3, Mistral with a
//! sliding window shorter than the sequence and bf16 weights, Phi-3 with a
//! window, GPT-2; one sharded with an index) load with their weights, and
//! on the recorded inputs the first loss and the gradients of a few
//! parameters equal what transformers computed, on 1 rank and full_shard
//! over 2 ranks.
//!
//! The gradient is read off one SGD step with learning rate 1 (no momentum,
//! no decay): the parameters before it (a run with learning rate 0) less
//! the parameters after it.

use crate::common::host_plan;
use fsdpc_ir::Optimizer;
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::data::GivenData;
use fsdpc_runtime::{HostTensor, TrainOptions, TrainReport};
use serde::Deserialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

/// Relative agreement of the first loss with transformers': both are f32
/// forward passes that sum in different orders and take `exp`, `cos` and
/// `sin` from different libraries.
const LOSS_RTOL: f64 = 1e-6;
/// Agreement of a gradient with transformers', relative to the largest
/// element of transformers' gradient.
const GRAD_RTOL: f32 = 1e-4;

#[derive(Deserialize)]
struct Reference {
    batch: usize,
    seq: usize,
    ids: Vec<Vec<i64>>,
    labels: Vec<Vec<i64>>,
    loss: f64,
    grads: Vec<String>,
}

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/hf")
        .join(name)
}

fn reference(name: &str) -> Reference {
    let text = std::fs::read_to_string(dir(name).join("reference.json")).expect("reference.json");
    serde_json::from_str(&text).expect("reference.json parses")
}

fn data(r: &Reference) -> GivenData {
    let t = |rows: &Vec<Vec<i64>>| HostTensor::from_i64(&[r.batch, r.seq], &rows.concat()).unwrap();
    GivenData::new([
        ("ids".to_string(), t(&r.ids)),
        ("labels".to_string(), t(&r.labels)),
    ])
    .unwrap()
}

/// One SGD step of `lr` on `world` ranks.
fn step(name: &str, r: &Reference, world: u32, lr: f64) -> TrainReport {
    let spec = format!(
        "hf:{}:seq={},batch={}",
        dir(name).display(),
        r.seq,
        r.batch / world as usize
    );
    let sgd = Optimizer::Sgd {
        lr,
        momentum: 0.0,
        weight_decay: 0.0,
    };
    let plan = host_plan(&spec, world, &FsdpConfig::default(), &sgd);
    let opts = TrainOptions {
        steps: 1,
        seed: 7,
        ..TrainOptions::default()
    };
    fsdpc_runtime::train_with_data(&plan, &opts, Arc::new(data(r)), &mut |_| {})
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Transformers' gradients of the fixture.
fn grads(name: &str) -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(dir(name).join("grads.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, v)| {
            let vals = v
                .data()
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            (n, vals)
        })
        .collect()
}

fn check(name: &str) {
    let r = reference(name);
    let want = grads(name);
    assert_eq!(want.len(), r.grads.len(), "{name}: grads.safetensors");
    for world in [1u32, 2] {
        let before = step(name, &r, world, 0.0);
        let after = step(name, &r, world, 1.0);
        let loss = before.losses[0] as f64;
        let rel = (loss - r.loss).abs() / r.loss.abs();
        eprintln!(
            "{name} F={world}: loss {loss} vs transformers {} (rel {rel:e})",
            r.loss
        );
        assert!(
            rel <= LOSS_RTOL,
            "{name} F={world}: loss {loss} vs transformers {}",
            r.loss
        );
        let values = |rep: &TrainReport| -> HashMap<String, Vec<f32>> {
            rep.final_params.iter().cloned().collect()
        };
        let (p0, p1) = (values(&before), values(&after));
        for (pname, g_ref) in &want {
            let (w0, w1) = (&p0[pname], &p1[pname]);
            assert_eq!(w0.len(), g_ref.len(), "{name}: {pname}");
            let scale = g_ref.iter().fold(0f32, |m, g| m.max(g.abs()));
            let err = w0
                .iter()
                .zip(w1)
                .zip(g_ref)
                .fold(0f32, |m, ((a, b), g)| m.max((a - b - g).abs()));
            eprintln!("  {pname}: max |grad - transformers'| {err:e} of max {scale:e}");
            assert!(
                err <= GRAD_RTOL * scale,
                "{name} F={world}: gradient of {pname} differs by {err:e} (max {scale:e})"
            );
        }
    }
}

macro_rules! fixtures {
    ($($name:ident),*) => {$(
        #[test]
        fn $name() {
            check(stringify!($name));
        }
    )*};
}

fixtures!(llama, llama31, qwen2, qwen2_yarn, qwen3, mistral, phi3, gpt2);

/// A copy of fixture `name` in a temporary directory with `edit` applied to
/// its config.json.
fn edited(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(dir(name)).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, tmp.path().join(p.file_name().unwrap())).unwrap();
    }
    let cfg = tmp.path().join("config.json");
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&cfg, v.to_string()).unwrap();
    tmp
}

fn load_error(path: &std::path::Path) -> String {
    let spec = format!("hf:{}", path.display());
    match fsdpc_frontends::load(&spec, &fsdpc_frontends::LoadOptions::default()) {
        Ok(_) => panic!("{spec} loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn weights_that_do_not_fit_the_config_are_named() {
    let t = edited("llama31", |v| v["intermediate_size"] = 40.into());
    let e = load_error(t.path());
    assert!(
        e.contains("mlp.") && e.contains("has shape [48, 32]") && e.contains("[40, 32]"),
        "{e}"
    );
    let t = edited("llama", |v| v["num_hidden_layers"] = 3.into());
    let e = load_error(t.path());
    assert!(
        e.contains("no tensor") && e.contains("model.layers.2.input_layernorm.weight"),
        "{e}"
    );
    let t = edited("qwen3", |v| v["num_hidden_layers"] = 1.into());
    let e = load_error(t.path());
    assert!(
        e.contains("not parameters") && e.contains("model.layers.1."),
        "{e}"
    );
}

#[test]
fn configs_fsdpc_cannot_build_are_refused_by_name() {
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit, &str); 6] = [
        (
            "llama",
            |v| v["model_type"] = "mamba".into(),
            "model type `mamba`",
        ),
        (
            "llama",
            |v| v["model_type"] = "mixtral".into(),
            "mixture-of-experts",
        ),
        (
            "qwen2",
            |v| v["num_experts"] = 8.into(),
            "mixture-of-experts",
        ),
        ("llama", |v| v["hidden_act"] = "gelu".into(), "`hidden_act`"),
        (
            "llama",
            |v| v["rope_parameters"]["rope_type"] = "dynamic".into(),
            "rope type `dynamic`",
        ),
        (
            "qwen2",
            |v| v["use_sliding_window"] = true.into(),
            "`use_sliding_window`",
        ),
    ];
    for (name, edit, want) in cases {
        let t = edited(name, edit);
        let e = load_error(t.path());
        assert!(e.contains(want), "{name}: {e}");
    }
    let e = load_error(std::path::Path::new("/nonexistent/model"));
    assert!(e.contains("not a model directory"), "{e}");
}

#[test]
fn a_config_alone_plans_without_weights() {
    // No safetensors beside it: the model is built and planned, parameters
    // initialised as the zoo does.
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(
        dir("qwen3").join("config.json"),
        tmp.path().join("config.json"),
    )
    .unwrap();
    let spec = format!(
        "hf:{}/config.json:seq=8,batch=2,lora=4",
        tmp.path().display()
    );
    let m = fsdpc_frontends::load(&spec, &fsdpc_frontends::LoadOptions::default()).unwrap();
    assert!(m
        .program
        .graph
        .params
        .iter()
        .all(|p| !matches!(p.init, fsdpc_ir::Init::File { .. })));
    assert_eq!(m.tokens_per_rank_step(), 16);
    let trainable = m
        .program
        .graph
        .params
        .iter()
        .filter(|p| p.requires_grad)
        .count();
    assert_eq!(
        trainable,
        2 * 4 * 2,
        "LoRA adapters of q, k, v, o in 2 layers"
    );
}

#[derive(Deserialize)]
struct Saved {
    /// A zoo spec to train instead of the fixture directory.
    spec: Option<String>,
    /// The fixture whose recorded inputs give the loss.
    inputs: String,
    args: String,
    lora: usize,
    loss: f64,
}

/// `fsdpc train hf:FIXTURE --save-hf OUT` writes a directory that
/// `transformers` loads: `saved.json` holds the loss transformers computed
/// on it (for the same command), which the model read back from OUT gives
/// too. The Qwen2 and Phi-3 cases train LoRA adapters and merge them; the
/// Qwen3 (YaRN) and Phi-3 (window) cases are zoo specs, whose config.json
/// fsdpc writes.
#[test]
fn save_hf_writes_what_transformers_loads() {
    let text = std::fs::read_to_string(dir("saved.json")).unwrap();
    let saved: HashMap<String, serde_json::Value> = serde_json::from_str(&text).unwrap();
    for name in ["llama", "qwen2", "qwen3_spec", "phi3_spec"] {
        let s: Saved = serde_json::from_value(saved[name].clone()).unwrap();
        let r = reference(&s.inputs);
        let out = tempfile::tempdir().unwrap();
        let lora = if s.lora > 0 {
            format!(",lora={}", s.lora)
        } else {
            String::new()
        };
        let model = s.spec.clone().unwrap_or_else(|| {
            format!(
                "hf:{}:seq={},batch={}{lora}",
                dir(name).display(),
                r.seq,
                r.batch
            )
        });
        let out_dir = out.path().join("saved");
        let mut args = vec!["train", model.as_str()];
        args.extend(s.args.split(' '));
        args.extend(["--save-hf", crate::common::cli::s(&out_dir)]);
        let printed = crate::common::cli::ok(&args);
        assert!(printed.contains("Hugging Face directory"), "{printed}");
        for f in ["config.json", "model.safetensors"] {
            assert!(out_dir.join(f).is_file(), "{name}: no {f}");
        }
        // A directory's companion files travel with it.
        let companion = out_dir.join("generation_config.json").is_file();
        assert_eq!(
            companion,
            s.spec.is_none(),
            "{name}: generation_config.json"
        );
        let spec = format!("hf:{}", out_dir.display());
        let back = fsdpc_frontends::load(&spec, &fsdpc_frontends::LoadOptions::default()).unwrap();
        assert!(
            back.program
                .graph
                .params
                .iter()
                .all(|p| !p.name.contains("lora_")),
            "{name}: adapters merged"
        );
        let before = {
            let saved_dir = out_dir.display().to_string();
            let spec = format!("hf:{saved_dir}:seq={},batch={}", r.seq, r.batch);
            let sgd = Optimizer::Sgd {
                lr: 0.0,
                momentum: 0.0,
                weight_decay: 0.0,
            };
            let plan = host_plan(&spec, 1, &FsdpConfig::default(), &sgd);
            let opts = TrainOptions {
                steps: 1,
                seed: 7,
                ..TrainOptions::default()
            };
            fsdpc_runtime::train_with_data(&plan, &opts, Arc::new(data(&r)), &mut |_| {}).unwrap()
        };
        let loss = before.losses[0] as f64;
        let rel = (loss - s.loss).abs() / s.loss;
        eprintln!(
            "{name}: saved model's loss {loss} vs transformers {} (rel {rel:e})",
            s.loss
        );
        assert!(rel <= 1e-5, "{name}: {loss} vs transformers {}", s.loss);
    }
}

/// The published configs in `examples/hf/` (config.json alone, as
/// `transformers` 4 wrote them) build the models their checkpoints hold:
/// the parameter counts are the checkpoints' (`total_size` of their
/// safetensors index over 2 bytes per bf16 element); a mixture of experts
/// is refused by name.
#[test]
fn published_configs_have_their_checkpoints_parameter_counts() {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/hf");
    for (name, params) in [
        ("llama3.1-405b", 405_853_388_800u64),
        ("llama3-70b", 70_553_706_496),
        ("qwen2.5-7b", 7_615_616_512),
    ] {
        let spec = format!("hf:{}", examples.join(name).display());
        let m = fsdpc_frontends::load(&spec, &fsdpc_frontends::LoadOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(m.program.graph.param_numel(), params, "{name}");
        // Sequence: the configured context capped at 8192.
        assert_eq!(m.tokens_per_rank_step(), 8192, "{name}");
    }
    let e = load_error(&examples.join("mixtral-8x7b"));
    assert!(e.contains("`mixtral` is a mixture-of-experts model"), "{e}");
}

/// `fsdpc inspect` says where the weights come from.
#[test]
fn inspect_names_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let plan = tmp.path().join("plan.json");
    let model = format!("hf:{}:seq=12,batch=1", dir("llama").display());
    crate::common::cli::ok(&[
        "compile",
        &model,
        "--world",
        "2",
        "-o",
        crate::common::cli::s(&plan),
    ]);
    let text = crate::common::cli::ok(&["inspect", crate::common::cli::s(&plan)]);
    assert!(
        text.contains("weights   21 of 21 parameters from 2 safetensors file(s)"),
        "{text}"
    );
}

/// `--save-hf` of a model it cannot write is refused before any step.
#[test]
fn save_hf_of_a_family_without_a_config_is_refused_before_training() {
    let out = tempfile::tempdir().unwrap();
    let dir = out.path().join("t5");
    let o = crate::common::cli::fsdpc(&[
        "train",
        "t5-mini",
        "--steps",
        "1",
        "--save-hf",
        crate::common::cli::s(&dir),
    ]);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(stderr.contains("--save-hf writes Llama-family"), "{stderr}");
    assert!(!stdout.contains("trained"), "{stdout}");
    assert!(!dir.exists());
}
