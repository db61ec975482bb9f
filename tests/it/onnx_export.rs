//! Training an imported ONNX model and writing the result back: the written
//! ONNX file re-imports with exactly the trained parameters, the safetensors
//! file holds every parameter under its original name, and the CLI's
//! `--dim`, `--loss`, `--save-onnx` and `--save-safetensors` do the same.

use fsdpc_frontends::onnx::{import, write_with_params};
use fsdpc_frontends::{LoadOptions, LoadedModel};
use fsdpc_ir::{Graph, Init};
use fsdpc_plan::{ModelInfo, Plan};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::{TrainOptions, TrainReport};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("frontends/tests/fixtures")
        .join(name)
}

fn batch4() -> HashMap<String, usize> {
    [("batch".to_string(), 4)].into()
}

fn plan(model: &Path, world: u32) -> Plan {
    let opts = LoadOptions {
        dims: batch4(),
        ..LoadOptions::default()
    };
    let LoadedModel {
        name,
        program,
        tokens_per_sample,
    } = fsdpc_frontends::load(&model.display().to_string(), &opts).expect("model loads");
    let cluster = fsdpc_planner::preset("cpu-local", world, world).expect("preset");
    let info = ModelInfo {
        name,
        params: program.graph.param_numel(),
        tokens_per_rank_step: tokens_per_sample,
    };
    fsdpc_planner::compile(program, info, &cluster, &FsdpConfig::default()).expect("plan")
}

fn train(plan: &Plan, steps: u64) -> TrainReport {
    let opts = TrainOptions {
        steps,
        seed: 3,
        ..TrainOptions::default()
    };
    fsdpc_runtime::train(plan, &opts, &mut |_| {}).expect("training runs")
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Every parameter's values as the file holds them.
fn file_params(g: &Graph) -> HashMap<String, Vec<f32>> {
    g.params
        .iter()
        .filter_map(|p| match &p.init {
            Init::Data { data } => Some((p.name.clone(), f32s(&data.bytes))),
            _ => None,
        })
        .collect()
}

/// The written ONNX file and the safetensors file both hold the trained values.
fn check_written(report: &TrainReport, onnx: &Path, st: &Path) {
    let trained: HashMap<String, Vec<f32>> = report.final_params.iter().cloned().collect();
    let back = import(onnx, &batch4()).expect("written model imports");
    assert_eq!(file_params(&back.graph), trained);
    let bytes = std::fs::read(st).expect("safetensors written");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors parses");
    assert_eq!(file.names().len(), trained.len());
    for p in &back.graph.params {
        let t = file.tensor(&p.name).expect("every parameter by name");
        assert_eq!(t.shape(), p.ty.shape.dims(), "{}", p.name);
        assert_eq!(f32s(t.data()), trained[&p.name], "{}", p.name);
    }
}

#[test]
fn trained_onnx_parameters_are_written_back() {
    let dir = tempfile::tempdir().expect("tmp");
    let model = fixture("mlp.onnx");
    let p = plan(&model, 2);
    let report = train(&p, 3);
    let before = file_params(&import(&model, &batch4()).expect("imports").graph);
    let trained: HashMap<String, Vec<f32>> = report.final_params.iter().cloned().collect();
    assert_ne!(before, trained, "training changed the parameters");
    let (onnx, st) = (dir.path().join("out.onnx"), dir.path().join("out.st"));
    write_with_params(&model, &trained, &onnx).expect("write-back");
    fsdpc_runtime::export::save_params(&p, &report.final_params, &st).expect("safetensors");
    check_written(&report, &onnx, &st);
}

fn fsdpc(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(args)
        .output()
        .expect("fsdpc runs")
}

#[test]
fn cli_trains_an_onnx_model_and_saves_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let model = fixture("mlp.onnx").display().to_string();
    let onnx = dir.path().join("t.onnx").display().to_string();
    let st = dir.path().join("t.safetensors").display().to_string();
    let o = fsdpc(&[
        "train",
        &model,
        "--dim",
        "batch=4",
        "--ranks",
        "2",
        "--steps",
        "2",
        "--save-onnx",
        &onnx,
        "--save-safetensors",
        &st,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let back = import(Path::new(&onnx), &batch4()).expect("imports");
    let bytes = std::fs::read(&st).expect("safetensors written");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("parses");
    for (name, v) in file_params(&back.graph) {
        let t = file.tensor(&name).expect("same names");
        assert_eq!(
            f32s(t.data()),
            v,
            "{name}: both files hold the trained values"
        );
    }
}

#[test]
fn cli_saves_zoo_models_as_safetensors() {
    let dir = tempfile::tempdir().expect("tmp");
    let st = dir.path().join("z.safetensors").display().to_string();
    let spec = "mlp:layers=2,in=8,hidden=16,classes=4,batch=2";
    let o = fsdpc(&["train", spec, "--steps", "1", "--save-safetensors", &st]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let bytes = std::fs::read(&st).expect("written");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("parses");
    assert!(!file.names().is_empty());
}

/// Runs `args`, expects a failure whose one-line message contains `needle`.
fn check_error(args: &[&str], needle: &str) {
    let o = fsdpc(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "{args:?} should fail");
    assert!(
        err.contains(needle),
        "{args:?}: expected `{needle}` in {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn cli_model_flags_give_clear_errors() {
    let model = fixture("mlp.onnx").display().to_string();
    let m = model.as_str();
    let base = ["compile", m, "--world", "2", "-o", "-"];
    let with = |extra: &[&'static str]| [&base[..], extra].concat();
    check_error(&with(&["--dim", "batch"]), "expected NAME=SIZE");
    check_error(
        &with(&["--dim", "batch=4", "--loss", "hinge"]),
        "unknown loss `hinge`",
    );
    check_error(
        &with(&["--dim", "batch=4", "--loss", "mse", "--logits", "nope"]),
        "its outputs are",
    );
    check_error(&with(&["--dim", "batch=4", "--labels", "y"]), "need --loss");
    check_error(&with(&[]), "--dim");
    check_error(
        &["train", "mlp-mini", "--steps", "1", "--save-onnx", "x.onnx"],
        "not an `.onnx` file",
    );
    let o = fsdpc(&with(&["--dim", "batch=4", "--loss", "mse"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
