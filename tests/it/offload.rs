//! CPU offload (`--cpu-offload`): shards, gradient shards and optimizer
//! state in host memory, copied on the offload stream.
//!
//! Offload changes where bytes live, not the arithmetic: an offloaded run is
//! bit-identical to the same plan without offload (F = 2, 4 and hybrid
//! 2 x 2) and, like it, within `tests/it/equivalence.rs`'s tolerances of one
//! unsharded rank. The memory plan moves exactly the shard, gradient-shard
//! and optimizer-state bytes from the device to the host; the verifier
//! refuses a plan whose kernel or collective reads host memory, or whose
//! copies are out of order; `inspect` shows both peaks (snapshot); the CLI
//! flag and its refusals; checkpoints resume bit-identically.

use crate::common::{bits, max_loss_rel_diff, max_param_diff, plan_with, train};
use fsdpc_plan::Collective;
use fsdpc_plan::{BufferKind, InstrOp, Location, ModelInfo, Plan, PlanViolation, Strategy, Stream};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::ExecMode;
use std::process::Command;

const STEPS: u64 = 12;
/// The tolerances of `tests/it/equivalence.rs` (loss relative, parameter absolute).
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;

fn gpt(batch: u32) -> String {
    format!("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch={batch}")
}

fn mlp(batch: u32) -> String {
    format!("mlp:layers=3,in=16,hidden=32,classes=5,batch={batch}")
}

fn cfg(strategy: Strategy, f: Option<u32>, offload: bool) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            cpu_offload: offload,
            ..fsdpc_plan::Settings::default()
        },
        shard_factor: f,
        ..FsdpConfig::default()
    }
}

/// The layouts under test: (name, world, strategy, F).
const LAYOUTS: [(&str, u32, Strategy, Option<u32>); 3] = [
    ("full_shard F=2", 2, Strategy::FullShard, None),
    ("full_shard F=4", 4, Strategy::FullShard, None),
    ("hybrid_shard 2x2", 4, Strategy::HybridShard, Some(2)),
];

/// Trains every layout with and without offload at a global batch of 8:
/// bit-identical to each other, within the tolerances of one rank.
fn check_family(spec: impl Fn(u32) -> String) {
    let reference = train(
        &plan_with(&spec(8), 1, &cfg(Strategy::NoShard, None, false)),
        STEPS,
        ExecMode::Arena,
    );
    for (name, world, strategy, f) in LAYOUTS {
        let model = spec(8 / world);
        let plain = train(
            &plan_with(&model, world, &cfg(strategy, f, false)),
            STEPS,
            ExecMode::Arena,
        );
        let offloaded = plan_with(&model, world, &cfg(strategy, f, true));
        let r = train(&offloaded, STEPS, ExecMode::Arena);
        assert_eq!(
            bits(&r),
            bits(&plain),
            "{model} {name}: offload must not change a bit"
        );
        let loss_rel = max_loss_rel_diff(&reference, &r);
        let (abs, _) = max_param_diff(&reference, &r);
        eprintln!(
            "{model} {name} offloaded: max loss rel diff {loss_rel:e}, max param abs diff {abs:e}"
        );
        assert!(
            loss_rel <= LOSS_RTOL,
            "{name}: losses differ by {loss_rel:e}"
        );
        assert!(abs <= PARAM_ATOL, "{name}: parameters differ by {abs:e}");
    }
}

#[test]
fn gpt_offloaded_equals_not_offloaded_and_one_rank() {
    check_family(gpt);
}

#[test]
fn mlp_offloaded_equals_not_offloaded_and_one_rank() {
    check_family(mlp);
}

/// The debug executor (one allocation per buffer, the list in order) runs
/// the copies too, and gives the same bits.
#[test]
fn debug_executor_runs_the_copies() {
    let p = plan_with(&gpt(4), 2, &cfg(Strategy::FullShard, None, true));
    let arena = train(&p, 3, ExecMode::Arena);
    let debug = train(&p, 3, ExecMode::DebugAlloc);
    assert_eq!(bits(&arena), bits(&debug));
}

