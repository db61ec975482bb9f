//! Sharded checkpoints end to end on thread ranks: a resumed run is
//! bit-identical to an uninterrupted one; loading at another world, shard
//! factor or strategy re-shards; every damaged checkpoint is refused with an
//! error naming the file, and nothing on disk is changed by the refusal.

use crate::common;

use crate::common::{bits, max_param_diff, plan};
use fsdpc_plan::{Plan, Strategy, WrapPolicy};
use fsdpc_runtime::checkpoint::CheckpointError;
use fsdpc_runtime::train::CheckpointConfig;
use fsdpc_runtime::{RuntimeError, TrainOptions, TrainReport};
use std::path::{Path, PathBuf};

/// Global batch 8: a world of W ranks runs 8 / W samples each.
fn gpt(world: u32) -> String {
    format!(
        "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch={}",
        8 / world
    )
}

fn gpt_plan(world: u32, strategy: Strategy) -> Plan {
    plan(&gpt(world), world, strategy, WrapPolicy::Blocks)
}

fn opts(steps: u64) -> TrainOptions {
    TrainOptions {
        steps,
        seed: 11,
        ..TrainOptions::default()
    }
}

fn run(plan: &Plan, o: &TrainOptions) -> Result<TrainReport, RuntimeError> {
    fsdpc_runtime::train(plan, o, &mut |_| {})
}

fn ok(plan: &Plan, o: &TrainOptions) -> TrainReport {
    run(plan, o).unwrap_or_else(|e| panic!("training fails: {e}"))
}

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"))
}

/// Trains 3 steps of `from`, checkpointing every 3, into `dir`.
fn checkpoint_at_3(from: &Plan, dir: &Path) -> TrainReport {
    ok(
        from,
        &TrainOptions {
            checkpoint: Some(CheckpointConfig {
                dir: dir.to_path_buf(),
                every: 3,
            }),
            ..opts(3)
        },
    )
}

/// Resumes `to` from `dir` up to step 6.
fn resume(to: &Plan, dir: &Path) -> Result<TrainReport, RuntimeError> {
    run(
        to,
        &TrainOptions {
            resume: Some(dir.to_path_buf()),
            seed: 999, // the checkpoint's seed wins
            ..opts(6)
        },
    )
}

fn check_bit_identical(world: u32) {
    let p = gpt_plan(world, Strategy::FullShard);
    assert_eq!(p.config.shard_factor, world);
    let full = ok(&p, &opts(6));
    let dir = tmp();
    let first = checkpoint_at_3(&p, dir.path());
    let rest = resume(&p, dir.path()).unwrap_or_else(|e| panic!("resume fails: {e}"));
    let (full_loss, full_params) = bits(&full);
    let (a, _) = bits(&first);
    let (b, params) = bits(&rest);
    assert_eq!(a, full_loss[..3], "steps 0..3 at F={world}");
    assert_eq!(b, full_loss[3..], "resumed steps 3..6 at F={world}");
    assert_eq!(params, full_params, "final parameters at F={world}");
}

#[test]
fn resume_is_bit_identical_at_f2() {
    check_bit_identical(2);
}

#[test]
fn resume_is_bit_identical_at_f4() {
    check_bit_identical(4);
}

/// Loss (relative) and parameter (absolute) tolerance of a re-sharded run
/// against an uninterrupted run at the new configuration: the reduction
/// order of the first 3 steps differs (world 4 sums 4 rank partials, world
/// 2 sums 2), so the state differs in the last bits, as in equivalence.rs.
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;

fn check_reshard(from: &Plan, to: &Plan, label: &str) -> (f32, f32) {
    let dir = tmp();
    checkpoint_at_3(from, dir.path());
    let rest = resume(to, dir.path()).unwrap_or_else(|e| panic!("{label}: resume fails: {e}"));
    let full = ok(to, &opts(6));
    let loss_rel = full.losses[3..]
        .iter()
        .zip(&rest.losses)
        .map(|(a, b)| (a - b).abs() / a.abs().max(1e-6))
        .fold(0f32, f32::max);
    let (abs, _) = max_param_diff(&full, &rest);
    println!("{label}: loss rel diff {loss_rel:e}, param abs diff {abs:e}");
    assert_eq!(rest.losses.len(), 3, "{label}");
    assert!(loss_rel <= LOSS_RTOL, "{label}: loss rel diff {loss_rel}");
    assert!(abs <= PARAM_ATOL, "{label}: param abs diff {abs}");
    (loss_rel, abs)
}

#[test]
fn resharding_4_to_2_ranks() {
    check_reshard(
        &gpt_plan(4, Strategy::FullShard),
        &gpt_plan(2, Strategy::FullShard),
        "4 -> 2 ranks",
    );
}

