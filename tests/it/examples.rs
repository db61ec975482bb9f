//! The examples in `examples/` run here, each through the function its
//! `main` calls, with arguments small enough to finish in seconds, so they
//! cannot rot. `read_plan.py` runs under `python3` against a plan the CLI
//! wrote and must print exactly what `read_plan.rs` prints.

// Each example is a binary; its `main` is not called here.
#[allow(dead_code)]
#[path = "../../examples/fsdp_paper_study.rs"]
mod fsdp_paper_study;
#[allow(dead_code)]
#[path = "../../examples/inspect_gpt3.rs"]
mod inspect_gpt3;
#[allow(dead_code)]
#[path = "../../examples/read_plan.rs"]
mod read_plan;
#[allow(dead_code)]
#[path = "../../examples/train_gpt_on_text.rs"]
mod train_gpt_on_text;
#[allow(dead_code)]
#[path = "../../examples/train_onnx.rs"]
mod train_onnx;

use std::path::Path;
use std::process::Command;

fn mean(xs: &[f32]) -> f32 {
    xs.iter().sum::<f32>() / xs.len().max(1) as f32
}

#[test]
fn train_gpt_on_text_learns_the_bytes() {
    let losses = train_gpt_on_text::run(&train_gpt_on_text::default_text(), 40, 2)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(losses.len(), 40);
    // A uniform guess over 256 bytes is ln 256 = 5.55; 40 steps of AdamW
    // learn at least the letter frequencies.
    assert!(
        (losses[0] - 256f32.ln()).abs() < 0.5,
        "first loss {}",
        losses[0]
    );
    let (early, late) = (mean(&losses[..5]), mean(&losses[35..]));
    assert!(late < early - 1.0, "loss {early} -> {late}");
}

#[test]
fn fsdp_paper_study_quick_simulates_t5_611m_on_8_to_32_gpus() {
    let models = &fsdp_paper_study::models()[..1];
    let worlds = [8, 16, 32];
    let rows = fsdp_paper_study::study(models, &worlds).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(rows.len(), 3);
    for r in &rows {
        let all = [r.fsdp, r.no_prefetch, r.no_limiter, r.ddp];
        for p in all.iter().chain(r.hybrid.iter()) {
            assert!(
                p.tflops > 0.0 && p.step_s > 0.0 && p.peak > 0,
                "{}: {p:?}",
                r.world
            );
        }
        // The 738M stand-in fits every way; sharding holds less than DDP's
        // whole parameters, gradients and AdamW state.
        assert!(r.fsdp.fits && r.ddp.fits, "{}", r.world);
        assert!(r.fsdp.peak < r.ddp.peak, "{}", r.world);
        // Backward prefetch never slows a step.
        assert!(r.no_prefetch.step_s >= r.fsdp.step_s, "{}", r.world);
        // Hybrid only above one node.
        assert_eq!(r.hybrid.is_some(), r.world > 8);
    }
    // The shard shrinks as GPUs are added.
    assert!(rows[2].fsdp.peak < rows[0].fsdp.peak);
    let table = fsdp_paper_study::render(models, &rows);
    for needle in [
        "| T5-611M | 8 | 32 |",
        "t5-large:batch=8",
        "DDP fits at every GPU count",
    ] {
        assert!(table.contains(needle), "`{needle}` missing from:\n{table}");
    }
}

#[test]
fn inspect_gpt3_prints_the_table_at_world_512() {
    let table = inspect_gpt3::run().unwrap_or_else(|e| panic!("{e}"));
    for needle in [
        "gpt3-175b",
        "world 512",
        "full_shard (F = 512)",
        "peak",
        "fits",
        "transformer.h.95",
    ] {
        assert!(table.contains(needle), "`{needle}` missing from:\n{table}");
    }
}

#[test]
fn train_onnx_trains_the_gpt2_export_on_the_text() {
    let (model, dims, data) = train_onnx::default_model();
    let losses = train_onnx::run(&model, dims, data, 2, 60).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(losses.len(), 60);
    assert!(losses.iter().all(|l| l.is_finite()), "{losses:?}");
    // The exported weights start near a uniform guess over 128 tokens
    // (ln 128 = 4.85); 60 steps on the text's windows learn much of it.
    let (early, late) = (mean(&losses[..5]), mean(&losses[50..]));
    assert!(
        early > 4.0 && late < early - 1.0,
        "loss {early} -> {late}, ln 128 = {}",
        128f32.ln()
    );
}

#[test]
fn read_plan_in_python_prints_what_rust_prints() {
    let dir = tempfile::tempdir().expect("temp dir");
    let plan = dir.path().join("plan.json");
    let o = Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args([
            "compile",
            "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=2",
        ])
        .args(["--world", "4", "--preset", "cpu-local", "-o"])
        .arg(&plan)
        .output()
        .expect("fsdpc runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let json = std::fs::read_to_string(&plan).expect("plan written");
    let rust = read_plan::run(&json).unwrap_or_else(|e| panic!("{e}"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/read_plan.py");
    let o = Command::new("python3")
        .arg(&script)
        .arg(&plan)
        .output()
        .expect("python3 runs (it is needed by this test)");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(String::from_utf8_lossy(&o.stdout), rust);
    // Root and two blocks; each block gathered in forward and in backward.
    let lines: Vec<&str> = rust.lines().collect();
    assert_eq!(lines.len(), 5, "{rust}");
    assert!(lines[2].contains("transformer.h.0") && lines[2].contains(" 2 "));
    let parsed: serde_json::Value = serde_json::from_str(&json).expect("json");
    let peak = &parsed["memory"]["peak_bytes"];
    assert_eq!(lines[4], format!("peak bytes per rank: {peak}"));
}
