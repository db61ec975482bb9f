//! The plan's memory against the process's memory, measured two independent
//! ways: the counting allocator's per-rank peak, and the resident set of a
//! fresh process (VmHWM, from the start of training to its end) minus the same process's resident set before any
//! rank exists (the program, the loaded model and its plan).
//!
//! Each configuration runs in a child process (this binary, re-run with
//! `FSDPC_MEMORY_CHILD=<model>|<ranks>`), so every high-water mark is its
//! own. Columns: planned peak per rank (`memory.rank_bytes`), measured peak
//! per rank (counting allocator, max over ranks), the child's peak RSS, its
//! baseline, and (RSS - baseline) / (ranks x planned).
//!
//! Run: `cargo bench --bench memory` (FSDPC_BENCH_STEPS steps, default 3).

mod common;

use fsdpc_plan::Strategy;
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::account::CountingAlloc;
use fsdpc_runtime::{ExecMode, TrainOptions};
use std::process::Command;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// The model of the user report (issue 6).
const GPT: &str = "gpt:layers=4,hidden=512,heads=8,seq=256,vocab=8192,batch=4";

/// Current resident set (VmRSS) of this process in bytes, from /proc.
fn rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// The child: compiles, measures the baseline, trains, prints one line of
/// figures (bytes): planned measured rss baseline.
fn child(spec: &str) {
    let (model, ranks) = spec.split_once('|').expect("model|ranks");
    let world: u32 = ranks.parse().expect("ranks");
    let steps: u64 = std::env::var("FSDPC_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3)
        .max(2);
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy: Strategy::FullShard,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let plan = common::compile(model, "cpu-local", world, world, &cfg).expect("plan");
    let baseline = rss_bytes().expect("/proc/self/status");
    // Start the high-water mark here: compiling's transient peak is not the
    // run's (Linux: writing 5 to clear_refs resets VmHWM to VmRSS).
    std::fs::write("/proc/self/clear_refs", "5").expect("reset VmHWM");
    let opts = TrainOptions {
        steps,
        seed: 1,
        mode: ExecMode::Arena,
        threads_per_rank: 1,
        // As `fsdpc train` without --save-*: no full parameters assembled
        // after the steps, so the whole run's high-water mark counts.
        keep_params: false,
        ..TrainOptions::default()
    };
    let report = fsdpc_runtime::train(&plan, &opts, &mut |_| {}).expect("training runs");
    let rss = common::peak_rss_bytes().unwrap_or(0);
    println!(
        "{} {} {} {}",
        plan.memory.rank_bytes,
        report
            .measured_peak_bytes
            .expect("counting allocator installed"),
        rss,
        baseline
    );
}

fn main() {
    common::figures(
        "memory",
        "planned memory against the process",
        "A 4-layer GPT trained on 1 and 2 CPU thread ranks (full_shard, AdamW), each in a fresh child process: the plan's bytes per rank, the counting allocator's measured peak per rank, and the process's peak resident set against its start-up baseline.",
    );
    if let Ok(spec) = std::env::var("FSDPC_MEMORY_CHILD") {
        child(&spec);
        return;
    }
    let exe = std::env::current_exe().expect("this binary");
    println!(
        "{:<60} {:>5} {:>12} {:>12} {:>10} {:>10} {:>8}",
        "model", "ranks", "planned/rank", "measured/rank", "RSS", "baseline", "ratio"
    );
    for ranks in [1u32, 2] {
        let out = Command::new(&exe)
            .env("FSDPC_MEMORY_CHILD", format!("{GPT}|{ranks}"))
            .output()
            .expect("child runs");
        if !out.status.success() {
            eprintln!("{}", String::from_utf8_lossy(&out.stderr));
            panic!("the child for {ranks} ranks failed");
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let f: Vec<u64> = text
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        let [planned, measured, rss, baseline] = f[..] else {
            panic!("unexpected child output: {text}");
        };
        let ratio = (rss - baseline) as f64 / (u64::from(ranks) * planned) as f64;
        println!(
            "{:<60} {:>5} {:>9.1} MiB {:>9.1} MiB {:>6.1} MiB {:>6.1} MiB {:>8.3}",
            GPT,
            ranks,
            common::mib(planned),
            common::mib(measured),
            common::mib(rss),
            common::mib(baseline),
            ratio
        );
    }
}
