//! The plan's memory is the run's memory, measured independently: this test
//! binary installs the counting allocator (`fsdpc_runtime::account`), which
//! attributes every heap byte to the rank whose threads allocated it, and
//! trains in the normal concurrent arena mode. A rank's measured peak (its
//! arena, kernel workspaces, the matrix library's packing buffers and
//! anything else its threads allocate during the steps) must not exceed the
//! plan's `memory.rank_bytes`, and must come within 2% of it.

use fsdpc_frontends::LoadOptions;
use fsdpc_ir::Optimizer;
use fsdpc_plan::{CheckpointPolicy, ModelInfo, Plan, Strategy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::{ExecMode, TrainOptions, TrainReport};

const GPT: &str = "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=4096,batch=4";
const MLP: &str = "mlp:layers=3,in=2048,hidden=2048,classes=10,batch=64";

fn cfg(strategy: Strategy, ckpt: CheckpointPolicy) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            activation_checkpointing: ckpt,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

fn train(plan: &Plan) -> TrainReport {
    let opts = TrainOptions {
        steps: 2,
        seed: 3,
        mode: ExecMode::Arena,
        ..TrainOptions::default()
    };
    fsdpc_runtime::train(plan, &opts, &mut |_| {}).expect("training runs")
}

/// Trains `spec` and checks measured <= planned <= measured + 2%.
fn check(spec: &str, world: u32, cfg: &FsdpConfig, optimizer: &Optimizer) {
    let plan = crate::common::host_plan(spec, world, cfg, optimizer);
    let r = train(&plan);
    let planned = plan.memory.rank_bytes;
    let measured = r
        .measured_peak_bytes
        .expect("the counting allocator is installed in this test binary");
    let what = format!(
        "{spec} world {world} T {} {:?} {:?}: measured {measured}, planned {planned} \
         (arena {}, heap {}, workspace {})",
        cfg.tensor_parallel,
        cfg.strategy,
        cfg.activation_checkpointing,
        plan.memory.arena_bytes,
        plan.memory.heap_bytes,
        plan.memory.workspace_bytes,
    );
    eprintln!("{what}");
    assert_eq!(r.planned_peak_bytes, planned, "{what}");
    assert!(
        measured <= planned,
        "a rank allocated more than planned: {what}"
    );
    assert!(
        (planned - measured) as f64 <= 0.02 * planned as f64,
        "the plan overstates the rank's memory by more than 2%: {what}"
    );
}

fn adamw() -> Optimizer {
    Optimizer::adamw(1e-3)
}

#[test]
fn gpt_full_shard_world_2() {
    check(
        GPT,
        2,
        &cfg(Strategy::FullShard, CheckpointPolicy::None),
        &adamw(),
    );
}

#[test]
fn gpt_full_shard_world_4() {
    check(
        GPT,
        4,
        &cfg(Strategy::FullShard, CheckpointPolicy::None),
        &adamw(),
    );
}

#[test]
fn gpt_no_shard_world_2() {
    check(
        GPT,
        2,
        &cfg(Strategy::NoShard, CheckpointPolicy::None),
        &adamw(),
    );
}

#[test]
fn gpt_full_shard_with_activation_checkpointing() {
    check(
        GPT,
        2,
        &cfg(Strategy::FullShard, CheckpointPolicy::Units),
        &adamw(),
    );
}

#[test]
fn mlp_with_sgd() {
    let sgd = Optimizer::Sgd {
        lr: 0.05,
        momentum: 0.9,
        weight_decay: 0.0,
    };
    check(
        MLP,
        2,
        &cfg(Strategy::FullShard, CheckpointPolicy::None),
        &sgd,
    );
}

/// The strategies that keep parameters gathered longer or replicate shards
/// (ZeRO-2, hybrid 2 x 2, a slice kept over 2 ranks): the plan still states
/// what the ranks hold.
#[test]
fn gpt_other_strategies_world_4() {
    use fsdpc_plan::ReshardAfterForward;
    for c in [
        cfg(Strategy::ShardGradOp, CheckpointPolicy::None),
        FsdpConfig {
            shard_factor: Some(2),
            ..cfg(Strategy::HybridShard, CheckpointPolicy::None)
        },
        FsdpConfig {
            reshard_after_forward: Some(ReshardAfterForward::To(2)),
            ..cfg(Strategy::FullShard, CheckpointPolicy::None)
        },
    ] {
        check(GPT, 4, &c, &adamw());
    }
}

/// Gradient accumulation: 2 micro-batches reduced each (partial shards
/// added into the gradient shard) and with `no_sync` (every flat gradient
/// held across the micro-batches).
#[test]
fn gpt_gradient_accumulation_world_2() {
    for no_sync in [false, true] {
        let c = FsdpConfig {
            settings: fsdpc_plan::Settings {
                grad_accum: 2,
                no_sync,
                ..(cfg(Strategy::FullShard, CheckpointPolicy::None)).settings
            },
            ..cfg(Strategy::FullShard, CheckpointPolicy::None)
        };
        check(
            "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=4096,batch=2",
            2,
            &c,
            &adamw(),
        );
    }
}

/// With this machine's matrix-product blocking in the cluster (what `fsdpc
/// calibrate` writes, `cpu::gemm_blocking`), the plan states the rank's
/// memory to within the packing bound's alignment slack: small models
/// whose heap is a large part of their memory (a 0.5 M-parameter MLP and
/// GPT, f32 and bf16) included.
#[test]
fn calibrated_blocking_makes_the_plan_exact() {
    let Some(blocking) = fsdpc_runtime::cpu::gemm_blocking() else {
        eprintln!("skipped: no gemm blocking is known for this CPU (not x86-64)");
        return;
    };
    let bf16 = FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: fsdpc_ir::DType::Bf16,
            reduce_dtype: fsdpc_ir::DType::Bf16,
            buffer_dtype: fsdpc_ir::DType::Bf16,
            ..(cfg(Strategy::FullShard, CheckpointPolicy::None)).settings
        },
        ..cfg(Strategy::FullShard, CheckpointPolicy::None)
    };
    for (spec, c) in [
        (
            "mlp:layers=2,in=512,hidden=512,classes=10,batch=64",
            cfg(Strategy::FullShard, CheckpointPolicy::None),
        ),
        (
            "gpt:layers=2,hidden=128,heads=4,seq=128,vocab=1024,batch=8",
            cfg(Strategy::NoShard, CheckpointPolicy::None),
        ),
        (
            "gpt:layers=2,hidden=128,heads=4,seq=128,vocab=1024,batch=8",
            bf16,
        ),
        (GPT, cfg(Strategy::FullShard, CheckpointPolicy::Units)),
    ] {
        let m = fsdpc_frontends::load(spec, &LoadOptions::default()).expect("model loads");
        let mut cluster = fsdpc_planner::preset("cpu-local", 2, 2).expect("preset");
        cluster.hardware.cpu_gemm = Some(blocking);
        let info = ModelInfo {
            tokens_per_rank_step: m.tokens_per_rank_step(),
            params: m.program.graph.param_numel(),
            name: m.name,
        };
        let plan = fsdpc_planner::compile(m.program, info, &cluster, &c).expect("plan compiles");
        let planned = plan.memory.rank_bytes;
        let measured = train(&plan)
            .measured_peak_bytes
            .expect("counting allocator");
        let what = format!(
            "{spec} {:?}: measured {measured}, planned {planned}",
            c.strategy
        );
        eprintln!("{what}");
        assert!(
            measured <= planned,
            "a rank allocated more than planned: {what}"
        );
        assert!(
            planned - measured <= 4096,
            "the plan overstates by more than 4 KiB: {what}"
        );
    }
}

