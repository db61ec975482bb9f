//! One conformance suite for every target: the same small plans, run
//! through `fsdpc train --target T`, give the losses of one unsharded rank
//! within each case's stated tolerance, and, where the target measures its
//! memory, a measured peak no larger than the plan's.
//!
//! Each case is compiled for the target (`fsdpc compile --target T`); a
//! case the target cannot run must be refused at compile time, in one
//! line naming the target, and is then not run there. The thread ranks
//! always run; MPI process ranks run when this test is built with
//! `--features mpi` and `mpirun` is installed, and must equal the thread
//! ranks bit for bit (both sum in rank order); the GPU runs when built with
//! `--features cuda` on a machine with one, within the CPU-vs-GPU
//! tolerance of `tests/it/cuda.rs`. A target that is not present says so.

use std::path::{Path, PathBuf};
use std::process::Command;

const STEPS: &str = "4";

/// One plan of the suite.
struct Case {
    name: &'static str,
    world: u32,
    /// Flags besides the model and the world.
    flags: &'static [&'static str],
    /// Losses against one unsharded rank, relative (the tolerances of
    /// tests/it/equivalence.rs and tests/it/precision.rs).
    rtol: f32,
}

/// The global batch is 8 samples a step on every world (8 / world per rank).
fn model(world: u32) -> String {
    format!(
        "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch={}",
        8 / world
    )
}

/// f32 against one rank (tests/it/equivalence.rs's `LOSS_RTOL`).
const F32: f32 = 1e-6;

const CASES: &[Case] = &[
    Case {
        name: "one rank",
        world: 1,
        flags: &[],
        rtol: 0.0,
    },
    Case {
        name: "one rank, bf16",
        world: 1,
        flags: &["--mixed-precision", "bf16"],
        rtol: 0.0,
    },
    Case {
        name: "one rank, gradient accumulation and clipping",
        world: 1,
        flags: &["--grad-accum", "2", "--clip-grad-norm", "0.5"],
        rtol: 0.0,
    },
    Case {
        name: "one rank, activation checkpointing",
        world: 1,
        flags: &["--activation-checkpointing"],
        rtol: 0.0,
    },
    Case {
        name: "full_shard",
        world: 2,
        flags: &[],
        rtol: F32,
    },
    Case {
        name: "full_shard over 4",
        world: 4,
        flags: &[],
        rtol: F32,
    },
    Case {
        name: "no_shard",
        world: 2,
        flags: &["--strategy", "no_shard"],
        rtol: F32,
    },
    Case {
        name: "hybrid_shard 2 x 2",
        world: 4,
        flags: &["--strategy", "hybrid_shard", "--shard-factor", "2"],
        rtol: F32,
    },
    Case {
        name: "full_shard over 4, resharded to 2 after forward",
        world: 4,
        flags: &["--shard-factor", "4", "--reshard-after-forward", "2"],
        rtol: F32,
    },
    Case {
        name: "gradient accumulation",
        world: 2,
        flags: &["--grad-accum", "2"],
        rtol: F32,
    },
    Case {
        name: "activation checkpointing",
        world: 2,
        flags: &["--activation-checkpointing"],
        rtol: F32,
    },
    Case {
        name: "gradient clipping",
        world: 2,
        flags: &["--clip-grad-norm", "0.5"],
        rtol: F32,
    },
    Case {
        name: "bf16",
        world: 2,
        flags: &["--mixed-precision", "bf16"],
        // tests/it/precision.rs's BF16_LOSS_RTOL.
        rtol: 1e-3,
    },
    Case {
        name: "fp16 with the loss scaler",
        world: 2,
        flags: &["--mixed-precision", "fp16"],
        // tests/it/precision.rs's FP16_LOSS_RTOL.
        rtol: 1e-4,
    },
    Case {
        name: "CPU offload",
        world: 2,
        flags: &["--cpu-offload"],
        rtol: F32,
    },
];

