//! `Kernels::PytorchEager`: a plan priced as PyTorch eager runs its
//! operators. Shape operators are views (a reshape copies only a strided
//! input), RMSNorm and cross-entropy are priced as PyTorch's composites
//! (the bytes and launches `scripts/eager-kernels.py` lists), and every
//! other kernel costs what it costs as fsdpc's.

use crate::common;
use crate::common::cli::{fsdpc, ok};

use fsdpc_ir::{Graph, Op};
use fsdpc_plan::cluster::Kernels;
use fsdpc_plan::{Cluster, InstrOp, Plan};
use fsdpc_planner::cost::eager::contiguous;
use fsdpc_planner::cost::instr_cost;
use fsdpc_planner::simulate::estimate_on;
use fsdpc_planner::FsdpConfig;

const LLAMA: &str = "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=512,seq=32,batch=2";

fn bf16() -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: fsdpc_ir::DType::Bf16,
            reduce_dtype: fsdpc_ir::DType::F32,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

/// An H100 preset whose kernels all run at memory bandwidth, whatever
/// their size, with a 5 us launch: the composites' costs in closed form.
fn flat_h100() -> Cluster {
    let mut c = fsdpc_planner::preset("h100-80g-ib", 2, 2).unwrap();
    c.hardware.kernel_bw.clear();
    c.hardware.bandwidth_by_size.clear();
    c.hardware.cache_bytes = 0.0;
    c.hardware.kernel_overhead_s = 5e-6;
    c
}

fn kernels(plan: &Plan) -> impl Iterator<Item = (&fsdpc_plan::Instr, fsdpc_ir::NodeId)> {
    plan.instructions.iter().filter_map(|i| match i.op {
        InstrOp::Kernel { node, .. } => Some((i, node)),
        _ => None,
    })
}

/// The elements of the node's first input and their size (0 for a node
/// without inputs).
fn input_numel(g: &Graph, node: fsdpc_ir::NodeId) -> (f64, f64) {
    g.inputs(node).first().map_or((0.0, 0.0), |v| {
        let t = g.value_type(*v);
        (t.numel() as f64, t.dtype.size() as f64)
    })
}

#[test]
fn eager_prices_views_and_composites_and_nothing_else() {
    let fused = flat_h100();
    let eager = Cluster {
        kernels: Kernels::PytorchEager,
        ..fused.clone()
    };
    let plan = common::compile_for(LLAMA, &fused, &bf16()).expect("plan");
    let g = &plan.training.graph;
    let (bw, launch) = (fused.hardware.mem_bw, fused.hardware.kernel_overhead_s);
    let mut seen = std::collections::BTreeMap::<&str, usize>::new();
    for (i, node) in kernels(&plan) {
        let (f, e) = (
            instr_cost(&plan, &fused, i).0,
            instr_cost(&plan, &eager, i).0,
        );
        let (n, size) = input_numel(g, node);
        let op = &g.node(node).op;
        let (kind, want) = match op {
            Op::Transpose { .. } | Op::Expand { .. } | Op::Slice { .. } => ("view", 0.0),
            Op::Reshape { .. } if contiguous(g, g.inputs(node)[0]) => ("view", 0.0),
            Op::Reshape { .. } => ("strided reshape", f),
            // 40 bytes per element of a bf16 input over 8 launches
            // forward, 104 over 17 backward.
            Op::RmsNorm { .. } => ("rms_norm", 8.0 * launch + 40.0 * n / bw),
            Op::RmsNormGrad { .. } => ("rms_norm_grad", 17.0 * launch + 104.0 * n / bw),
            // log_softmax writes the log-probabilities, its backward reads
            // them back beside the NLL gradient.
            Op::CrossEntropy { .. } => ("cross_entropy", 2.0 * launch + 2.0 * size * n / bw),
            Op::CrossEntropyGrad { .. } => {
                ("cross_entropy_grad", 2.0 * launch + 4.0 * size * n / bw)
            }
            _ => ("other", f),
        };
        *seen.entry(kind).or_default() += 1;
        assert!(
            (e - want).abs() <= 1e-9 * want.max(1e-9),
            "{kind} {op:?}: eager {e} s, want {want} s (fsdpc {f} s)"
        );
        if kind == "rms_norm" {
            assert_eq!(size, 2.0, "the activations are bf16");
            assert!(
                e > 5.0 * f,
                "the composite costs more than one kernel: {e} vs {f}"
            );
        }
    }
    for kind in [
        "view",
        "strided reshape",
        "rms_norm",
        "rms_norm_grad",
        "cross_entropy",
        "cross_entropy_grad",
        "other",
    ] {
        assert!(
            seen.get(kind).is_some_and(|&c| c > 0),
            "no {kind} kernel: {seen:?}"
        );
    }
    // The merged heads are a transpose then a reshape: one copy, as
    // PyTorch's `.transpose(1, 2).reshape(...)`.
    let merged = g
        .node_ids()
        .find(|&n| g.node(n).name.ends_with("merge_heads_reshape"))
        .expect("merge_heads_reshape");
    assert!(!contiguous(g, g.inputs(merged)[0]));
    assert_ne!(
        estimate_on(&plan, &fused).step_time_s,
        estimate_on(&plan, &eager).step_time_s
    );
}

