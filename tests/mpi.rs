//! MPI process ranks against thread ranks: `mpirun -np N fsdpc train
//! --backend mpi` gives bit-identical losses to `fsdpc train --ranks N`
//! (both sum in rank order). Needs `mpirun` (openmpi-bin) and the `mpi`
//! feature: `cargo test --features mpi --test mpi`.
#![cfg(feature = "mpi")]

use std::path::Path;
use std::process::Command;

const MODEL: &str = "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256,batch=4";
const STEPS: &str = "4";

/// The `loss` of every line of a `--metrics` file.
fn losses(path: &Path) -> Vec<f32> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["loss"].as_f64().map(|x| x as f32))
        .collect()
}

fn mpirun(np: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        &np.to_string(),
    ]);
    c.arg(env!("CARGO_BIN_EXE_fsdpc"));
    c
}

fn check(np: usize, extra: &[&str]) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let (threads, procs) = (dir.path().join("t.jsonl"), dir.path().join("m.jsonl"));
    let out = Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(["train", MODEL, "--steps", STEPS, "--ranks", &np.to_string()])
        .args(extra)
        .arg("--metrics")
        .arg(&threads)
        .output()
        .expect("fsdpc runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = mpirun(np)
        .args(["train", MODEL, "--steps", STEPS, "--backend", "mpi"])
        .args(extra)
        .arg("--metrics")
        .arg(&procs)
        .output()
        .expect("mpirun runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Only rank 0 prints its summary.
    assert_eq!(stdout.matches("trained ").count(), 1, "{stdout}");
    let (t, m) = (losses(&threads), losses(&procs));
    assert_eq!(t.len(), 4);
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&t), bits(&m), "thread ranks {t:?}, MPI ranks {m:?}");
}

#[test]
fn two_processes_match_two_thread_ranks() {
    check(2, &[]);
}

#[test]
fn four_processes_match_four_thread_ranks() {
    check(4, &[]);
}

/// `no_shard` reduces gradients with all-reduce instead of reduce-scatter.
#[test]
fn no_shard_processes_match_thread_ranks() {
    check(2, &["--strategy", "no_shard"]);
}

#[test]
fn a_plan_for_another_world_is_refused_naming_both() {
    let out = mpirun(2)
        .args([
            "train",
            MODEL,
            "--steps",
            "1",
            "--backend",
            "mpi",
            "--ranks",
            "4",
        ])
        .output()
        .expect("mpirun runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("compiled for world 4") && err.contains("runs 2 ranks"),
        "{err}"
    );
}

/// Runs 2 MPI ranks with `fault` injected (`FSDPC_TEST_FAULT`) and a 3 s
/// collective timeout; returns the exit status, stderr, and the time from
/// the fault to mpirun's exit (every rank gone).
fn faulty_run(fault: &str, seed: &str) -> (bool, String, std::time::Duration) {
    let out = mpirun(2)
        .args(["train", MODEL, "--steps", "50", "--backend", "mpi"])
        .args(["--collective-timeout", "3", "--seed", seed])
        .env("FSDPC_TEST_FAULT", fault)
        .output()
        .expect("mpirun runs");
    let end = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let at: u128 = err
        .lines()
        .find_map(|l| l.strip_prefix("fault injected at "))
        .and_then(|l| l.split(':').next())
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    assert!(at > 0, "the fault was not injected: {err}");
    let took = std::time::Duration::from_millis(end.saturating_sub(at) as u64);
    // No rank outlives the job: no process of this run (its seed) remains.
    let ps = Command::new("ps")
        .args(["-eo", "args"])
        .output()
        .expect("ps runs");
    let marker = format!("--seed {seed}");
    let left: Vec<String> = String::from_utf8_lossy(&ps.stdout)
        .lines()
        .filter(|l| l.contains("fsdpc") && l.contains(&marker))
        .map(str::to_string)
        .collect();
    assert!(left.is_empty(), "orphan ranks: {left:?}");
    (out.status.success(), err, took)
}

#[test]
fn a_killed_rank_stops_every_rank() {
    let (ok, err, took) = faulty_run("1:kill:1", "9101");
    assert!(!ok);
    assert!(
        err.contains("rank 1") && err.contains("signal 9"),
        "mpirun names the killed rank: {err}"
    );
    println!("MPI, kill -9 of rank 1: every rank gone {took:?} after the fault");
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
}

#[test]
fn a_rank_that_stops_answering_is_named_and_every_rank_stops() {
    let (ok, err, took) = faulty_run("1:sleep:1", "9102");
    assert!(!ok);
    assert!(err.contains("no answer from rank 1"), "{err}");
    println!("MPI, rank 1 sleeps: every rank gone {took:?} after the fault (timeout 3 s)");
    assert!(
        took >= std::time::Duration::from_secs(3) && took < std::time::Duration::from_secs(30),
        "took {took:?}"
    );
}
