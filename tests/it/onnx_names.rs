//! Original PyTorch parameter names of dynamo exports. The dynamo exporter
//! stores a `Linear` weight transposed, as a constant named `val_N`; the
//! import names it after the PyTorch weight in PyTorch's orientation (from the
//! file's metadata). On the committed fixtures (`tests/fixtures/onnx/`):
//!
//! - the imported parameters, and the `--save-safetensors` export of the
//!   trained ones, have exactly the names and shapes PyTorch reports for the
//!   module (`tests/fixtures/torch/param_names.json`, made by
//!   `scripts/torch_param_names.py`): one per distinct parameter, a tied
//!   weight under any of its `state_dict` names;
//! - the trained parameters written back into the ONNX file (`--save-onnx`)
//!   land in the `val_N` initializers in the file's orientation: the written
//!   file re-imports with exactly the trained values, and its loss on the
//!   recorded inputs is the loss the training run reached next.

use fsdpc_frontends::onnx::write_with_params;
use fsdpc_frontends::{LoadOptions, LoadedModel};
use fsdpc_ir::Init;
use fsdpc_plan::{ModelInfo, Plan};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::data::GivenData;
use fsdpc_runtime::{HostTensor, TrainOptions, TrainReport};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Names and shapes by parameter.
type Shapes = BTreeMap<String, Vec<usize>>;

/// A model's parameters as PyTorch reports them.
#[derive(Deserialize)]
struct TorchParams {
    /// `named_parameters()`: every distinct parameter under its first name.
    params: Shapes,
    /// The other names of tied parameters, with their first name.
    tied: BTreeMap<String, String>,
}

impl TorchParams {
    /// `got` with every tied name replaced by the parameter's first name;
    /// panics if two names are one parameter.
    fn canonical(&self, got: Shapes, what: &str) -> Shapes {
        let n = got.len();
        let out: Shapes = got
            .into_iter()
            .map(|(name, shape)| (self.tied.get(&name).cloned().unwrap_or(name), shape))
            .collect();
        assert_eq!(out.len(), n, "{what}: a tied parameter appears twice");
        out
    }
}

/// What `scripts/export_fixtures.py` records beside a fixture (the part read here).
#[derive(Deserialize)]
struct Record {
    file: String,
    model: String,
    dims: HashMap<String, usize>,
    inputs: BTreeMap<String, Vec<Vec<i64>>>,
}

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn record(name: &str) -> Record {
    let path = fixtures().join(format!("onnx/{name}.json"));
    let text = std::fs::read_to_string(&path).expect("fixture record");
    serde_json::from_str(&text).expect("fixture record parses")
}

/// PyTorch's parameter names and shapes of `model`.
fn torch_params(model: &str) -> TorchParams {
    let path = fixtures().join("torch/param_names.json");
    let text = std::fs::read_to_string(&path).expect("param_names.json");
    let mut all: BTreeMap<String, TorchParams> = serde_json::from_str(&text).expect("parses");
    all.remove(model).expect("the model is recorded")
}