/// Offload combined with the other controls (clipping, bf16 and fp16 mixed
/// precision with its loss scaler, gradient accumulation with and without
/// `no_sync`, ZeRO-2): still bit-identical to the same plan without it.
#[test]
fn offload_combines_with_every_other_control() {
    use fsdpc_ir::DType;
    let base = cfg(Strategy::FullShard, None, false);
    let half = |d: DType| FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: d,
            reduce_dtype: d,
            buffer_dtype: d,
            ..base.settings.clone()
        },
        ..base.clone()
    };
    let combos: Vec<(&str, FsdpConfig)> = vec![
        (
            "clip 0.5",
            FsdpConfig {
                settings: fsdpc_plan::Settings {
                    clip_grad_norm: Some(0.5),
                    ..base.settings.clone()
                },
                ..base.clone()
            },
        ),
        ("bf16", half(DType::Bf16)),
        ("fp16", half(DType::F16)),
        (
            "grad_accum 2",
            FsdpConfig {
                settings: fsdpc_plan::Settings {
                    grad_accum: 2,
                    ..base.settings.clone()
                },
                ..base.clone()
            },
        ),
        (
            "grad_accum 2 no_sync",
            FsdpConfig {
                settings: fsdpc_plan::Settings {
                    grad_accum: 2,
                    no_sync: true,
                    ..base.settings.clone()
                },
                ..base.clone()
            },
        ),
        (
            "shard_grad_op",
            FsdpConfig {
                settings: fsdpc_plan::Settings {
                    strategy: Strategy::ShardGradOp,
                    ..base.settings.clone()
                },
                ..base.clone()
            },
        ),
    ];
    for (name, c) in combos {
        let plain = train(&plan_with(&gpt(4), 2, &c), 6, ExecMode::Arena);
        let off_cfg = FsdpConfig {
            settings: fsdpc_plan::Settings {
                cpu_offload: true,
                ..c.settings.clone()
            },
            ..c
        };
        let r = train(&plan_with(&gpt(4), 2, &off_cfg), 6, ExecMode::Arena);
        assert_eq!(
            bits(&r),
            bits(&plain),
            "{name}: offload must not change a bit"
        );
    }
}

const GPT4: &str = "gpt:layers=4,hidden=64,heads=2,seq=16,vocab=128,batch=2";

/// Bytes per rank of the offloaded kinds, from the layout: each unit's
/// parameter shard, and for each unit with gradients its gradient shard
/// and the optimizer's state slots over the trainable part, all f32.
fn offloaded_bytes_from_layout(p: &Plan) -> u64 {
    let slots = p.training.optimizer.state_slots() as u64;
    p.units
        .iter()
        .filter(|u| u.flat_numel > 0)
        .map(|u| {
            let trains = p
                .buffers
                .iter()
                .any(|b| b.unit == Some(u.id) && b.kind == BufferKind::ShardGrads);
            let grad = if trains {
                u.trainable_shard_numel() * 4
            } else {
                0
            };
            u.shard_numel * 4 + grad * (1 + slots)
        })
        .sum()
}

fn bytes_of(p: &Plan, kinds: &[BufferKind]) -> u64 {
    p.buffers
        .iter()
        .filter(|b| kinds.contains(&b.kind))
        .map(|b| b.bytes)
        .sum()
}

