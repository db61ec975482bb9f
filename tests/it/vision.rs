//! Real vision exports: the fixtures in `tests/fixtures/vision/` (a tiny
//! ResNet of torchvision `BasicBlock`s and a tiny Hugging Face
//! `ViTForImageClassification`, from torch's dynamo and TorchScript
//! exporters, made by `scripts/export_vision_fixtures.py`; see the README
//! there). Every fixture that fsdpc can train
//!
//! - imports with its batch axis bound to the recorded images and has as
//!   many parameter elements as the PyTorch module, less what the exporter
//!   folded (`FOLDED_BY_EXPORTER`);
//! - has a first training loss equal to ONNX Runtime's (and PyTorch's) on
//!   the recorded inputs within `ORT_RTOL`;
//! - trains for a few steps on 1 and on 2 ranks with losses that agree
//!   within `LOSS_RTOL`, wrapped by module kind (`BasicBlock`, `ViTLayer`),
//!   in arena mode, holding no more memory than planned and within 2% of it.
//!
//! Training-mode batch normalisation (the TorchScript exporter's
//! `TrainingMode.TRAINING`) is checked in `batch_norm.rs`; the dynamo
//! exporter's, which it writes in inference mode although the module ran
//! in training mode, is refused with an error naming the node.

use fsdpc_frontends::LoadOptions;
use fsdpc_plan::{ModelInfo, Plan, WrapPolicy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::data::GivenData;
use fsdpc_runtime::{ExecMode, HostTensor, TrainOptions, TrainReport};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;

/// Training steps of the 1-rank / 2-rank comparison.
const STEPS: u64 = 3;
/// Relative loss tolerance between 1 and 2 ranks: the weight gradients of
/// the two sum the batch's images in different orders (each rank its own,
/// then the reduce-scatter), as for `tests/it/onnx_fixtures.rs`.
const LOSS_RTOL: f32 = 1e-6;
/// AdamW's learning rate: fine-tuning's (the default 1e-3 moves every
/// weight of the full-size ResNet-18 so far in its first steps that the
/// loss explodes, which leaves nothing to compare).
const LR: f64 = 1e-4;
/// Relative tolerance between the first training loss and ONNX Runtime's.
const ORT_RTOL: f64 = 1e-4;

/// Parameter elements an export folded away, by fixture: the dynamo
/// exporter's default optimisation folds every inference-mode
/// `BatchNormalization` into the convolution before it, whose new bias
/// (one element per channel) replaces the normalisation's scale and shift
/// (two per channel): the tiny ResNet's six normalisations have 72
/// channels (8, 8, 8, 16, 16, 16), the full ResNet-18's twenty 4800 (64,
/// four of 64, five each of 128, 256 and 512).
const FOLDED_BY_EXPORTER: &[(&str, u64)] =
    &[("resnet_dynamo_eval", 72), ("resnet18_dynamo_eval", 4800)];

/// What `scripts/export_vision_fixtures.py` records beside each fixture.
#[derive(Debug, Deserialize)]
pub(crate) struct Record {
    pub(crate) name: String,
    pub(crate) file: String,
    pub(crate) model: String,
    exporter: String,
    pub(crate) mode: String,
    pub(crate) batch: usize,
    nodes: usize,
    torch_params: u64,
    inputs: BTreeMap<String, Input>,
    pub(crate) torch_loss: f64,
    pub(crate) ort_loss: f64,
    /// ONNX Runtime's loss equals PyTorch's (false where the exporter
    /// changed what the model computes).
    ort_agrees: bool,
    /// Training-mode ResNets: PyTorch's own training on the recorded batch
    /// (see `batch_norm.rs`).
    #[serde(default)]
    pub(crate) torch_training: Vec<crate::batch_norm::Reference>,
    /// The directory the record was read from.
    #[serde(skip)]
    dir: PathBuf,
}

#[derive(Debug, Deserialize)]
struct Input {
    shape: Vec<usize>,
    data: Vec<f64>,
}

pub(crate) fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/vision")
}

pub(crate) fn record(name: &str) -> Record {
    record_in(&dir(), name)
}

pub(crate) fn record_in(dir: &std::path::Path, name: &str) -> Record {
    let path = dir.join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut rec: Record = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not a fixture record: {e}", path.display()));
    rec.dir = dir.to_path_buf();
    rec
}

