//! Every sharding strategy and gather control trains like one unsharded
//! rank: `shard_grad_op`, `hybrid_shard` and `hybrid_shard_zero2` at
//! F = 2, 4, 8 and hybrid layouts 2 x 2, 2 x 4 and 4 x 2 (groups x F),
//! `reshard_after_forward` as a number of ranks, and the prefetch controls.
//!
//! The global batch is fixed (8 samples a step), as in `equivalence.rs`, and
//! the tolerances against the 1-rank run are that file's. Where two settings
//! sum gradients in the same order they must agree bit for bit: every
//! strategy with the same F and world reduce-scatters the same flat
//! gradients over the same group, so whether parameters stay gathered, are
//! kept as a slice or are gathered earlier changes no value; hybrid
//! sharding sums within the group first, then across the replicas, an order
//! that differs from one reduce-scatter over the world (hence compared with
//! one rank within the tolerance only).

use crate::common::{bits, compile_on, max_loss_rel_diff, max_param_diff, plan_with, train};
use fsdpc_plan::Collective;
use fsdpc_plan::{BackwardPrefetch, Group, InstrOp, Plan, ReshardAfterForward, Strategy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::{ExecMode, TrainReport};

const STEPS: u64 = 20;
/// The tolerances of `tests/it/equivalence.rs` (loss relative, parameter absolute).
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;

fn gpt(batch: u32) -> String {
    format!("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch={batch}")
}

fn mlp(batch: u32) -> String {
    format!("mlp:layers=3,in=16,hidden=32,classes=5,batch={batch}")
}

/// One setting under test.
#[derive(Clone, Debug)]
struct Setting {
    name: &'static str,
    world: u32,
    cfg: FsdpConfig,
}

fn setting(name: &'static str, world: u32, strategy: Strategy, f: Option<u32>) -> Setting {
    Setting {
        name,
        world,
        cfg: FsdpConfig {
            settings: fsdpc_plan::Settings {
                strategy,
                ..fsdpc_plan::Settings::default()
            },
            shard_factor: f,
            ..FsdpConfig::default()
        },
    }
}

fn with(mut s: Setting, name: &'static str, edit: impl FnOnce(&mut FsdpConfig)) -> Setting {
    s.name = name;
    edit(&mut s.cfg);
    s
}

fn settings() -> Vec<Setting> {
    let fs4 = setting("full_shard F=4", 4, Strategy::FullShard, None);
    let h8 = setting("hybrid_shard 2x4", 8, Strategy::HybridShard, Some(4));
    vec![
        setting("shard_grad_op F=2", 2, Strategy::ShardGradOp, None),
        setting("shard_grad_op F=4", 4, Strategy::ShardGradOp, None),
        setting("shard_grad_op F=8", 8, Strategy::ShardGradOp, None),
        fs4.clone(),
        setting("full_shard F=8", 8, Strategy::FullShard, None),
        with(fs4.clone(), "full_shard F=4 reshard 2", |c| {
            c.reshard_after_forward = Some(ReshardAfterForward::To(2))
        }),
        with(fs4.clone(), "full_shard F=4 reshard false", |c| {
            c.reshard_after_forward = Some(ReshardAfterForward::Keep)
        }),
        with(fs4.clone(), "full_shard F=4 no forward prefetch", |c| {
            c.forward_prefetch = false
        }),
        with(fs4.clone(), "full_shard F=4 depth 3 limit 4", |c| {
            c.prefetch_depth = 3;
            c.limit_all_gathers = 4;
        }),
        with(fs4, "full_shard F=4 depth 2 post", |c| {
            c.prefetch_depth = 2;
            c.backward_prefetch = BackwardPrefetch::Post;
        }),
        setting("hybrid_shard 2x2", 4, Strategy::HybridShard, Some(2)),
        setting(
            "hybrid_shard_zero2 2x2",
            4,
            Strategy::HybridShardZero2,
            Some(2),
        ),
        h8.clone(),
        setting(
            "hybrid_shard_zero2 2x4",
            8,
            Strategy::HybridShardZero2,
            Some(4),
        ),
        with(h8, "hybrid_shard 2x4 reshard 2", |c| {
            c.reshard_after_forward = Some(ReshardAfterForward::To(2))
        }),
        setting("hybrid_shard 4x2", 8, Strategy::HybridShard, Some(2)),
        // full_shard with F < world is hybrid sharding by another name.
        setting("full_shard 4x2", 8, Strategy::FullShard, Some(2)),
    ]
}

/// Trains every setting of `family` and checks each against one rank, then
/// the groups that must be bit-identical.
fn check_family(spec: impl Fn(u32) -> String) {
    let reference_cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy: Strategy::NoShard,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let reference = train(
        &plan_with(&spec(8), 1, &reference_cfg),
        STEPS,
        ExecMode::Arena,
    );
    let mut runs: Vec<(&'static str, TrainReport)> = Vec::new();
    for s in settings() {
        let p = plan_with(&spec(8 / s.world), s.world, &s.cfg);
        let r = train(&p, STEPS, ExecMode::Arena);
        let loss_rel = max_loss_rel_diff(&reference, &r);
        let (abs, _) = max_param_diff(&reference, &r);
        eprintln!(
            "{}: {}: max loss rel diff {loss_rel:e}, max param abs diff {abs:e}",
            spec(8 / s.world),
            s.name
        );
        assert!(
            loss_rel <= LOSS_RTOL,
            "{}: losses differ by {loss_rel:e}",
            s.name
        );
        assert!(
            abs <= PARAM_ATOL,
            "{}: parameters differ by {abs:e}",
            s.name
        );
        runs.push((s.name, r));
    }
    let run = |name: &str| &runs.iter().find(|(n, _)| *n == name).expect("ran").1;
    for (a, b) in [
        ("full_shard F=4", "shard_grad_op F=4"),
        ("full_shard F=4", "full_shard F=4 reshard 2"),
        ("full_shard F=4", "full_shard F=4 reshard false"),
        ("full_shard F=4", "full_shard F=4 no forward prefetch"),
        ("full_shard F=4", "full_shard F=4 depth 3 limit 4"),
        ("full_shard F=4", "full_shard F=4 depth 2 post"),
        ("full_shard F=8", "shard_grad_op F=8"),
        ("hybrid_shard 2x2", "hybrid_shard_zero2 2x2"),
        ("hybrid_shard 2x4", "hybrid_shard_zero2 2x4"),
        ("hybrid_shard 2x4", "hybrid_shard 2x4 reshard 2"),
        ("hybrid_shard 4x2", "full_shard 4x2"),
    ] {
        assert_eq!(
            bits(run(a)),
            bits(run(b)),
            "{a} and {b} must be bit-identical"
        );
    }
}

#[test]
fn gpt_every_strategy_equals_unsharded() {
    check_family(gpt);
}

#[test]
fn mlp_every_strategy_equals_unsharded() {
    check_family(mlp);
}

fn count(plan: &Plan, f: impl Fn(&InstrOp) -> bool) -> usize {
    plan.instructions.iter().filter(|i| f(&i.op)).count()
}

fn gpt4(world: u32, cfg: FsdpConfig) -> Plan {
    plan_with(
        "gpt:layers=4,hidden=64,heads=2,seq=16,vocab=128,batch=2",
        world,
        &cfg,
    )
}

fn cfg(strategy: Strategy, f: Option<u32>) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            ..fsdpc_plan::Settings::default()
        },
        shard_factor: f,
        ..FsdpConfig::default()
    }
}