/// The sharding flags a one-rank reference drops (one rank shards nothing).
const SHARDING: &[&str] = &["--strategy", "--shard-factor", "--reshard-after-forward"];

/// What one run reports, from its `--metrics` file.
struct Run {
    losses: Vec<f32>,
    /// Each step's measured and planned peak per rank.
    peaks: Vec<(Option<u64>, u64)>,
}

/// The `fsdpc` binary: this build's, or `FSDPC_BIN` (a binary carried to a
/// GPU machine with this test, `scripts/gpu-bundle.sh`).
fn bin() -> PathBuf {
    std::env::var_os("FSDPC_BIN").map_or_else(|| env!("CARGO_BIN_EXE_fsdpc").into(), PathBuf::from)
}

fn fsdpc() -> Command {
    Command::new(bin())
}

fn ok(mut c: Command, what: &str) -> Result<String, String> {
    let o = c
        .output()
        .map_err(|e| format!("{what}: cannot start: {e}"))?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!(
            "{what}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

fn metrics(path: &Path) -> Run {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    Run {
        losses: lines
            .iter()
            .filter_map(|v| v["loss"].as_f64().map(|x| x as f32))
            .collect(),
        peaks: lines
            .iter()
            .map(|v| {
                (
                    v["measured_peak_bytes"].as_u64(),
                    v["planned_peak_bytes"].as_u64().unwrap_or(0),
                )
            })
            .collect(),
    }
}

/// Compiles `flags` at `world` for `target` into `dir`: the plan's path,
/// or the compiler's refusal.
fn compile(dir: &Path, target: &str, world: u32, flags: &[&str]) -> Result<PathBuf, String> {
    let plan = dir.join(format!("{target}-{world}-{}.json", flags.join("_")));
    let mut c = fsdpc();
    c.args(["compile", &model(world), "--world", &world.to_string()])
        .args(["--cluster", "cpu-local", "--target", target])
        .args(flags)
        .arg("-o")
        .arg(&plan);
    ok(c, "compile").map(|_| plan)
}

/// Trains `plan` on `target` (world ranks), with its metrics in `dir`.
fn train(dir: &Path, target: &str, world: u32, plan: &Path) -> Result<Run, String> {
    let out = dir.join(format!(
        "{target}-{}.jsonl",
        plan.file_stem().and_then(|s| s.to_str()).unwrap_or("plan")
    ));
    let mut c = if target == "mpi" {
        let mut c = Command::new("mpirun");
        c.args(["--allow-run-as-root", "--oversubscribe", "-np"])
            .arg(world.to_string())
            .arg(bin());
        c
    } else {
        fsdpc()
    };
    c.arg("train")
        .arg(plan)
        .args(["--target", target, "--steps", STEPS, "--metrics"])
        .arg(&out);
    let stdout = ok(c, &format!("train on {target}"))?;
    // Only rank 0 of a process world reports.
    if stdout.matches("trained ").count() != 1 {
        return Err(format!("one summary expected, got: {stdout}"));
    }
    Ok(metrics(&out))
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Largest relative difference, step by step.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / y.abs().max(1e-6))
        .fold(0.0, f32::max)
}

/// Runs every case of at most `max_world` ranks on `target`; `tolerance`
/// widens a case's (the GPU's arithmetic), `bitwise` asks for the thread
/// ranks' losses to the bit.
fn conform(target: &str, max_world: u32, tolerance: fn(&Case) -> f32, bitwise: bool) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let caps = fsdpc_runtime::targets::capabilities(target).expect("a target");
    let mut failures = Vec::new();
    for case in CASES {
        if case.world > max_world {
            eprintln!(
                "{target}: {} needs {} ranks, {max_world} here: not run",
                case.name, case.world
            );
            continue;
        }
        let tolerance = tolerance(case);
        let plan = match compile(dir.path(), target, case.world, case.flags) {
            Ok(p) => p,
            Err(e) => {
                // Out of this target's capabilities: refused in one line
                // naming it, and not run.
                let named =
                    e.contains(&format!("on the {target} target")) && e.trim().lines().count() == 1;
                if !named {
                    failures.push(format!(
                        "{}: refused without naming the target: {e}",
                        case.name
                    ));
                } else {
                    eprintln!("{target}: {} is not in its capabilities ({e})", case.name);
                }
                continue;
            }
        };
        let reference_flags: Vec<&str> = case
            .flags
            .iter()
            .enumerate()
            // A sharding flag and its value.
            .filter(|(i, f)| {
                let value_of_one = *i > 0 && SHARDING.contains(&case.flags[i - 1]);
                !SHARDING.contains(f) && !value_of_one
            })
            .map(|(_, f)| *f)
            .collect();
        let result = (|| -> Result<(), String> {
            let reference_plan = compile(dir.path(), "threads", 1, &reference_flags)?;
            let reference = train(dir.path(), "threads", 1, &reference_plan)?;
            let run = train(dir.path(), target, case.world, &plan)?;
            if run.losses.len() != reference.losses.len() || run.losses.is_empty() {
                return Err(format!(
                    "{} losses against {}",
                    run.losses.len(),
                    reference.losses.len()
                ));
            }
            let d = rel_diff(&run.losses, &reference.losses);
            eprintln!("{target}: {}: losses within {d:e} of one rank", case.name);
            if d > case.rtol + tolerance {
                return Err(format!(
                    "losses {:?} differ from one rank's {:?} by {d:e} (tolerance {:e})",
                    run.losses,
                    reference.losses,
                    case.rtol + tolerance
                ));
            }
            if bitwise {
                let threads = train(dir.path(), "threads", case.world, &plan)?;
                if bits(&run.losses) != bits(&threads.losses) {
                    return Err(format!(
                        "losses {:?} are not the thread ranks' {:?} bit for bit",
                        run.losses, threads.losses
                    ));
                }
            }
            for (measured, planned) in &run.peaks {
                if matches!(measured, Some(m) if m > planned) {
                    return Err(format!(
                        "measured peak {measured:?} over the plan's {planned}"
                    ));
                }
            }
            Ok(())
        })();
        if let Err(e) = result {
            failures.push(format!("{}: {e}", case.name));
        }
    }
    assert!(
        caps.target == target,
        "capabilities name their target: {caps:?}"
    );
    assert!(failures.is_empty(), "{target}:\n{}", failures.join("\n"));
}