/// Two-dimensional meshes: T = 2 tensor-parallel ranks with FSDP over the
/// other dimension (world 4: two data ranks), with recomputation, T = 4
/// alone (all with sequence parallelism), and T = 2 without it. Each rank
/// holds its slice of the split layers, the replicated layers and its
/// shard of both, and its chunks of the activations between, and the plan
/// states it.
#[test]
fn gpt_tensor_parallel_meshes() {
    let tp = |t: u32, ckpt| {
        let c = cfg(Strategy::FullShard, ckpt);
        FsdpConfig {
            settings: fsdpc_plan::Settings {
                tensor_parallel: t,
                ..c.settings
            },
            ..c
        }
    };
    check(GPT, 4, &tp(2, CheckpointPolicy::None), &adamw());
    check(GPT, 4, &tp(2, CheckpointPolicy::Units), &adamw());
    check(GPT, 4, &tp(4, CheckpointPolicy::None), &adamw());
    // Plain tensor parallelism: the activations between regions whole.
    let mut plain = tp(2, CheckpointPolicy::None);
    plain.sequence_parallel = false;
    check(GPT, 4, &plain, &adamw());
}

/// On a cluster of GPUs a plan states what a rank of the cuda target holds
/// outside the arena, line by line: the context, one cuBLAS workspace per
/// stream with matrix products (the compute stream), and NCCL's buffers
/// for each communicator its collectives use: full_shard gathers on the
/// unshard stream and reduce-scatters on the reduce stream over the shard
/// group, hybrid_shard adds the replicas' all-reduce, T = 2 the tensor
/// group's sums on the compute stream, and the loss report has its own.
/// One rank uses no NCCL; a CPU cluster has no such lines. The capacity
/// is checked against the live peak and these lines.
#[test]
fn a_gpu_plan_states_its_memory_outside_the_arena() {
    use fsdpc_plan::memory::{CUBLAS_WORKSPACE_BYTES, NCCL_CHANNEL_BYTES};
    use fsdpc_plan::OutsideKind;
    let spec = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=64,batch=2";
    let plan_on = |preset: &str, world: u32, c: FsdpConfig| {
        crate::common::compile_on(spec, preset, world, world.min(8), &c).expect("plan")
    };
    let cfg = |strategy: Strategy, t: u32| {
        let mut c = FsdpConfig::default();
        c.settings.strategy = strategy;
        c.settings.tensor_parallel = t;
        c
    };
    let channels = 32;
    for (world, strategy, t, comms) in [
        (8, Strategy::FullShard, 1, 3),
        (16, Strategy::HybridShard, 1, 4),
        (8, Strategy::FullShard, 2, 4),
        (1, Strategy::NoShard, 1, 0),
    ] {
        let plan = plan_on("h100-80g-ib", world, cfg(strategy, t));
        let what = format!("world {world} {strategy:?} T={t}");
        let lines: Vec<(OutsideKind, u64)> = plan
            .memory
            .outside_arena
            .iter()
            .map(|o| (o.kind, o.bytes))
            .collect();
        // The H100 preset's context and cuBLAS handle as measured on an
        // H200 (planner/src/presets/measured.rs).
        let mut want = vec![
            (OutsideKind::Context, 556_597_248),
            (
                OutsideKind::CublasWorkspace,
                CUBLAS_WORKSPACE_BYTES + (66 << 20),
            ),
        ];
        if comms > 0 {
            want.push((
                OutsideKind::NcclBuffers,
                comms * channels * NCCL_CHANNEL_BYTES,
            ));
        }
        assert_eq!(lines, want, "{what}");
        assert_eq!(
            plan.memory.device_peak_bytes(),
            plan.memory.peak_bytes + want.iter().map(|(_, b)| b).sum::<u64>(),
            "{what}"
        );
    }
    let cpu = plan_on("cpu-local", 2, cfg(Strategy::FullShard, 1));
    assert!(cpu.memory.outside_arena.is_empty());
    // A GPU whose memory holds the arena's peak but not the lines beside
    // it: refused, naming the bytes, unless the fit is not checked.
    let plan = plan_on("h100-80g-ib", 8, cfg(Strategy::FullShard, 1));
    let mut cluster = fsdpc_planner::preset("h100-80g-ib", 8, 8).expect("preset");
    cluster.memory_bytes = plan.memory.peak_bytes + plan.memory.outside_arena_bytes() / 2;
    let mut c = cfg(Strategy::FullShard, 1);
    c.check_fits = true;
    let e = crate::common::compile_for(spec, &cluster, &c).expect_err("does not fit");
    assert!(
        matches!(e, fsdpc_planner::PlanError::DoesNotFit { needed_bytes, .. } if needed_bytes == plan.memory.device_peak_bytes()),
        "{e}"
    );
    c.check_fits = false;
    crate::common::compile_for(spec, &cluster, &c).expect("compiles unchecked");
    // A context as large as the GPU: the error says that no world helps
    // and points at the cluster's figures, not at the model.
    let mut huge = fsdpc_planner::preset("h100-80g-ib", 8, 8).expect("preset");
    huge.hardware.context_bytes = huge.memory_bytes;
    c.check_fits = true;
    let e = crate::common::compile_for(spec, &huge, &c)
        .expect_err("does not fit")
        .to_string();
    assert!(
        e.contains("what a GPU rank holds outside the arena")
            && e.contains("check the cluster's context_bytes and nccl_channels"),
        "{e}"
    );
}