/// The memory plan: the host holds exactly the shards, gradient shards and
/// optimizer state (their bytes by the layout's arithmetic); the device
/// holds none of them, only staged copies while a gather or reduction
/// uses them: its peak drops by exactly those bytes, less at most one
/// staged parameter shard and one staged gradient shard.
#[test]
fn host_holds_shards_grads_and_state_and_the_device_peak_drops_by_them() {
    const OFFLOADED: [BufferKind; 3] = [
        BufferKind::ShardParams,
        BufferKind::ShardGrads,
        BufferKind::OptimizerState,
    ];
    const STAGED: [BufferKind; 2] = [BufferKind::StagedParams, BufferKind::StagedGrads];
    for (name, world, strategy, f) in LAYOUTS {
        let plain = plan_with(GPT4, world, &cfg(strategy, f, false));
        let off = plan_with(GPT4, world, &cfg(strategy, f, true));
        let host = offloaded_bytes_from_layout(&off);
        assert_eq!(bytes_of(&off, &OFFLOADED), host, "{name}");
        assert_eq!(bytes_of(&plain, &OFFLOADED), host, "{name}");
        assert_eq!(off.memory.host_peak_bytes, host, "{name}");
        assert!(off.memory.host_arena_bytes >= host, "{name}");
        assert_eq!(plain.memory.host_peak_bytes, 0, "{name}");
        assert_eq!(plain.memory.host_arena_bytes, 0, "{name}");
        for b in &off.buffers {
            let on_host = OFFLOADED.contains(&b.kind);
            assert_eq!(b.location == Location::Host, on_host, "{name}: {b:?}");
        }
        // Persistent, so all of them are at the plan's peak without
        // offload; with it, none is on the device.
        let at_peak = |p: &Plan, kinds: &[BufferKind]| -> u64 {
            p.memory
                .breakdown
                .iter()
                .filter(|(k, _)| kinds.contains(k))
                .map(|(_, b)| b)
                .sum()
        };
        assert_eq!(at_peak(&plain, &OFFLOADED), host, "{name}");
        assert_eq!(at_peak(&off, &OFFLOADED), 0, "{name}");
        // Without the staged copies, the device's live bytes are exactly
        // the plain plan's less the host bytes, at every instruction: the
        // same buffers (their indices shift by the inserted copies and
        // events), so the same maximum.
        let n = off.instructions.len();
        let unstaged: Vec<_> = off
            .buffers
            .iter()
            .filter(|b| b.location == Location::Device && !STAGED.contains(&b.kind))
            .cloned()
            .collect();
        let unstaged_peak = fsdpc_plan::memory::live_bytes(&unstaged, n)
            .into_iter()
            .max()
            .unwrap_or(0);
        assert_eq!(unstaged_peak, plain.memory.peak_bytes - host, "{name}");
        // The staged copies add at most one parameter shard and one
        // gradient shard (a gather's and a reduction's, in flight at once).
        let largest = |k: BufferKind| {
            off.buffers
                .iter()
                .filter(|b| b.kind == k)
                .map(|b| b.bytes)
                .max()
                .unwrap_or(0)
        };
        let staged_max = largest(BufferKind::StagedParams) + largest(BufferKind::StagedGrads);
        eprintln!(
            "{name}: device peak {} -> {} (host {host}, staged at the peak {}, at most {staged_max})",
            plain.memory.peak_bytes,
            off.memory.peak_bytes,
            at_peak(&off, &STAGED)
        );
        assert!(
            off.memory.peak_bytes >= plain.memory.peak_bytes - host,
            "{name}"
        );
        assert!(
            off.memory.peak_bytes <= plain.memory.peak_bytes - host + staged_max,
            "{name}"
        );
        assert_eq!(
            off.memory.rank_bytes,
            off.memory.arena_bytes + off.memory.host_arena_bytes + off.memory.heap_bytes
        );
    }
}

/// Every gather reads a staged copy made on the offload stream, every
/// reduction writes one copied to the host on the reduce stream before
/// the optimizer step.
#[test]
fn copies_run_on_the_offload_stream_around_every_gather_and_reduction() {
    let off = plan_with(GPT4, 4, &cfg(Strategy::HybridShard, Some(2), true));
    let count = |f: &dyn Fn(&InstrOp) -> bool| off.instructions.iter().filter(|i| f(&i.op)).count();
    let gathers = count(&|o| matches!(o, InstrOp::AllGather { .. }));
    let scatters = count(&|o| matches!(o, InstrOp::ReduceScatter { .. }));
    let copies = count(&|o| matches!(o, InstrOp::Copy { .. }));
    assert_eq!(copies, gathers + scatters);
    for ins in &off.instructions {
        if let InstrOp::Copy { dst, .. } = ins.op {
            let expected = match off.buffers[dst.index()].location {
                Location::Device => Stream::Offload,
                Location::Host => Stream::Reduce,
            };
            assert_eq!(ins.stream, expected);
        }
        if let InstrOp::AllGather {
            c: Collective { src, .. },
            ..
        } = ins.op
        {
            assert_eq!(off.buffers[src.index()].kind, BufferKind::StagedParams);
        }
    }
}

