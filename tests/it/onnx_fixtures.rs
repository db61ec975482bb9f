//! Real PyTorch exports: the fixtures in `tests/fixtures/onnx/` (nanoGPT,
//! GPT-2, Llama and BERT from torch's dynamo and TorchScript exporters, made by
//! `scripts/export-fixtures.sh`; see the README there). Every fixture
//!
//! - imports and compiles, with its symbolic `batch`/`seq` bound to the
//!   recorded inputs' sizes;
//! - trains for a few steps on the recorded global batch (fed by name through
//!   `GivenData`) on 1 rank and on 2 ranks, whose losses agree within the
//!   tolerance `tests/it/equivalence.rs` uses for that case;
//! - has as many parameter elements as the PyTorch module had (less what
//!   the exporter itself dropped, `DROPPED_BY_EXPORTER`), with the
//!   initializers the dynamo exporter merged in a fresh model untied;
//! - when dropout-free, has a first training loss (the loss of the exported
//!   weights on the recorded inputs) equal to the loss ONNX Runtime computed
//!   for the same inputs, within `ORT_RTOL`.
//!
//! A fixture that fails only because of a known frontend gap that is being
//! fixed elsewhere is listed in `PENDING`: it prints why it is pending, and
//! fails if it fails any other way. `fixture_table` prints one row per
//! fixture (run it with `--nocapture`).

use fsdpc_frontends::LoadOptions;
use fsdpc_plan::{ModelInfo, Plan};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::data::GivenData;
use fsdpc_runtime::{HostTensor, TrainOptions, TrainReport};
use serde::Deserialize;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Training steps of the 1-rank / 2-rank comparison.
const STEPS: u64 = 3;
/// Relative loss tolerance between 1 and 2 ranks: `tests/it/equivalence.rs`'s
/// `LOSS_RTOL` for the same comparison (the two sum in different orders).
const LOSS_RTOL: f32 = 1e-6;
/// Relative tolerance between the first training loss and ONNX Runtime's
/// loss: both are f32 forward passes of the same graph that sum in different
/// orders.
const ORT_RTOL: f64 = 1e-4;

/// A fixture that fails only because of a known frontend gap.
struct Pending {
    fixture: &'static str,
    /// The gap, as the team names it.
    gap: &'static str,
    /// A piece of the error the gap gives.
    error: &'static str,
}

/// Fixtures waiting for a frontend gap to be fixed elsewhere.
const PENDING: &[Pending] = &[];

/// Parameter elements that an export itself left out, by fixture: the
/// dynamo exporter's optimiser removes the `Add` of an all-zero bias, so a
/// fresh GPT-2 export has no `c_attn`, `attn.c_proj`, `c_fc`, `mlp.c_proj`
/// biases at all: 2 layers x (96 + 32 + 128 + 32).
const DROPPED_BY_EXPORTER: &[(&str, u64)] = &[("gpt2_dynamo_fresh", 2 * (96 + 32 + 128 + 32))];

/// Parameter elements the import should have: the PyTorch module's, less
/// what the exporter dropped.
fn expected_params(rec: &Record) -> u64 {
    let dropped = DROPPED_BY_EXPORTER
        .iter()
        .find(|(f, _)| *f == rec.name)
        .map_or(0, |d| d.1);
    rec.torch_params - dropped
}

/// What `scripts/export_fixtures.py` records beside each fixture.
#[derive(Debug, Deserialize)]
struct Record {
    name: String,
    file: String,
    model: String,
    exporter: String,
    opset: u32,
    mode: String,
    fresh: bool,
    dropout_free: bool,
    /// Symbolic dimensions of the graph inputs and their recorded sizes.
    dims: HashMap<String, usize>,
    /// The symbol of the inputs' batch axis.
    batch_dim: Option<String>,
    batch: usize,
    /// ONNX nodes in the file.
    nodes: usize,
    /// Parameter elements of the PyTorch module (tied ones once).
    torch_params: u64,
    /// The recorded global batch by input name: `[batch][seq]` integers.
    inputs: BTreeMap<String, Vec<Vec<i64>>>,
    torch_loss: f64,
    ort_loss: Option<f64>,
}

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx")
}

