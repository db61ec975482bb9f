//! `fsdpc simulate` and cluster files: a plan simulated on its own cluster
//! gives the plan's estimates; on a faster cluster a shorter step; a
//! cluster file written by `fsdpc cluster` plans like its preset, and an
//! edited one (a measured efficiency curve) changes the estimate the way
//! the edit says; bad cluster files are clear errors.

use std::path::Path;

use crate::common::cli::{fsdpc, ok};

fn err(args: &[&str]) -> String {
    let o = fsdpc(args);
    assert!(!o.status.success(), "fsdpc {args:?} should fail");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const MODEL: &str = "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=4096,batch=4";

fn compile(dir: &Path, name: &str, cluster: &str) -> String {
    let out = dir.join(name);
    let out = out.to_str().expect("utf-8 path").to_string();
    ok(&[
        "compile",
        MODEL,
        "--world",
        "16",
        "--cluster",
        cluster,
        "-o",
        &out,
    ]);
    out
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).expect("JSON")
}

fn step(sim: &serde_json::Value) -> f64 {
    sim["step_time_s"].as_f64().expect("step_time_s")
}

#[test]
fn simulate_reports_the_plans_estimates_and_reacts_to_the_cluster() {
    let dir = tempfile::tempdir().expect("tmp");
    let plan = compile(dir.path(), "plan.json", "a100-80g-roce");
    let own = json(&ok(&["simulate", &plan, "--json"]));
    for key in [
        "step_time_s",
        "exposed_comm_s",
        "tflops_per_rank",
        "mfu",
        "peak_bytes_per_rank",
    ] {
        assert!(own.get(key).is_some(), "{key} missing: {own}");
    }
    // On its own cluster: the plan's own estimate.
    let p: serde_json::Value = json(&std::fs::read_to_string(&plan).expect("plan written"));
    let planned = p["estimates"]["step_time_s"].as_f64().expect("estimate");
    assert!((step(&own) - planned).abs() <= 1e-12 * planned.max(1.0));
    // The same plan on H100s: faster compute and links, a shorter step.
    let h100 = json(&ok(&[
        "simulate",
        &plan,
        "--cluster",
        "h100-80g-ib",
        "--json",
    ]));
    assert!(step(&h100) < step(&own), "{h100} vs {own}");
    assert_eq!(h100["cluster"], "h100-80g-ib");
    let text = ok(&["simulate", &plan]);
    assert!(text.contains("busy: compute"), "{text}");
}

/// Model FLOPs leave recomputation out, executed FLOPs count it: without
/// recomputation the two agree; with every block recomputed the executed
/// count grows by the blocks' forward and HFU exceeds MFU by the same
/// ratio, each the FLOPs over the step over the preset's peak.
#[test]
fn simulate_names_model_and_executed_flops() {
    let dir = tempfile::tempdir().expect("tmp");
    let sim = |name: &str, extra: &[&str]| {
        let out = dir.path().join(name);
        let out = out.to_str().expect("utf-8 path").to_string();
        let mut args = vec![
            "compile",
            MODEL,
            "--world",
            "16",
            "--cluster",
            "a100-80g-roce",
            "-o",
            &out,
        ];
        args.extend_from_slice(extra);
        ok(&args);
        json(&ok(&["simulate", &out, "--json"]))
    };
    let f = |v: &serde_json::Value, k: &str| v[k].as_f64().unwrap_or_else(|| panic!("{k}: {v}"));
    let plain = sim("plain.json", &[]);
    assert_eq!(
        f(&plain, "model_flops_per_rank_step"),
        f(&plain, "executed_flops_per_rank_step")
    );
    assert!(
        (f(&plain, "mfu") - f(&plain, "hfu")).abs() < 1e-12,
        "{plain}"
    );
    let re = sim("recompute.json", &["--activation-checkpointing", "all"]);
    let (model, executed) = (
        f(&re, "model_flops_per_rank_step"),
        f(&re, "executed_flops_per_rank_step"),
    );
    assert_eq!(model, f(&plain, "model_flops_per_rank_step"));
    // The blocks' forward again: under a third of forward and backward,
    // since the head and the embedding are not recomputed.
    let ratio = executed / model;
    assert!(ratio > 1.05 && ratio < 1.34, "executed / model = {ratio}");
    let hfu_over_mfu = f(&re, "hfu") / f(&re, "mfu");
    assert!((hfu_over_mfu - ratio).abs() < 1e-9 * ratio, "{re}");
    // MFU is the model FLOPs over the step over the A100's 312 TFLOP/s
    // (bf16) or 19.5 (f32): here f32.
    let mfu = model / f(&re, "step_time_s") / 19.5e12;
    assert!((f(&re, "mfu") - mfu).abs() < 1e-9, "{re}");
    let text = ok(&[
        "simulate",
        dir.path().join("recompute.json").to_str().expect("utf-8"),
    ]);
    assert!(text.contains("recomputation included (HFU"), "{text}");
}