/// One unit per block: by module kind (`BasicBlock`, `ViTLayer`) where the
/// exporter records the classes (dynamo), else by module path.
fn wrap(rec: &Record) -> WrapPolicy {
    if rec.model == "resnet18" && rec.exporter != "dynamo" {
        let paths = (1..=4)
            .flat_map(|l| (0..2).map(move |b| format!("model.layer{l}.{b}")))
            .collect();
        return WrapPolicy::Paths { paths };
    }
    let (kind, paths) = if rec.model == "vit" {
        ("ViTLayer", ["model.vit.layers.0", "model.vit.layers.1"])
    } else {
        ("BasicBlock", ["model.layer1.0", "model.layer2.0"])
    };
    if rec.exporter == "dynamo" {
        WrapPolicy::Kind {
            kind: kind.to_string(),
        }
    } else {
        WrapPolicy::Paths {
            paths: paths.map(str::to_string).to_vec(),
        }
    }
}

/// Imports `rec` with its batch split over `world` ranks and plans it,
/// one unit per block.
fn compile(rec: &Record, world: u32) -> Result<(Plan, u64), String> {
    compile_with(rec, world, 1, fsdpc_ir::Optimizer::adamw(LR))
}

/// `compile` with `optimizer`, the batch split over `world` ranks and
/// `accum` micro-batches of each.
pub(crate) fn compile_with(
    rec: &Record,
    world: u32,
    accum: u32,
    optimizer: fsdpc_ir::Optimizer,
) -> Result<(Plan, u64), String> {
    let per_rank = rec.batch / (world * accum) as usize;
    let dims: HashMap<String, usize> = [("batch".to_string(), per_rank)].into();
    let opts = LoadOptions {
        dims,
        optimizer,
        ..LoadOptions::default()
    };
    let path = rec.dir.join(&rec.file);
    let m = fsdpc_frontends::load(&path.display().to_string(), &opts)
        .map_err(|e| format!("import: {e}"))?;
    let params = m.program.graph.param_numel();
    // This CPU's matrix-library blocking, so the plan's heap bound is what
    // the library allocates here (as `fsdpc train` plans).
    let mut cluster =
        fsdpc_planner::preset("cpu-local", world, world).map_err(|e| e.to_string())?;
    cluster.hardware.cpu_gemm = fsdpc_runtime::cpu::gemm_blocking();
    let info = ModelInfo {
        tokens_per_rank_step: m.tokens_per_rank_step(),
        params,
        name: m.name,
    };
    let mut cfg = FsdpConfig::default();
    cfg.settings.wrap = wrap(rec);
    cfg.settings.grad_accum = accum;
    let plan = fsdpc_planner::compile(m.program, info, &cluster, &cfg)
        .map_err(|e| format!("plan: {e}"))?;
    if let Err(v) = plan.validate() {
        panic!("{}: the plan does not validate: {v:?}", rec.name);
    }
    Ok((plan, params))
}

/// The recorded images and labels as a data source.
pub(crate) fn data(rec: &Record) -> GivenData {
    let tensors = rec.inputs.iter().map(|(name, t)| {
        let host = if name == "labels" {
            let v: Vec<i64> = t.data.iter().map(|&x| x as i64).collect();
            HostTensor::from_i64(&t.shape, &v)
        } else {
            let v: Vec<f32> = t.data.iter().map(|&x| x as f32).collect();
            HostTensor::from_f32(&t.shape, &v)
        };
        (name.clone(), host.expect("shape matches"))
    });
    GivenData::new(tensors).expect("one tensor per input name")
}

fn train(rec: &Record, plan: &Plan) -> Result<TrainReport, String> {
    let opts = TrainOptions {
        steps: STEPS,
        seed: 7,
        mode: ExecMode::Arena,
        ..TrainOptions::default()
    };
    fsdpc_runtime::train_with_data(plan, &opts, Arc::new(data(rec)), &mut |_| {})
        .map_err(|e| format!("train: {e}"))
}

/// Measured against planned bytes of the busiest rank.
pub(crate) fn memory(rec: &Record, plan: &Plan, r: &TrainReport) -> (u64, u64) {
    let planned = plan.memory.rank_bytes;
    let measured = r
        .measured_peak_bytes
        .expect("the counting allocator is installed in this test binary");
    let what = format!("{}: measured {measured}, planned {planned}", rec.name);
    assert!(
        measured <= planned,
        "a rank allocated more than planned: {what}"
    );
    assert!(
        (planned - measured) as f64 <= 0.02 * planned as f64,
        "the plan overstates the rank's memory by more than 2%: {what}"
    );
    (measured, planned)
}

/// One fixture's figures: `(first loss, 1 vs 2 ranks relative difference,
/// units, measured and planned bytes on 2 ranks)`.
struct Figures {
    first: f32,
    ranks_diff: f32,
    units: usize,
    measured: u64,
    planned: u64,
    params: u64,
}