/// The plan's collectives per strategy: the groups they run over, how many
/// all-gathers, and the memory they trade.
#[test]
fn strategies_change_collectives_and_memory_as_documented() {
    let full = gpt4(8, cfg(Strategy::FullShard, None));
    let zero2 = gpt4(8, cfg(Strategy::ShardGradOp, None));
    let hybrid = gpt4(8, cfg(Strategy::HybridShard, Some(4)));
    let hpz = gpt4(
        8,
        FsdpConfig {
            reshard_after_forward: Some(ReshardAfterForward::To(2)),
            ..cfg(Strategy::FullShard, None)
        },
    );
    let gathers = |p: &Plan| count(p, |o| matches!(o, InstrOp::AllGather { .. }));
    let units = full.units.len();
    // ZeRO-2 gathers each unit once; ZeRO-3 gathers non-root units again
    // for backward.
    assert_eq!(gathers(&zero2), units);
    assert!(gathers(&full) > gathers(&zero2));
    // ...and holds them all from forward to backward: a higher peak.
    assert!(zero2.memory.peak_bytes > full.memory.peak_bytes);
    // Hybrid: sharded over F = 4 (shards about twice full_shard's at F =
    // 8), one all-reduce of each gradient shard across the two replicas.
    assert_eq!(hybrid.config.shard_factor, 4);
    for (h, f) in hybrid.units.iter().zip(&full.units) {
        assert_eq!(h.shard_numel * 4, h.padded_numel);
        assert!(h.shard_numel >= 2 * f.shard_numel - 1);
    }
    let replica_reduces = count(&hybrid, |o| {
        matches!(
            o,
            InstrOp::AllReduce {
                group: Group::Replicate,
                ..
            }
        )
    });
    let scatters = count(&hybrid, |o| matches!(o, InstrOp::ReduceScatter { .. }));
    assert_eq!(replica_reduces, scatters);
    assert_eq!(count(&full, |o| matches!(o, InstrOp::AllReduce { .. })), 0);
    // hpZ: every backward gather of a resharded unit reads a slice over the
    // reshard group; each slice is kept once and freed after its gather.
    let sliced = count(&hpz, |o| {
        matches!(
            o,
            InstrOp::AllGather {
                c: Collective {
                    group: Group::Reshard,
                    ..
                },
                ..
            }
        )
    });
    let kept = count(&hpz, |o| matches!(o, InstrOp::Reshard { .. }));
    assert!(sliced > 0);
    assert_eq!(sliced, kept);
    for p in [&full, &zero2, &hybrid, &hpz] {
        p.validate().expect("validates");
    }
}