#[test]
fn cluster_files_plan_like_their_preset_and_edits_change_the_estimate() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("a100.json");
    let file = file.to_str().expect("utf-8").to_string();
    ok(&["cluster", "a100-80g-roce", "-o", &file]);
    let written = json(&std::fs::read_to_string(&file).expect("written"));
    assert_eq!(written["schema"], "fsdpc.cluster/v1");
    assert!(written["sources"]["peak_flops_bf16"].is_string());
    let from_preset = compile(dir.path(), "a.json", "a100-80g-roce");
    let from_file = compile(dir.path(), "b.json", &file);
    let est = |p: &str| {
        json(&std::fs::read_to_string(p).expect("plan"))["estimates"]["step_time_s"]
            .as_f64()
            .expect("estimate")
    };
    assert_eq!(est(&from_preset), est(&from_file));
    // A measured efficiency curve: every product at 0.1% of peak at most.
    let mut edited = written.clone();
    edited["hardware"]["matmul_efficiency"] = serde_json::json!([[1.0e6, 0.0001], [1.0e12, 0.001]]);
    let slow = dir.path().join("slow.json");
    std::fs::write(&slow, edited.to_string()).expect("write");
    let slow = slow.to_str().expect("utf-8").to_string();
    let sim = json(&ok(&[
        "simulate",
        &from_preset,
        "--cluster",
        &slow,
        "--json",
    ]));
    assert!(step(&sim) > est(&from_preset), "{sim}");
    // A file that is not a cluster, an impossible figure, a missing file.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"schema": "fsdpc.cluster/v1"}"#).expect("write");
    let e = err(&[
        "simulate",
        &from_preset,
        "--cluster",
        bad.to_str().expect("utf-8"),
    ]);
    assert!(e.contains("not a cluster file"), "{e}");
    let mut neg = written;
    neg["hardware"]["mem_bw"] = serde_json::json!(-1.0);
    std::fs::write(&bad, neg.to_string()).expect("write");
    let e = err(&[
        "simulate",
        &from_preset,
        "--cluster",
        bad.to_str().expect("utf-8"),
    ]);
    assert!(
        e.contains("hardware.mem_bw must be a positive number"),
        "{e}"
    );
    let e = err(&["simulate", &from_preset, "--cluster", "no-such-cluster"]);
    assert!(e.contains("neither a preset"), "{e}");
}

/// `fsdpc cluster PRESET --attention flash-attention-2` writes the preset
/// with FlashAttention-2's published attention rates and their source: on
/// Hopper slower than the preset's measured kernel, so a bf16 plan's step
/// is longer and nothing else moves; on the A100 the preset's own figures;
/// on a preset without them, one line naming it.
#[test]
fn cluster_files_can_price_attention_as_flash_attention_2() {
    let dir = tempfile::tempdir().expect("tmp");
    let write = |name: &str, args: &[&str]| {
        let path = dir.path().join(name);
        let path = path.to_str().expect("utf-8").to_string();
        let mut all = vec!["cluster"];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", &path]);
        ok(&all);
        path
    };
    let rates = |file: &str| {
        let c = json(&std::fs::read_to_string(file).expect("written"));
        let h = &c["hardware"]["kernel_flops"];
        let source = c["sources"]["kernel_flops"]
            .as_str()
            .expect("source")
            .to_string();
        (
            h["attention:bf16"].as_f64().expect("forward"),
            h["attention_grad:bf16"].as_f64().expect("backward"),
            source,
        )
    };
    let preset = write("h100.json", &["h100-80g-ib"]);
    let flash = write(
        "h100-fa2.json",
        &["h100-80g-ib", "--attention", "flash-attention-2"],
    );
    let (pf, pb, psource) = rates(&preset);
    let (ff, fb, fsource) = rates(&flash);
    assert!(
        ff < pf && fb < pb,
        "FlashAttention-2 {ff}/{fb} vs preset {pf}/{pb}"
    );
    assert!(psource.contains("cuDNN"), "{psource}");
    assert!(
        fsource.contains("FlashAttention-2") && fsource.contains("Figures 5 and 6"),
        "{fsource}"
    );
    let a100 = rates(&write("a100.json", &["a100-80g-roce"]));
    let a100_flash = rates(&write(
        "a100-fa2.json",
        &["a100-80g-roce", "--attention", "flash-attention-2"],
    ));
    assert_eq!(a100, a100_flash);

    let plan = dir.path().join("p.json");
    let plan = plan.to_str().expect("utf-8").to_string();
    // Attention long enough to show beside the gathers.
    ok(&[
        "compile",
        "gpt:layers=2,hidden=256,heads=4,seq=1024,vocab=4096,batch=4",
        "--world",
        "2",
        "--cluster",
        "h100-80g-ib",
        "--mixed-precision",
        "bf16",
        "-o",
        &plan,
    ]);
    let on = |cluster: &str| json(&ok(&["simulate", &plan, "--cluster", cluster, "--json"]));
    let (fast, slow) = (on(&preset), on(&flash));
    assert!(
        step(&slow) > step(&fast),
        "{} vs {}",
        step(&slow),
        step(&fast)
    );
    for same in [
        "peak_bytes_per_rank",
        "comm_bytes_per_step",
        "model_flops_per_rank_step",
    ] {
        assert_eq!(slow[same], fast[same], "{same}");
    }

    let e = err(&[
        "cluster",
        "l40s-48g-eth",
        "--attention",
        "flash-attention-2",
    ]);
    assert!(
        e.contains("no FlashAttention-2 figures for preset `l40s-48g-eth`")
            && e.lines().count() == 1,
        "{e}"
    );
}