#[test]
fn resharding_2_to_4_ranks() {
    check_reshard(
        &gpt_plan(2, Strategy::FullShard),
        &gpt_plan(4, Strategy::FullShard),
        "2 -> 4 ranks",
    );
}

#[test]
fn full_shard_to_no_shard_is_bit_identical() {
    // full_shard and no_shard at the same world sum in the same order, so
    // re-sharding between them is exact.
    let (loss, param) = check_reshard(
        &gpt_plan(2, Strategy::FullShard),
        &gpt_plan(2, Strategy::NoShard),
        "full_shard -> no_shard",
    );
    assert_eq!((loss, param), (0.0, 0.0));
}

/// `gpt` at world 4 planned hybrid: 2 replica groups of F = 2.
fn hybrid_plan() -> Plan {
    common::plan_with(
        &gpt(4),
        4,
        &fsdpc_planner::FsdpConfig {
            settings: fsdpc_plan::Settings {
                strategy: Strategy::HybridShard,
                ..fsdpc_plan::Settings::default()
            },
            shard_factor: Some(2),
            ..Default::default()
        },
    )
}

/// Hybrid sharding saves the first replica group's shards (F = 2 files)
/// and resumes bit-identically; its checkpoint resumes under full_shard at
/// world 4 (re-sharded from F = 2 to F = 4) and back, within the
/// re-shard tolerance.
#[test]
fn hybrid_checkpoints_resume_and_reshard() {
    let h = hybrid_plan();
    assert_eq!(h.config.shard_factor, 2);
    let full = ok(&h, &opts(6));
    let dir = tmp();
    checkpoint_at_3(&h, dir.path());
    let rest = resume(&h, dir.path()).unwrap_or_else(|e| panic!("resume fails: {e}"));
    let (full_loss, full_params) = bits(&full);
    let (b, params) = bits(&rest);
    assert_eq!(b, full_loss[3..], "resumed hybrid steps 3..6");
    assert_eq!(params, full_params, "final hybrid parameters");
    check_reshard(
        &h,
        &gpt_plan(4, Strategy::FullShard),
        "hybrid 2x2 -> full_shard 4",
    );
    check_reshard(
        &gpt_plan(4, Strategy::FullShard),
        &h,
        "full_shard 4 -> hybrid 2x2",
    );
}

/// A checkpoint of 3 steps at world 2, its step directory and the bytes of
/// every file in it.
fn saved() -> (tempfile::TempDir, PathBuf, Plan) {
    let p = gpt_plan(2, Strategy::FullShard);
    let dir = tmp();
    checkpoint_at_3(&p, dir.path());
    let sdir = dir.path().join("step-000000003");
    assert!(sdir.join("manifest.json").exists());
    (dir, sdir, p)
}

fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out: Vec<_> = walk(dir)
        .into_iter()
        .map(|p| {
            let b = std::fs::read(&p).unwrap_or_else(|e| panic!("{e}"));
            (p, b)
        })
        .collect();
    out.sort();
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{e}")) {
        let p = e.unwrap_or_else(|e| panic!("{e}")).path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Damages the checkpoint with `damage`, resumes, and checks the error is a
/// checkpoint error naming `file` and that the refusal wrote nothing.
fn check_refused(damage: impl FnOnce(&Path), file: &str, want: fn(&CheckpointError) -> bool) {
    let (dir, sdir, p) = saved();
    damage(&sdir);
    let before = snapshot(dir.path());
    let err = resume(&p, dir.path())
        .err()
        .unwrap_or_else(|| panic!("{file}: resume succeeded"));
    let msg = err.to_string();
    println!("{file}: {msg}");
    match &err {
        RuntimeError::Checkpoint(e) => assert!(want(e), "{file}: wrong kind: {e:?}"),
        e => panic!("{file}: not a checkpoint error: {e:?}"),
    }
    assert!(msg.contains(file), "the error names {file}: {msg}");
    assert_eq!(snapshot(dir.path()), before, "the refusal changed nothing");
}

#[test]
fn a_flipped_byte_in_a_shard_is_refused() {
    check_refused(
        |sdir| {
            let f = sdir.join("rank-00001.safetensors");
            let mut b = std::fs::read(&f).unwrap_or_else(|e| panic!("{e}"));
            let at = b.len() - 5;
            b[at] ^= 0x10;
            std::fs::write(&f, b).unwrap_or_else(|e| panic!("{e}"));
        },
        "rank-00001.safetensors",
        |e| matches!(e, CheckpointError::Checksum { .. }),
    );
}

#[test]
fn a_truncated_shard_is_refused() {
    check_refused(
        |sdir| {
            let f = sdir.join("rank-00000.safetensors");
            let b = std::fs::read(&f).unwrap_or_else(|e| panic!("{e}"));
            std::fs::write(&f, &b[..b.len() / 2]).unwrap_or_else(|e| panic!("{e}"));
        },
        "rank-00000.safetensors",
        |e| matches!(e, CheckpointError::Size { .. }),
    );
}

