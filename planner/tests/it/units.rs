//! Units and flat parameters.
use crate::common::*;
use fsdpc_plan::*;
use fsdpc_planner::units::assign_units;
use fsdpc_planner::*;

fn units_of(spec: &str, wrap: WrapPolicy) -> Vec<Unit> {
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            wrap,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    plan(spec, 2, &cfg).unwrap().units
}

#[test]
fn blocks_policy_finds_every_numbered_block() {
    let units = units_of(
        "gpt:layers=3,hidden=32,heads=2,seq=8,vocab=64,batch=1",
        WrapPolicy::Blocks,
    );
    let modules: Vec<&str> = units.iter().map(|u| u.module.as_str()).collect();
    assert_eq!(
        modules,
        ["", "transformer.h.0", "transformer.h.1", "transformer.h.2"]
    );
    assert!(units[1..].iter().all(|u| u.kind == units[1].kind));
}

#[test]
fn tied_embedding_lands_in_the_root_unit() {
    // Wrap the embedding module itself: the output projection (root) also
    // reads it, so it must go to the root.
    let (p, _) = program(TINY_GPT);
    let wte = p
        .graph
        .params
        .iter()
        .position(|s| s.name.contains("wte"))
        .unwrap();
    let m = p
        .graph
        .modules
        .iter()
        .find(|m| m.path.ends_with("wte"))
        .unwrap()
        .path
        .clone();
    let a = assign_units(&p.graph, &WrapPolicy::Paths { paths: vec![m] }).unwrap();
    assert_eq!(a.param_unit[wte], UnitId(0));
    let units = units_of(TINY_GPT, WrapPolicy::Blocks);
    assert!(units[0].params.iter().any(|fp| fp.name.contains("wte")));
}

#[test]
fn kind_policy_wraps_outermost_modules_of_the_class() {
    let blocks = units_of(TINY_GPT, WrapPolicy::Blocks);
    let kind = units_of(
        TINY_GPT,
        WrapPolicy::Kind {
            kind: blocks[1].kind.clone(),
        },
    );
    assert_eq!(blocks, kind);
}

#[test]
fn unknown_kind_and_path_are_errors() {
    let (p, _) = program(TINY_GPT);
    let e = assign_units(
        &p.graph,
        &WrapPolicy::Kind {
            kind: "Nope".into(),
        },
    )
    .unwrap_err();
    assert!(matches!(e, PlanError::BadConfig { .. }), "{e}");
    let e = assign_units(
        &p.graph,
        &WrapPolicy::Paths {
            paths: vec!["no.such".into()],
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("no.such"), "{e}");
}

#[test]
fn size_policy_is_bottom_up() {
    let units = units_of(TINY_GPT, WrapPolicy::Size { min_numel: 10_000 });
    // Every non-root unit holds at least min_numel elements it did not leave
    // to a smaller unit, except `transformer`, which was wrapped counting the
    // tied embedding that then moved to the root (the output projection there
    // reads it).
    assert!(units.len() > 1);
    let small: Vec<&str> = units[1..]
        .iter()
        .filter(|u| u.flat_numel < 10_000)
        .map(|u| u.module.as_str())
        .collect();
    assert_eq!(small, ["transformer"], "{units:#?}");
    assert!(units.iter().any(|u| u.module == "transformer.h.0.mlp.c_fc"));
    let total: u64 = units.iter().map(|u| u.flat_numel).sum();
    let (p, _) = program(TINY_GPT);
    assert_eq!(total, p.graph.param_numel());
}

#[test]
fn flat_parameters_are_padded_to_a_multiple_of_f() {
    for world in [1u32, 3, 5, 7, 8] {
        let (p, info) = program(TINY_MLP);
        let cluster = fsdpc_planner::preset("cpu-local", world, world).unwrap();
        let plan = compile(p, info, &cluster, &FsdpConfig::default()).unwrap();
        for u in &plan.units {
            let f = u64::from(world);
            assert_eq!(u.padded_numel % f, 0);
            assert!(u.padded_numel - u.flat_numel < f);
            assert_eq!(u.shard_numel * f, u.padded_numel);
            let mut next = 0;
            for fp in &u.params {
                assert_eq!(fp.offset, next);
                next += fp.numel;
            }
            assert_eq!(next, u.flat_numel);
        }
    }
}

#[test]
fn config_strings_parse_and_errors_list_allowed_values() {
    assert_eq!(WrapPolicy::parse("blocks").unwrap(), WrapPolicy::Blocks);
    assert_eq!(
        WrapPolicy::parse("kind:GPT2Block").unwrap(),
        WrapPolicy::Kind {
            kind: "GPT2Block".into()
        }
    );
    assert_eq!(
        WrapPolicy::parse("size:1_000_000").unwrap(),
        WrapPolicy::Size {
            min_numel: 1_000_000
        }
    );
    assert_eq!(
        WrapPolicy::parse("paths:a, b").unwrap(),
        WrapPolicy::Paths {
            paths: vec!["a".into(), "b".into()]
        }
    );
    assert!(WrapPolicy::parse("size:x").is_err());
    assert!(WrapPolicy::parse("what")
        .unwrap_err()
        .to_string()
        .contains("kind:"));
    assert_eq!(Strategy::parse("NO_SHARD").unwrap(), Strategy::NoShard);
    assert!(Strategy::parse("zero9")
        .unwrap_err()
        .to_string()
        .contains("full_shard, shard_grad_op, hybrid_shard, hybrid_shard_zero2, no_shard"));
    assert_eq!(
        Strategy::parse("ShardingStrategy.HYBRID_SHARD").unwrap(),
        Strategy::HybridShard
    );
    assert_eq!(
        Strategy::parse("_hybrid_shard_zero2").unwrap(),
        Strategy::HybridShardZero2
    );
}

#[test]
fn cluster_presets_and_errors() {
    let c = fsdpc_planner::preset("a100-80g-roce", 512, 8).unwrap();
    assert_eq!((c.nodes(), c.memory_bytes), (64, 80 << 30));
    assert_eq!(
        fsdpc_planner::preset("cpu-local", 4, 4)
            .unwrap()
            .memory_bytes,
        (24 << 30) / 4
    );
    let e = fsdpc_planner::preset("tpu", 8, 8).unwrap_err().to_string();
    assert!(
        e.contains("a100-80g-roce") && e.contains("h100-80g-ib") && e.contains("cpu-local"),
        "{e}"
    );
    assert!(matches!(
        fsdpc_planner::preset("h100-80g-ib", 0, 8),
        Err(PlanError::BadCluster { .. })
    ));
    assert!(fsdpc_planner::preset("h100-80g-ib", 12, 8)
        .unwrap_err()
        .to_string()
        .contains("multiple"));
}
