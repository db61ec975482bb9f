//! Partial CPU offload (`--cpu-offload all|every:K|paths:a,b|kind:CLASS`,
//! `--offload-what params|optimizer`): some units' shards and optimizer
//! state on the host, or only their optimizer state, the rest on the
//! device.
//!
//! Offload moves bytes, not arithmetic: every mix trains bit-identically
//! to the same plan without offload (F = 2 and 4, alone and with clipping,
//! bf16, gradient accumulation), and so within `tests/it/equivalence.rs`'s
//! tolerances of one unsharded rank, as full offload does
//! (`tests/it/offload.rs`). The device peak falls, and the host peak rises,
//! as units are added, between no offload and full offload; refusals name
//! what was asked for; the verifier refuses a buffer in the wrong memory;
//! the CLI flags and `inspect`.

use crate::common;

use crate::common::{bits, max_loss_rel_diff, max_param_diff, plan_with, train};
use fsdpc_ir::DType;
use fsdpc_plan::ConfigError;
use fsdpc_plan::{BufferKind, Location, OffloadUnits, OffloadWhat, Strategy};
use fsdpc_planner::{FsdpConfig, PlanError};
use fsdpc_runtime::ExecMode;

const STEPS: u64 = 8;
/// The tolerances of `tests/it/equivalence.rs` (loss relative, parameter absolute).
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;

fn gpt(layers: u32, batch: u32) -> String {
    format!("gpt:layers={layers},hidden=32,heads=2,seq=8,vocab=64,batch={batch}")
}

fn offload(which: &str, what: OffloadWhat, base: &FsdpConfig) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            cpu_offload: true,
            offload_what: what,
            ..base.settings.clone()
        },
        offload_units: OffloadUnits::parse(which).expect("selection parses"),
        ..base.clone()
    }
}

const MIXES: [(&str, OffloadWhat); 5] = [
    ("paths:transformer.h.0", OffloadWhat::Params),
    ("every:2", OffloadWhat::Params),
    ("paths:root,transformer.h.1", OffloadWhat::Params),
    ("all", OffloadWhat::Optimizer),
    ("kind:GPT2Block", OffloadWhat::Optimizer),
];

#[test]
fn every_mix_is_bit_identical_to_no_offload() {
    let base = FsdpConfig::default();
    let reference = train(
        &plan_with(
            &gpt(2, 8),
            1,
            &FsdpConfig {
                settings: fsdpc_plan::Settings {
                    strategy: Strategy::NoShard,
                    ..base.settings.clone()
                },
                ..base.clone()
            },
        ),
        STEPS,
        ExecMode::Arena,
    );
    for world in [2u32, 4] {
        let model = gpt(2, 8 / world);
        let plain = train(&plan_with(&model, world, &base), STEPS, ExecMode::Arena);
        for (which, what) in MIXES {
            let plan = plan_with(&model, world, &offload(which, what, &base));
            let on_host = plan
                .buffers
                .iter()
                .filter(|b| b.location == Location::Host)
                .count();
            assert!(on_host > 0, "{which} {what:?}: something is on the host");
            let r = train(&plan, STEPS, ExecMode::Arena);
            assert_eq!(
                bits(&r),
                bits(&plain),
                "F={world} {which} {what:?}: offload must not change a bit"
            );
            let rel = max_loss_rel_diff(&reference, &r);
            let (abs, _) = max_param_diff(&reference, &r);
            assert!(
                rel <= LOSS_RTOL && abs <= PARAM_ATOL,
                "{which}: {rel} {abs}"
            );
            if world == 2 {
                let d = train(&plan, 2, ExecMode::DebugAlloc);
                assert_eq!(bits(&d).0, bits(&r).0[..2].to_vec(), "{which} debug");
            }
        }
    }
}

#[test]
fn mixes_combine_with_clipping_bf16_and_accumulation() {
    let base = FsdpConfig::default();
    let combos = [
        FsdpConfig {
            settings: fsdpc_plan::Settings {
                clip_grad_norm: Some(0.5),
                ..base.settings.clone()
            },
            ..base.clone()
        },
        FsdpConfig {
            settings: fsdpc_plan::Settings {
                param_dtype: DType::Bf16,
                reduce_dtype: DType::Bf16,
                buffer_dtype: DType::Bf16,
                ..base.settings.clone()
            },
            ..base.clone()
        },
        FsdpConfig {
            settings: fsdpc_plan::Settings {
                grad_accum: 2,
                ..base.settings.clone()
            },
            ..base.clone()
        },
    ];
    let model = gpt(2, 2);
    for c in &combos {
        let plain = train(&plan_with(&model, 2, c), 4, ExecMode::Arena);
        for (which, what) in [MIXES[0], MIXES[4]] {
            let r = train(
                &plan_with(&model, 2, &offload(which, what, c)),
                4,
                ExecMode::Arena,
            );
            assert_eq!(bits(&r), bits(&plain), "{which} {what:?} with {c:?}");
        }
    }
}

