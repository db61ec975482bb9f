//! Validation of the cost model and the memory plan (issue 9): predicted
//! against measured step time and planned against measured peak memory,
//! over models from 0.5 M to 50 M parameters, 1 and 2 rank threads,
//! full_shard and no_shard, prefetch on and off, activation checkpointing
//! and bf16.
//!
//! The cluster file comes from `FSDPC_CLUSTER` (used for every
//! configuration; `FSDPC_CLUSTER_1`, if set, for the 1-rank ones), or, if
//! unset, from calibrating this machine first (`fsdpc calibrate`'s
//! `measure`, for 1 and for 2 ranks per node). Each configuration is
//! compiled on that cluster, simulated (the predicted step), and trained
//! with the runtime as `fsdpc train` does (thread ranks, arena mode, one
//! matrix-product thread per rank) for `FSDPC_PREDICT_STEPS` steps
//! (default 8); the first 3 are warm-up, the measured step time is the
//! median of the rest (`StepReport::step_time`; the fastest is printed
//! too, unscored: on a loaded machine it is the least disturbed). Peak memory is measured
//! by the counting allocator installed here (as tests/memory.rs does).
//!
//! Run: `cargo bench --bench predict` (a few minutes; prints the load
//! average next to the figures: measure on a quiet machine).

use fsdpc::cli::calibrate;
use fsdpc_ir::DType;
use fsdpc_planner::cluster::ClusterFile;
use fsdpc_planner::{BackwardPrefetch, CheckpointPolicy, FsdpConfig, ModelInfo, Strategy};
use fsdpc_runtime::account::CountingAlloc;
use fsdpc_runtime::{ExecMode, TrainOptions};

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

const WARMUP: usize = 3;

/// One configuration of the validation set.
struct Case {
    spec: &'static str,
    world: u32,
    strategy: Strategy,
    prefetch: bool,
    checkpoint: bool,
    dtype: DType,
}

fn cases() -> Vec<Case> {
    let c = |spec, world, strategy, prefetch, checkpoint, dtype| Case {
        spec,
        world,
        strategy,
        prefetch,
        checkpoint,
        dtype,
    };
    use DType::{Bf16, F32};
    use Strategy::{FullShard, NoShard};
    const GPT_05M: &str = "gpt:layers=2,hidden=128,heads=4,seq=128,vocab=1024,batch=8";
    const GPT_2M: &str = "gpt:layers=4,hidden=192,heads=4,seq=128,vocab=2048,batch=4";
    const GPT_9M: &str = "gpt:layers=4,hidden=384,heads=6,seq=128,vocab=4096,batch=2";
    const GPT_23M: &str = "gpt:layers=6,hidden=512,heads=8,seq=128,vocab=8192,batch=2";
    const MLP_05M: &str = "mlp:layers=2,in=512,hidden=512,classes=10,batch=64";
    const MLP_50M: &str = "mlp:layers=3,in=4096,hidden=4096,classes=10,batch=16";
    vec![
        c(GPT_05M, 1, NoShard, true, false, F32),
        c(GPT_05M, 2, FullShard, true, false, F32),
        c(GPT_05M, 2, NoShard, true, false, F32),
        c(GPT_05M, 2, FullShard, true, false, Bf16),
        c(MLP_05M, 2, FullShard, true, false, F32),
        c(GPT_2M, 2, FullShard, true, false, F32),
        c(GPT_2M, 2, FullShard, false, false, F32),
        c(GPT_2M, 2, FullShard, true, true, F32),
        c(GPT_9M, 1, NoShard, true, false, F32),
        c(GPT_9M, 2, FullShard, true, false, F32),
        c(GPT_23M, 2, FullShard, true, false, F32),
        c(MLP_50M, 1, NoShard, true, false, F32),
        c(MLP_50M, 2, FullShard, true, false, F32),
    ]
}

fn config(case: &Case) -> FsdpConfig {
    FsdpConfig {
        strategy: case.strategy,
        forward_prefetch: case.prefetch,
        backward_prefetch: if case.prefetch {
            BackwardPrefetch::Pre
        } else {
            BackwardPrefetch::None
        },
        activation_checkpointing: if case.checkpoint {
            CheckpointPolicy::Units
        } else {
            CheckpointPolicy::None
        },
        param_dtype: case.dtype,
        reduce_dtype: case.dtype,
        buffer_dtype: case.dtype,
        ..FsdpConfig::default()
    }
}