#[test]
fn cluster_files_and_simulate_name_the_kernels() {
    let dir = tempfile::tempdir().unwrap();
    let plan = dir.path().join("plan.json");
    let plan = plan.to_str().unwrap();
    ok(&[
        "compile",
        LLAMA,
        "--world",
        "2",
        "--cluster",
        "h100-80g-ib",
        "-o",
        plan,
    ]);
    let own = ok(&["simulate", plan]);
    assert!(own.contains("(world 2):"), "{own}");
    let eager = ok(&["simulate", plan, "--kernels", "pytorch-eager"]);
    assert!(
        eager.contains("(world 2, pytorch-eager kernels):"),
        "{eager}"
    );
    let sim: serde_json::Value = serde_json::from_str(&ok(&[
        "simulate",
        plan,
        "--kernels",
        "pytorch-eager",
        "--json",
    ]))
    .unwrap();
    assert_eq!(sim["kernels"], "pytorch-eager");

    // A cluster file can name them; `--kernels fsdpc` overrides it.
    let file = fsdpc_planner::preset("h100-80g-ib", 2, 2).unwrap();
    let file = Cluster {
        kernels: Kernels::PytorchEager,
        ..file
    };
    let text = file.to_file(false);
    assert!(text.contains("\"kernels\": \"pytorch-eager\""), "{text}");
    let path = dir.path().join("eager.json");
    std::fs::write(&path, &text).unwrap();
    let path = path.to_str().unwrap();
    let from_file: serde_json::Value =
        serde_json::from_str(&ok(&["simulate", plan, "--cluster", path, "--json"])).unwrap();
    assert_eq!(from_file["kernels"], "pytorch-eager");
    assert_eq!(from_file["step_time_s"], sim["step_time_s"]);
    let back: serde_json::Value = serde_json::from_str(&ok(&[
        "simulate",
        plan,
        "--cluster",
        path,
        "--kernels",
        "fsdpc",
        "--json",
    ]))
    .unwrap();
    assert_eq!(back["kernels"], "fsdpc");

    // A misspelt value is one line naming the field and the choices.
    std::fs::write(path, text.replace("pytorch-eager", "eager")).unwrap();
    let o = fsdpc(&["simulate", plan, "--cluster", path]);
    assert!(!o.status.success());
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(
        msg.contains("\"eager\"") && msg.contains("`kernels` as \"fsdpc\" or \"pytorch-eager\""),
        "{msg}"
    );
    assert_eq!(msg.lines().count(), 1, "{msg}");
    std::fs::write(path, text.replace("\"pytorch-eager\"", "3")).unwrap();
    let o = fsdpc(&["simulate", plan, "--cluster", path]);
    assert!(!o.status.success());
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(msg.contains("integer `3`, expected `kernels`"), "{msg}");
    let o = fsdpc(&["simulate", plan, "--kernels", "torch"]);
    assert!(!o.status.success());
    let msg = String::from_utf8_lossy(&o.stderr);
    assert!(msg.contains("pytorch-eager"), "{msg}");
}