#[test]
fn shard_factor_must_divide_the_world() {
    let err = compile_on(
        "gpt-mini",
        "cpu-local",
        6,
        6,
        &cfg(Strategy::HybridShard, Some(4)),
    )
    .expect_err("4 does not divide 6");
    let text = err.to_string();
    assert!(text.contains("1, 2, 3, 6"), "{text}");
    let err = compile_on(
        "gpt-mini",
        "cpu-local",
        6,
        6,
        &FsdpConfig {
            reshard_after_forward: Some(ReshardAfterForward::To(4)),
            ..cfg(Strategy::FullShard, None)
        },
    )
    .expect_err("4 does not divide 6");
    assert!(
        err.to_string().contains("must divide the shard factor 6"),
        "{err}"
    );
}

/// `gpt4` planned for two nodes of 4 ranks (A100 preset) with `cfg`.
fn two_nodes(cfg: &FsdpConfig) -> Plan {
    compile_on(
        "gpt:layers=4,hidden=64,heads=2,seq=16,vocab=128,batch=2",
        "a100-80g-roce",
        8,
        4,
        cfg,
    )
    .expect("compiles")
}

/// How each strategy control changes the memory breakdown at the peak and
/// the bytes sent inside and across nodes (two nodes of 4 ranks), as
/// `fsdpc inspect` reports them; and the whole inspect text of one hybrid
/// plan that keeps a slice over 2 ranks.
#[test]
fn inspect_shows_what_each_strategy_changes() {
    use fsdpc_plan::readable::human_bytes;
    use fsdpc_report::inspect::{render_text, summary};
    use std::fmt::Write;
    let reshard = |n| FsdpConfig {
        reshard_after_forward: Some(n),
        ..cfg(Strategy::FullShard, None)
    };
    let rows = [
        ("full_shard", cfg(Strategy::FullShard, None)),
        ("shard_grad_op", cfg(Strategy::ShardGradOp, None)),
        ("hybrid_shard", cfg(Strategy::HybridShard, None)),
        ("hybrid_shard_zero2", cfg(Strategy::HybridShardZero2, None)),
        ("full_shard reshard 4", reshard(ReshardAfterForward::To(4))),
        ("no_shard", cfg(Strategy::NoShard, None)),
    ];
    let mut out = String::new();
    for (name, c) in &rows {
        let s = summary(&two_nodes(c));
        let _ = writeln!(
            out,
            "{name} (F = {}): peak {}, across nodes {}",
            s.shard_factor,
            human_bytes(s.peak_bytes_per_rank),
            human_bytes(s.inter_node_bytes)
        );
        for (kind, bytes) in &s.breakdown {
            let _ = writeln!(out, "  {kind:?} {}", human_bytes(*bytes));
        }
        for t in &s.traffic {
            let _ = writeln!(
                out,
                "  {} over {:?} ({} ranks, {}): x{} {}",
                t.op,
                t.group,
                t.ranks,
                if t.inter_node {
                    "inter-node"
                } else {
                    "intra-node"
                },
                t.count,
                human_bytes(t.bytes_sent)
            );
        }
    }
    insta::assert_snapshot!("strategy_comparison", out);
    let hpz = FsdpConfig {
        reshard_after_forward: Some(ReshardAfterForward::To(2)),
        ..cfg(Strategy::HybridShard, None)
    };
    insta::assert_snapshot!("hybrid_reshard_2_inspect", render_text(&two_nodes(&hpz)));
}

