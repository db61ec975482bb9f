//! The loss-curve study of the low-precision collectives (issue 11, item
//! 3): a small GPT trained on CPU thread ranks (full_shard, bf16 mixed
//! precision, AdamW) for a few hundred steps with native bf16 gathers, fp8
//! e4m3 gathers, int8 block gathers, int8 block reduce-scatters and both
//! fp8 gathers and int8 reduce-scatters, each from the same seed and data.
//! An f32 run (no mixed precision) shows how far bf16 itself is from f32.
//!
//! Printed per run: the loss at checkpoints, the final loss, the mean and
//! the largest relative loss difference against the bf16 run over all
//! steps, the bytes a rank sends per step (the cost model's ring
//! accounting of the plan's collectives at their wire formats) and the
//! measured wall time per step.
//!
//! Run: `cargo bench --bench lowp [-- STEPS [RANKS]]` (defaults 300, 4).

#[allow(dead_code)] // only `figures` is used here
mod common;

use fsdpc_frontends::LoadOptions;
use fsdpc_ir::DType;
use fsdpc_plan::{ModelInfo, Plan, Wire};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::{DataSpec, TrainOptions};
use std::path::Path;
use std::time::Instant;

/// A 3-layer byte-level GPT, 2.4 M parameters, 64 bytes of context; 8
/// sequences a step over all ranks.
fn model(ranks: u32) -> String {
    format!(
        "gpt:layers=3,hidden=256,heads=4,seq=64,vocab=256,batch={}",
        (8 / ranks).max(1)
    )
}

fn plan(spec: &str, ranks: u32, cfg: &FsdpConfig) -> Plan {
    let m = fsdpc_frontends::load(spec, &LoadOptions::default()).expect("model loads");
    let cluster = fsdpc_planner::preset("cpu-local", ranks, ranks).expect("preset");
    let info = ModelInfo {
        tokens_per_rank_step: m.tokens_per_rank_step(),
        params: m.program.graph.param_numel(),
        name: m.name,
    };
    fsdpc_planner::compile(m.program, info, &cluster, cfg).expect("plan compiles")
}

fn config(mixed: bool, ag: Wire, rs: Wire) -> FsdpConfig {
    let d = if mixed { DType::Bf16 } else { DType::F32 };
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: d,
            reduce_dtype: d,
            buffer_dtype: d,
            allgather_wire: ag,
            reduce_scatter_wire: rs,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

struct Run {
    name: &'static str,
    losses: Vec<f32>,
    bytes: u64,
    step_s: f64,
}

fn run(name: &'static str, spec: &str, ranks: u32, steps: u64, cfg: &FsdpConfig) -> Run {
    let p = plan(spec, ranks, cfg);
    let text = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/data/lighthouse.txt");
    let opts = TrainOptions {
        steps,
        seed: 5,
        data: DataSpec::TextFile(text),
        keep_params: false,
        ..TrainOptions::default()
    };
    let started = Instant::now();
    let r = fsdpc_runtime::train(&p, &opts, &mut |_| {}).expect("training runs");
    let step_s = started.elapsed().as_secs_f64() / steps.max(1) as f64;
    Run {
        name,
        losses: r.losses,
        bytes: p.estimates.comm_bytes_per_step,
        step_s,
    }
}

fn rel(a: f32, b: f32) -> f64 {
    f64::from((a - b).abs()) / f64::from(b.abs()).max(1e-6)
}

fn main() {
    common::figures(
        "lowp",
        "low-precision collectives and the loss",
        "A 3-layer byte-level GPT trained on 4 CPU thread ranks (full_shard, bf16, AdamW) on `examples/data/lighthouse.txt` with each wire format (`--allgather-wire`, `--reduce-scatter-wire`), and in f32: the loss along the run, its difference from the native bf16 run, the bytes a rank sends per step and the wall time per step.",
    );
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let steps: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(300);
    let ranks: u32 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(4);
    let spec = model(ranks);
    let fp8 = Wire::parse("fp8", 0).expect("fp8");
    let int8 = Wire::Int8Block {
        block: fsdpc_plan::wire::DEFAULT_BLOCK,
    };
    let native = Wire::Native;
    println!(
        "{spec} on {ranks} CPU thread ranks (full_shard), AdamW lr 1e-3, {steps} steps on \
         examples/data/lighthouse.txt, seed 5; int8 blocks of {}",
        fsdpc_plan::wire::DEFAULT_BLOCK
    );
    let runs = [
        ("bf16 (native)", true, native, native),
        ("fp8 all-gather", true, fp8, native),
        ("int8 all-gather", true, int8, native),
        ("int8 reduce-scatter", true, native, int8),
        ("fp8 ag + int8 rs", true, fp8, int8),
        ("f32 (no mixed prec.)", false, native, native),
    ]
    .map(|(name, mixed, ag, rs)| {
        let r = run(name, &spec, ranks, steps, &config(mixed, ag, rs));
        eprintln!("  done: {name} ({:.3} s/step)", r.step_s);
        r
    });
    let base = &runs[0];
    let checkpoints: Vec<usize> = (0..steps as usize)
        .step_by((steps as usize / 6).max(1))
        .chain([steps as usize - 1])
        .collect();
    print!("{:<22}", "loss at step");
    for c in &checkpoints {
        print!(" {:>7}", c + 1);
    }
    println!();
    for r in &runs {
        print!("{:<22}", r.name);
        for &c in &checkpoints {
            print!(" {:>7.4}", r.losses[c]);
        }
        println!();
    }
    println!(
        "\n{:<22} {:>10} {:>14} {:>14} {:>14} {:>10}",
        "run", "final loss", "mean rel diff", "max rel diff", "bytes/step", "s/step"
    );
    for r in &runs {
        let diffs: Vec<f64> = r
            .losses
            .iter()
            .zip(&base.losses)
            .map(|(a, b)| rel(*a, *b))
            .collect();
        let mean = diffs.iter().sum::<f64>() / diffs.len().max(1) as f64;
        let max = diffs.iter().copied().fold(0.0, f64::max);
        println!(
            "{:<22} {:>10.4} {:>14.2e} {:>14.2e} {:>14} {:>10.3}",
            r.name,
            r.losses.last().copied().unwrap_or(f32::NAN),
            mean,
            max,
            r.bytes,
            r.step_s
        );
    }
    println!(
        "(differences are against the bf16 run, step by step; bytes/step: what one rank sends \
         per step over all collectives, ring accounting at the wire formats)"
    );
}
