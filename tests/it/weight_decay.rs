//! Weight decay applies to the parameters nanoGPT and Hugging Face's
//! trainer decay (matrices), not to norms, biases and embedding tables,
//! unless `--weight-decay-all`: the plan marks each parameter, every
//! rank's optimizer step follows the marks across shard boundaries, and
//! `inspect` says which are decayed.

use crate::common::{bits, host_plan};
use fsdpc_ir::Optimizer;
use fsdpc_plan::{Plan, Strategy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::{TrainOptions, TrainReport};
use std::collections::HashMap;
use std::process::Command;

const GPT: &str = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=2";
const LR: f64 = 0.01;
const WD: f64 = 0.5;

fn adamw() -> Optimizer {
    Optimizer::AdamW {
        lr: LR,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: WD,
    }
}

fn planned(strategy: Strategy, decay_all: bool) -> Plan {
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            decay_all,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    host_plan(GPT, 2, &cfg, &adamw())
}

fn params(plan: &Plan, steps: u64) -> HashMap<String, Vec<f32>> {
    let o = TrainOptions {
        steps,
        seed: 3,
        keep_params: true,
        ..TrainOptions::default()
    };
    let r: TrainReport =
        fsdpc_runtime::train(plan, &o, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
    r.final_params.into_iter().collect()
}

#[test]
fn norms_biases_and_embeddings_are_not_decayed() {
    let plan = planned(Strategy::FullShard, false);
    let decay: HashMap<&str, bool> = plan
        .units
        .iter()
        .flat_map(|u| u.params.iter())
        .map(|p| (p.name.as_str(), p.decay))
        .collect();
    for (name, want) in [
        ("transformer.wte.weight", false),
        ("transformer.wpe.weight", false),
        ("transformer.h.0.ln_1.weight", false),
        ("transformer.h.0.ln_1.bias", false),
        ("transformer.h.0.attn.c_attn.bias", false),
        ("transformer.h.0.attn.c_attn.weight", true),
        ("transformer.h.1.mlp.c_proj.weight", true),
    ] {
        assert_eq!(decay.get(name), Some(&want), "{name} in {decay:?}");
    }
    let all = planned(Strategy::FullShard, true);
    assert!(all.units.iter().flat_map(|u| &u.params).all(|p| p.decay));
    // The mark is in the plan's JSON (absent where it decays).
    let json = plan.to_json_pretty().expect("json");
    assert!(json.contains("\"decay\": false"), "{json}");
    let back = Plan::from_json(&json).expect("plan");
    assert_eq!(back.units, plan.units);
}

/// One AdamW step: `p = p0 * (1 - lr * wd) - u` where decay applies and
/// `p = p0 - u` where it does not, `u` the same update. So against
/// `--weight-decay-all`, the decayed parameters are bit for bit the same
/// and the others differ by `p0 * lr * wd`, on every element of every
/// rank's shard (the shard boundary at world 2 cuts through parameters).
#[test]
fn the_step_skips_decay_exactly_where_the_plan_says() {
    let plan = planned(Strategy::FullShard, false);
    let all = planned(Strategy::FullShard, true);
    let p0 = params(&plan, 0);
    let p = params(&plan, 1);
    let q = params(&all, 1);
    let decay: HashMap<String, bool> = plan
        .units
        .iter()
        .flat_map(|u| u.params.iter())
        .map(|p| (p.name.clone(), p.decay))
        .collect();
    let mut skipped = 0;
    for (name, a) in &p {
        let (b, x0) = (&q[name], &p0[name]);
        if decay[name] {
            assert_eq!(a, b, "{name} is decayed in both runs");
            continue;
        }
        skipped += 1;
        for ((a, b), x0) in a.iter().zip(b).zip(x0) {
            let want = x0 * (LR * WD) as f32;
            assert!(
                ((a - b) - want).abs() <= 1e-6 * x0.abs().max(1.0),
                "{name}: {a} - {b} != {want}"
            );
        }
        if x0.iter().any(|&x| x != 0.0) {
            assert_ne!(a, b, "{name} must differ");
        }
    }
    assert!(skipped >= 6, "{skipped} undecayed parameters");
    // Sharding does not change it: full_shard equals no_shard bit for bit.
    let whole = planned(Strategy::NoShard, false);
    let r = |plan: &Plan| {
        let o = TrainOptions {
            steps: 3,
            seed: 3,
            keep_params: true,
            ..TrainOptions::default()
        };
        fsdpc_runtime::train(plan, &o, &mut |_| {}).unwrap_or_else(|e| panic!("{e}"))
    };
    assert_eq!(bits(&r(&plan)), bits(&r(&whole)));
}

#[test]
fn inspect_says_which_parameters_are_decayed() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("p.json");
    let out_s = out.to_str().expect("utf-8");
    let fsdpc = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_fsdpc"))
            .args(args)
            .output()
            .expect("fsdpc runs");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    for (extra, want) in [
        (
            None,
            "weight decay 0.1 on 8 of 28 parameters (24.6 K of 27.8 K elements; not norms, biases, embeddings)",
        ),
        (
            Some("--weight-decay-all"),
            "weight decay 0.1 on 28 of 28 parameters (27.8 K of 27.8 K elements; every one: --weight-decay-all)",
        ),
    ] {
        let mut a = vec!["compile", GPT, "--world", "2", "--weight-decay", "0.1", "-o", out_s];
        a.extend(extra);
        fsdpc(&a);
        let text = fsdpc(&["inspect", out_s]);
        assert!(text.contains(want), "{text}");
        let json: serde_json::Value =
            serde_json::from_str(&fsdpc(&["inspect", out_s, "--json"])).expect("json");
        assert_eq!(json["optimizer"]["trainable_params"], 28);
    }
}
