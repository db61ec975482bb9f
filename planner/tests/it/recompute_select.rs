//! Which units activation checkpointing selects (`all`, `every:K`,
//! `paths:a,b`, `kind:CLASS`), the errors of a selection that names nothing,
//! and the memory plan between none and all.
use crate::common::*;
use fsdpc_plan::*;
use fsdpc_planner::*;

/// A 4-block GPT: units `transformer.h.0` .. `transformer.h.3` (ids 1 .. 4) under the root.
const GPT4: &str = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128,batch=2";

fn cfg(policy: CheckpointPolicy) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            activation_checkpointing: policy,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

fn selected(policy: CheckpointPolicy) -> Result<Vec<u32>, PlanError> {
    let (p, _) = program(GPT4);
    let assign = units::assign_units(&p.graph, &WrapPolicy::Blocks).unwrap();
    Ok(recompute::selected_units(&assign, &policy)?
        .into_iter()
        .map(|u| u.0)
        .collect())
}

fn parse(s: &str) -> CheckpointPolicy {
    CheckpointPolicy::parse(s).unwrap()
}

#[test]
fn parses_every_form_and_names_it_back() {
    for (text, policy) in [
        ("", CheckpointPolicy::Units),
        ("all", CheckpointPolicy::Units),
        ("units", CheckpointPolicy::Units),
        ("none", CheckpointPolicy::None),
        ("every:2", CheckpointPolicy::Every(2)),
        (
            "paths: h.0 ,h.2",
            CheckpointPolicy::Paths(vec!["h.0".into(), "h.2".into()]),
        ),
        ("kind:GPT2Block", CheckpointPolicy::Kind("GPT2Block".into())),
    ] {
        assert_eq!(parse(text), policy, "{text}");
        assert_eq!(parse(&policy.name()), policy, "{text} named back");
    }
    for bad in [
        "every:0",
        "every:x",
        "every",
        "paths:",
        "paths: , ",
        "kind:",
        "some",
    ] {
        let err = CheckpointPolicy::parse(bad).unwrap_err().to_string();
        assert!(
            err.contains("activation checkpointing") && err.contains(bad.trim()),
            "{bad}: {err}"
        );
    }
}

#[test]
fn selects_which_units() {
    assert_eq!(selected(CheckpointPolicy::None).unwrap(), Vec::<u32>::new());
    assert_eq!(selected(CheckpointPolicy::Units).unwrap(), vec![1, 2, 3, 4]);
    assert_eq!(selected(parse("every:1")).unwrap(), vec![1, 2, 3, 4]);
    assert_eq!(selected(parse("every:2")).unwrap(), vec![1, 3]);
    assert_eq!(selected(parse("every:3")).unwrap(), vec![1, 4]);
    assert_eq!(selected(parse("every:9")).unwrap(), vec![1]);
    assert_eq!(selected(parse("paths:transformer.h.2")).unwrap(), vec![3]);
    assert_eq!(
        selected(parse("paths:transformer.h.3,transformer.h.0")).unwrap(),
        vec![1, 4]
    );
    assert_eq!(selected(parse("kind:GPT2Block")).unwrap(), vec![1, 2, 3, 4]);
}

