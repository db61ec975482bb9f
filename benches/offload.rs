//! CPU offload figures from the memory plan: gpt3-175b at 128 ranks (8 per
//! node, the A100 80 GB preset: PCIe 4 x16 at 25 GB/s between host and
//! device), full_shard, in f32 and in bf16 (parameters gathered and
//! gradients reduced in bf16, f32 master shards), without and with
//! activation checkpointing of every block: the device peak per rank
//! without and with `--cpu-offload`, the host bytes per rank it moves
//! there, the bytes copied each way per step, and the estimated step time.
//!
//! Run: `cargo bench --bench offload`

// Only `common::compile` is used here.
#[allow(dead_code)]
mod common;

use fsdpc_ir::DType;
use fsdpc_plan::{BufferKind, CheckpointPolicy, Location};
use fsdpc_planner::FsdpConfig;

fn row(name: &str, cfg: &FsdpConfig) {
    let plain = common::compile("gpt3-175b", "a100-80g-roce", 128, 8, cfg);
    let offload = FsdpConfig {
        settings: fsdpc_plan::Settings {
            cpu_offload: true,
            ..cfg.settings.clone()
        },
        ..cfg.clone()
    };
    let off = common::compile("gpt3-175b", "a100-80g-roce", 128, 8, &offload);
    let (p, o) = match (plain, off) {
        (Ok(p), Ok(o)) => (p, o),
        (Err(e), _) | (_, Err(e)) => {
            println!("  {name:<16} does not plan: {e}");
            return;
        }
    };
    let state: u64 = o
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::OptimizerState)
        .map(|b| b.bytes)
        .sum();
    println!(
        "  {:<16} {:>8.2} GiB {:>8.2} GiB {:>8.2} GiB {:>8.2} GiB {:>8.2} GiB {:>8.2} GiB {:>7.2} s {:>7.2} s",
        name,
        common::gib(p.memory.peak_bytes),
        common::gib(o.memory.peak_bytes),
        common::gib(o.memory.host_peak_bytes),
        common::gib(state),
        common::gib(o.copied_bytes(Location::Device)),
        common::gib(o.copied_bytes(Location::Host)),
        p.estimates.step_time_s,
        o.estimates.step_time_s,
    );
}

fn main() {
    common::figures(
        "offload",
        "CPU offload at scale",
        "gpt3-175b at world 128 (`a100-80g-roce`, full_shard), f32 and bf16, with and without activation checkpointing: the device peak per rank without and with `--cpu-offload`, the bytes moved to the host, the bytes copied each way per step and the simulated step.",
    );
    println!("gpt3-175b, world 128 (8 per node, a100-80g-roce), full_shard: per rank");
    println!(
        "  {:<16} {:>12} {:>12} {:>12} {:>12} {:>12} {:>12} {:>9} {:>9}",
        "setting",
        "device peak",
        "offloaded",
        "host bytes",
        "(opt. state)",
        "copied in",
        "copied out",
        "step",
        "offl. step"
    );
    for dtype in [DType::F32, DType::Bf16] {
        for ac in [false, true] {
            let cfg = FsdpConfig {
                settings: fsdpc_plan::Settings {
                    param_dtype: dtype,
                    reduce_dtype: dtype,
                    activation_checkpointing: if ac {
                        CheckpointPolicy::Units
                    } else {
                        CheckpointPolicy::None
                    },
                    ..fsdpc_plan::Settings::default()
                },
                check_fits: false,
                ..FsdpConfig::default()
            };
            row(&format!("{dtype}{}", if ac { " + AC" } else { "" }), &cfg);
        }
    }
}