fn run(rec: &Record) -> Result<Figures, String> {
    let name = &rec.name;
    let (one_plan, params) = compile(rec, 1)?;
    let one = train(rec, &one_plan)?;
    let (two_plan, _) = compile(rec, 2)?;
    let two = train(rec, &two_plan)?;
    memory(rec, &one_plan, &one);
    let (measured, planned) = memory(rec, &two_plan, &two);
    assert!(
        one.losses.len() == STEPS as usize && one.losses.iter().all(|l| l.is_finite()),
        "{name}: losses {:?}",
        one.losses
    );
    let ranks_diff = one
        .losses
        .iter()
        .zip(&two.losses)
        .map(|(a, b)| (a - b).abs() / a.abs().max(1e-6))
        .fold(0f32, f32::max);
    eprintln!(
        "{name}: losses 1 rank {:?}, 2 ranks {:?}, max rel diff {ranks_diff:e}",
        one.losses, two.losses
    );
    assert!(
        ranks_diff <= LOSS_RTOL,
        "{name}: 1 and 2 ranks differ by {ranks_diff:e}"
    );
    let first = one.losses[0];
    let d = (f64::from(first) - rec.ort_loss).abs() / rec.ort_loss.abs();
    eprintln!(
        "{name}: first loss {first} vs ONNX Runtime {} (PyTorch {}), rel diff {d:e}",
        rec.ort_loss, rec.torch_loss,
    );
    assert!(
        rec.ort_agrees,
        "{name}: ONNX Runtime does not compute PyTorch's loss"
    );
    assert!(
        d <= ORT_RTOL,
        "{name}: first loss {first} vs ONNX Runtime {}",
        rec.ort_loss
    );
    let folded = FOLDED_BY_EXPORTER
        .iter()
        .find(|f| f.0 == name)
        .map_or(0, |f| f.1);
    assert_eq!(
        params,
        rec.torch_params - folded,
        "{name}: parameter elements"
    );
    // Every block is a unit of its own, beside the root.
    let blocks = if rec.model == "resnet18" { 8 } else { 2 };
    let units = two_plan.units.len();
    assert_eq!(
        units,
        blocks + 1,
        "{name}: units {:?}",
        two_plan.units.iter().map(|u| &u.module).collect::<Vec<_>>()
    );
    Ok(Figures {
        first,
        ranks_diff,
        units,
        measured,
        planned,
        params,
    })
}

macro_rules! fixtures {
    ($($name:ident),* $(,)?) => {
        /// Every trainable fixture with a test of its own.
        const FIXTURES: &[&str] = &[$(stringify!($name)),*];
        $(
            #[test]
            fn $name() {
                let rec = record(stringify!($name));
                if let Err(e) = run(&rec) {
                    panic!("{}: {e}", rec.name);
                }
            }
        )*
    };
}

fixtures!(
    resnet_dynamo_eval,
    resnet_torchscript_eval,
    vit_dynamo_eval,
    vit_torchscript_eval,
    vit_dynamo_train,
);

/// The fixtures the dynamo exporter wrote with inference-mode
/// normalisation for a module that ran in training mode (folded into the
/// convolution, or not with `optimize=False`), and the op the error names.
const REFUSED: &[(&str, &str)] = &[
    ("resnet_dynamo_train", "(Conv)"),
    ("resnet_dynamo_train_noopt", "(BatchNormalization)"),
];

#[test]
fn inference_mode_export_of_a_training_module_is_refused_naming_the_node() {
    for (name, op) in REFUSED {
        let rec = record(name);
        assert_eq!(rec.mode, "train", "{name}");
        let e = compile(&rec, 1)
            .err()
            .unwrap_or_else(|| panic!("{name} imported"));
        assert!(
            e.contains(op) && e.contains("training mode") && e.contains("model.eval()"),
            "{name}: {e}"
        );
    }
}

#[test]
fn every_committed_fixture_has_a_test() {
    let mut committed: Vec<String> = std::fs::read_dir(dir())
        .expect("tests/fixtures/vision exists")
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "json").then(|| p.file_stem()?.to_str().map(str::to_string))?
        })
        .collect();
    committed.sort();
    let mut listed: Vec<String> = FIXTURES
        .iter()
        .chain(REFUSED.iter().map(|r| &r.0))
        .chain(crate::batch_norm::FIXTURES)
        .map(|s| s.to_string())
        .collect();
    listed.sort();
    assert_eq!(
        committed, listed,
        "tests/fixtures/vision/*.json vs the tests"
    );
}