#[test]
fn a_selection_that_names_no_unit_is_an_error_listing_the_units() {
    let err = selected(parse("paths:transformer.h.0,h.7"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`h.7`"), "{err}");
    assert!(
        err.contains("transformer.h.0, transformer.h.1, transformer.h.2, transformer.h.3"),
        "{err}"
    );
    // A module that exists but is not a unit cannot be checkpointed alone.
    let err = selected(parse("paths:transformer.h.1.attn"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`transformer.h.1.attn` is not the module path of a unit"),
        "{err}"
    );
    let err = selected(parse("kind:Block")).unwrap_err().to_string();
    assert!(
        err.contains("no unit is a `Block`") && err.contains("GPT2Block"),
        "{err}"
    );
    // A policy built in code (or read from JSON) with K = 0 is refused too.
    let err = selected(CheckpointPolicy::Every(0))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("every:0") && err.contains("at least 1"),
        "{err}"
    );
    // Through compile: the same error, no plan.
    match plan(GPT4, 2, &cfg(parse("paths:h.9"))) {
        Err(PlanError::BadConfig { what, reason, .. }) => {
            assert_eq!(what, "activation checkpointing");
            assert!(reason.contains("h.9"), "{reason}");
        }
        other => panic!("expected BadConfig, got {other:?}"),
    }
}

#[test]
fn the_plan_records_the_selected_units() {
    let p = plan(GPT4, 2, &cfg(parse("every:2"))).unwrap();
    assert_eq!(p.config.checkpointed_units, vec![UnitId(1), UnitId(3)]);
    let back = Plan::from_json(&p.to_json_pretty().unwrap()).unwrap();
    assert_eq!(back.config, p.config);
    // Only the selected units recompute: clones fall into units 1 and 3.
    let mut recomputing: Vec<u32> = p
        .training
        .graph
        .node_ids()
        .filter(|&n| recompute::is_recompute(p.training.graph.node(n)))
        .filter_map(|n| {
            let module = &p.training.graph.modules[p.training.graph.node(n).module.0 as usize];
            p.units
                .iter()
                .filter(|u| {
                    !u.module.is_empty()
                        && (module.path == u.module
                            || module.path.starts_with(&format!("{}.", u.module)))
                })
                .map(|u| u.id.0)
                .next()
        })
        .collect();
    recomputing.sort();
    recomputing.dedup();
    assert_eq!(recomputing, vec![1, 3]);
    let none = plan(GPT4, 2, &cfg(CheckpointPolicy::None)).unwrap();
    assert!(none.config.checkpointed_units.is_empty());
    assert!(!none
        .to_json_pretty()
        .unwrap()
        .contains("checkpointed_units"));
}

fn activation_bytes(p: &Plan) -> u64 {
    p.memory
        .breakdown
        .iter()
        .filter(|(k, _)| *k == BufferKind::Activation)
        .map(|(_, b)| *b)
        .sum()
}

/// gpt2 (12 blocks) at world 8 on the a100 preset: peak and activation bytes
/// at the peak fall as more units are checkpointed, and every plan validates.
#[test]
fn memory_falls_monotonically_with_the_units_checkpointed() {
    let (program, info) = program("gpt2");
    let cluster = fsdpc_planner::preset("a100-80g-roce", 8, 8).unwrap();
    let mut rows = Vec::new();
    for policy in ["none", "every:4", "every:2", "all"] {
        let c = FsdpConfig {
            check_fits: false,
            ..cfg(parse(policy))
        };
        let p = compile(program.clone(), info.clone(), &cluster, &c).unwrap();
        assert_eq!(p.validate(), Ok(()), "{policy}");
        rows.push((
            policy,
            p.config.checkpointed_units.len(),
            p.memory.peak_bytes,
            activation_bytes(&p),
        ));
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!("gpt2, world 8, full_shard, a100-80g-roce: activation checkpointing");
    println!(
        "{:<8} {:>6} {:>12} {:>16}",
        "policy", "units", "peak GiB", "activations GiB"
    );
    for (policy, n, peak, act) in &rows {
        println!(
            "{policy:<8} {n:>6} {:>12.3} {:>16.3}",
            gib(*peak),
            gib(*act)
        );
    }
    assert_eq!(
        rows.iter().map(|r| r.1).collect::<Vec<_>>(),
        vec![0, 3, 6, 12]
    );
    for w in rows.windows(2) {
        assert!(w[1].2 < w[0].2, "peak falls from {} to {}", w[0].0, w[1].0);
        assert!(
            w[1].3 < w[0].3,
            "activations fall from {} to {}",
            w[0].0,
            w[1].0
        );
    }
}
