//! Frozen parameters (`--freeze`): the plan holds no flat-gradient,
//! gradient-shard or optimizer-state byte for a frozen element — in a unit
//! that is all frozen and in units mixing frozen and trainable parameters —
//! with the exact sizes the two-segment layout gives; validation catches a
//! tampered layout; a pattern matching nothing is an error naming
//! parameters; and an insta snapshot of `inspect`.

use crate::common::{plan, program};
use fsdpc_plan::*;
use fsdpc_planner::*;

/// Two blocks; the tied embedding lives in the root unit.
const GPT: &str = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=2";

/// Block 0 entirely; block 1's attention (block 1 mixes); the position
/// embedding (the root mixes).
fn frozen_cfg(strategy: Strategy) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            freeze: vec![
                "transformer.h.0.*".into(),
                "transformer.h.1.attn.*".into(),
                "*.wpe.weight".into(),
            ],
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

/// The bytes of every buffer of `kind` for `unit`.
fn bytes_of(p: &Plan, kind: BufferKind, unit: usize) -> Vec<u64> {
    p.buffers
        .iter()
        .filter(|b| b.kind == kind && b.unit == Some(UnitId(unit as u32)))
        .map(|b| b.bytes)
        .collect()
}

/// Trainable elements of a unit, from its parameter list.
fn trainable(u: &Unit) -> u64 {
    u.params
        .iter()
        .filter(|p| p.requires_grad)
        .map(|p| p.numel)
        .sum()
}

#[test]
fn frozen_elements_get_no_gradient_reduction_or_optimizer_bytes() {
    for world in [2u32, 4, 8] {
        let p = plan(GPT, world, &frozen_cfg(Strategy::FullShard)).expect("plan compiles");
        p.validate().expect("validates");
        let f = u64::from(world);
        assert_eq!(p.units.len(), 3, "root and two blocks");
        let mixed = [0usize, 2];
        for (u, unit) in p.units.iter().enumerate() {
            let t = trainable(unit);
            let frozen = unit.flat_numel - t;
            assert!(frozen > 0, "unit {u} holds frozen parameters");
            let tp = t.div_ceil(f) * f;
            let zp = frozen.div_ceil(f) * f;
            assert_eq!(unit.padded_numel, tp + zp, "unit {u}: two padded segments");
            assert_eq!(unit.frozen_numel, zp);
            assert_eq!(
                bytes_of(&p, BufferKind::ShardParams, u),
                vec![(tp + zp) / f * 4]
            );
            if mixed.contains(&u) {
                assert!(t > 0);
                // Exactly the trainable segment, nothing for the frozen one.
                assert_eq!(bytes_of(&p, BufferKind::FlatGrads, u), vec![tp * 4]);
                assert_eq!(bytes_of(&p, BufferKind::ShardGrads, u), vec![tp / f * 4]);
                assert_eq!(
                    bytes_of(&p, BufferKind::OptimizerState, u),
                    vec![tp / f * 4; 2],
                    "AdamW: two slots over the trainable shard"
                );
            } else {
                assert_eq!(t, 0, "block 0 is all frozen");
                for k in [
                    BufferKind::FlatGrads,
                    BufferKind::ShardGrads,
                    BufferKind::OptimizerState,
                ] {
                    assert!(bytes_of(&p, k, u).is_empty(), "unit {u} has no {k:?}");
                }
                assert!(!p.instructions.iter().any(|i| matches!(
                    i.op,
                    InstrOp::ReduceScatter { c: Collective { unit, .. } } | InstrOp::OptimizerStep { unit, .. }
                        if unit.index() == u
                )));
            }
            // Gathered: both segments.
            for b in bytes_of(&p, BufferKind::GatheredParams, u) {
                assert_eq!(b, (tp + zp) * 4);
            }
        }
        // Frozen parameters come after every trainable one in each unit.
        for unit in &p.units {
            for fp in &unit.params {
                assert_eq!(fp.requires_grad, fp.offset < unit.trainable_numel());
            }
        }
        // The training program lost the frozen parameters' gradients.
        let frozen_ids: Vec<_> = p
            .units
            .iter()
            .flat_map(|u| {
                u.params
                    .iter()
                    .filter(|x| !x.requires_grad)
                    .map(|x| x.param)
            })
            .collect();
        assert!(p
            .training
            .grads
            .iter()
            .all(|g| !frozen_ids.contains(&g.param)));
    }
}

