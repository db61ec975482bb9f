//! Validation of the cost model and the memory plan (issue 9): predicted
//! against measured step time and planned against measured peak memory,
//! over models from 0.5 M to 50 M parameters (GPTs, MLPs, a ResNet-18 on
//! 32x32 images and a small ViT), 1 and 2 rank threads,
//! full_shard and no_shard, prefetch on and off, activation checkpointing
//! and bf16.
//!
//! The bench runs `FSDPC_PREDICT_ROUNDS` rounds (default 3). Each round's
//! cluster file comes from `FSDPC_CLUSTER` (used for every
//! configuration; `FSDPC_CLUSTER_1`, if set, for the 1-rank ones), or, if
//! unset, from calibrating this machine at the start of the round
//! (`fsdpc_runtime::calibrate::measure`, what `fsdpc calibrate` runs, for
//! 1 and for 2 ranks per node): a
//! user calibrates, then plans. Each round prints its own table; the
//! scored table compares each configuration's median prediction with its
//! median measurement over the rounds, with the measurements' spread (on
//! a shared 2-core VM the same step's time drifts by 10-30% from one
//! minute to the next, and one round's error is mostly that drift). Each configuration is
//! compiled on that cluster, simulated (the predicted step), and trained
//! with the runtime as `fsdpc train` does (thread ranks, arena mode, one
//! matrix-product thread per rank) for `FSDPC_PREDICT_STEPS` steps
//! (default 20); the first 3 are warm-up, the measured step time is the
//! median of the rest (`StepReport::step_time`; the fastest is printed
//! too, unscored: on a loaded machine it is the least disturbed). Peak memory is measured
//! by the counting allocator installed here (as tests/it/memory.rs does).
//!
//! Run: `cargo bench --bench predict` (a few minutes; prints the load
//! average next to the figures: measure on a quiet machine).

mod common;

use common::mib;
use fsdpc_ir::DType;
use fsdpc_plan::Cluster;
use fsdpc_plan::{BackwardPrefetch, CheckpointPolicy, Strategy};
use fsdpc_planner::FsdpConfig;
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
    const RESNET18: &str = "resnet:depth=18,image=32,classes=10,batch=16,bn=frozen";
    const VIT_5M: &str =
        "vit:layers=6,hidden=256,heads=4,mlp=1024,patch=4,image=32,classes=10,batch=8";
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
        c(RESNET18, 1, NoShard, true, false, F32),
        c(RESNET18, 2, FullShard, true, false, F32),
        c(VIT_5M, 2, FullShard, true, false, F32),
    ]
}

fn config(case: &Case) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
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
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