/// Device and host peaks per rank as units are added, paths in unit
/// order: the device peak never rises and the host peak never falls;
/// every partial mix lies between no offload and full offload, and the
/// last unit's offload makes the full one.
#[test]
fn the_device_peak_falls_between_none_and_full_as_units_are_added() {
    let model = gpt(4, 2);
    let base = FsdpConfig::default();
    let none = plan_with(&model, 2, &base);
    for what in [OffloadWhat::Params, OffloadWhat::Optimizer] {
        let full = plan_with(&model, 2, &offload("all", what, &base));
        let mut paths: Vec<String> = vec!["root".into()];
        let mut prev = (none.memory.peak_bytes, 0u64);
        eprintln!(
            "{what:?}: none: device {} host 0; all: device {} host {}",
            none.memory.peak_bytes, full.memory.peak_bytes, full.memory.host_peak_bytes
        );
        for l in 0..4 {
            let p = plan_with(
                &model,
                2,
                &offload(&format!("paths:{}", paths.join(",")), what, &base),
            );
            let (dev, host) = (p.memory.peak_bytes, p.memory.host_peak_bytes);
            eprintln!("{what:?} {}: device {dev} host {host}", paths.join(","));
            assert!(
                dev <= prev.0 && host > prev.1,
                "{what:?} {paths:?}: {dev} {host} after {prev:?}"
            );
            assert!(
                full.memory.peak_bytes <= dev && dev < none.memory.peak_bytes,
                "{what:?} {paths:?}: {dev} not between {} and {}",
                full.memory.peak_bytes,
                none.memory.peak_bytes
            );
            assert!(host < full.memory.host_peak_bytes, "{what:?} {paths:?}");
            prev = (dev, host);
            paths.push(format!("transformer.h.{l}"));
        }
        let every = plan_with(
            &model,
            2,
            &offload(&format!("paths:{}", paths.join(",")), what, &base),
        );
        assert_eq!(every.memory.peak_bytes, full.memory.peak_bytes, "{what:?}");
        assert_eq!(
            every.memory.host_peak_bytes, full.memory.host_peak_bytes,
            "{what:?}"
        );
    }
    // Optimizer-only offload keeps the shards on the device.
    let opt = plan_with(&model, 2, &offload("all", OffloadWhat::Optimizer, &base));
    for b in &opt.buffers {
        let host = b.location == Location::Host;
        assert_eq!(host, b.kind == BufferKind::OptimizerState, "{:?}", b.kind);
    }
}

#[test]
fn bad_selections_are_refused() {
    let base = FsdpConfig::default();
    let model = gpt(2, 2);
    for which in ["paths:transformer.h.9", "kind:T5Block", "every:0"] {
        let cfg = match OffloadUnits::parse(which) {
            Ok(units) => FsdpConfig {
                settings: fsdpc_plan::Settings {
                    cpu_offload: true,
                    ..base.settings.clone()
                },
                offload_units: units,
                ..base.clone()
            },
            Err(e) => {
                assert!(
                    matches!(
                        e,
                        ConfigError {
                            what: "cpu offload",
                            ..
                        }
                    ),
                    "{e}"
                );
                continue;
            }
        };
        match common::compile_on(&model, "cpu-local", 2, 2, &cfg) {
            Err(
                e @ PlanError::BadConfig {
                    what: "cpu offload",
                    ..
                },
            ) => {
                let text = e.to_string();
                assert!(
                    text.contains("transformer.h.0") || text.contains("GPT2Block"),
                    "{text}"
                );
            }
            other => panic!("{which}: expected a refusal, got {:?}", other.map(|_| ())),
        }
    }
    assert!(OffloadWhat::parse("gradients").is_err());
}

#[test]
fn the_verifier_refuses_state_in_the_wrong_memory() {
    let plan = plan_with(
        &gpt(2, 2),
        2,
        &offload(
            "paths:transformer.h.0",
            OffloadWhat::Params,
            &FsdpConfig::default(),
        ),
    );
    let mut bad = plan.clone();
    // A unit that does not offload with its state on the host.
    let b = bad
        .buffers
        .iter()
        .position(|b| b.kind == BufferKind::OptimizerState && b.location == Location::Device)
        .expect("a device state buffer");
    bad.buffers[b].location = Location::Host;
    let errs = bad.validate().expect_err("invalid");
    assert!(
        errs.iter()
            .any(|e| e.to_string().contains("expected Device")),
        "{errs:?}"
    );
}

/// `compile --cpu-offload paths:... --offload-what optimizer` writes a
/// plan that `inspect` describes and `train` runs; `--offload-what`
/// without `--cpu-offload` is refused.
#[test]
fn cli_flags() {
    use crate::common::cli::{check_error, dir, ok, s};
    let d = dir("partial-offload");
    let path = d.join("plan.json");
    let model = gpt(2, 2);
    let base = ["compile", &model, "--world", "2", "--preset", "cpu-local"];
    let mut args = base.to_vec();
    args.extend([
        "--cpu-offload",
        "paths:transformer.h.1",
        "--offload-what",
        "optimizer",
        "-o",
        s(&path),
    ]);
    ok(&args);
    let text = ok(&["inspect", s(&path)]);
    assert!(
        text.contains("offload   1 of 3 units (transformer.h.1): optimizer state in host memory"),
        "{text}"
    );
    ok(&["train", s(&path), "--steps", "2"]);
    let mut args = base.to_vec();
    args.extend(["--cpu-offload", "every:2", "-o", s(&path)]);
    ok(&args);
    let text = ok(&["inspect", s(&path)]);
    assert!(
        text.contains("offload   1 of 3 units (transformer.h.0): shards"),
        "{text}"
    );
    let mut bad = base.to_vec();
    bad.extend(["--offload-what", "optimizer", "-o", s(&path)]);
    check_error(&bad, "--cpu-offload");
    let mut bad = base.to_vec();
    bad.extend(["--cpu-offload", "paths:nowhere", "-o", s(&path)]);
    check_error(&bad, "nowhere");
    let _ = std::fs::remove_dir_all(&d);
}