/// Controls combined: a kept slice over 2 of F = 4 ranks, forward prefetch
/// off, 2 micro-batches, clipping and checkpointing of every other unit;
/// and hybrid ZeRO-2 (2 x 2) with `no_sync` accumulation and clipping:
/// each against one rank with the same clipping on the global batch.
#[test]
fn combined_controls_equal_one_rank() {
    use fsdpc_plan::CheckpointPolicy;
    const CLIP: f64 = 0.05;
    let reference = train(
        &plan_with(
            &gpt(8),
            1,
            &FsdpConfig {
                settings: fsdpc_plan::Settings {
                    strategy: Strategy::NoShard,
                    clip_grad_norm: Some(CLIP),
                    ..fsdpc_plan::Settings::default()
                },
                ..FsdpConfig::default()
            },
        ),
        STEPS,
        ExecMode::Arena,
    );
    let combos = [
        (
            "full_shard F=4, reshard 2, no forward prefetch, K=2, clip, every:2",
            FsdpConfig {
                settings: fsdpc_plan::Settings {
                    forward_prefetch: false,
                    grad_accum: 2,
                    clip_grad_norm: Some(CLIP),
                    activation_checkpointing: CheckpointPolicy::Every(2),
                    ..(cfg(Strategy::FullShard, None)).settings
                },
                reshard_after_forward: Some(ReshardAfterForward::To(2)),
                ..cfg(Strategy::FullShard, None)
            },
        ),
        (
            "hybrid_shard_zero2 2x2, K=2 no_sync, clip, depth 2",
            FsdpConfig {
                settings: fsdpc_plan::Settings {
                    grad_accum: 2,
                    no_sync: true,
                    clip_grad_norm: Some(CLIP),
                    prefetch_depth: 2,
                    limit_all_gathers: 3,
                    ..(cfg(Strategy::HybridShardZero2, Some(2))).settings
                },
                ..cfg(Strategy::HybridShardZero2, Some(2))
            },
        ),
    ];
    for (name, c) in combos {
        let r = train(&plan_with(&gpt(1), 4, &c), STEPS, ExecMode::Arena);
        let loss_rel = max_loss_rel_diff(&reference, &r);
        let (abs, _) = max_param_diff(&reference, &r);
        eprintln!("{name}: max loss rel diff {loss_rel:e}, max param abs diff {abs:e}");
        assert!(
            loss_rel <= LOSS_RTOL,
            "{name}: losses differ by {loss_rel:e}"
        );
        assert!(abs <= PARAM_ATOL, "{name}: parameters differ by {abs:e}");
    }
}

/// FSDP2's per-module `reshard_after_forward`: by default a 1/2 slice is
/// kept over F = 4, the first block frees its parameters (`true`) and the
/// second keeps them (`false`). Each unit's gathers follow its own
/// setting, and training is bit-identical to plain full_shard.
#[test]
fn per_unit_reshard_after_forward() {
    let base = plan_with(&gpt(2), 4, &cfg(Strategy::FullShard, None));
    let blocks: Vec<String> = base.units[1..].iter().map(|u| u.module.clone()).collect();
    assert_eq!(blocks.len(), 2, "{blocks:?}");
    let c = FsdpConfig {
        reshard_after_forward: Some(ReshardAfterForward::To(2)),
        reshard_units: vec![
            (blocks[0].clone(), ReshardAfterForward::Full),
            (blocks[1].clone(), ReshardAfterForward::Keep),
        ],
        ..cfg(Strategy::FullShard, None)
    };
    let p = plan_with(&gpt(2), 4, &c);
    let gathers = |u: usize, g: Group| {
        count(
            &p,
            |o| matches!(o, InstrOp::AllGather { c: Collective { unit, group, .. }, .. } if unit.index() == u && *group == g),
        )
    };
    assert_eq!(
        p.units[1].reshard_after_forward,
        Some(ReshardAfterForward::Full)
    );
    assert_eq!(
        p.units[2].reshard_after_forward,
        Some(ReshardAfterForward::Keep)
    );
    assert_eq!(
        (gathers(1, Group::Shard), gathers(1, Group::Reshard)),
        (2, 0)
    );
    assert_eq!(
        (gathers(2, Group::Shard), gathers(2, Group::Reshard)),
        (1, 0)
    );
    let a = train(&base, STEPS, ExecMode::Arena);
    let b = train(&p, STEPS, ExecMode::Arena);
    assert_eq!(bits(&a), bits(&b));
    // An unknown path, and two group sizes in one plan, are refused by name.
    for (bad, want) in [
        (
            vec![("h.99".to_string(), ReshardAfterForward::Keep)],
            "is not a non-root unit",
        ),
        (
            vec![(blocks[0].clone(), ReshardAfterForward::To(4))],
            "one group size",
        ),
    ] {
        let c = FsdpConfig {
            reshard_after_forward: Some(ReshardAfterForward::To(2)),
            reshard_units: bad,
            ..cfg(Strategy::FullShard, None)
        };
        let err = compile_on(&gpt(1), "cpu-local", 8, 8, &c).expect_err("refused");
        assert!(err.to_string().contains(want), "{err}");
    }
}