fn violations(p: &Plan) -> Vec<PlanViolation> {
    p.validate().err().unwrap_or_default()
}

/// The verifier: a kernel or collective reading host memory, a copy on the
/// wrong stream, a gather before its copy, a buffer in the wrong memory.
#[test]
fn verifier_refuses_host_reads_and_unordered_copies() {
    let good = plan_with(&gpt(2), 2, &cfg(Strategy::FullShard, None, true));
    good.validate().expect("validates");

    // A gather straight from the host shard.
    let mut bad = good.clone();
    let (i, shard) = bad
        .instructions
        .iter()
        .enumerate()
        .find_map(|(i, ins)| match ins.op {
            InstrOp::Copy { src, .. } if bad.buffers[src.index()].location == Location::Host => {
                Some((i, src))
            }
            _ => None,
        })
        .expect("a copy in");
    let g = (i..bad.instructions.len())
        .find(|&j| matches!(bad.instructions[j].op, InstrOp::AllGather { .. }))
        .expect("its gather");
    if let InstrOp::AllGather {
        c: Collective { src, .. },
        ..
    } = &mut bad.instructions[g].op
    {
        *src = shard;
    }
    let v = violations(&bad);
    assert!(
        v.iter()
            .any(|v| matches!(v, PlanViolation::HostAccess { instr, buffer }
            if *instr as usize == g && *buffer == shard)),
        "{v:?}"
    );

    // The copy in on the unshard stream.
    let mut bad = good.clone();
    bad.instructions[i].stream = Stream::Unshard;
    let v = violations(&bad);
    assert!(
        v.iter().any(
            |v| matches!(v, PlanViolation::Offload { instr: Some(x), .. } if *x as usize == i)
        ),
        "{v:?}"
    );

    // The gather's wait for the copy removed: it may read the staged
    // buffer before the copy fills it.
    let mut bad = good.clone();
    let wait = (i..g)
        .rev()
        .find(|&j| {
            bad.instructions[j].stream == Stream::Unshard
                && matches!(bad.instructions[j].op, InstrOp::Wait { .. })
        })
        .expect("the gather waits for its copy");
    bad.instructions.remove(wait);
    let v = violations(&bad);
    assert!(
        v.iter().any(|v| matches!(v, PlanViolation::Offload { .. })),
        "{v:?}"
    );

    // A shard on the device in an offloaded plan.
    let mut bad = good.clone();
    bad.buffers[shard.index()].location = Location::Device;
    assert!(!violations(&bad).is_empty());

    // An offloaded plan survives its JSON round trip (locations, host
    // figures, the offload stream).
    let back = Plan::from_json(&good.to_json_pretty().expect("serialises")).expect("loads");
    assert_eq!(back.buffers, good.buffers);
    assert_eq!(back.memory, good.memory);
    assert!(back.streams.contains(&Stream::Offload));

    // A plan written before offload existed (no location, no host fields)
    // still loads, everything on the device.
    let plain = plan_with(&gpt(2), 2, &cfg(Strategy::FullShard, None, false));
    let json = plain.to_json_pretty().expect("serialises");
    assert!(!json.contains("location") && !json.contains("cpu_offload"));
    let back = Plan::from_json(&json).expect("loads");
    assert!(back.buffers.iter().all(|b| b.location == Location::Device));
}

#[test]
fn no_shard_cannot_offload() {
    let m = fsdpc_frontends::load(&gpt(2), &Default::default()).expect("loads");
    let cluster = fsdpc_planner::preset("cpu-local", 2, 2).expect("preset");
    let info = ModelInfo {
        name: m.name.clone(),
        params: 0,
        tokens_per_rank_step: 1,
    };
    let err = fsdpc_planner::compile(
        m.program,
        info,
        &cluster,
        &cfg(Strategy::NoShard, None, true),
    )
    .expect_err("no_shard reads parameters in place");
    assert!(err.to_string().contains("cpu_offload"), "{err}");
}

