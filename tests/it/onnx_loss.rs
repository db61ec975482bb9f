//! The causal-LM loss as PyTorch exports it, end to end: ONNX models built
//! here in code whose `labels` go through Pad(-100) -> Slice -> Reshape into a
//! SoftmaxCrossEntropyLoss with `ignore_index=-100` (what `torch.onnx.export`
//! writes for `model(input_ids, labels=labels).loss`) import, compute
//! PyTorch's loss (the mean over the counted positions) and train on
//! synthetic data; a training-mode Dropout's `mask` output agrees with its
//! output and trains whether or not the graph reads it.

use fsdpc_frontends::onnx::{import, import_forward, ForwardOptions};
use fsdpc_frontends::{load, LoadOptions};
use fsdpc_ir::Op;
use fsdpc_plan::{ModelInfo, Plan};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::data::analyse;
use fsdpc_runtime::{eval_graph, init_params, HostTensor, KernelCtx, TrainOptions, TrainReport};
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::tensor_shape_proto::{dimension, Dimension};
use onnx_protobuf::{
    type_proto, AttributeProto, GraphProto, Message, ModelProto, NodeProto, OperatorSetIdProto,
    TensorProto, TensorShapeProto, TypeProto, ValueInfoProto,
};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

const BATCH: usize = 2;
const SEQ: usize = 4;
const VOCAB: usize = 16;
const HIDDEN: usize = 8;

// ---- building ONNX models ----

fn value_info(name: &str, elem_type: i32, dims: &[usize]) -> ValueInfoProto {
    let dim = dims
        .iter()
        .map(|&d| Dimension {
            value: Some(dimension::Value::DimValue(d as i64)),
            ..Dimension::default()
        })
        .collect();
    let tensor = type_proto::Tensor {
        elem_type,
        shape: Some(TensorShapeProto {
            dim,
            ..TensorShapeProto::default()
        })
        .into(),
        ..type_proto::Tensor::default()
    };
    ValueInfoProto {
        name: name.into(),
        type_: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(tensor)),
            ..TypeProto::default()
        })
        .into(),
        ..ValueInfoProto::default()
    }
}

fn floats(name: &str, dims: &[usize], v: Vec<f32>) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: 1,
        float_data: v,
        ..TensorProto::default()
    }
}

fn ints(name: &str, v: &[i64]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![v.len() as i64],
        data_type: 7,
        int64_data: v.to_vec(),
        ..TensorProto::default()
    }
}

fn scalar(name: &str, data_type: i32, v: f32) -> TensorProto {
    TensorProto {
        name: name.into(),
        data_type,
        float_data: if data_type == 1 { vec![v] } else { Vec::new() },
        int64_data: if data_type == 7 {
            vec![v as i64]
        } else {
            Vec::new()
        },
        int32_data: if data_type == 9 {
            vec![v as i32]
        } else {
            Vec::new()
        },
        ..TensorProto::default()
    }
}

fn attr_i(name: &str, i: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i,
        type_: AttributeType::INT.into(),
        ..AttributeProto::default()
    }
}

fn attr_s(name: &str, s: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        s: s.as_bytes().to_vec(),
        type_: AttributeType::STRING.into(),
        ..AttributeProto::default()
    }
}

fn node(op: &str, ins: &[&str], outs: &[&str], attribute: Vec<AttributeProto>) -> NodeProto {
    NodeProto {
        op_type: op.into(),
        name: format!("/{}/{op}", outs.first().copied().unwrap_or("")),
        input: ins.iter().map(|s| s.to_string()).collect(),
        output: outs.iter().map(|s| s.to_string()).collect(),
        attribute,
        ..NodeProto::default()
    }
}

fn model(graph: GraphProto) -> Vec<u8> {
    let m = ModelProto {
        ir_version: 8,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 17,
            ..OperatorSetIdProto::default()
        }],
        graph: Some(graph).into(),
        ..ModelProto::default()
    };
    m.write_to_bytes().unwrap_or_else(|e| panic!("{e}"))
}

/// Deterministic weights: the embedding `[VOCAB, HIDDEN]` and the output
/// projection `[HIDDEN, VOCAB]`.
fn weights() -> (Vec<f32>, Vec<f32>) {
    let emb = (0..VOCAB * HIDDEN)
        .map(|i| (i as f32 * 0.37).sin() * 0.5)
        .collect();
    let w = (0..HIDDEN * VOCAB)
        .map(|i| (i as f32 * 0.23).cos() * 0.5)
        .collect();
    (emb, w)
}

/// How the LM's hidden state goes through a training-mode Dropout.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Dropout {
    None,
    /// Both outputs named; the mask is not read.
    MaskUnread,
    /// The mask, cast to float, multiplies the dropout's output.
    MaskRead,
}

