//! A plan is made for a target: compiled for one, it holds only what that
//! target runs (its capabilities, data the planner reads), `inspect` names
//! the target, and a plan a target cannot run is refused before anything
//! starts, naming the instruction.

use crate::common;

use fsdpc_plan::target::Capabilities;
use fsdpc_plan::{CollectiveAlgorithm, InstrOp, Plan, Strategy, Wire};
use fsdpc_planner::{FsdpConfig, PlanError};
use std::process::Command;

const GPT: &str = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=2";

fn cuda() -> Capabilities {
    fsdpc_runtime::targets::capabilities("cuda").expect("the cuda target exists")
}

/// `cfg` on `world` ranks of `preset`, `per_node` to a node.
fn compile(cfg: &FsdpConfig, preset: &str, world: u32, per_node: u32) -> Result<Plan, PlanError> {
    common::compile_on(GPT, preset, world, per_node, cfg)
}

/// `cpu-local` with `per_node` ranks to a node and a slow network between
/// nodes (1/50 of the bandwidth, 10 x the latency), where the
/// hierarchical collectives pay.
fn two_level(world: u32, per_node: u32) -> fsdpc_plan::Cluster {
    let mut c = fsdpc_planner::preset("cpu-local", world, per_node).expect("preset");
    c.hardware.inter_bw = c.hardware.intra_bw / 50.0;
    c.hardware.inter_latency_s = c.hardware.intra_latency_s * 10.0;
    c
}

fn has_algorithm(plan: &Plan, a: CollectiveAlgorithm) -> bool {
    plan.instructions.iter().any(|i| match &i.op {
        InstrOp::AllGather { c, .. } | InstrOp::ReduceScatter { c } => c.algorithm == a,
        InstrOp::AllReduce { algorithm, .. } => *algorithm == a,
        _ => false,
    })
}

/// Across strategies, precisions, accumulation, clipping and clusters of
/// several nodes, a plan compiled for the cuda target passes its capability
/// check; on two nodes of two ranks behind a slow network the thread
/// ranks' plan uses the hierarchical collectives the cuda target does not
/// run, and the cuda plan does not.
#[test]
fn a_plan_for_cuda_holds_only_what_cuda_runs() {
    type Edit = fn(&mut FsdpConfig);
    let edits: [(&str, Edit); 6] = [
        ("full_shard", |_| {}),
        ("hybrid_shard", |c| c.strategy = Strategy::HybridShard),
        ("no_shard", |c| c.strategy = Strategy::NoShard),
        ("bf16", |c| {
            c.param_dtype = fsdpc_ir::DType::Bf16;
            c.reduce_dtype = fsdpc_ir::DType::Bf16;
        }),
        ("accumulation", |c| c.grad_accum = 2),
        ("clipping", |c| c.clip_grad_norm = Some(1.0)),
    ];
    for (name, edit) in edits {
        for (world, per_node) in [(4, 2), (8, 4), (2, 2)] {
            let cluster = two_level(world, per_node);
            let mut cfg = FsdpConfig::default();
            edit(&mut cfg);
            let threads = common::compile_for(GPT, &cluster, &cfg)
                .unwrap_or_else(|e| panic!("{name} at {world}: {e}"));
            cfg.target = cuda();
            let plan = common::compile_for(GPT, &cluster, &cfg)
                .unwrap_or_else(|e| panic!("{name} at {world} for cuda: {e}"));
            assert_eq!(plan.config.target, "cuda");
            assert_eq!(cuda().check(&plan), Ok(()), "{name} at {world}");
            assert!(
                !has_algorithm(&plan, CollectiveAlgorithm::Hierarchical)
                    && !has_algorithm(&plan, CollectiveAlgorithm::ReduceScatterAllGather),
                "{name} at {world}"
            );
            if name == "full_shard" && world == 4 {
                assert!(
                    has_algorithm(&threads, CollectiveAlgorithm::Hierarchical),
                    "two nodes of two ranks: the thread ranks' plan gathers hierarchically"
                );
                assert!(cuda().check(&threads).is_err());
            }
        }
    }
}

