//! Training a Hugging Face causal-LM export on a user's text: the real GPT-2
//! dynamo export in `tests/fixtures/onnx/` (vocabulary 128, inputs
//! `input_ids`, `attention_mask`, `labels`; the loss shifts `labels` inside
//! the graph) fed an ASCII text with `fsdpc train --data`. The labels are
//! the ids' own window (the graph shifts them), the loss falls on a
//! repetitive text, and 1 and 2 ranks see the same losses. Exports whose
//! labels reach the loss unshifted (nanoGPT's pre-shifted targets, BERT's
//! masked-LM labels) are refused file data with an error naming `labels`.

use fsdpc_frontends::LoadOptions;
use fsdpc_runtime::data::{self, DataSpec};
use fsdpc_runtime::{Batch, HostTensor};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A fixture of `tests/fixtures/onnx/`.
fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/onnx")
        .join(format!("{name}.onnx"))
        .display()
        .to_string()
}

/// A repetitive ASCII text (every byte < 128, the fixtures' vocabulary).
fn text(dir: &Path) -> PathBuf {
    let path = dir.join("text.txt");
    let line = "the lighthouse keeper climbs the stairs and lights the lamp. ";
    std::fs::write(&path, line.repeat(40)).expect("text written");
    path
}

/// `fsdpc train MODEL --dim batch=B --dim seq=16 --ranks R --steps S --data
/// TEXT`; the output and the loss of every step.
fn train(model: &str, batch: u32, ranks: u32, steps: u32, data: &Path) -> (Output, Vec<f64>) {
    let dir = data.parent().expect("a directory");
    let metrics = dir.join(format!("metrics-{ranks}.jsonl"));
    let o = Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .arg("train")
        .arg(model)
        .args(["--dim", &format!("batch={batch}"), "--dim", "seq=16"])
        .args(["--ranks", &ranks.to_string(), "--steps", &steps.to_string()])
        .arg("--data")
        .arg(data)
        .arg("--metrics")
        .arg(&metrics)
        .output()
        .expect("fsdpc runs");
    let losses = std::fs::read_to_string(&metrics)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
            v["loss"].as_f64().expect("a loss")
        })
        .collect();
    (o, losses)
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

#[test]
fn gpt2_export_learns_a_text_and_ranks_agree() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = text(dir.path());
    let gpt2 = fixture("gpt2_dynamo_eval");
    let (o, two) = train(&gpt2, 2, 2, 60, &data);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(two.len(), 60);
    // The exported weights start near a uniform guess over 128 tokens
    // (ln 128 = 4.85); a text of one repeated line is soon predictable
    // (measured: 4.61 over the first 5 steps, 2.67 over the last 10).
    let (early, late) = (mean(&two[..5]), mean(&two[50..]));
    eprintln!("gpt2 on text, 2 ranks: loss {early:.4} -> {late:.4}");
    assert!(early > 4.0 && late < early - 1.5, "loss {early} -> {late}");
    // One rank with the same global batch of 4 sees the same samples.
    let (o, one) = train(&gpt2, 4, 1, 60, &data);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for (step, (a, b)) in one.iter().zip(&two).enumerate() {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs().max(1.0),
            "step {step}: 1 rank {a}, 2 ranks {b}"
        );
    }
}

/// The first `batch` samples of input `name` from the data of `model`.
fn fill(model: &str, spec: &DataSpec, name: &str) -> Vec<i64> {
    let opts = LoadOptions {
        dims: [("batch".to_string(), 2), ("seq".to_string(), 16)].into(),
        ..LoadOptions::default()
    };
    let m = fsdpc_frontends::load(model, &opts).unwrap_or_else(|e| panic!("{model}: {e}"));
    let source = data::open(spec, &m.program.graph, 7).unwrap_or_else(|e| panic!("{e}"));
    let ty = data::analyse(&m.program.graph)
        .into_iter()
        .find(|d| d.name == name)
        .expect("the input")
        .ty;
    let mut t = HostTensor::zeros(ty);
    let batch = Batch {
        step: 3,
        first_sample: 0,
    };
    source
        .fill(name, batch, t.view_mut())
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    t.to_i64()
}

#[test]
fn labels_the_graph_shifts_are_the_ids_and_the_mask_is_ones() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = DataSpec::TextFile(text(dir.path()));
    let gpt2 = fixture("gpt2_dynamo_eval");
    let ids = fill(&gpt2, &spec, "input_ids");
    assert_eq!(fill(&gpt2, &spec, "labels"), ids);
    assert!(fill(&gpt2, &spec, "attention_mask").iter().all(|&m| m == 1));
    // Bytes of the text, not synthetic tokens.
    let line = b"the lighthouse keeper climbs the stairs and lights the lamp. ";
    assert!(ids.iter().all(|&t| line.contains(&(t as u8))), "{ids:?}");
}

#[test]
fn the_zoo_labels_are_the_next_tokens() {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = DataSpec::TextFile(text(dir.path()));
    let zoo = "gpt:layers=1,hidden=16,heads=2,seq=16,vocab=256,batch=2";
    let (ids, labels) = (fill(zoo, &spec, "ids"), fill(zoo, &spec, "labels"));
    for s in 0..2 {
        let row = |v: &[i64]| v[s * 16..(s + 1) * 16].to_vec();
        assert_eq!(row(&ids)[1..], row(&labels)[..15], "sample {s}");
    }
}

#[test]
fn labels_the_graph_reads_unshifted_are_refused_file_data() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data = text(dir.path());
    for name in ["bert_dynamo_eval", "nanogpt_dynamo_eval"] {
        let (o, _) = train(&fixture(name), 2, 1, 2, &data);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{name} trained on text");
        assert!(
            err.contains("labels") && err.contains("cannot tell what these labels are"),
            "{name}: {err}"
        );
    }
}

#[test]
fn without_file_data_unshifted_labels_stay_synthetic() {
    // BERT's masked-LM labels keep the generic task (uniform tokens in range).
    let bert = fixture("bert_dynamo_eval");
    let labels = fill(&bert, &DataSpec::Synthetic, "labels");
    assert!(labels.iter().all(|&t| (0..128).contains(&t)), "{labels:?}");
}