fn load(path: &Path, rec: &Record) -> LoadedModel {
    let opts = LoadOptions {
        dims: rec.dims.clone(),
        ..LoadOptions::default()
    };
    fsdpc_frontends::load(&path.display().to_string(), &opts)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn plan(m: LoadedModel) -> Plan {
    let info = ModelInfo {
        tokens_per_rank_step: m.tokens_per_rank_step(),
        params: m.program.graph.param_numel(),
        name: m.name,
    };
    let cluster = fsdpc_planner::preset("cpu-local", 1, 1).expect("preset");
    fsdpc_planner::compile(m.program, info, &cluster, &FsdpConfig::default()).expect("plan")
}

/// Trains `plan` for `steps` on the recorded inputs (the same batch each step).
fn train(plan: &Plan, rec: &Record, steps: u64) -> TrainReport {
    let tensors = rec.inputs.iter().map(|(name, rows)| {
        let seq = rows.first().map_or(0, Vec::len);
        let t = HostTensor::from_i64(&[rows.len(), seq], &rows.concat()).expect("shape");
        (name.clone(), t)
    });
    let data = GivenData::new(tensors).expect("one tensor per input");
    let opts = TrainOptions {
        steps,
        seed: 7,
        ..TrainOptions::default()
    };
    fsdpc_runtime::train_with_data(plan, &opts, Arc::new(data), &mut |_| {}).expect("trains")
}

fn shapes(m: &LoadedModel) -> Shapes {
    let g = &m.program.graph;
    g.params
        .iter()
        .map(|p| (p.name.clone(), p.ty.shape.dims().to_vec()))
        .collect()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The imported parameters and the safetensors export of the trained ones
/// carry PyTorch's names and shapes; no `val_N` is left.
fn check_names(fixture: &str) {
    let rec = record(fixture);
    let path = fixtures().join("onnx").join(&rec.file);
    let m = load(&path, &rec);
    let torch = torch_params(&rec.model);
    let what = format!("{fixture}: imported parameters");
    let imported = shapes(&m);
    assert!(
        imported.keys().all(|k| !k.starts_with("val_")),
        "{what}: {:?}",
        imported.keys()
    );
    assert_eq!(torch.canonical(imported, &what), torch.params, "{what}");
    let p = plan(m);
    let report = train(&p, &rec, 1);
    let dir = tempfile::tempdir().expect("tmp");
    let st = dir.path().join("p.safetensors");
    fsdpc_runtime::export::save_params(&p, &report.final_params, &st).expect("safetensors");
    let bytes = std::fs::read(&st).expect("written");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("parses");
    let saved: Shapes = file
        .tensors()
        .into_iter()
        .map(|(name, t)| (name, t.shape().to_vec()))
        .collect();
    let what = format!("{fixture}: safetensors names and shapes");
    assert_eq!(torch.canonical(saved, &what), torch.params, "{what}");
}

#[test]
fn nanogpt_dynamo_names_are_pytorchs() {
    check_names("nanogpt_dynamo_eval");
}

#[test]
fn llama_dynamo_names_are_pytorchs() {
    check_names("llama_dynamo_train");
    check_names("llama_dynamo_eval_external");
}

#[test]
fn bert_dynamo_names_are_pytorchs() {
    check_names("bert_dynamo_eval");
}

#[test]
fn gpt2_dynamo_names_are_pytorchs() {
    check_names("gpt2_dynamo_eval");
}

/// Relative tolerance between the loss after the write-back and the loss the
/// training run reached: the same f32 forward on the same values, in a plan
/// compiled again.
const LOSS_RTOL: f32 = 1e-6;

/// Trains `steps`, writes the trained parameters into the ONNX file and
/// re-imports it: its parameters are exactly the trained ones (under the
/// same PyTorch names) and its first loss is the loss of step `steps + 1`.
fn check_round_trip(fixture: &str) {
    let steps = 2;
    let rec = record(fixture);
    let src = fixtures().join("onnx").join(&rec.file);
    let p = plan(load(&src, &rec));
    let longer = train(&p, &rec, steps + 1);
    let report = train(&p, &rec, steps);
    let trained: HashMap<String, Vec<f32>> = report.final_params.iter().cloned().collect();
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("trained.onnx");
    let summary = write_with_params(&src, &trained, &out).expect("write-back");
    assert!(summary.renamed > 0, "{fixture}: {summary:?}");
    let back = load(&out, &rec);
    let written: HashMap<String, Vec<f32>> = back
        .program
        .graph
        .params
        .iter()
        .filter_map(|p| match &p.init {
            Init::Data { data } => Some((p.name.clone(), f32s(&data.bytes))),
            _ => None,
        })
        .collect();
    assert_eq!(written, trained, "{fixture}: the written file's parameters");
    let again = train(&plan(back), &rec, 1);
    let (want, got) = (longer.losses[steps as usize], again.losses[0]);
    eprintln!(
        "{fixture}: losses {:?}; after the write-back {got} (step {} reached {want})",
        longer.losses,
        steps + 1
    );
    assert!(
        (got - want).abs() <= LOSS_RTOL * want.abs(),
        "{fixture}: {got} after the write-back, {want} in training"
    );
}

#[test]
fn nanogpt_dynamo_write_back_keeps_the_loss() {
    check_round_trip("nanogpt_dynamo_eval");
}

#[test]
fn llama_dynamo_write_back_keeps_the_loss() {
    check_round_trip("llama_dynamo_eval_external");
}

#[test]
fn bert_dynamo_write_back_keeps_the_loss() {
    check_round_trip("bert_dynamo_eval");
}