/// `inspect` of an offloaded plan on two A100 nodes: both peaks, the host
/// breakdown, the copies and their stream.
#[test]
fn inspect_shows_device_and_host_memory() {
    let m = fsdpc_frontends::load(GPT4, &Default::default()).expect("loads");
    let cluster = fsdpc_planner::preset("a100-80g-roce", 8, 4).expect("preset");
    let info = ModelInfo {
        name: m.name.clone(),
        params: m.program.graph.param_numel(),
        tokens_per_rank_step: m.tokens_per_rank_step(),
    };
    let p = fsdpc_planner::compile(
        m.program,
        info,
        &cluster,
        &cfg(Strategy::FullShard, None, true),
    )
    .expect("compiles");
    insta::assert_snapshot!(
        "inspect_cpu_offload",
        fsdpc_report::inspect::render_text(&p)
    );
}

fn fsdpc(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(args)
        .output()
        .expect("fsdpc runs")
}

/// `compile --cpu-offload` writes an offloaded plan that `train` runs;
/// `train plan.json --cpu-offload` is refused (the plan decided it).
#[test]
fn cli_flag_and_its_refusal_with_a_plan() {
    let dir = std::env::temp_dir().join(format!("fsdpc-offload-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("offload.json");
    let p = path.to_str().expect("utf8");
    let model = gpt(2);
    let o = fsdpc(&[
        "compile",
        &model,
        "--world",
        "2",
        "--preset",
        "cpu-local",
        "--cpu-offload",
        "-o",
        p,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let plan = Plan::from_json(&std::fs::read_to_string(&path).expect("written")).expect("loads");
    assert!(plan.config.cpu_offload);
    assert!(plan.memory.host_peak_bytes > 0);
    let o = fsdpc(&["train", p, "--steps", "2"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = fsdpc(&["train", p, "--steps", "1", "--cpu-offload"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("--cpu-offload"), "{err}");
    let o = fsdpc(&[
        "compile",
        &model,
        "--world",
        "2",
        "--strategy",
        "no_shard",
        "--cpu-offload",
        "-o",
        p,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("cpu_offload") && !err.contains("panicked"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Checkpoints read and write the shards where they live: an offloaded run
/// checkpointed at step 3 and resumed to step 6 is bit-identical to six
/// steps in one go (and to the run without offload).
#[test]
fn offloaded_checkpoint_resumes_bit_identical() {
    use fsdpc_runtime::train::CheckpointConfig;
    use fsdpc_runtime::TrainOptions;
    let p = plan_with(&gpt(4), 2, &cfg(Strategy::FullShard, None, true));
    let plain = plan_with(&gpt(4), 2, &cfg(Strategy::FullShard, None, false));
    let opts = |steps| TrainOptions {
        steps,
        seed: 11,
        ..TrainOptions::default()
    };
    let run = |plan: &Plan, o: &TrainOptions| {
        fsdpc_runtime::train(plan, o, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"))
    };
    let full = run(&p, &opts(6));
    assert_eq!(bits(&full), bits(&run(&plain, &opts(6))));
    let dir = std::env::temp_dir().join(format!("fsdpc-offload-ckpt-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let first = run(
        &p,
        &TrainOptions {
            checkpoint: Some(CheckpointConfig {
                dir: dir.clone(),
                every: 3,
            }),
            ..opts(3)
        },
    );
    let rest = run(
        &p,
        &TrainOptions {
            resume: Some(dir.clone()),
            ..opts(6)
        },
    );
    let (full_loss, full_params) = bits(&full);
    assert_eq!(bits(&first).0, full_loss[..3]);
    assert_eq!(bits(&rest).0, full_loss[3..]);
    assert_eq!(bits(&rest).1, full_params);
    let _ = std::fs::remove_dir_all(&dir);
}