/// The cluster file `var` names (at one rank: each case reshapes it).
fn load_file(var: &str) -> Option<Cluster> {
    let path = std::env::var(var).ok()?;
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{var}={path}: cannot read it: {e}"));
    Some(
        Cluster::from_file(&text, Some(1), Some(1)).unwrap_or_else(|e| panic!("{var}={path}: {e}")),
    )
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// One configuration's figures in one round.
struct Outcome {
    predicted: f64,
    measured: f64,
    planned: u64,
    peak: u64,
    /// One evaluation batch (the plan's forward-only prefix): predicted,
    /// and measured as the mean of `EVAL_BATCHES` after the last step.
    eval_predicted: f64,
    eval_measured: f64,
}

/// Evaluation batches run after the last step of each configuration.
const EVAL_BATCHES: u64 = 5;

/// This machine calibrated for `ranks_per_node` ranks per node, from the
/// `cpu-local` preset (what `fsdpc calibrate` does), and its table.
fn calibrate(ranks_per_node: u32) -> (Cluster, String) {
    let base = fsdpc_planner::presets::described("cpu-local", ranks_per_node, ranks_per_node)
        .expect("preset");
    let model = |spec: &str| {
        fsdpc_frontends::load(spec, &fsdpc_frontends::LoadOptions::default())
            .map(|m| m.program.graph)
            .map_err(|e| e.to_string())
    };
    fsdpc_runtime::calibrate::measure(base, ranks_per_node, &model, &mut |_| {})
        .expect("calibration")
}

/// The cluster files of one round: from `FSDPC_CLUSTER` (and
/// `FSDPC_CLUSTER_1`), else calibrated now (2 and 1 ranks per node).
fn clusters(round: usize) -> (Cluster, Cluster) {
    match load_file("FSDPC_CLUSTER") {
        Some(f) => {
            println!("cluster file: FSDPC_CLUSTER ({})", f.description);
            let one = load_file("FSDPC_CLUSTER_1").unwrap_or_else(|| f.clone());
            (f, one)
        }
        None => {
            println!("round {round}: calibrating this machine (1 and 2 ranks per node)");
            let (two, table) = calibrate(2);
            if round == 1 {
                print!("{table}");
            }
            let (one, _) = calibrate(1);
            (two, one)
        }
    }
}

/// Compiles `case` on `file`'s cluster, simulates it and trains it for
/// `steps` steps: the predicted and measured step and peak.
fn run_case(case: &Case, file: &Cluster, steps: u64) -> (Outcome, f64, u64) {
    let cluster = file.reshaped(case.world, case.world).expect("cluster");
    let plan = common::compile_for(case.spec, &cluster, &config(case)).expect("plan");
    let params = plan.model.params;
    let predicted = fsdpc_planner::simulate::run(&plan, &cluster).step_time_s;
    let eval_predicted = fsdpc_planner::simulate::estimate_on(&plan, &cluster).eval_s;
    let opts = TrainOptions {
        steps,
        seed: 1,
        mode: ExecMode::Arena,
        threads_per_rank: 1,
        eval: Some(fsdpc_runtime::EvalOptions {
            data: fsdpc_runtime::DataSpec::Synthetic,
            every: 0,
            batches: Some(EVAL_BATCHES),
        }),
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
    // The fastest kept step: the least disturbed by other processes on a
    // shared machine (printed beside the median, not scored).
    let fastest = kept.first().copied().unwrap_or(f64::NAN);
    let eval = report
        .evals
        .last()
        .expect("an evaluation after the last step");
    let outcome = Outcome {
        predicted,
        measured,
        planned: plan.memory.rank_bytes,
        peak: report.measured_peak_bytes.unwrap_or(0),
        eval_predicted,
        eval_measured: eval.time.as_secs_f64() / eval.batches as f64,
    };
    (outcome, fastest, params)
}

fn describe(case: &Case, params: u64) -> String {
    format!(
        "{:<62} {:>2} {:<10} {:>3} {:>3} {:>4}",
        format!("{} ({:.1} M)", case.spec, params as f64 / 1e6),
        case.world,
        case.strategy.name(),
        if case.prefetch { "on" } else { "off" },
        if case.checkpoint { "on" } else { "off" },
        case.dtype.to_string(),
    )
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn max(v: &[f64]) -> f64 {
    v.iter().copied().fold(0.0, f64::max)
}

fn pct(predicted: f64, measured: f64) -> f64 {
    (predicted - measured) / measured * 100.0
}

fn main() {
    common::figures(
        "predict",
        "predicted against measured",
        "The cost model and the memory plan checked on this machine: each round calibrates it (as `fsdpc calibrate`), then compiles, simulates and trains 13 configurations (GPT and MLP, 0.5 M to 50 M parameters, 1 and 2 ranks, full_shard and no_shard, prefetch off, activation checkpointing, bf16), and prints the predicted and measured step, peak memory and evaluation batch (the plan's forward-only prefix, 5 batches after the last step); the last table scores each configuration's median prediction against its median measurement over the rounds.",
    );
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    let steps = env("FSDPC_PREDICT_STEPS", 20).max(WARMUP as u64 + 1);
    let rounds = env("FSDPC_PREDICT_ROUNDS", 3).max(1) as usize;
    println!(
        "{rounds} round(s), each a fresh calibration (unless FSDPC_CLUSTER is set) then every configuration: {steps} steps, the first {WARMUP} warm-up, the median of the rest"
    );
    println!("load average before: {}", load_average());
    let header = format!(
        "{:<62} {:>2} {:<10} {:>3} {:>3} {:>4}",
        "model", "w", "strategy", "pf", "ac", "dt"
    );
    let cases = cases();
    let mut all: Vec<Vec<Outcome>> = cases.iter().map(|_| Vec::new()).collect();
    let mut names = vec![String::new(); cases.len()];
    for round in 1..=rounds {
        let (two, one) = clusters(round);
        println!(
            "\nround {round}\n{header}  {:>9} {:>9} {:>7} {:>9}  {:>9} {:>9} {:>6}  {:>9} {:>9} {:>7}",
            "pred s", "meas s", "err %", "fastest s", "plan MiB", "meas MiB", "err %",
            "eval pred", "eval meas", "err %"
        );
        let (mut time_err, mut mem_err, mut eval_err) = (Vec::new(), Vec::new(), Vec::new());
        for (i, case) in cases.iter().enumerate() {
            let file = if case.world == 1 { &one } else { &two };
            let (o, fastest, params) = run_case(case, file, steps);
            names[i] = describe(case, params);
            let t_err = pct(o.predicted, o.measured);
            let m_err = pct(o.planned as f64, o.peak.max(1) as f64);
            let e_err = pct(o.eval_predicted, o.eval_measured);
            time_err.push(t_err.abs());
            mem_err.push(m_err.abs());
            eval_err.push(e_err.abs());
            println!(
                "{}  {:>9.4} {:>9.4} {:>+7.1} {:>9.4}  {:>9.1} {:>9.1} {:>+6.2}  {:>9.4} {:>9.4} {:>+7.1}",
                names[i],
                o.predicted,
                o.measured,
                t_err,
                fastest,
                mib(o.planned),
                mib(o.peak),
                m_err,
                o.eval_predicted,
                o.eval_measured,
                e_err
            );
            all[i].push(o);
        }
        println!(
            "round {round}: step time |error| median {:.1}%, max {:.1}%; peak memory |error| median {:.2}%, max {:.2}%; evaluation batch |error| median {:.1}%, max {:.1}%",
            median(&time_err),
            max(&time_err),
            median(&mem_err),
            max(&mem_err),
            median(&eval_err),
            max(&eval_err)
        );
    }
    // Over the rounds: each configuration's median prediction against its
    // median measurement (the machine's speed drifts between rounds, and
    // each round's calibration with it), and how far its measurements
    // spread.
    println!(
        "\nover {rounds} round(s): median predicted against median measured\n{header}  {:>9} {:>9} {:>7} {:>9}  {:>9} {:>9} {:>7}",
        "pred s", "meas s", "err %", "spread %", "eval pred", "eval meas", "err %"
    );
    let (mut time_err, mut mem_err, mut eval_err) = (Vec::new(), Vec::new(), Vec::new());
    for (name, outcomes) in names.iter().zip(&all) {
        let p = median(&outcomes.iter().map(|o| o.predicted).collect::<Vec<_>>());
        let ms: Vec<f64> = outcomes.iter().map(|o| o.measured).collect();
        let m = median(&ms);
        let spread = (ms.iter().copied().fold(f64::MIN, f64::max)
            - ms.iter().copied().fold(f64::MAX, f64::min))
            / m
            * 100.0;
        let e = pct(p, m);
        time_err.push(e.abs());
        mem_err.extend(
            outcomes
                .iter()
                .map(|o| pct(o.planned as f64, o.peak.max(1) as f64).abs()),
        );
        let ep = median(
            &outcomes
                .iter()
                .map(|o| o.eval_predicted)
                .collect::<Vec<_>>(),
        );
        let em = median(&outcomes.iter().map(|o| o.eval_measured).collect::<Vec<_>>());
        let ee = pct(ep, em);
        eval_err.push(ee.abs());
        println!(
            "{name}  {p:>9.4} {m:>9.4} {e:>+7.1} {spread:>9.1}  {ep:>9.4} {em:>9.4} {ee:>+7.1}"
        );
    }
    println!(
        "\nstep time |error|: median {:.1}%, max {:.1}% (targets 5%, 15%); peak memory |error|: median {:.2}%, max {:.2}% (target 2%); evaluation batch |error|: median {:.1}%, max {:.1}%",
        median(&time_err),
        max(&time_err),
        median(&mem_err),
        max(&mem_err),
        median(&eval_err),
        max(&eval_err)
    );
    println!("load average after: {}", load_average());
}
