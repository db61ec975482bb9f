//! The command line: bad input gives one clear error and a non-zero exit;
//! `inspect` prints a table a person can read (snapshot).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn fsdpc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(args)
        .output()
        .expect("fsdpc runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Runs `args`, expects failure with a message containing `needle`, no panic.
fn check_error(args: &[&str], needle: &str) {
    let o = fsdpc(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} should fail");
    assert!(
        err.contains(needle),
        "{args:?}: expected `{needle}` in: {err}"
    );
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    assert!(
        err.lines().count() <= 3,
        "{args:?}: one clear message, got: {err}"
    );
}

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fsdpc-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    dir.join(name)
}

const TINY: &str = "gpt:layers=2,hidden=16,heads=2,seq=4,vocab=32,batch=2";

fn compile_tiny(out: &Path) {
    let o = fsdpc(&[
        "compile",
        TINY,
        "--world",
        "2",
        "--preset",
        "cpu-local",
        "-o",
        out.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "compile failed: {}", stderr(&o));
}

#[test]
fn bad_model_spec() {
    check_error(
        &["compile", "gpt:layers=two", "--world", "2", "-o", "-"],
        "layers",
    );
}

#[test]
fn unknown_preset_model() {
    check_error(
        &["compile", "gpt5-ultra", "--world", "2", "-o", "-"],
        "gpt5-ultra",
    );
}

#[test]
fn unknown_cluster_preset() {
    check_error(
        &[
            "compile", TINY, "--world", "2", "--preset", "tpu-v9", "-o", "-",
        ],
        "tpu-v9",
    );
}

#[test]
fn world_size_zero() {
    check_error(&["compile", TINY, "--world", "0", "-o", "-"], "world");
    check_error(&["train", TINY, "--ranks", "0", "--steps", "1"], "ranks");
}

#[test]
fn unreadable_plan() {
    check_error(
        &["inspect", "/nonexistent/plan.json"],
        "/nonexistent/plan.json",
    );
}

#[test]
fn tampered_plan() {
    let path = tmp("tampered.json");
    compile_tiny(&path);
    let text = std::fs::read_to_string(&path).expect("plan written");

    // Not JSON at all / truncated.
    std::fs::write(&path, &text[..text.len() / 2]).expect("write");
    check_error(&["inspect", path.to_str().expect("utf8")], "tampered.json");

    // A different schema version.
    std::fs::write(&path, text.replacen("fsdpc.plan/v1", "fsdpc.plan/v9", 1)).expect("write");
    check_error(&["inspect", path.to_str().expect("utf8")], "fsdpc.plan/v9");

    // Valid JSON, broken plan: drop every all-gather.
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("json");
    let instrs = v["instructions"].as_array_mut().expect("instructions");
    instrs.retain(|i| i["op"] != "all_gather");
    std::fs::write(&path, v.to_string()).expect("write");
    check_error(&["inspect", path.to_str().expect("utf8")], "all-gather");
}

#[test]
fn inspect_tiny_plan() {
    let path = tmp("tiny.json");
    compile_tiny(&path);
    let o = fsdpc(&["inspect", path.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    insta::assert_snapshot!(String::from_utf8_lossy(&o.stdout));

    let o = fsdpc(&["inspect", "--json", path.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_slice(&o.stdout).expect("inspect --json prints JSON");
    for key in ["peak_bytes_per_rank", "units", "comm_bytes_per_step"] {
        assert!(v.get(key).is_some(), "inspect --json has `{key}`");
    }
}

#[test]
fn train_writes_metrics() {
    let metrics = tmp("metrics.jsonl");
    let o = fsdpc(&[
        "train",
        TINY,
        "--ranks",
        "2",
        "--steps",
        "3",
        "--metrics",
        metrics.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&metrics).expect("metrics written");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 3);
    for (i, l) in lines.iter().enumerate() {
        assert_eq!(l["step"], i as u64);
        assert!(l["loss"].as_f64().is_some_and(f64::is_finite));
        assert!(l["tokens_per_s"].as_f64().is_some_and(|t| t > 0.0));
        // The binary installs the counting allocator: the measured peak is
        // its own field, next to the plan's.
        let planned = l["planned_peak_bytes"].as_u64().unwrap_or(0);
        let measured = l["measured_peak_bytes"].as_u64().unwrap_or(u64::MAX);
        assert!(planned > 0 && measured > 0 && measured <= planned, "{l}");
    }
    assert!(String::from_utf8_lossy(&o.stdout).contains("trained"));
}

#[test]
fn trace_has_every_instruction_on_its_stream() {
    let plan_path = tmp("trace-plan.json");
    compile_tiny(&plan_path);
    let out = tmp("trace.json");
    let o = fsdpc(&[
        "trace",
        plan_path.to_str().expect("utf8"),
        "-o",
        out.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&plan_path).expect("plan"))
            .expect("plan json");
    let trace: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("trace")).expect("trace json");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let slices: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    let instrs = plan["instructions"].as_array().expect("instructions");
    assert_eq!(slices.len(), instrs.len(), "one slice per instruction");
    for (s, i) in slices.iter().zip(instrs) {
        let tid = match i["stream"].as_str() {
            Some("compute") => 0,
            Some("unshard") => 1,
            Some("reduce") => 2,
            other => panic!("unknown stream {other:?}"),
        };
        assert_eq!(s["tid"], tid);
        assert!(s["dur"].as_f64().is_some_and(|d| d >= 0.0));
    }
    assert!(slices.iter().any(|s| s["name"]
        .as_str()
        .is_some_and(|n| n.starts_with("all_gather"))));
    assert!(
        events.iter().any(|e| e["ph"] == "C"),
        "a live-memory counter track"
    );
}

#[test]
fn train_runs_a_plan_at_its_world_only() {
    let path = tmp("train-plan.json");
    compile_tiny(&path);
    let p = path.to_str().expect("utf8");
    let o = fsdpc(&["train", p, "--steps", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("on 2 ranks"));
    check_error(
        &["train", p, "--ranks", "3", "--steps", "1"],
        "compiled for world 2",
    );
    check_error(
        &["train", p, "--ranks", "1", "--steps", "1"],
        "compiled for world 2",
    );
}

/// `fsdpc train plan.json` refuses every compile flag given with it (the
/// plan has fixed what they decide), naming them, even one given at its
/// default value; a model still takes them.
#[test]
fn train_refuses_compile_flags_with_a_plan() {
    let path = tmp("train-refuses-compile-flags.json");
    compile_tiny(&path);
    let p = path.to_str().expect("utf8");
    check_error(
        &["train", p, "--strategy", "no_shard", "--steps", "1"],
        "so --strategy cannot apply",
    );
    check_error(
        &["train", p, "--backward-prefetch", "pre", "--steps", "1"],
        "--backward-prefetch",
    );
    let o = fsdpc(&[
        "train",
        p,
        "--steps",
        "1",
        "--cluster",
        "cpu-local",
        "--lr",
        "0.1",
        "--activation-checkpointing",
        "--dim",
        "batch=2",
        "--seed",
        "3",
    ]);
    let err = stderr(&o);
    assert!(!o.status.success(), "compile flags with a plan should fail");
    assert!(
        err.contains("--cluster, --lr, --activation-checkpointing, --dim cannot apply"),
        "every refused flag named, got: {err}"
    );
    assert!(!err.contains("--seed"), "--seed applies to a run: {err}");
    let o = fsdpc(&[
        "train",
        TINY,
        "--ranks",
        "2",
        "--steps",
        "1",
        "--strategy",
        "no_shard",
        "--lr",
        "0.01",
        "--preset",
        "cpu-local",
    ]);
    assert!(
        o.status.success(),
        "a model takes compile flags: {}",
        stderr(&o)
    );
}

/// Runs `args`, expects failure with exactly one line on stderr, `error: `
/// and containing `needle`.
fn check_error_line(args: &[&str], needle: &str) {
    let o = fsdpc(args);
    let err = stderr(&o);
    assert!(!o.status.success(), "{args:?} should fail");
    assert_eq!(err.lines().count(), 1, "{args:?}: one line, got: {err}");
    assert!(
        err.starts_with("error: ") && err.contains(needle),
        "{args:?}: expected `error: ...{needle}...`, got: {err}"
    );
}

/// Runs `args` with stdout a pipe; `read_first_line` reads a line before
/// closing the pipe (as `| head -1`), else the pipe is closed at once.
/// Returns the exit code and stderr.
fn with_closed_pipe(args: &[&str], read_first_line: bool) -> (Option<i32>, String) {
    use std::io::{BufRead, BufReader, Read};
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("fsdpc runs");
    let out = child.stdout.take().expect("piped stdout");
    if read_first_line {
        let mut line = String::new();
        BufReader::new(out)
            .read_line(&mut line)
            .expect("reads a line");
        assert!(!line.is_empty(), "{args:?} printed nothing");
    } else {
        drop(out);
    }
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("piped stderr")
        .read_to_string(&mut err)
        .expect("reads stderr");
    let status = child.wait().expect("fsdpc ends");
    (status.code(), err)
}

#[test]
fn closed_output_pipe_ends_quietly() {
    // The convention of `cat` and other tools killed by SIGPIPE: status
    // 128 + 13 and nothing on stderr.
    let compile = [
        "compile",
        TINY,
        "--world",
        "2",
        "--preset",
        "cpu-local",
        "-o",
        "-",
    ];
    let o = fsdpc(&compile);
    assert!(
        o.stdout.len() > 1 << 17,
        "the plan must overflow the pipe buffer (64 KiB) for this test"
    );
    assert_eq!(with_closed_pipe(&compile, true), (Some(141), String::new()));

    let path = tmp("pipe-plan.json");
    compile_tiny(&path);
    let p = path.to_str().expect("utf8");
    for args in [vec!["inspect", p], vec!["inspect", "--json", p]] {
        assert_eq!(
            with_closed_pipe(&args, false),
            (Some(141), String::new()),
            "{args:?}"
        );
    }
}

#[test]
fn meaningless_numeric_flags() {
    for (flag, value) in [
        ("--lr", "nan"),
        ("--lr", "-1"),
        ("--lr", "inf"),
        ("--lr", "-inf"),
        ("--weight-decay", "-0.1"),
        ("--weight-decay", "inf"),
        ("--weight-decay", "NaN"),
    ] {
        let shown = value.to_ascii_lowercase();
        for cmd in ["train", "compile"] {
            let mut args = vec![cmd, TINY, flag, value];
            args.extend(if cmd == "train" {
                ["--steps", "1"]
            } else {
                ["--world", "1"]
            });
            if cmd == "compile" {
                args.extend(["-o", "-"]);
            }
            let o = fsdpc(&args);
            let err = stderr(&o).to_ascii_lowercase();
            assert!(!o.status.success(), "{args:?} should fail");
            assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
            assert!(
                err.contains(&format!("error: {flag} {shown}")),
                "{args:?}: {err}"
            );
        }
    }
    check_error_line(
        &["train", TINY, "--steps", "0"],
        "--steps must be at least 1",
    );
    check_error_line(
        &["train", TINY, "--threads-per-rank", "0"],
        "--threads-per-rank must be at least 1",
    );
    // Checked also when training a plan, which does not use them.
    let path = tmp("flags-plan.json");
    compile_tiny(&path);
    check_error_line(
        &["train", path.to_str().expect("utf8"), "--lr", "nan"],
        "--lr NaN",
    );
}

#[test]
fn unwritable_metrics_file_is_reported_before_any_work() {
    // gpt3-175b does not fit cpu-local: had the model been planned first, that
    // would be the error.
    check_error_line(
        &[
            "train",
            "gpt3-175b",
            "--metrics",
            "/nonexistent-fsdpc-dir/metrics.jsonl",
        ],
        "/nonexistent-fsdpc-dir/metrics.jsonl",
    );
}

#[test]
fn json_is_told_apart_before_loading() {
    let other = tmp("other.json");
    std::fs::write(&other, r#"{"name": "bert", "layers": 12}"#).expect("write");
    let o = other.to_str().expect("utf8");
    for args in [
        vec!["train", o, "--steps", "1"],
        vec!["inspect", o],
        vec!["compile", o, "--world", "2", "-o", "-"],
    ] {
        check_error_line(&args, "neither an fsdpc plan");
    }

    // A plan file that cannot be read: said so, not handed to the IR loader.
    let dir = tmp("unreadable-plan.json");
    std::fs::create_dir_all(&dir).expect("dir");
    let d = dir.to_str().expect("utf8");
    check_error_line(&["train", d, "--steps", "1"], "unreadable-plan.json: ");
    check_error_line(&["inspect", d], "unreadable-plan.json: ");

    // An IR model where a plan belongs, and a plan where a model belongs.
    let ir = tmp("model-ir.json");
    std::fs::write(&ir, r#"{"nodes": [], "outputs": []}"#).expect("write");
    check_error_line(&["inspect", ir.to_str().expect("utf8")], "compile it first");
    let plan = tmp("model-plan.json");
    compile_tiny(&plan);
    check_error_line(
        &[
            "compile",
            plan.to_str().expect("utf8"),
            "--world",
            "2",
            "-o",
            "-",
        ],
        "already a plan",
    );

    // Not JSON at all.
    let bad = tmp("broken.json");
    std::fs::write(&bad, "{\"schema\": ").expect("write");
    check_error_line(&["train", bad.to_str().expect("utf8")], "not valid JSON");
}

/// Total memory of this machine (`MemTotal`), if known.
fn total_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[test]
fn token_bin_files_are_mapped_even_past_memory_and_oversized_text_refused() {
    // A small .bin of u16 tokens below TINY's vocabulary trains.
    let small = tmp("small.bin");
    let toks: Vec<u8> = (0..400u16)
        .flat_map(|t| (t * 7 % 32).to_le_bytes())
        .collect();
    std::fs::write(&small, toks).expect("write");
    let o = fsdpc(&[
        "train",
        TINY,
        "--steps",
        "2",
        "--data",
        small.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("trained"));

    // A token outside the vocabulary is named with its position when a
    // window reads it (a mapped file is not scanned up front).
    let bad = tmp("bad.bin");
    let toks: Vec<u8> = (0..400u16)
        .flat_map(|t| if t == 7 { 60000u16 } else { 1 }.to_le_bytes())
        .collect();
    std::fs::write(&bad, toks).expect("write");
    for window in 0..40 {
        // Some step's windows include position 7: every step draws starts
        // anywhere in the file, so a few steps reach it.
        let o = fsdpc(&[
            "train",
            TINY,
            "--steps",
            "20",
            "--seed",
            &window.to_string(),
            "--data",
            bad.to_str().expect("utf8"),
        ]);
        if !o.status.success() {
            assert!(
                stderr(&o).contains("token 60000 at position 7"),
                "{}",
                stderr(&o)
            );
            break;
        }
        assert!(window < 39, "no window ever read position 7");
    }

    // A sparse .bin twice the machine's memory trains: it is mapped, and a
    // step reads only the pages of its windows (all zero tokens here), so
    // it ends in seconds instead of reading twice the memory.
    let Some(total) = total_memory_bytes() else {
        eprintln!("skipped the oversized file: /proc/meminfo has no MemTotal");
        return;
    };
    let huge = tmp("huge.bin");
    std::fs::File::create(&huge)
        .and_then(|f| f.set_len(2 * total))
        .expect("sparse file");
    let start = std::time::Instant::now();
    let o = fsdpc(&[
        "train",
        TINY,
        "--steps",
        "1",
        "--data",
        huge.to_str().expect("utf8"),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        start.elapsed() < std::time::Duration::from_secs(20),
        "mapped, not read: took {:?}",
        start.elapsed()
    );

    // The same size as a text file (read into memory) is refused from its
    // size, at once, with one line.
    let text = tmp("huge.txt");
    std::fs::rename(&huge, &text).expect("rename");
    check_error_line(
        &[
            "train",
            TINY,
            "--steps",
            "1",
            "--data",
            text.to_str().expect("utf8"),
        ],
        "bytes are available",
    );
    let _ = std::fs::remove_file(&text);
}

#[test]
fn thread_ranks_refuse_a_multi_process_launch_and_a_zero_timeout() {
    let out = Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args([
            "train",
            "gpt:layers=1,hidden=32,heads=2,seq=8,vocab=64,batch=2",
        ])
        .args(["--steps", "1"])
        .env("SLURM_PROCID", "1")
        .env("SLURM_NTASKS", "2")
        .output()
        .expect("fsdpc runs");
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("srun started this process as rank 1 of 2") && err.contains("--target mpi"),
        "{err}"
    );
    check_error(
        &["train", "gpt:layers=1", "--collective-timeout", "0"],
        "--collective-timeout must be a positive number of seconds",
    );
}

#[cfg(not(feature = "mpi"))]
#[test]
fn mpi_backend_says_it_was_not_compiled_in() {
    check_error(
        &["train", "gpt:layers=1", "--target", "mpi"],
        "the mpi target was not compiled in; rebuild with `--features mpi`",
    );
}

#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_backend_says_it_was_not_compiled_in() {
    check_error(
        &["train", "gpt:layers=1", "--target", "cuda"],
        "the cuda target was not compiled in; rebuild with `--features cuda`",
    );
}

/// With the feature: on a machine without a GPU, one line saying what is
/// missing (the driver, or a device), exit non-zero, no panic; with one,
/// a run that prints the device's memory line.
#[cfg(feature = "cuda")]
#[test]
fn cuda_backend_trains_or_says_what_is_missing() {
    let args = [
        "train",
        "gpt:layers=1,hidden=32,heads=2,seq=8,vocab=64,batch=2",
        "--steps",
        "2",
        "--target",
        "cuda",
    ];
    let o = fsdpc(&args);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(!err.contains("panicked"), "{err}");
    if o.status.success() {
        assert!(
            out.contains("cuda: ") && out.contains("planned arena"),
            "{out}"
        );
    } else {
        assert!(
            err.contains("libcuda") || err.contains("no CUDA device"),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}

/// `calibrate --target cuda` without the feature: one line saying so.
#[cfg(not(feature = "cuda"))]
#[test]
fn cuda_backend_calibrate_says_it_was_not_compiled_in() {
    check_error(
        &["calibrate", "--target", "cuda"],
        "the cuda target was not compiled in; rebuild with `--features cuda`",
    );
}

/// `calibrate --target cuda` with the feature: on a machine without a
/// GPU, one line naming what is missing; with one, a cluster file of the
/// GPU's kind whose sources name the measurement, and its table.
#[cfg(feature = "cuda")]
#[test]
fn cuda_backend_calibrates_or_says_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gpu.json");
    let o = fsdpc(&[
        "calibrate",
        "--target",
        "cuda",
        "-o",
        path.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    if o.status.success() {
        let text = std::fs::read_to_string(&path).unwrap();
        let c = fsdpc_plan::cluster::Cluster::from_file(&text, Some(8), None).unwrap();
        assert!(c.sources["matmul_efficiency"].contains("fsdpc calibrate --target cuda"));
        assert!(c.hardware.kernel_flops.contains_key("attention:bf16"));
        assert!(c.hardware.context_bytes > 0);
        assert!(err.contains("matrix products"), "{err}");
    } else {
        assert!(
            err.contains("libcuda") || err.contains("no CUDA device"),
            "{err}"
        );
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(!path.exists());
    }
}

/// A thread rank that never returns (`FSDPC_TEST_FAULT=1:hang:1`) does not
/// keep `fsdpc train` alive: it exits non-zero within the collective
/// timeout (the others give up) plus one more (the grace for the ranks to
/// stop), naming the rank, without joining it.
#[test]
fn a_hung_thread_rank_does_not_keep_the_process_alive() {
    let start = std::time::Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args([
            "train",
            "gpt:layers=1,hidden=32,heads=2,seq=8,vocab=64,batch=2",
        ])
        .args(["--ranks", "2", "--steps", "50", "--collective-timeout", "1"])
        .env("FSDPC_TEST_FAULT", "1:hang:1")
        .output()
        .expect("fsdpc runs");
    let took = start.elapsed();
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("error: rank 1 failed: did not stop within 1s")
            && err.contains("no answer from rank(s) 1"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    // Start-up, one step and the fault fit well in the slack.
    assert!(took < std::time::Duration::from_secs(10), "took {took:?}");
}

/// One memory figure, "peak per rank", named and valued the same by
/// `compile`, `inspect`, `simulate` and `train` of the same plan: the
/// plan's `memory.rank_bytes` (arena plus heap), which `inspect` breaks
/// down into the arena's live peak and the heap.
#[test]
fn compile_inspect_simulate_and_train_print_one_peak_per_rank() {
    let plan = tmp("one-peak.json");
    let p = plan.to_str().expect("utf-8 path");
    let o = fsdpc(&["compile", "gpt-mini", "--world", "2", "-o", p]);
    assert!(o.status.success(), "{}", stderr(&o));
    let parsed = fsdpc_plan::Plan::from_json(&std::fs::read_to_string(&plan).expect("plan"))
        .expect("a plan");
    let m = &parsed.memory;
    let figure = fsdpc_plan::readable::human_bytes(m.rank_bytes);
    assert_ne!(m.rank_bytes, m.peak_bytes, "the heap makes them differ");
    let peak = format!("peak per rank {figure}");
    assert!(stderr(&o).contains(&peak), "compile: {}", stderr(&o));
    let text = |args: &[&str]| {
        let o = fsdpc(args);
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let inspect = text(&["inspect", p]);
    assert!(
        inspect.contains(&format!(
            "{peak}: arena {} + heap {}",
            fsdpc_plan::readable::human_bytes(m.arena_bytes),
            fsdpc_plan::readable::human_bytes(m.heap_bytes)
        )),
        "{inspect}"
    );
    assert!(
        inspect.contains(&format!(
            "live peak {} at instruction {}",
            fsdpc_plan::readable::human_bytes(m.peak_bytes),
            m.peak_at
        )),
        "{inspect}"
    );
    let simulate = text(&["simulate", p]);
    assert!(simulate.contains(&peak), "{simulate}");
    let train = text(&["train", p, "--steps", "1"]);
    assert!(
        train.contains("peak per rank") && train.contains(&format!("{figure} planned")),
        "{train}"
    );
    let _ = std::fs::remove_file(&plan);
}