fn load_file(var: &str) -> Option<ClusterFile> {
    let path = std::env::var(var).ok()?;
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{var}={path}: cannot read it: {e}"));
    Some(ClusterFile::from_json(&text).unwrap_or_else(|e| panic!("{var}={path}: {e}")))
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn mib(b: u64) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

fn main() {
    let steps: u64 = std::env::var("FSDPC_PREDICT_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8)
        .max(WARMUP as u64 + 1);
    println!("load average before: {}", load_average());
    let (two, one) = match load_file("FSDPC_CLUSTER") {
        Some(f) => {
            println!("cluster file: FSDPC_CLUSTER ({})", f.description);
            let one = load_file("FSDPC_CLUSTER_1").unwrap_or_else(|| f.clone());
            (f, one)
        }
        None => {
            println!("FSDPC_CLUSTER unset: calibrating this machine (1 and 2 ranks per node)");
            let (two, table) = calibrate::measure(2, false).expect("calibration");
            print!("{table}");
            let (one, _) = calibrate::measure(1, false).expect("calibration");
            (two, one)
        }
    };
    println!(
        "\n{:<62} {:>2} {:<10} {:>3} {:>3} {:>4}  {:>9} {:>9} {:>7} {:>9}  {:>9} {:>9} {:>6}",
        "model",
        "w",
        "strategy",
        "pf",
        "ac",
        "dt",
        "pred s",
        "meas s",
        "err %",
        "fastest s",
        "plan MiB",
        "meas MiB",
        "err %"
    );
    let (mut time_err, mut mem_err) = (Vec::new(), Vec::new());
    for case in cases() {
        let file = if case.world == 1 { &one } else { &two };
        let cluster = file
            .cluster(Some(case.world), Some(case.world))
            .expect("cluster");
        let m = fsdpc_frontends::load(case.spec, &fsdpc_frontends::LoadOptions::default())
            .expect("model loads");
        let info = ModelInfo {
            name: m.name.clone(),
            params: m.program.graph.param_numel(),
            tokens_per_rank_step: m.tokens_per_rank_step(),
        };
        let params = info.params;
        let plan = fsdpc_planner::compile(m.program, info, &cluster, &config(&case)).expect("plan");
        let predicted = fsdpc_planner::simulate::run(&plan, &cluster).step_time_s;
        let opts = TrainOptions {
            steps,
            seed: 1,
            mode: ExecMode::Arena,
            threads_per_rank: 1,
            ..TrainOptions::default()
        };
        let mut times = Vec::new();
        let report = fsdpc_runtime::train(&plan, &opts, &mut |r| {
            times.push(r.step_time.as_secs_f64());
        })
        .expect("training runs");
        let mut kept = times.split_off(WARMUP.min(times.len()));
        kept.sort_by(f64::total_cmp);
        let measured = kept.get(kept.len() / 2).copied().unwrap_or(f64::NAN);
        // The fastest kept step: the least disturbed by other processes
        // on a shared machine (printed beside the median, not scored).
        let fastest = kept.first().copied().unwrap_or(f64::NAN);
        let t_err = (predicted - measured) / measured * 100.0;
        let planned = plan.memory.rank_bytes;
        let peak = report.measured_peak_bytes.unwrap_or(0);
        let m_err = (planned as f64 - peak as f64) / peak.max(1) as f64 * 100.0;
        time_err.push(t_err.abs());
        mem_err.push(m_err.abs());
        println!(
            "{:<62} {:>2} {:<10} {:>3} {:>3} {:>4}  {:>9.4} {:>9.4} {:>+7.1} {:>9.4}  {:>9.1} {:>9.1} {:>+6.2}",
            format!("{} ({:.1} M)", case.spec, params as f64 / 1e6),
            case.world,
            case.strategy.name(),
            if case.prefetch { "on" } else { "off" },
            if case.checkpoint { "on" } else { "off" },
            case.dtype.to_string(),
            predicted,
            measured,
            t_err,
            fastest,
            mib(planned),
            mib(peak),
            m_err
        );
    }
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let median = if v.len() % 2 == 1 {
            v[v.len() / 2]
        } else {
            (v[v.len() / 2 - 1] + v[v.len() / 2]) / 2.0
        };
        (median, v.last().copied().unwrap_or(0.0))
    };
    let (tm, tx) = stats(&mut time_err);
    let (mm, mx) = stats(&mut mem_err);
    println!(
        "\nstep time |error|: median {tm:.1}%, max {tx:.1}% (targets 5%, 15%); peak memory |error|: median {mm:.2}%, max {mx:.2}% (target 2%)"
    );
    println!("load average after: {}", load_average());
}