fn record(name: &str) -> Record {
    let path = dir().join(format!("{name}.json"));
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let rec: Record = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("{} is not a fixture record: {e}", path.display()));
    assert_eq!(rec.name, name, "{}: name", path.display());
    rec
}

/// A plan and what it took to make it.
struct Compiled {
    plan: Plan,
    params: u64,
    ir_nodes: usize,
    /// Import, autodiff and planning.
    compile_time: Duration,
}

/// Imports `rec` with its batch split over `world` ranks and plans it.
fn compile(rec: &Record, world: u32) -> Result<Compiled, String> {
    let w = world as usize;
    assert_eq!(
        rec.batch % w,
        0,
        "{}: batch {} over {world} ranks",
        rec.name,
        rec.batch
    );
    let mut dims = rec.dims.clone();
    match &rec.batch_dim {
        Some(b) => {
            dims.insert(b.clone(), rec.batch / w);
        }
        None => assert_eq!(world, 1, "{}: the batch axis is not symbolic", rec.name),
    }
    let path = dir().join(&rec.file);
    let start = Instant::now();
    // Untying is a no-op where the exporter merged nothing, so every fixture
    // also checks that genuine weights are not taken for merged ones.
    let opts = LoadOptions {
        dims,
        untie_merged_initializers: true,
        ..LoadOptions::default()
    };
    let m = fsdpc_frontends::load(&path.display().to_string(), &opts)
        .map_err(|e| format!("import: {e}"))?;
    let params = m.program.graph.param_numel();
    let ir_nodes = m.program.graph.node_count();
    let cluster = fsdpc_planner::preset("cpu-local", world, world).map_err(|e| e.to_string())?;
    let info = ModelInfo {
        tokens_per_rank_step: m.tokens_per_rank_step(),
        params,
        name: m.name,
    };
    let plan = fsdpc_planner::compile(m.program, info, &cluster, &FsdpConfig::default())
        .map_err(|e| format!("plan: {e}"))?;
    let compile_time = start.elapsed();
    if let Err(v) = plan.validate() {
        panic!(
            "{}: the plan for {world} ranks does not validate: {v:?}",
            rec.name
        );
    }
    Ok(Compiled {
        plan,
        params,
        ir_nodes,
        compile_time,
    })
}

/// The recorded inputs as a data source.
fn data(rec: &Record) -> GivenData {
    let tensors = rec.inputs.iter().map(|(name, rows)| {
        let seq = rows.first().map_or(0, Vec::len);
        assert!(
            rows.iter().all(|r| r.len() == seq),
            "{}: ragged {name}",
            rec.name
        );
        let flat: Vec<i64> = rows.concat();
        let t = HostTensor::from_i64(&[rows.len(), seq], &flat).expect("shape matches");
        (name.clone(), t)
    });
    GivenData::new(tensors).expect("one tensor per input name")
}

fn train(rec: &Record, c: &Compiled, steps: u64) -> Result<TrainReport, String> {
    let opts = TrainOptions {
        steps,
        seed: 7,
        ..TrainOptions::default()
    };
    fsdpc_runtime::train_with_data(&c.plan, &opts, Arc::new(data(rec)), &mut |_| {})
        .map_err(|e| format!("train: {e}"))
}

/// Relative difference of the first loss from ONNX Runtime's.
fn ort_diff(rec: &Record, first: f32) -> Option<f64> {
    let ort = rec.ort_loss?;
    Some((f64::from(first) - ort).abs() / ort.abs())
}

