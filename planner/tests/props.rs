//! Property tests: random models, world sizes, strategies, wrap policies and
//! activation checkpointing (on or off) always give plans that validate.
mod common;
use common::*;
use fsdpc_planner::{
    compile_unchecked, BackwardPrefetch, CheckpointPolicy, Cluster, FsdpConfig, Plan, WrapPolicy,
};
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
            Just(fsdpc_planner::Strategy::FullShard),
            Just(fsdpc_planner::Strategy::NoShard)
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
                    strategy,
                    wrap,
                    backward_prefetch,
                    limit_all_gathers,
                    activation_checkpointing,
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
        let cluster = Cluster::preset("cpu-local", world, 1).unwrap();
        let plan = compile_unchecked(p, info, &cluster, &cfg).unwrap();
        prop_assert_eq!(plan.validate(), Ok(()));
        prop_assert_eq!(plan.training.validate(), Ok(()));
        let back = Plan::from_json(&plan.to_json_pretty().unwrap()).unwrap();
        prop_assert_eq!(back.memory, plan.memory);
    }
}