/// `loss = cross_entropy(embed(input_ids) @ w, shift(labels))`, the shift as
/// the exporters write it: labels padded with one -100 at the end, the first
/// position sliced off, both flattened.
fn lm(dropout: Dropout) -> Vec<u8> {
    let (emb, w) = weights();
    let mut nodes = vec![node("Gather", &["emb", "input_ids"], &["h"], vec![])];
    let mut initializer = vec![
        floats("emb", &[VOCAB, HIDDEN], emb),
        floats("w", &[HIDDEN, VOCAB], w),
        ints("pads", &[0, 0, 0, 1]),
        scalar("minus100", 7, -100.0),
        ints("one", &[1]),
        ints("end", &[i64::MAX]),
        ints("rows", &[-1, VOCAB as i64]),
        ints("flat", &[-1]),
    ];
    let hidden = match dropout {
        Dropout::None => "h",
        Dropout::MaskUnread | Dropout::MaskRead => {
            initializer.push(scalar("ratio", 1, 0.25));
            initializer.push(scalar("training", 9, 1.0));
            let d = ["h", "ratio", "training"];
            nodes.push(node("Dropout", &d, &["hd", "mask"], vec![]));
            if dropout == Dropout::MaskRead {
                nodes.push(node("Cast", &["mask"], &["mf"], vec![attr_i("to", 1)]));
                nodes.push(node("Mul", &["hd", "mf"], &["hm"], vec![]));
                "hm"
            } else {
                "hd"
            }
        }
    };
    nodes.extend([
        node("MatMul", &[hidden, "w"], &["logits"], vec![]),
        node("Reshape", &["logits", "rows"], &["scores"], vec![]),
        node("Pad", &["labels", "pads", "minus100"], &["padded"], vec![]),
        node(
            "Slice",
            &["padded", "one", "end", "one"],
            &["shifted"],
            vec![],
        ),
        node("Reshape", &["shifted", "flat"], &["target"], vec![]),
        node(
            "SoftmaxCrossEntropyLoss",
            &["scores", "target"],
            &["loss"],
            vec![attr_i("ignore_index", -100), attr_s("reduction", "mean")],
        ),
    ]);
    model(GraphProto {
        name: "shifted_lm".into(),
        node: nodes,
        initializer,
        input: vec![
            value_info("input_ids", 7, &[BATCH, SEQ]),
            value_info("labels", 7, &[BATCH, SEQ]),
        ],
        output: vec![value_info("loss", 1, &[])],
        ..GraphProto::default()
    })
}

// ---- importing, planning, training ----

/// Writes `bytes` as `name` in a fresh directory (kept alive by the caller).
fn write(bytes: &[u8], name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{e}"));
    (dir, path)
}

fn plan(path: &Path, world: u32) -> Plan {
    let m = load(&path.display().to_string(), &LoadOptions::default())
        .unwrap_or_else(|e| panic!("{e}"));
    let cluster =
        fsdpc_planner::preset("cpu-local", world, world).unwrap_or_else(|e| panic!("{e}"));
    let info = ModelInfo {
        tokens_per_rank_step: m.tokens_per_rank_step(),
        params: m.program.graph.param_numel(),
        name: m.name,
    };
    fsdpc_planner::compile(m.program, info, &cluster, &FsdpConfig::default())
        .unwrap_or_else(|e| panic!("{e}"))
}

