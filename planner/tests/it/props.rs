//! Property tests: random models, world sizes, strategies, wrap policies and
//! activation checkpointing (on or off) always give plans that validate.
use crate::common::*;
use fsdpc_plan::{BackwardPrefetch, CheckpointPolicy, Plan, WrapPolicy};
use fsdpc_planner::{compile_unchecked, FsdpConfig};
use proptest::prelude::*;

fn spec() -> impl proptest::strategy::Strategy<Value = String> {
    prop_oneof![
        (1usize..4, 1usize..3, 1usize..4, 2usize..9, 1usize..3).prop_map(|(layers, heads, hd, seq, batch)| {
            let hidden = heads * hd * 4;
            format!("gpt:layers={layers},hidden={hidden},heads={heads},seq={seq},vocab={},batch={batch}", 16 + seq)
        }),
        (1usize..4, 1usize..9, 1usize..17, 2usize..5, 1usize..4).prop_map(|(layers, i, h, c, b)| {
            format!("mlp:layers={layers},in={i},hidden={h},classes={c},batch={b}")
        }),
    ]
}

fn wrap() -> impl proptest::strategy::Strategy<Value = WrapPolicy> {
    prop_oneof![
        Just(WrapPolicy::Blocks),
        (1u64..2000).prop_map(|min_numel| WrapPolicy::Size { min_numel }),
    ]
}

fn config() -> impl proptest::strategy::Strategy<Value = FsdpConfig> {
    (
        prop_oneof![
            Just(fsdpc_plan::Strategy::FullShard),
            Just(fsdpc_plan::Strategy::NoShard)
        ],
        wrap(),
        prop_oneof![
            Just(BackwardPrefetch::Pre),
            Just(BackwardPrefetch::Post),
            Just(BackwardPrefetch::None)
        ],
        1u32..4,
        prop_oneof![Just(CheckpointPolicy::None), Just(CheckpointPolicy::Units)],
    )
        .prop_map(
            |(strategy, wrap, backward_prefetch, limit_all_gathers, activation_checkpointing)| {
                FsdpConfig {
                    settings: fsdpc_plan::Settings {
                        strategy,
                        wrap,
                        backward_prefetch,
                        limit_all_gathers,
                        activation_checkpointing,
                        ..fsdpc_plan::Settings::default()
                    },
                    ..FsdpConfig::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn every_plan_validates(spec in spec(), world in 1u32..9, cfg in config()) {
        let (p, info) = program(&spec);
        let cluster = fsdpc_planner::preset("cpu-local", world, 1).unwrap();
        let plan = compile_unchecked(p, info, &cluster, &cfg).unwrap();
        prop_assert_eq!(plan.validate(), Ok(()));
        prop_assert_eq!(plan.training.validate(), Ok(()));
        let back = Plan::from_json(&plan.to_json_pretty().unwrap()).unwrap();
        prop_assert_eq!(back.memory, plan.memory);
    }
}

/// The sharding controls of issue 7 in random combinations: every
/// strategy, a sharding factor dividing the world (or the default), every
/// form of `reshard_after_forward` (an n dividing F), forward prefetch on
/// or off, prefetch depth, gradient accumulation with or without
/// `no_sync`, clipping.
fn controls(world: u32) -> impl proptest::strategy::Strategy<Value = FsdpConfig> {
    let divisors: Vec<u32> = (1..=world).filter(|d| world.is_multiple_of(*d)).collect();
    (
        prop::sample::select(fsdpc_plan::Strategy::ALL.to_vec()),
        prop::option::of(prop::sample::select(divisors.clone())),
        0usize..4,
        prop::sample::select(divisors),
        any::<bool>(),
        1u32..4,
        1u32..4,
        any::<bool>(),
        any::<bool>(),
        1u32..4,
    )
        .prop_map(
            |(
                strategy,
                f,
                reshard_kind,
                n,
                forward_prefetch,
                prefetch_depth,
                grad_accum,
                no_sync,
                clip,
                limit,
            )| {
                use fsdpc_plan::ReshardAfterForward as R;
                let shard_factor = if strategy == fsdpc_plan::Strategy::NoShard {
                    None
                } else {
                    f
                };
                FsdpConfig {
                    settings: fsdpc_plan::Settings {
                        strategy,
                        forward_prefetch,
                        prefetch_depth,
                        limit_all_gathers: limit,
                        grad_accum,
                        no_sync: no_sync && grad_accum > 1,
                        clip_grad_norm: clip.then_some(1.0),
                        ..fsdpc_plan::Settings::default()
                    },
                    shard_factor,
                    reshard_after_forward: [None, Some(R::Full), Some(R::Keep), Some(R::To(n))]
                        [reshard_kind],
                    ..FsdpConfig::default()
                }
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn every_combination_of_controls_validates_or_is_refused_by_name(
        spec in spec(),
        (world, cfg) in prop::sample::select(vec![1u32, 2, 4, 6, 8])
            .prop_flat_map(|w| (Just(w), controls(w))),
    ) {
        let (p, info) = program(&spec);
        let cluster = fsdpc_planner::preset("cpu-local", world, 2.min(world)).unwrap();
        match compile_unchecked(p, info, &cluster, &cfg) {
            Ok(plan) => {
                prop_assert_eq!(plan.validate(), Ok(()));
                let back = Plan::from_json(&plan.to_json_pretty().unwrap()).unwrap();
                prop_assert_eq!(back.memory, plan.memory);
            }
            // Only a reshard group that does not divide the chosen F (the
            // default F of a hybrid strategy is one node) is refused.
            Err(fsdpc_planner::PlanError::BadConfig { what, .. }) => {
                prop_assert_eq!(what, "reshard_after_forward");
            }
            Err(e) => prop_assert!(false, "{e}"),
        }
    }
}