/// Trains on 1 and 2 ranks and checks the losses; `Err` for a stage that
/// fails (import, plan, train), a panic for wrong numbers.
fn run(rec: &Record) -> Result<(), String> {
    let compiled = compile(rec, 1)?;
    let one = train(rec, &compiled, STEPS)?;
    let two = train(rec, &compile(rec, 2)?, STEPS)?;
    let name = &rec.name;
    assert!(
        one.losses.len() == STEPS as usize && one.losses.iter().all(|l| l.is_finite()),
        "{name}: losses {:?}",
        one.losses
    );
    let rel = one
        .losses
        .iter()
        .zip(&two.losses)
        .map(|(a, b)| (a - b).abs() / a.abs().max(1e-6))
        .fold(0f32, f32::max);
    eprintln!(
        "{name}: losses 1 rank {:?}, 2 ranks {:?}, max rel diff {rel:e}",
        one.losses, two.losses
    );
    assert!(
        rel <= LOSS_RTOL,
        "{name}: 1 and 2 ranks differ by {rel:e} (relative): {:?} vs {:?}",
        one.losses,
        two.losses
    );
    if rec.dropout_free {
        let Some(d) = ort_diff(rec, one.losses[0]) else {
            panic!("{name}: a dropout-free fixture without an ONNX Runtime loss");
        };
        eprintln!(
            "{name}: first loss {} vs ONNX Runtime {:?} (PyTorch {}), rel diff {d:e}",
            one.losses[0], rec.ort_loss, rec.torch_loss
        );
        assert!(
            d <= ORT_RTOL,
            "{name}: first loss {} vs ONNX Runtime {:?}: {d:e} relative",
            one.losses[0],
            rec.ort_loss
        );
    }
    if compiled.params != expected_params(rec) {
        return Err(format!(
            "{} parameter elements in the import, {} expected ({} in the PyTorch module)",
            compiled.params,
            expected_params(rec),
            rec.torch_params
        ));
    }
    Ok(())
}

fn pending(name: &str) -> Option<&'static Pending> {
    PENDING.iter().find(|p| p.fixture == name)
}

/// Runs `run`, tolerating only the listed gap of a pending fixture.
fn check(name: &str) {
    let rec = record(name);
    match (run(&rec), pending(name)) {
        (Ok(()), None) => {}
        (Ok(()), Some(p)) => eprintln!(
            "NOTE {name} passes: the gap `{}` is fixed; remove it from PENDING",
            p.gap
        ),
        (Err(e), Some(p)) if e.contains(p.error) => {
            eprintln!("PENDING {name}: waits for `{}`: {e}", p.gap)
        }
        (Err(e), _) => panic!("{name}: {e}"),
    }
}

macro_rules! fixtures {
    ($($name:ident),* $(,)?) => {
        /// Every fixture with a test of its own.
        const FIXTURES: &[&str] = &[$(stringify!($name)),*];
        $(
            #[test]
            fn $name() {
                check(stringify!($name));
            }
        )*
    };
}

fixtures!(
    nanogpt_dynamo_eval,
    nanogpt_torchscript_eval,
    nanogpt_torchscript_train,
    gpt2_dynamo_eval,
    gpt2_torchscript_eval,
    gpt2_dynamo_train,
    gpt2_dynamo_fresh,
    gpt2_dynamo_fresh_noopt,
    llama_dynamo_eval_external,
    llama_torchscript_eval,
    llama_dynamo_train,
    bert_dynamo_eval,
    bert_torchscript_eval_external,
    bert_torchscript_train,
);

/// The `.json` records in the fixture directory, by name.
fn committed() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir())
        .expect("tests/fixtures/onnx exists")
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "json").then(|| p.file_stem()?.to_str().map(str::to_string))?
        })
        .collect();
    names.sort();
    names
}

#[test]
fn every_committed_fixture_has_a_test() {
    let mut listed: Vec<String> = FIXTURES.iter().map(|s| s.to_string()).collect();
    listed.sort();
    assert_eq!(
        committed(),
        listed,
        "tests/fixtures/onnx/*.json vs fixtures!(...)"
    );
    for p in PENDING {
        assert!(FIXTURES.contains(&p.fixture), "PENDING names {}", p.fixture);
    }
}