#[test]
fn a_missing_shard_is_refused() {
    check_refused(
        |sdir| {
            std::fs::remove_file(sdir.join("rank-00001.safetensors"))
                .unwrap_or_else(|e| panic!("{e}"))
        },
        "rank-00001.safetensors",
        |e| matches!(e, CheckpointError::Missing { .. }),
    );
}

#[test]
fn a_checkpoint_of_another_model_is_refused() {
    let (dir, _sdir, _) = saved();
    let other = plan(
        "gpt:layers=2,hidden=16,heads=2,seq=8,vocab=64,batch=4",
        2,
        Strategy::FullShard,
        WrapPolicy::Blocks,
    );
    let before = snapshot(dir.path());
    let err = resume(&other, dir.path())
        .err()
        .unwrap_or_else(|| panic!("resumed"));
    println!("{err}");
    assert!(matches!(
        err,
        RuntimeError::Checkpoint(CheckpointError::Incompatible { .. })
    ));
    assert!(err.to_string().contains("manifest.json"), "{err}");
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn an_incomplete_newer_checkpoint_leaves_the_previous_one_latest() {
    // What a run killed while writing step 6's files leaves: its rank files
    // (one of them partial) but no manifest, and `latest` still at step 3.
    let (dir, sdir, p) = saved();
    let newer = dir.path().join("step-000000006");
    std::fs::create_dir_all(&newer).unwrap_or_else(|e| panic!("{e}"));
    std::fs::copy(
        sdir.join("rank-00000.safetensors"),
        newer.join("rank-00000.safetensors"),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    std::fs::write(newer.join(".rank-00001.safetensors.tmp-1"), b"partial")
        .unwrap_or_else(|e| panic!("{e}"));
    let rest = resume(&p, dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let full = ok(&p, &opts(6));
    assert_eq!(bits(&rest).0, bits(&full).0[3..]);
}

/// `--resume DIR/step-N` rolls back to an older checkpoint than `latest`:
/// the run continues from step N exactly as the uninterrupted run did, and
/// checkpointing into DIR again replaces the steps rolled back from,
/// `latest` naming the resumed step until the first new checkpoint.
#[test]
fn resume_from_a_chosen_older_checkpoint_rolls_back() {
    let p = gpt_plan(2, Strategy::FullShard);
    let full = ok(&p, &opts(6));
    let dir = tmp();
    let every3 = |steps| TrainOptions {
        checkpoint: Some(CheckpointConfig {
            dir: dir.path().to_path_buf(),
            every: 3,
        }),
        ..opts(steps)
    };
    ok(&p, &every3(6));
    let latest = || std::fs::read_to_string(dir.path().join("latest")).unwrap_or_default();
    assert_eq!(latest(), "step-000000006");
    let step3 = dir.path().join("step-000000003");
    assert_eq!(
        fsdpc_runtime::checkpoint::Checkpoint::step_of(&step3).ok(),
        Some(3)
    );
    // Without checkpointing, reading the older step changes nothing.
    let rest = ok(
        &p,
        &TrainOptions {
            resume: Some(step3.clone()),
            ..opts(5)
        },
    );
    assert_eq!(bits(&rest).0, bits(&full).0[3..5]);
    assert_eq!(latest(), "step-000000006");
    // Checkpointing into the same directory: step 6 is rolled back from,
    // then written again by the resumed run.
    let rest = ok(
        &p,
        &TrainOptions {
            resume: Some(step3.clone()),
            ..every3(6)
        },
    );
    assert_eq!(bits(&rest).0, bits(&full).0[3..]);
    assert_eq!(bits(&rest).1, bits(&full).1);
    assert_eq!(latest(), "step-000000006");
    // A run that stops before its next checkpoint leaves `latest` on the
    // step it resumed from, not on a removed one.
    let short = ok(
        &p,
        &TrainOptions {
            resume: Some(step3.clone()),
            ..every3(5)
        },
    );
    assert_eq!(bits(&short).0, bits(&full).0[3..5]);
    assert_eq!(latest(), "step-000000003");
    assert!(!dir.path().join("step-000000006").exists());
    let c =
        fsdpc_runtime::checkpoint::Checkpoint::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.manifest.step, 3);
}

#[test]
fn two_checkpoints_are_kept() {
    let p = gpt_plan(2, Strategy::FullShard);
    let dir = tmp();
    let o = TrainOptions {
        checkpoint: Some(CheckpointConfig {
            dir: dir.path().to_path_buf(),
            every: 1,
        }),
        ..opts(4)
    };
    ok(&p, &o);
    let mut names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap_or_else(|e| panic!("{e}"))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("{e}"))
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    assert_eq!(names, ["latest", "step-000000003", "step-000000004"]);
    let latest = std::fs::read_to_string(dir.path().join("latest")).unwrap_or_default();
    assert_eq!(latest, "step-000000004");
}

/// Exports the checkpoint `trained` (of plan `p`) wrote into `dir` and
/// checks the file holds the trained run's final parameters bit for bit,
/// under their names and whole shapes; returns how many of them are split
/// over a tensor group in `p`.
fn check_export(p: &Plan, dir: &Path, trained: &TrainReport) -> usize {
    assert!(!trained.final_params.is_empty());
    let out = dir.join("model.safetensors");
    let ckpt = fsdpc_runtime::checkpoint::Checkpoint::open(dir).unwrap_or_else(|e| panic!("{e}"));
    let n = ckpt
        .export_safetensors(&out)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(n, trained.final_params.len());
    let bytes = std::fs::read(&out).unwrap_or_else(|e| panic!("{e}"));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(st.names().len(), n);
    let specs: std::collections::HashMap<&str, &fsdpc_ir::ParamSpec> = p
        .training
        .graph
        .params
        .iter()
        .map(|q| (q.name.as_str(), q))
        .collect();
    let mut split = 0;
    for (name, vals) in &trained.final_params {
        let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        let spec = specs[name.as_str()];
        assert_eq!(t.shape(), spec.whole().ty.shape.dims(), "{name}");
        split += usize::from(spec.tp.is_some());
        let got: Vec<u32> = t
            .data()
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let want: Vec<u32> = vals.iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "{name}");
    }
    split
}