/// The table of `records`, each run (a failure panics naming it).
fn table(records: &[Record]) -> String {
    let mut rows = vec![
        "| fixture | mode | ONNX nodes | params (PyTorch) | units | first loss | ONNX Runtime | PyTorch | 1 vs 2 ranks | measured / planned bytes (2 ranks) |".to_string(),
        "|---|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    for rec in records {
        let name = &rec.name;
        let f = run(rec).unwrap_or_else(|e| panic!("{name}: {e}"));
        rows.push(format!(
            "| {name} | {} | {} | {} ({}) | {} | {:.6} | {:.6} | {:.6} | {:.1e} | {} / {} |",
            rec.mode,
            rec.nodes,
            f.params,
            rec.torch_params,
            f.units,
            f.first,
            rec.ort_loss,
            rec.torch_loss,
            f.ranks_diff,
            f.measured,
            f.planned
        ));
    }
    rows.join("\n")
}

/// One row per fixture (run with `--nocapture`): what it is, its size, its
/// first loss against ONNX Runtime's and PyTorch's, 1 vs 2 ranks, and
/// memory measured against planned on 2 ranks.
#[test]
fn fixture_table() {
    let records: Vec<Record> = FIXTURES.iter().map(|n| record(n)).collect();
    println!("{}", table(&records));
}

/// Exports too large to commit (the full torchvision ResNet-18: `python
/// scripts/export_vision_fixtures.py --extra DIR`), checked like the
/// committed ones when `FSDPC_VISION_EXTRA=DIR` names them; skipped, saying
/// so, otherwise.
#[test]
fn exports_outside_the_repository() {
    let Some(dir) = std::env::var_os("FSDPC_VISION_EXTRA").map(PathBuf::from) else {
        eprintln!("skipping: FSDPC_VISION_EXTRA names no directory of vision exports");
        return;
    };
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "json").then(|| p.file_stem()?.to_str().map(str::to_string))?
        })
        .collect();
    names.sort();
    let (trained, records): (Vec<Record>, Vec<Record>) = names
        .iter()
        .map(|n| record_in(&dir, n))
        .partition(|r| !r.torch_training.is_empty());
    println!("{}", table(&records));
    // Training-mode exports: against PyTorch's own training.
    for rec in &trained {
        for (w, loss, stats) in crate::batch_norm::against_pytorch(rec) {
            println!(
                "{}: {w} rank(s), losses within {loss:.1e} (relative) and rank 0's running \
                 statistics within {stats:.1e} of PyTorch's",
                rec.name
            );
        }
    }
}

/// A trained normalised ResNet written back (`--save-onnx`): the file
/// re-imports with exactly the trained parameters, and the running
/// statistics, constants of the graph, are the file's as they were.
#[test]
fn a_trained_export_is_written_back_with_its_running_statistics() {
    use onnx_protobuf::Message;
    let rec = record("resnet_torchscript_eval");
    let (plan, _) = compile(&rec, 2).unwrap_or_else(|e| panic!("{e}"));
    let report = train(&rec, &plan).unwrap_or_else(|e| panic!("{e}"));
    let trained: HashMap<String, Vec<f32>> = report.final_params.iter().cloned().collect();
    let src = dir().join(&rec.file);
    let out = tempfile::tempdir().expect("temp dir");
    let written = out.path().join("trained.onnx");
    fsdpc_frontends::onnx::write_with_params(&src, &trained, &written).expect("write-back");
    let dims: HashMap<String, usize> = [("batch".to_string(), 2)].into();
    let back = fsdpc_frontends::onnx::import(&written, &dims).expect("the written file imports");
    for p in &back.graph.params {
        let fsdpc_ir::Init::Data { data } = &p.init else {
            panic!("{}: not the file's data", p.name);
        };
        let values: Vec<f32> = data
            .bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(Some(&values), trained.get(&p.name), "{}", p.name);
    }
    assert_eq!(back.graph.params.len(), trained.len());
    let initializers = |path: &std::path::Path| -> HashMap<String, Vec<u8>> {
        let bytes = std::fs::read(path).expect("readable");
        let m = onnx_protobuf::ModelProto::parse_from_bytes(&bytes).expect("an ONNX model");
        m.graph
            .initializer
            .iter()
            .map(|t| (t.name.clone(), t.raw_data.clone()))
            .collect()
    };
    let (before, after) = (initializers(&src), initializers(&written));
    let running: Vec<&String> = before.keys().filter(|n| n.contains("running_")).collect();
    assert_eq!(running.len(), 12, "6 normalisations' means and variances");
    for name in running {
        assert!(!before[name].is_empty(), "{name}: no raw data to compare");
        assert_eq!(before[name], after[name], "{name} changed");
    }
}