#[test]
fn thread_ranks_conform() {
    conform("threads", u32::MAX, |_| 0.0, false);
}

/// MPI process ranks: the same losses as the thread ranks, bit for bit.
#[cfg(feature = "mpi")]
#[test]
fn mpi_process_ranks_conform() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!("skipped: mpirun is not installed");
        return;
    }
    conform("mpi", u32::MAX, |_| 0.0, true);
}

/// The GPUs of this machine, where one is present (each GPU rank is a
/// process; this suite starts one, so it runs the one-rank cases): within
/// the CPU-vs-GPU loss tolerances of `tests/it/cuda.rs` (fast `exp`/`tanh`,
/// other summation orders), 1e-4 in f32 and 2e-2 in bf16.
#[cfg(feature = "cuda")]
#[test]
fn cuda_ranks_conform() {
    let probe = fsdpc()
        .args(["train", &model(1), "--target", "cuda", "--steps", "1"])
        .output()
        .expect("fsdpc runs");
    if !probe.status.success() {
        eprintln!(
            "skipped: no GPU here ({})",
            String::from_utf8_lossy(&probe.stderr).trim()
        );
        return;
    }
    conform(
        "cuda",
        1,
        |c| {
            if c.flags.contains(&"bf16") {
                2e-2
            } else {
                1e-4
            }
        },
        false,
    );
}