#[test]
fn export_gives_the_trained_parameters_with_their_names_and_shapes() {
    let p = gpt_plan(4, Strategy::FullShard);
    let dir = tmp();
    let trained = checkpoint_at_3(&p, dir.path());
    assert_eq!(check_export(&p, dir.path(), &trained), 0);
}

fn fsdpc(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn text(o: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

#[test]
fn cli_checkpoints_resumes_and_exports() {
    let dir = tmp();
    let d = dir.path().join("ckpt");
    let d = d.to_string_lossy().into_owned();
    let model = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=2";
    let first = fsdpc(&[
        "train",
        model,
        "--ranks",
        "2",
        "--steps",
        "3",
        "--checkpoint-dir",
        &d,
        "--checkpoint-every",
        "3",
    ]);
    assert!(first.status.success(), "{}", text(&first));
    let rest = fsdpc(&[
        "train",
        model,
        "--ranks",
        "2",
        "--steps",
        "6",
        "--resume",
        &d,
        "--strategy",
        "no_shard",
    ]);
    assert!(rest.status.success(), "{}", text(&rest));
    assert!(text(&rest).contains("for 3 steps"), "{}", text(&rest));
    let out = dir.path().join("m.safetensors");
    let out = out.to_string_lossy().into_owned();
    let e = fsdpc(&["export", &d, "-o", &out]);
    assert!(e.status.success(), "{}", text(&e));
    assert!(text(&e).contains("step 3"), "{}", text(&e));
    // Nothing to write, and a damaged checkpoint: one clear error each.
    let none = fsdpc(&["export", &d]);
    assert!(!none.status.success());
    std::fs::write(
        dir.path()
            .join("ckpt/step-000000003/rank-00000.safetensors"),
        b"x",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let bad = fsdpc(&["export", &d, "-o", &out]);
    assert!(!bad.status.success());
    assert!(
        text(&bad).contains("rank-00000.safetensors"),
        "{}",
        text(&bad)
    );
    assert!(!text(&bad).contains("panicked"), "{}", text(&bad));
}

/// A requeued job re-runs its command: on its first run `--resume` of its
/// own empty `--checkpoint-dir` starts at step 0; `--resume` of a
/// checkpoint already at `--steps` has nothing left to do and exits 0,
/// changing nothing; a step directory given to `--resume` continues from
/// that step.
#[test]
fn cli_resume_at_steps_has_nothing_left_to_do() {
    let dir = tmp();
    let d = dir.path().join("ckpt");
    let d = d.to_string_lossy().into_owned();
    let model = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=2";
    let train = |steps: &str, resume: Option<&str>| {
        let mut a = vec![
            "train",
            model,
            "--ranks",
            "2",
            "--steps",
            steps,
            "--checkpoint-dir",
            &d,
            "--checkpoint-every",
            "3",
        ];
        if let Some(r) = resume {
            a.extend(["--resume", r]);
        }
        fsdpc(&a)
    };
    // A typo in --resume is not taken for a first run.
    let elsewhere = format!("{d}-typo");
    let typo = train("6", Some(&elsewhere));
    assert!(!typo.status.success(), "{}", text(&typo));
    // The requeued command's first run: its own checkpoint directory holds
    // nothing yet, so it starts at step 0.
    let first = train("6", Some(&d));
    assert!(first.status.success(), "{}", text(&first));
    assert!(
        text(&first).contains("yet: starting at step 0") && text(&first).contains("for 6 steps"),
        "{}",
        text(&first)
    );
    let before = snapshot(dir.path());
    let again = train("6", Some(&d));
    assert!(again.status.success(), "{}", text(&again));
    assert!(
        text(&again).contains("nothing left to do: the checkpoint")
            && text(&again).contains("is at step 6, --steps is 6"),
        "{}",
        text(&again)
    );
    assert!(!text(&again).contains("trained"), "{}", text(&again));
    assert_eq!(snapshot(dir.path()), before, "nothing written");
    // The older step: it trains steps 3..6 again.
    let step3 = format!("{d}/step-000000003");
    let back = train("6", Some(&step3));
    assert!(back.status.success(), "{}", text(&back));
    assert!(text(&back).contains("for 3 steps"), "{}", text(&back));
    // Fewer steps than the checkpoint holds stays an error, naming it.
    let fewer = train("2", Some(&d));
    assert!(!fewer.status.success());
    assert!(text(&fewer).contains("at step 6"), "{}", text(&fewer));
    assert!(!text(&fewer).contains("panicked"), "{}", text(&fewer));
}

#[test]
fn cli_exports_a_checkpoint_back_into_onnx() {
    let dir = tmp();
    let path = |n: &str| dir.path().join(n).to_string_lossy().into_owned();
    let model = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("frontends/tests/fixtures/mlp.onnx")
        .to_string_lossy()
        .into_owned();
    let (d, trained, exported) = (path("ckpt"), path("trained.onnx"), path("exported.onnx"));
    let t = fsdpc(&[
        "train",
        &model,
        "--dim",
        "batch=4",
        "--ranks",
        "2",
        "--steps",
        "2",
        "--save-onnx",
        &trained,
        "--checkpoint-dir",
        &d,
        "--checkpoint-every",
        "2",
    ]);
    assert!(t.status.success(), "{}", text(&t));
    let e = fsdpc(&["export", &d, "--save-onnx", &exported, "--model", &model]);
    assert!(e.status.success(), "{}", text(&e));
    let a = std::fs::read(&trained).unwrap_or_else(|e| panic!("{e}"));
    let b = std::fs::read(&exported).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        a == b,
        "the exported ONNX file equals the one training wrote"
    );
}

#[test]
fn killing_a_run_while_it_checkpoints_leaves_a_loadable_checkpoint() {
    // Checkpointing every step, the run spends most of its time writing one:
    // a kill -9 at any of these moments lands in a write or between writes.
    let model = "gpt:layers=4,hidden=256,heads=4,seq=16,vocab=4096,batch=2";
    let dir = tmp();
    let d = dir.path().join("ckpt");
    let ds = d.to_string_lossy().into_owned();
    for (i, delay_ms) in [0u64, 5, 13, 29, 71, 150, 310].into_iter().enumerate() {
        // The first run starts the directory; each later one continues it.
        let mut args = vec![
            "train",
            model,
            "--ranks",
            "2",
            "--steps",
            "100000",
            "--checkpoint-dir",
            &ds,
            "--checkpoint-every",
            "1",
        ];
        if i > 0 {
            args.extend(["--resume", &ds]);
        }
        let before = if i > 0 {
            fsdpc_runtime::checkpoint::Checkpoint::open(&d)
                .map(|c| c.manifest.step)
                .unwrap_or_else(|e| panic!("{e}"))
        } else {
            0
        };
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fsdpc"))
            .args(&args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        // Wait for a checkpoint newer than the one this run started from.
        let newer = || {
            fsdpc_runtime::checkpoint::Checkpoint::open(&d).is_ok_and(|c| c.manifest.step > before)
        };
        let t = std::time::Instant::now();
        while !newer() && t.elapsed().as_secs() < 120 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(delay_ms));
        child.kill().unwrap_or_else(|e| panic!("{e}"));
        let _ = child.wait();
        let c = fsdpc_runtime::checkpoint::Checkpoint::open(&d)
            .unwrap_or_else(|e| panic!("killed after {delay_ms} ms: {e}"));
        println!(
            "run {i} killed {delay_ms} ms after its first checkpoint: latest is step {}",
            c.manifest.step
        );
        assert!(c.manifest.step > before, "run {i} made progress");
    }
    let c = fsdpc_runtime::checkpoint::Checkpoint::open(&d).unwrap_or_else(|e| panic!("{e}"));
    let steps = (c.manifest.step + 1).to_string();
    let r = fsdpc(&[
        "train", model, "--ranks", "2", "--steps", &steps, "--resume", &ds,
    ]);
    assert!(r.status.success(), "{}", text(&r));
}

#[test]
fn a_new_run_does_not_overwrite_a_checkpoint_directory() {
    let (dir, _sdir, p) = saved();
    let before = snapshot(dir.path());
    let err = run(
        &p,
        &TrainOptions {
            checkpoint: Some(CheckpointConfig {
                dir: dir.path().to_path_buf(),
                every: 1,
            }),
            ..opts(3)
        },
    )
    .err()
    .unwrap_or_else(|| panic!("a fresh run wrote into a checkpoint directory"));
    println!("{err}");
    assert!(err.to_string().contains("--resume"), "{err}");
    assert_eq!(snapshot(dir.path()), before);
}

#[test]
fn a_damaged_manifest_is_refused() {
    check_refused(
        |sdir| {
            std::fs::write(
                sdir.join("manifest.json"),
                b"{\"format\": \"fsdpc.checkpoint/v1\"",
            )
            .unwrap_or_else(|e| panic!("{e}"))
        },
        "manifest.json",
        |e| matches!(e, CheckpointError::Format { .. }),
    );
}

#[test]
fn a_latest_pointer_outside_the_directory_is_refused() {
    check_refused(
        |sdir| {
            let dir = sdir.parent().unwrap_or_else(|| panic!("no parent"));
            std::fs::write(dir.join("latest"), b"../elsewhere").unwrap_or_else(|e| panic!("{e}"))
        },
        "latest",
        |e| matches!(e, CheckpointError::Format { .. }),
    );
}

#[test]
fn resume_in_debug_mode_is_bit_identical() {
    let p = gpt_plan(2, Strategy::FullShard);
    let debug = |o: TrainOptions| TrainOptions {
        mode: fsdpc_runtime::ExecMode::DebugAlloc,
        ..o
    };
    let full = ok(&p, &debug(opts(6)));
    let dir = tmp();
    checkpoint_at_3(&p, dir.path());
    let rest = ok(
        &p,
        &debug(TrainOptions {
            resume: Some(dir.path().to_path_buf()),
            ..opts(6)
        }),
    );
    assert_eq!(bits(&rest).0, bits(&full).0[3..]);
    assert_eq!(bits(&rest).1, bits(&full).1);
}

#[test]
fn a_directory_without_a_checkpoint_is_named_as_such() {
    let dir = std::env::temp_dir().join(format!("fsdpc-no-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{e}"));
    let Err(e) = fsdpc_runtime::checkpoint::Checkpoint::open(&dir) else {
        panic!("opened a checkpoint in an empty directory");
    };
    assert!(
        matches!(&e, CheckpointError::NotACheckpoint { dir: d } if d == &dir.display().to_string()),
        "{e}"
    );
    assert!(
        e.to_string().contains("is not a checkpoint directory"),
        "{e}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `gpt` planned for `world` ranks split over `t` tensor positions, with
/// `strategy` over the world / t data ranks (each running 8 / data ranks
/// samples: the global batch stays 8).
fn tp_plan(world: u32, t: u32, strategy: Strategy) -> Plan {
    let mut c = fsdpc_planner::FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            wrap: WrapPolicy::Blocks,
            tensor_parallel: t,
            ..fsdpc_plan::Settings::default()
        },
        ..fsdpc_planner::FsdpConfig::default()
    };
    c.tensor_parallel = t;
    common::plan_with(&gpt(world / t), world, &c)
}

/// A checkpoint of a 2-D mesh (T = 2 over F = 2) holds one file per shard
/// and tensor position and resumes on the same layout bit for bit.
#[test]
fn a_tensor_parallel_checkpoint_resumes_bit_identically() {
    let p = tp_plan(4, 2, Strategy::FullShard);
    assert!(p.config.tensor.is_some(), "the plan splits");
    let full = ok(&p, &opts(6));
    let dir = tmp();
    let first = checkpoint_at_3(&p, dir.path());
    let ckpt =
        fsdpc_runtime::checkpoint::Checkpoint::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(ckpt.manifest.tensor_parallel, 2);
    let files: Vec<(u32, u32)> = ckpt
        .manifest
        .files
        .iter()
        .map(|f| (f.position, f.tensor))
        .collect();
    assert_eq!(files, [(0, 0), (0, 1), (1, 0), (1, 1)]);
    let rest = resume(&p, dir.path()).unwrap_or_else(|e| panic!("resume fails: {e}"));
    let (full_loss, full_params) = bits(&full);
    assert_eq!(bits(&first).0, full_loss[..3]);
    let (b, params) = bits(&rest);
    assert_eq!(b, full_loss[3..], "resumed steps 3..6");
    assert_eq!(params, full_params, "final parameters");
}

/// Checkpoints move between (T, F) layouts through whole parameters: T = 2,
/// F = 2 resumes at T = 1, F = 4 and back, within the tolerances of a
/// changed reduction order (the row-parallel sums), and exactly where the
/// order is the same (full_shard and no_shard at T = 2).
#[test]
fn tensor_parallel_checkpoints_move_between_layouts() {
    check_reshard(
        &tp_plan(4, 2, Strategy::FullShard),
        &tp_plan(4, 1, Strategy::FullShard),
        "T=2,F=2 -> T=1,F=4",
    );
    check_reshard(
        &tp_plan(4, 1, Strategy::FullShard),
        &tp_plan(4, 2, Strategy::FullShard),
        "T=1,F=4 -> T=2,F=2",
    );
    check_reshard(
        &tp_plan(4, 2, Strategy::FullShard),
        &tp_plan(2, 2, Strategy::FullShard),
        "T=2,F=2 -> T=2,F=1",
    );
    let exact = check_reshard(
        &tp_plan(4, 2, Strategy::FullShard),
        &tp_plan(4, 2, Strategy::NoShard),
        "T=2 full_shard -> T=2 no_shard",
    );
    assert_eq!(exact, (0.0, 0.0));
}

/// `export` writes the whole parameters from a tensor-parallel checkpoint:
/// the trained run's own (reassembled) final parameters, bit for bit, under
/// their whole shapes.
#[test]
fn export_puts_tensor_parallel_parts_back_together() {
    let p = tp_plan(4, 2, Strategy::FullShard);
    let dir = tmp();
    let trained = checkpoint_at_3(&p, dir.path());
    assert!(
        check_export(&p, dir.path(), &trained) > 0,
        "some parameters are split"
    );
}

/// The GPT with an odd vocabulary of 61 (as GPT-2's 50,257: padded to 62
/// over T = 2, to 64 over T = 4) and four heads, planned for `world` ranks
/// split over `t` tensor positions (global batch 8), under AdamW with
/// weight decay on every parameter, the tied embedding too. (With 63 and
/// this seed an MLP weight whose gradient is all but zero moves by 2.4e-5
/// when plain FSDP alone changes its reduction order, past `PARAM_ATOL`.)
fn odd_vocab_plan(world: u32, t: u32) -> Plan {
    let spec = format!(
        "gpt:layers=2,hidden=32,heads=4,seq=8,vocab=61,batch={}",
        8 * t / world
    );
    let mut c = fsdpc_planner::FsdpConfig {
        settings: fsdpc_plan::Settings {
            wrap: WrapPolicy::Blocks,
            tensor_parallel: t,
            decay_all: true,
            ..fsdpc_plan::Settings::default()
        },
        ..fsdpc_planner::FsdpConfig::default()
    };
    c.tensor_parallel = t;
    let adamw = fsdpc_ir::Optimizer::AdamW {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.1,
    };
    common::host_plan(&spec, world, &c, &adamw)
}

/// A checkpoint of a padded vocabulary (61 over T = 2: parts of 31, the
/// second ending in a row of padding) holds the padding as zeros, in the
/// parameters and in AdamW's state, after steps with weight decay;
/// resumes on its own layout bit for bit; and moves to T = 1 and T = 4
/// (parts of 16, the last ending in three rows of padding) and back
/// through the whole [61, 32] table.
#[test]
fn a_padded_vocabulary_checkpoint_stays_zero_and_moves_between_layouts() {
    let p = odd_vocab_plan(2, 2);
    let padded = p
        .config
        .tensor
        .as_ref()
        .and_then(|t| t.vocabulary_padded.clone());
    assert_eq!(padded.map(|v| (v.vocabulary, v.padded)), Some((61, 62)));
    let full = ok(&p, &opts(6));
    let dir = tmp();
    checkpoint_at_3(&p, dir.path());
    let ckpt =
        fsdpc_runtime::checkpoint::Checkpoint::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(padding_of_member_1(&ckpt), 1 + ckpt.manifest.state_slots);
    let rest = resume(&p, dir.path()).unwrap_or_else(|e| panic!("resume fails: {e}"));
    let (full_loss, full_params) = bits(&full);
    let (b, params) = bits(&rest);
    assert_eq!(b, full_loss[3..], "resumed steps 3..6");
    assert_eq!(params, full_params, "final parameters");
    for (from, to, label) in [
        ((2, 2), (2, 1), "vocab 61 T=2 -> T=1"),
        ((4, 2), (4, 4), "vocab 61 T=2,F=2 -> T=4"),
        ((4, 4), (4, 2), "vocab 61 T=4 -> T=2,F=2"),
        ((4, 1), (4, 2), "vocab 61 T=1,F=4 -> T=2,F=2"),
    ] {
        let plan = |(world, t)| odd_vocab_plan(world, t);
        check_reshard(&plan(from), &plan(to), label);
    }
}

/// Checks that in tensor position 1's file of `ckpt` (written at F = 1:
/// its whole flat parameters and optimizer state) every padded
/// parameter's padding is zero and the rest is not; returns how many
/// tensors were checked.
fn padding_of_member_1(ckpt: &fsdpc_runtime::checkpoint::Checkpoint) -> usize {
    use fsdpc_runtime::checkpoint::manifest::{params_tensor, state_tensor};
    assert_eq!(ckpt.manifest.shard_factor, 1);
    let bytes = std::fs::read(ckpt.dir.join(&ckpt.manifest.files[1].name))
        .unwrap_or_else(|e| panic!("{e}"));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{e}"));
    let mut checked = 0;
    for (u, unit) in ckpt.manifest.units.iter().enumerate() {
        for q in &unit.params {
            let Some(tp) = q.tp.as_ref().filter(|tp| tp.padded()) else {
                continue;
            };
            let mut held = vec![false; q.numel as usize];
            for (l, _, n) in tp.runs(&q.shape, 1) {
                held[l as usize..(l + n) as usize].fill(true);
            }
            let slots = (0..ckpt.manifest.state_slots).map(|k| state_tensor(u, k));
            for name in std::iter::once(params_tensor(u)).chain(slots) {
                let data = st.tensor(&name).unwrap_or_else(|e| panic!("{name}: {e}"));
                let vals: Vec<f32> = data
                    .data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                let part = &vals[q.offset as usize..(q.offset + q.numel) as usize];
                let pad: Vec<f32> = (0..part.len())
                    .filter(|&e| !held[e])
                    .map(|e| part[e])
                    .collect();
                let kept = (0..part.len()).filter(|&e| held[e]).map(|e| part[e]);
                assert_eq!(pad.len(), q.shape[1], "{}: one row of padding", q.name);
                assert!(pad.iter().all(|&v| v == 0.0), "{} in {name}", q.name);
                assert!(kept.into_iter().any(|v| v != 0.0), "{} in {name}", q.name);
                checked += 1;
            }
        }
    }
    checked
}

/// `export` of a padded vocabulary's checkpoint writes the whole [61, 32]
/// table, the trained run's own final parameters bit for bit, and those
/// are one unsharded rank's within the tolerances of a changed reduction
/// order.
#[test]
fn export_of_a_padded_vocabulary_writes_the_whole_table() {
    let p = odd_vocab_plan(4, 2);
    let dir = tmp();
    let trained = checkpoint_at_3(&p, dir.path());
    assert!(check_export(&p, dir.path(), &trained) > 0);
    let table = p
        .training
        .graph
        .params
        .iter()
        .find(|q| q.name == "transformer.wte.weight")
        .expect("the embedding");
    assert_eq!(table.ty.shape.0, [31, 32], "a member's part");
    assert_eq!(table.whole().ty.shape.0, [61, 32]);
    let one = ok(&odd_vocab_plan(1, 1), &opts(3));
    let (abs, _) = max_param_diff(&one, &trained);
    println!("vocab 61 T=2,F=2 against one rank: param abs diff {abs:e}");
    assert!(abs <= PARAM_ATOL, "param abs diff {abs}");
}

/// From the command line: `train --save-safetensors` at T = 2 and `export`
/// of its checkpoint write the padded vocabulary's whole [63, 32]
/// embedding, the same bytes, within the tolerances of one rank's.
#[test]
fn cli_saves_and_exports_a_padded_vocabulary_whole() {
    let dir = tmp();
    let path = |f: &str| dir.path().join(f).to_string_lossy().into_owned();
    let (d, saved, exported, one) = (
        path("ckpt"),
        path("t2.safetensors"),
        path("export.safetensors"),
        path("one.safetensors"),
    );
    let model = |batch: u32| format!("gpt:layers=2,hidden=32,heads=4,seq=8,vocab=63,batch={batch}");
    let t2 = fsdpc(&[
        "train",
        &model(8),
        "--ranks",
        "2",
        "--tensor-parallel",
        "2",
        "--steps",
        "3",
        "--checkpoint-dir",
        &d,
        "--checkpoint-every",
        "3",
        "--save-safetensors",
        &saved,
    ]);
    assert!(t2.status.success(), "{}", text(&t2));
    let e = fsdpc(&["export", &d, "-o", &exported]);
    assert!(e.status.success(), "{}", text(&e));
    let r1 = fsdpc(&[
        "train",
        &model(8),
        "--ranks",
        "1",
        "--steps",
        "3",
        "--save-safetensors",
        &one,
    ]);
    assert!(r1.status.success(), "{}", text(&r1));
    let table = |file: &str| {
        let bytes = std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}"));
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap_or_else(|e| panic!("{e}"));
        let t = st
            .tensor("transformer.wte.weight")
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(t.shape(), [63, 32], "{file}");
        t.data()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect::<Vec<f32>>()
    };
    let (a, b, c) = (table(&saved), table(&exported), table(&one));
    assert_eq!(a, b, "saved and exported");
    let diff = a
        .iter()
        .zip(&c)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    println!("cli vocab 63 T=2 against one rank: embedding abs diff {diff:e}");
    assert!(diff <= PARAM_ATOL, "embedding abs diff {diff}");
}