/// One row per fixture: what it is, its size, how long import + autodiff +
/// planning took on 1 rank, and its first training loss against ONNX
/// Runtime's. Prints the figures (run with `--nocapture`); fails only where a
/// fixture fails to import, plan or train other than as `PENDING` says.
#[test]
fn fixture_table() {
    let mut rows = vec![
        "| fixture | model | exporter | opset | mode | ONNX nodes | IR nodes | params (PyTorch) | compile | first loss | ONNX Runtime | rel diff |".to_string(),
        "|---|---|---|---|---|---|---|---|---|---|---|---|".to_string(),
    ];
    for name in FIXTURES {
        let rec = record(name);
        let mode = format!("{}{}", rec.mode, if rec.fresh { " (fresh)" } else { "" });
        let head = format!(
            "| {name} | {} | {} | {} | {mode} | {} |",
            rec.model, rec.exporter, rec.opset, rec.nodes
        );
        let row = compile(&rec, 1).and_then(|c| Ok((train(&rec, &c, 1)?, c)));
        match (row, pending(name)) {
            (Ok((r, c)), _) => {
                let first = r.losses.first().copied().unwrap_or(f32::NAN);
                let (ort, diff) = match (rec.ort_loss, ort_diff(&rec, first)) {
                    (Some(o), Some(d)) => (format!("{o:.6}"), format!("{d:.1e}")),
                    _ => ("— (dropout)".to_string(), "—".to_string()),
                };
                rows.push(format!(
                    "{head} {} | {} ({}) | {:.0} ms | {first:.6} | {ort} | {diff} |",
                    c.ir_nodes,
                    c.params,
                    rec.torch_params,
                    c.compile_time.as_secs_f64() * 1e3,
                ));
            }
            (Err(e), Some(p)) if e.contains(p.error) => {
                rows.push(format!("{head} pending: {} | | | | | |", p.gap));
            }
            (Err(e), _) => panic!("{name}: {e}"),
        }
    }
    println!("{}", rows.join("\n"));
}

/// The committed PyTorch exports (tests/fixtures/onnx, made by
/// scripts/export_fixtures.py): `(fixture, labels shifted in the graph)`.
/// GPT-2 and Llama are `transformers` causal LMs, whose loss shifts
/// `labels == input_ids` (both exporters); nanoGPT takes targets that
/// are already the next tokens; BERT's masked-LM labels are read where
/// they are.
const SHIFTED: &[(&str, bool)] = &[
    ("gpt2_dynamo_eval", true),
    ("gpt2_dynamo_train", true),
    ("gpt2_torchscript_eval", true),
    ("gpt2_dynamo_fresh_noopt", true),
    ("llama_dynamo_eval_external", true),
    ("llama_torchscript_eval", true),
    ("nanogpt_dynamo_eval", false),
    ("nanogpt_torchscript_eval", false),
    ("nanogpt_torchscript_train", false),
    ("bert_dynamo_eval", false),
    ("bert_torchscript_eval_external", false),
];

#[test]
fn the_fixtures_labels_are_shifted_as_their_models_shift_them() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/onnx");
    for &(name, want) in SHIFTED {
        let opts = fsdpc_frontends::LoadOptions {
            dims: [("batch".to_string(), 2), ("seq".to_string(), 16)].into(),
            ..fsdpc_frontends::LoadOptions::default()
        };
        let path = dir.join(format!("{name}.onnx"));
        let m = fsdpc_frontends::load(&path.display().to_string(), &opts)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let r: std::collections::HashMap<String, bool> =
            fsdpc_runtime::data::analyse(&m.program.graph)
                .into_iter()
                .map(|d| (d.name, d.shifted_in_graph))
                .collect();
        assert_eq!(r.get("labels"), Some(&want), "{name}: {r:?}");
        assert_eq!(r.get("input_ids"), Some(&false), "{name}: {r:?}");
    }
}