/// What the cuda target cannot run is refused when compiling for it, in
/// one message naming the flag and the target.
#[test]
fn settings_the_target_cannot_run_are_refused_naming_the_flag() {
    type Edit = fn(&mut FsdpConfig);
    let cases: [(&str, Edit); 3] = [
        ("--cpu-offload", |c| c.cpu_offload = true),
        ("--allgather-wire fp8", |c| {
            c.allgather_wire = Wire::parse("fp8", 256).expect("a wire format")
        }),
        ("fp16", |c| {
            c.param_dtype = fsdpc_ir::DType::F16;
            c.reduce_dtype = fsdpc_ir::DType::F16;
        }),
    ];
    for (flag, edit) in cases {
        let mut cfg = FsdpConfig::default();
        edit(&mut cfg);
        assert!(
            compile(&cfg, "cpu-local", 2, 2).is_ok(),
            "{flag} on threads"
        );
        cfg.target = cuda();
        let e = compile(&cfg, "cpu-local", 2, 2).expect_err(flag);
        let text = e.to_string();
        assert!(matches!(e, PlanError::Unsupported(_)), "{flag}: {e:?}");
        assert!(
            text.contains(flag) && text.contains("cuda target"),
            "{flag}: {text}"
        );
    }
}

/// A plan the cuda target cannot run is refused by its check, naming the
/// instruction: the first copy to a host buffer.
#[test]
fn a_plan_with_host_buffers_is_refused_at_its_first_copy() {
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            cpu_offload: true,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let plan = compile(&cfg, "cpu-local", 2, 2).expect("offload compiles for threads");
    let copy = plan
        .instructions
        .iter()
        .position(|i| matches!(i.op, InstrOp::Copy { .. }))
        .expect("an offloaded plan copies");
    let refusal = cuda().check(&plan).expect_err("cuda holds no host buffers");
    assert_eq!(refusal.instr, Some(copy));
    assert!(
        refusal
            .to_string()
            .starts_with(&format!("instruction {copy}: host buffer")),
        "{refusal}"
    );
}

fn fsdpc(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(args)
        .output()
        .expect("fsdpc runs")
}

/// `fsdpc compile --target cuda` writes a plan `inspect` says is for cuda;
/// one it cannot run is refused in one line; an unknown target is named.
#[test]
fn compile_for_a_target_and_inspect_names_it() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("plan.json");
    let p = path.to_str().expect("utf-8 path");
    let o = fsdpc(&["compile", GPT, "--world", "2", "--target", "cuda", "-o", p]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = fsdpc(&["inspect", p]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("target    cuda"), "{out}");
    let o = fsdpc(&[
        "compile",
        GPT,
        "--world",
        "2",
        "--target",
        "cuda",
        "--cpu-offload",
        "-o",
        p,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--cpu-offload does not run on the cuda target") && err.lines().count() == 1,
        "{err}"
    );
    let o = fsdpc(&["compile", GPT, "--world", "2", "--target", "tpu", "-o", p]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("tpu") && err.contains("threads"),
        "{err}"
    );
}

/// A plan made for thread ranks with offload, run on the cuda target: the
/// refusal names the instruction before any device work (without the
/// feature: the build says the target was not compiled in).
#[test]
fn a_plan_the_target_cannot_run_is_refused_before_it_starts() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = dir.path().join("plan.json");
    let p = path.to_str().expect("utf-8 path");
    let o = fsdpc(&[
        "compile",
        GPT,
        "--world",
        "1",
        "--cluster",
        "cpu-local",
        "--cpu-offload",
        "-o",
        p,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = fsdpc(&["train", p, "--target", "cuda", "--steps", "1"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && !err.contains("panicked"), "{err}");
    if cfg!(feature = "cuda") {
        assert!(
            err.contains("host buffer") && err.contains("does not run on the cuda target"),
            "{err}"
        );
    } else {
        assert!(err.contains("not compiled in"), "{err}");
    }
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}
