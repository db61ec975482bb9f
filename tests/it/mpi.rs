//! MPI process ranks (`mpirun -np N fsdpc train --target mpi`): a plan for
//! another world, killed and silent ranks, checkpoints resumed across
//! targets and saved parameters (running statistics too), against the
//! thread ranks bit for bit.
//! (Their losses against the thread ranks, case by case, are the
//! conformance suite's: tests/it/conformance.rs.) Needs `mpirun`
//! (openmpi-bin) and the `mpi` feature: `cargo test --features mpi --test
//! mpi`.
#![cfg(feature = "mpi")]

use std::path::Path;
use std::process::Command;

const MODEL: &str = "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256,batch=4";

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

#[test]
fn a_plan_for_another_world_is_refused_naming_both() {
    let out = mpirun(2)
        .args([
            "train", MODEL, "--steps", "1", "--target", "mpi", "--ranks", "4",
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
        .args(["train", MODEL, "--steps", "50", "--target", "mpi"])
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

/// Runs `fsdpc` as `cmd` describes, asserting it succeeds; returns stdout.
fn ok(mut cmd: Command) -> String {
    let out = cmd.output().expect("the command runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `MODEL` at world `np` with the same global batch (8 sequences a step),
/// so a checkpoint of one world continues at another.
fn model_for(np: usize) -> String {
    format!(
        "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256,batch={}",
        8 / np
    )
}

/// `fsdpc train` of `model_for(np)` for `steps` steps on `np` thread ranks
/// (`mpi` false) or `np` MPI processes, with `extra` flags and metrics into
/// `metrics`.
fn train(mpi: bool, np: usize, steps: u64, metrics: &Path, extra: &[&std::ffi::OsStr]) -> String {
    let mut cmd = if mpi {
        let mut c = mpirun(np);
        c.args(["train", &model_for(np), "--target", "mpi"]);
        c
    } else {
        let mut c = Command::new(env!("CARGO_BIN_EXE_fsdpc"));
        c.args(["train", &model_for(np), "--ranks", &np.to_string()]);
        c
    };
    cmd.args(["--steps", &steps.to_string()])
        .arg("--metrics")
        .arg(metrics)
        .args(extra);
    ok(cmd)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The flags writing a checkpoint into `dir` every `every` steps.
fn ckpt(dir: &Path, every: u64) -> Vec<std::ffi::OsString> {
    vec![
        "--checkpoint-dir".into(),
        dir.into(),
        "--checkpoint-every".into(),
        every.to_string().into(),
    ]
}

fn os(v: &[std::ffi::OsString]) -> Vec<&std::ffi::OsStr> {
    v.iter().map(|s| s.as_os_str()).collect()
}

#[test]
fn mpi_checkpoints_resume_bit_identical_to_an_uninterrupted_thread_run() {
    let t = tempfile::tempdir().expect("a temporary directory");
    let p = t.path();
    train(false, 2, 4, &p.join("full.jsonl"), &[]);
    let d = p.join("ck");
    train(true, 2, 2, &p.join("a.jsonl"), &os(&ckpt(&d, 1)));
    assert_eq!(latest(&d), "step-000000002");
    let step2 = d.join("step-000000002");
    for f in [
        "manifest.json",
        "rank-00000.safetensors",
        "rank-00001.safetensors",
    ] {
        assert!(step2.join(f).is_file(), "{f}");
    }
    let mut resume = ckpt(&d, 1);
    resume.extend(["--resume".into(), d.clone().into()]);
    train(true, 2, 4, &p.join("b.jsonl"), &os(&resume));
    let full = losses(&p.join("full.jsonl"));
    let mut parts = losses(&p.join("a.jsonl"));
    parts.extend(losses(&p.join("b.jsonl")));
    assert_eq!(full.len(), 4);
    assert_eq!(bits(&full), bits(&parts), "threads {full:?}, MPI {parts:?}");
    assert_eq!(latest(&d), "step-000000004");
    assert!(d.join("step-000000004/manifest.json").is_file());
}

/// The step directory a checkpoint directory's `latest` names.
fn latest(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("latest")).unwrap_or_default()
}

/// Largest relative difference of two loss lists of the same length.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "{a:?} against {b:?}");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs() / x.abs().max(1e-6))
        .fold(0f32, f32::max)
}

/// A checkpoint at step 2 of a world `from` (MPI when `from_mpi`) resumed
/// to step 4 at world `to` (MPI when `to_mpi`): the losses against an
/// uninterrupted run at world `to` agree within the re-shard tolerance of
/// tests/it/checkpoint.rs (the first steps' reduction order differs).
fn check_reshard(from_mpi: bool, from: usize, to_mpi: bool, to: usize) -> f32 {
    let t = tempfile::tempdir().expect("a temporary directory");
    let p = t.path();
    let d = p.join("ck");
    train(from_mpi, from, 2, &p.join("a.jsonl"), &os(&ckpt(&d, 2)));
    let resume: Vec<std::ffi::OsString> = vec!["--resume".into(), d.into()];
    train(to_mpi, to, 4, &p.join("b.jsonl"), &os(&resume));
    train(false, to, 4, &p.join("full.jsonl"), &[]);
    let full = losses(&p.join("full.jsonl"));
    let rel = rel_diff(&full[2..], &losses(&p.join("b.jsonl")));
    assert!(rel <= 1e-6, "loss rel diff {rel}");
    rel
}

#[test]
fn an_mpi_checkpoint_of_4_processes_resumes_on_2_thread_ranks() {
    let rel = check_reshard(true, 4, false, 2);
    println!("MPI -np 4 -> 2 thread ranks: loss rel diff {rel:e}");
}

#[test]
fn a_thread_checkpoint_of_4_ranks_resumes_on_2_mpi_processes() {
    let rel = check_reshard(false, 4, true, 2);
    println!("4 thread ranks -> MPI -np 2: loss rel diff {rel:e}");
}

/// The tensors of a safetensors file by name, as bytes.
fn tensors(path: &Path) -> Vec<(String, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let mut out: Vec<_> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| (n, v.shape().to_vec(), v.data().to_vec()))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn mpi_saved_and_exported_parameters_equal_the_thread_runs() {
    let t = tempfile::tempdir().expect("a temporary directory");
    let p = t.path();
    let threads = p.join("threads.safetensors");
    let save =
        |out: &Path| -> Vec<std::ffi::OsString> { vec!["--save-safetensors".into(), out.into()] };
    train(false, 2, 3, &p.join("t.jsonl"), &os(&save(&threads)));
    let (mpi, d) = (p.join("mpi.safetensors"), p.join("ck"));
    let mut flags = save(&mpi);
    flags.extend(ckpt(&d, 3));
    let stdout = train(true, 2, 3, &p.join("m.jsonl"), &os(&flags));
    assert_eq!(stdout.matches("wrote ").count(), 1, "{stdout}");
    let want = tensors(&threads);
    assert!(!want.is_empty());
    assert_eq!(tensors(&mpi), want, "--save-safetensors on MPI ranks");
    let exported = p.join("export.safetensors");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fsdpc"));
    cmd.arg("export").arg(&d).arg("-o").arg(&exported);
    ok(cmd);
    assert_eq!(
        tensors(&exported),
        want,
        "fsdpc export of an MPI checkpoint"
    );
}

#[test]
fn mpi_save_onnx_equals_the_thread_runs() {
    let t = tempfile::tempdir().expect("a temporary directory");
    let p = t.path();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("frontends/tests/fixtures/mlp.onnx");
    let (threads, procs) = (p.join("threads.onnx"), p.join("mpi.onnx"));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fsdpc"));
    cmd.arg("train")
        .arg(&model)
        .args(["--dim", "batch=4", "--ranks", "2", "--steps", "2"])
        .arg("--save-onnx")
        .arg(&threads);
    ok(cmd);
    let mut cmd = mpirun(2);
    cmd.arg("train")
        .arg(&model)
        .args(["--dim", "batch=4", "--target", "mpi", "--steps", "2"])
        .arg("--save-onnx")
        .arg(&procs);
    ok(cmd);
    let (a, b) = (std::fs::read(&threads), std::fs::read(&procs));
    assert!(
        matches!((&a, &b), (Ok(a), Ok(b)) if a == b),
        "the MPI run's ONNX file equals the thread run's"
    );
}

/// A checkpoint directory that already holds checkpoints is refused by rank
/// 0, which readies it, and every process stops; nothing is written.
#[test]
fn mpi_ranks_refuse_a_directory_holding_checkpoints() {
    let t = tempfile::tempdir().expect("a temporary directory");
    let p = t.path();
    let d = p.join("ck");
    train(true, 2, 1, &p.join("a.jsonl"), &os(&ckpt(&d, 1)));
    let before = latest(&d);
    let out = mpirun(2)
        .args(["train", &model_for(2), "--target", "mpi", "--steps", "2"])
        .args(os(&ckpt(&d, 1)))
        .output()
        .expect("mpirun runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("already holds checkpoints"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(latest(&d), before);
    assert!(!d.join("step-000000002").exists());
}

#[test]
fn an_mpi_rank_that_never_returns_is_named_and_every_rank_stops() {
    let (ok, err, took) = faulty_run("1:hang:1", "9103");
    assert!(!ok);
    assert!(err.contains("no answer from rank 1"), "{err}");
    println!("MPI, rank 1 hangs: every rank gone {took:?} after the fault (timeout 3 s)");
    assert!(took < std::time::Duration::from_secs(30), "took {took:?}");
}

/// `no_shard`: one shard position, so rank 1 is a replica that writes no
/// file but joins the gather; resuming is still bit-identical, and the
/// saved parameters equal the thread run's.
#[test]
fn mpi_no_shard_checkpoints_from_rank_0_only() {
    let t = tempfile::tempdir().expect("a temporary directory");
    let p = t.path();
    let strategy: Vec<std::ffi::OsString> = vec!["--strategy".into(), "no_shard".into()];
    let threads = p.join("threads.safetensors");
    let mut flags = strategy.clone();
    flags.extend(["--save-safetensors".into(), threads.clone().into()]);
    train(false, 2, 4, &p.join("full.jsonl"), &os(&flags));
    let d = p.join("ck");
    let mut flags = strategy.clone();
    flags.extend(ckpt(&d, 2));
    train(true, 2, 2, &p.join("a.jsonl"), &os(&flags));
    let mut files: Vec<String> = std::fs::read_dir(d.join("step-000000002"))
        .map(|r| {
            r.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    assert_eq!(files, ["manifest.json", "rank-00000.safetensors"]);
    let procs = p.join("mpi.safetensors");
    let mut flags = strategy;
    flags.extend(["--resume".into(), d.into()]);
    flags.extend(["--save-safetensors".into(), procs.clone().into()]);
    train(true, 2, 4, &p.join("b.jsonl"), &os(&flags));
    let full = losses(&p.join("full.jsonl"));
    let mut parts = losses(&p.join("a.jsonl"));
    parts.extend(losses(&p.join("b.jsonl")));
    assert_eq!(bits(&full), bits(&parts), "threads {full:?}, MPI {parts:?}");
    assert_eq!(tensors(&procs), tensors(&threads));
}

/// The `eval_loss` of every line of a `--metrics` file that has one.
fn eval_losses(path: &Path) -> Vec<f32> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["eval_loss"].as_f64().map(|x| x as f32))
        .collect()
}

/// Evaluations on MPI process ranks, across a resume, are the thread
/// ranks' evaluations bit for bit (the losses are gathered and averaged in
/// rank order by both).
#[test]
fn mpi_evaluations_equal_the_thread_runs_across_a_resume() {
    let t = tempfile::tempdir().expect("a temporary directory");
    let p = t.path();
    let eval: Vec<std::ffi::OsString> = [
        "--eval-data",
        "synthetic",
        "--eval-every",
        "2",
        "--eval-batches",
        "2",
    ]
    .iter()
    .map(|s| s.into())
    .collect();
    train(false, 2, 4, &p.join("full.jsonl"), &os(&eval));
    let d = p.join("ck");
    let mut first = ckpt(&d, 2);
    first.extend(eval.iter().cloned());
    train(true, 2, 2, &p.join("a.jsonl"), &os(&first));
    let mut rest = first.clone();
    rest.extend(["--resume".into(), d.clone().into()]);
    train(true, 2, 4, &p.join("b.jsonl"), &os(&rest));
    let full = eval_losses(&p.join("full.jsonl"));
    let mut parts = eval_losses(&p.join("a.jsonl"));
    parts.extend(eval_losses(&p.join("b.jsonl")));
    assert_eq!(full.len(), 2);
    assert_eq!(bits(&full), bits(&parts), "threads {full:?}, MPI {parts:?}");
}

/// A tensor-parallel plan on MPI processes: the thread ranks' losses bit
/// for bit, and the same whole parameters put back together from the
/// members' parts.
#[test]
fn mpi_tensor_parallel_runs_equal_the_thread_runs() {
    let t = tempfile::tempdir().expect("a temporary directory");
    let p = t.path();
    let (threads, procs) = (p.join("threads.safetensors"), p.join("mpi.safetensors"));
    let flags = |out: &Path| -> Vec<std::ffi::OsString> {
        vec![
            "--tensor-parallel".into(),
            "2".into(),
            "--save-safetensors".into(),
            out.into(),
        ]
    };
    let (tm, mm) = (p.join("t.jsonl"), p.join("m.jsonl"));
    train(false, 4, 3, &tm, &os(&flags(&threads)));
    train(true, 4, 3, &mm, &os(&flags(&procs)));
    assert_eq!(bits(&losses(&mm)), bits(&losses(&tm)));
    let want = tensors(&threads);
    assert!(!want.is_empty());
    assert_eq!(tensors(&procs), want);
}

/// MPI processes write a tensor-parallel checkpoint (one file per shard
/// and tensor position) that thread ranks resume bit for bit.
#[test]
fn mpi_tensor_parallel_checkpoints_resume_on_thread_ranks() {
    let t = tempfile::tempdir().expect("a temporary directory");
    let p = t.path();
    let tp: Vec<std::ffi::OsString> = vec!["--tensor-parallel".into(), "2".into()];
    train(false, 4, 4, &p.join("full.jsonl"), &os(&tp));
    let d = p.join("ck");
    let mut first = tp.clone();
    first.extend(ckpt(&d, 2));
    train(true, 4, 2, &p.join("a.jsonl"), &os(&first));
    let step2 = d.join("step-000000002");
    for i in 0..4 {
        let f = format!("rank-{i:05}.safetensors");
        assert!(step2.join(&f).is_file(), "{f}");
    }
    let mut resume = tp.clone();
    resume.extend(["--resume".into(), d.clone().into()]);
    train(false, 4, 4, &p.join("b.jsonl"), &os(&resume));
    let full = losses(&p.join("full.jsonl"));
    let mut parts = losses(&p.join("a.jsonl"));
    parts.extend(losses(&p.join("b.jsonl")));
    assert_eq!(full.len(), 4);
    assert_eq!(
        bits(&full),
        bits(&parts),
        "threads {full:?}, MPI then threads {parts:?}"
    );
}

/// The training-mode ResNet export (running statistics as module buffers):
/// on 2 MPI processes its saved parameters and rank 0's running
/// statistics, and the checkpoint's export of both, equal the thread
/// ranks' bit for bit.
#[test]
fn mpi_running_statistics_equal_the_thread_runs() {
    let model = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/vision/resnet_torchscript_train.onnx"
    );
    let t = tempfile::tempdir().expect("a temporary directory");
    let p = t.path();
    let run = |mpi: bool, out: &Path, extra: &[&std::ffi::OsStr]| {
        let mut cmd = if mpi {
            let mut c = mpirun(2);
            c.args(["train", model, "--target", "mpi"]);
            c
        } else {
            let mut c = Command::new(env!("CARGO_BIN_EXE_fsdpc"));
            c.args(["train", model, "--ranks", "2"]);
            c
        };
        cmd.args(["--dim", "batch=1", "--steps", "2", "--lr", "1e-3"])
            .arg("--save-safetensors")
            .arg(out)
            .args(extra);
        ok(cmd)
    };
    let threads = p.join("threads.safetensors");
    run(false, &threads, &[]);
    let (mpi, d) = (p.join("mpi.safetensors"), p.join("ck"));
    run(true, &mpi, &os(&ckpt(&d, 2)));
    let want = tensors(&threads);
    let stats = want.iter().filter(|t| t.0.contains("running_")).count();
    assert_eq!(stats, 12, "6 normalisations' running means and variances");
    assert_eq!(tensors(&mpi), want, "--save-safetensors on MPI ranks");
    let exported = p.join("export.safetensors");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fsdpc"));
    cmd.arg("export").arg(&d).arg("-o").arg(&exported);
    ok(cmd);
    assert_eq!(
        tensors(&exported),
        want,
        "fsdpc export of an MPI checkpoint"
    );
}