fn train(plan: &Plan, steps: u64) -> TrainReport {
    let opts = TrainOptions {
        steps,
        seed: 11,
        ..TrainOptions::default()
    };
    fsdpc_runtime::train(plan, &opts, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"))
}

/// Trains `steps` steps on synthetic data: every loss is finite and every
/// parameter moved (the gradient reached it).
fn trains(path: &Path, world: u32, steps: u64) {
    let report = train(&plan(path, world), steps);
    assert_eq!(report.losses.len() as u64, steps);
    for &l in &report.losses {
        assert!(l.is_finite() && l > 0.0, "step loss {l}");
    }
    let (emb, w) = weights();
    let init: HashMap<&str, Vec<f32>> = [("emb", emb), ("w", w)].into();
    assert_eq!(report.final_params.len(), 2);
    for (name, v) in &report.final_params {
        assert_ne!(Some(v), init.get(name.as_str()), "{name} did not train");
    }
}

// ---- the tests ----

/// PyTorch's `cross_entropy(ignore_index=-100)` of the shifted labels,
/// computed here from the weights: the mean over the counted positions.
fn expected_loss(ids: &[i64], labels: &[i64]) -> f64 {
    let (emb, w) = weights();
    let mut sum = 0.0f64;
    let mut count = 0usize;
    for b in 0..BATCH {
        for s in 0..SEQ {
            let target = if s + 1 < SEQ {
                labels[b * SEQ + s + 1]
            } else {
                -100
            };
            if target == -100 {
                continue;
            }
            let h = &emb[ids[b * SEQ + s] as usize * HIDDEN..][..HIDDEN];
            let logits: Vec<f64> = (0..VOCAB)
                .map(|c| {
                    (0..HIDDEN)
                        .map(|k| f64::from(h[k] * w[k * VOCAB + c]))
                        .sum()
                })
                .collect();
            let m = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + logits.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            sum += lse - logits[target as usize];
            count += 1;
        }
    }
    sum / count as f64
}

#[test]
fn shifted_labels_are_ranged_ignored_where_padded_and_train() {
    let (_dir, path) = write(&lm(Dropout::None), "lm.onnx");
    let m = import(&path, &HashMap::new()).unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    assert_eq!(
        g.node(m.loss.node).op,
        Op::CrossEntropy {
            ignore_index: Some(-100)
        }
    );
    // The synthetic data knows both integer inputs' ranges (the labels' only
    // through Pad -> Slice -> Reshape), so it draws labels in 0..VOCAB.
    let ranges: Vec<(String, Option<i64>)> =
        analyse(g).into_iter().map(|d| (d.name, d.range)).collect();
    let vocab = Some(VOCAB as i64);
    assert_eq!(
        ranges,
        [
            ("input_ids".to_string(), vocab),
            ("labels".to_string(), vocab)
        ]
    );
    // Labels that hold -100 themselves (a masked position) and the -100 the
    // pad adds are both left out of the mean.
    let ids = [3, 7, 1, 15, 0, 9, 9, 4];
    let labels = [3, 7, -100, 15, 0, 9, 9, 4];
    let feeds: HashMap<String, HostTensor> = [
        ("input_ids", HostTensor::from_i64(&[BATCH, SEQ], &ids)),
        ("labels", HostTensor::from_i64(&[BATCH, SEQ], &labels)),
    ]
    .into_iter()
    .map(|(n, t)| (n.to_string(), t.unwrap_or_else(|e| panic!("{e:?}"))))
    .collect();
    let params = init_params(g, 0).unwrap_or_else(|e| panic!("{e}"));
    let vals = eval_graph(g, &feeds, &params, &KernelCtx::default());
    let vals = vals.unwrap_or_else(|e| panic!("{e}"));
    let loss = f64::from(vals[&m.loss].to_f32()[0]);
    let want = expected_loss(&ids, &labels);
    assert!((loss - want).abs() < 1e-5 * want, "{loss} vs {want}");
    trains(&path, 2, 3);
}

#[test]
fn training_dropout_mask_marks_the_kept_elements() {
    let x_dims = [4, 8];
    let graph = GraphProto {
        name: "dropout".into(),
        node: vec![node(
            "Dropout",
            &["x", "ratio", "training"],
            &["y", "mask"],
            vec![],
        )],
        initializer: vec![scalar("ratio", 1, 0.5), scalar("training", 9, 1.0)],
        input: vec![value_info("x", 1, &x_dims)],
        output: vec![value_info("y", 1, &x_dims), value_info("mask", 9, &x_dims)],
        ..GraphProto::default()
    };
    let (_dir, path) = write(&model(graph), "dropout.onnx");
    let f = import_forward(&path, &ForwardOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    let x: Vec<f32> = (1..=32).map(|i| i as f32).collect();
    let feeds = [(
        "x".to_string(),
        HostTensor::from_f32(&x_dims, &x).unwrap_or_else(|e| panic!("{e:?}")),
    )]
    .into();
    let ctx = KernelCtx {
        step: 3,
        sample_offset: 0,
        seed: 5,
        eval: false,
    };
    let vals = eval_graph(&f.graph, &feeds, &HashMap::new(), &ctx);
    let vals = vals.unwrap_or_else(|e| panic!("{e}"));
    let out = |name: &str| {
        let v = f.outputs.iter().find(|(n, _)| n == name);
        let v = v.unwrap_or_else(|| panic!("no output {name}")).1;
        vals[&v].clone()
    };
    let (y, mask) = (out("y").to_f32(), out("mask").to_i64());
    assert_eq!(out("mask").view().dtype(), fsdpc_ir::DType::Bool);
    for ((&xi, &yi), &mi) in x.iter().zip(&y).zip(&mask) {
        let kept = mi == 1;
        assert_eq!(yi, if kept { 2.0 * xi } else { 0.0 }, "x {xi} mask {mi}");
    }
    let kept = mask.iter().filter(|&&m| m == 1).count();
    assert!(
        kept > 0 && kept < mask.len(),
        "{kept} of {} kept",
        mask.len()
    );
}

#[test]
fn training_dropout_with_its_mask_output_trains() {
    for dropout in [Dropout::MaskUnread, Dropout::MaskRead] {
        let (_dir, path) = write(&lm(dropout), "lm_dropout.onnx");
        trains(&path, 1, 3);
    }
}