#[test]
fn h200_preset_has_its_memory() {
    let out = ok(&["cluster", "h200-141g-ib"]);
    let c = json(&out);
    assert_eq!(c["memory_bytes_per_rank"], 141u64 << 30);
}

/// `fsdpc calibrate` writes a cluster file of this machine that plans: the
/// figures are measured (positive, with their sources), and the file is
/// accepted by `compile` and `simulate`. (No timing is asserted.)
#[test]
fn calibrate_writes_a_cluster_file_that_plans() {
    let dir = tempfile::tempdir().expect("tmp");
    let file = dir.path().join("calibrated.json");
    let file = file.to_str().expect("utf-8").to_string();
    let o = fsdpc(&["calibrate", "-o", &file]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let table = String::from_utf8_lossy(&o.stderr);
    assert!(
        table.contains("GFLOP/s") && table.contains("all-gather"),
        "{table}"
    );
    let c = json(&std::fs::read_to_string(&file).expect("written"));
    assert_eq!(c["name"], "calibrated");
    for k in ["peak_flops_f32", "mem_bw", "intra_bw"] {
        assert!(c["hardware"][k].as_f64().expect(k) > 0.0, "{k}");
        assert!(
            c["sources"][k]
                .as_str()
                .expect(k)
                .contains("fsdpc calibrate"),
            "{k}"
        );
    }
    assert!(!c["hardware"]["matmul_efficiency"]
        .as_array()
        .expect("a curve")
        .is_empty());
    // Per-kernel overhead, kernel bandwidths by family, per-size collective
    // fits and contention, each with its source.
    let h = &c["hardware"];
    assert!(h["kernel_overhead_s"].as_f64().expect("overhead") > 0.0);
    for family in [
        "binary",
        "layer_norm",
        "softmax",
        "optimizer",
        "softmax:bf16",
    ] {
        assert!(
            h["kernel_bw"][family].as_f64().expect(family) > 0.0,
            "{family}"
        );
    }
    let fits = h["collective_fits"].as_array().expect("fits");
    for op in ["all_gather", "reduce_scatter", "all_reduce"] {
        assert!(
            fits.iter().any(|f| f["op"] == op && f["ranks"] == 2),
            "{op}: {fits:?}"
        );
    }
    for k in ["comm_slowdown", "compute_slowdown"] {
        assert!(h["comm_compute_contention"][k].as_f64().expect(k) >= 1.0);
    }
    for k in [
        "kernel_overhead_s",
        "kernel_bw",
        "collective_fits",
        "comm_compute_contention",
    ] {
        assert!(
            c["sources"][k]
                .as_str()
                .expect(k)
                .contains("fsdpc calibrate"),
            "{k}"
        );
    }
    let plan = compile(dir.path(), "p.json", &file);
    let sim = json(&ok(&["simulate", &plan, "--json"]));
    assert_eq!(sim["cluster"], "calibrated");
    assert!(step(&sim) > 0.0);
}

/// `fsdpc calibrate` refuses what it could not use before it measures: an
/// output it cannot write and no ranks per node. Each is one error line,
/// exit 2, and nothing written.
#[test]
fn calibrate_refuses_bad_arguments_before_measuring() {
    let dir = tempfile::tempdir().expect("tmp");
    let missing = dir.path().join("no-such-dir").join("cal.json");
    let missing = missing.to_str().expect("utf-8");
    let here = dir.path().to_str().expect("utf-8");
    for (args, says) in [
        (vec!["calibrate", "-o", missing], "there is no directory"),
        (vec!["calibrate", "-o", here], "it is a directory"),
        (
            vec!["calibrate", "--ranks-per-node", "0"],
            "0 is not in 1..",
        ),
    ] {
        let o = fsdpc(&args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(!err.contains("GFLOP/s"), "{args:?} measured first: {err}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).expect("dir").count(), 0);
}
