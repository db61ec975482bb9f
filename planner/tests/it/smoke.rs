//! Quick end-to-end checks that the planner produces plans for zoo models.
use crate::common::*;
use fsdpc_plan::*;
use fsdpc_planner::*;

#[test]
fn zoo_models_plan_under_both_strategies() {
    for spec in [TINY_GPT, TINY_MLP] {
        for strategy in [Strategy::FullShard, Strategy::NoShard] {
            for world in [1, 2, 4] {
                let cfg = FsdpConfig {
                    settings: fsdpc_plan::Settings {
                        strategy,
                        ..fsdpc_plan::Settings::default()
                    },
                    ..FsdpConfig::default()
                };
                let plan = plan(spec, world, &cfg).unwrap();
                assert!(plan.memory.peak_bytes > 0);
                assert!(plan.memory.arena_bytes >= plan.memory.peak_bytes);
            }
        }
    }
}