#[test]
fn freezing_saves_gradient_and_optimizer_bytes_and_reduce_scatter_traffic() {
    let world = 4;
    let all = plan(GPT, world, &FsdpConfig::default()).expect("plan");
    let some = plan(GPT, world, &frozen_cfg(Strategy::FullShard)).expect("plan");
    let persistent = |p: &Plan, k: BufferKind| -> u64 {
        p.buffers
            .iter()
            .filter(|b| b.kind == k)
            .map(|b| b.bytes)
            .sum()
    };
    let rs_bytes = |p: &Plan| -> u64 {
        p.instructions
            .iter()
            .filter_map(|i| match i.op {
                InstrOp::ReduceScatter {
                    c: Collective { src, .. },
                } => Some(p.buffers[src.index()].bytes),
                _ => None,
            })
            .sum()
    };
    let t: u64 = some
        .units
        .iter()
        .map(|u| u.trainable_shard_numel() * 4)
        .sum();
    assert_eq!(persistent(&some, BufferKind::ShardGrads), t);
    assert_eq!(persistent(&some, BufferKind::OptimizerState), 2 * t);
    assert!(persistent(&some, BufferKind::ShardGrads) < persistent(&all, BufferKind::ShardGrads));
    let trainable_padded: u64 = some.units.iter().map(|u| u.trainable_numel() * 4).sum();
    assert_eq!(rs_bytes(&some), trainable_padded);
    assert!(rs_bytes(&some) < rs_bytes(&all));
    assert!(some.estimates.comm_bytes_per_step < all.estimates.comm_bytes_per_step);
    println!(
        "gpt 2 blocks world 4: gradient shards {} -> {} B, optimizer state {} -> {} B, reduce-scatter input {} -> {} B, peak {} -> {} B",
        persistent(&all, BufferKind::ShardGrads),
        persistent(&some, BufferKind::ShardGrads),
        persistent(&all, BufferKind::OptimizerState),
        persistent(&some, BufferKind::OptimizerState),
        rs_bytes(&all),
        rs_bytes(&some),
        all.memory.peak_bytes,
        some.memory.peak_bytes
    );
}

#[test]
fn no_shard_frozen_plan_validates_and_sizes_the_flat_gradient() {
    let p = plan(GPT, 2, &frozen_cfg(Strategy::NoShard)).expect("plan compiles");
    p.validate().expect("validates");
    for (u, unit) in p.units.iter().enumerate() {
        let t = trainable(unit);
        for b in bytes_of(&p, BufferKind::FlatGrads, u) {
            assert_eq!(b, t * 4, "F = 1: no padding");
        }
        assert!(bytes_of(&p, BufferKind::ShardGrads, u).is_empty());
    }
    assert_eq!(p.config.freeze.len(), 3, "patterns recorded in the plan");
}

#[test]
fn validation_catches_a_gradient_buffer_covering_frozen_elements() {
    let mut p = plan(GPT, 2, &frozen_cfg(Strategy::FullShard)).expect("plan");
    let b = p
        .buffers
        .iter_mut()
        .find(|b| b.kind == BufferKind::OptimizerState)
        .expect("a state buffer");
    b.bytes += 8;
    let v = p.validate().expect_err("oversized state");
    assert!(v.iter().any(|v| matches!(
        v,
        PlanViolation::BufferSize {
            kind: BufferKind::OptimizerState,
            ..
        }
    )));
    let mut p = plan(GPT, 2, &frozen_cfg(Strategy::FullShard)).expect("plan");
    p.units[2].frozen_numel = 0;
    let v = p
        .validate()
        .expect_err("frozen parameters outside their segment");
    assert!(
        v.iter().any(|v| matches!(v, PlanViolation::Layout { .. })),
        "{v:?}"
    );
}

#[test]
fn a_pattern_matching_nothing_names_parameters() {
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            freeze: vec!["transformer.h.9.*".into()],
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let e = plan(GPT, 2, &cfg).expect_err("matches nothing");
    assert!(matches!(e, PlanError::FreezeMatchesNothing { .. }));
    let text = e.to_string();
    assert!(text.contains("transformer.h.9.*"), "{text}");
    assert!(text.contains("transformer.wte.weight"), "{text}");
    let bad = FsdpConfig {
        settings: fsdpc_plan::Settings {
            freeze: vec!["a[".into()],
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    assert!(matches!(
        plan(GPT, 2, &bad),
        Err(PlanError::BadConfig {
            what: "freeze pattern",
            ..
        })
    ));
}

#[test]
fn unfrozen_plans_keep_one_segment() {
    let (prog, _) = program(GPT);
    assert!(prog.graph.params.iter().all(|p| p.requires_grad));
    let p = plan(GPT, 4, &FsdpConfig::default()).expect("plan");
    assert!(p
        .units
        .iter()
        .all(|u| u.frozen_numel == 0 && u.segments().len() == 1));
    let json = p.to_json_pretty().expect("json");
    assert!(!json.contains("frozen_numel") && !json.contains("\"freeze\""));
}
