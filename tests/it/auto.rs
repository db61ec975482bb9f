//! The auto-planner (`fsdpc compile --auto`): on small spaces the pruned
//! search chooses what an exhaustive grid chooses and no bound exceeds what
//! a compile gives; a model that fits nowhere names the smallest world,
//! which a compile there confirms; the chosen plan validates and trains like
//! one unsharded rank; the CLI prints the table and writes the plan.

use crate::common;

use crate::common::{max_loss_rel_diff, max_param_diff, train};
use fsdpc_frontends::LoadOptions;
use fsdpc_ir::DType;
use fsdpc_plan::{BackwardPrefetch, CheckpointPolicy, ModelInfo, Plan, Strategy};
use fsdpc_planner::auto::{AutoError, AutoResult, Fixed, Search, Space, Verdict};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::ExecMode;
use std::process::{Command, Output};

const FOUR_LAYERS: &str = "gpt:layers=4,hidden=32,heads=2,seq=16,vocab=64,batch=2";

fn load(spec: &str) -> (fsdpc_ir::TrainingProgram, ModelInfo) {
    let m = fsdpc_frontends::load(spec, &LoadOptions::default()).expect("model loads");
    let info = ModelInfo {
        name: m.name.clone(),
        params: m.program.graph.param_numel(),
        tokens_per_rank_step: m.tokens_per_rank_step(),
    };
    (m.program, info)
}

/// The default space at `world` with fewer schedule knobs (8 variants per
/// class), so the exhaustive grid stays fast.
fn small_space(program: &fsdpc_ir::TrainingProgram, world: u32, bf16: bool) -> Space {
    let base = FsdpConfig::default();
    let mut s = Space::around(&base, program, world, &Fixed::default(), bf16).expect("space");
    s.backward_prefetch = vec![BackwardPrefetch::Pre, BackwardPrefetch::None];
    s.forward_prefetch = vec![true];
    s.prefetch_depth = vec![1, 2];
    s.limit_all_gathers = vec![2, 1];
    s
}

/// The default configuration split over `t` tensor-parallel ranks.
fn tensor(t: u32) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            tensor_parallel: t,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

/// Pruned and exhaustive searches of one space: same chosen candidate,
/// same step time; every bound at most what the compile gave.
fn check_same_best(spec: &str, preset: &str, world: u32, capacity: Option<u64>, bf16: bool) {
    check_same_best_at(spec, preset, world, capacity, bf16, 1)
}

/// `check_same_best` at tensor-parallel degree `t` (the space over the
/// world / t data ranks).
fn check_same_best_at(
    spec: &str,
    preset: &str,
    world: u32,
    capacity: Option<u64>,
    bf16: bool,
    t: u32,
) {
    let (program, info) = load(spec);
    let mut cluster = fsdpc_planner::preset(preset, world, world.min(8)).expect("preset");
    let space = small_space(&program, world / t, bf16);
    let base = tensor(t);
    if let Some(c) = capacity {
        cluster.memory_bytes = c;
    }
    let search = Search::new(&program, &info, &cluster, &base, &space);
    let label = format!("{spec} on {preset} at world {world}, T {t}, capacity {capacity:?}");
    let grid = search.exhaustive().expect("grid finds a plan");
    let pruned = search.run().expect("search finds a plan");
    assert_eq!(grid.weighed.len(), space.len(), "{label}");
    assert_eq!(pruned.weighed.len(), space.len(), "{label}");
    assert_eq!(pruned.plan.config.tensor_parallel, t, "{label}");
    if t > 1 {
        assert!(
            pruned.plan.config.tensor.is_some(),
            "{label}: the plan splits"
        );
    }
    let chosen = |r: &AutoResult| {
        r.weighed
            .iter()
            .find(|w| w.verdict == Verdict::Chosen)
            .map(|w| (w.candidate.index, w.candidate.config.clone()))
            .expect("one chosen")
    };
    assert_eq!(chosen(&grid), chosen(&pruned), "{label}");
    assert_eq!(
        grid.plan.estimates.step_time_s, pruned.plan.estimates.step_time_s,
        "{label}"
    );
    let without_record = |p: &Plan| fsdpc_plan::PlanConfig {
        auto: None,
        ..p.config.clone()
    };
    assert_eq!(
        without_record(&grid.plan),
        without_record(&pruned.plan),
        "{label}"
    );
    assert_eq!(pruned.plan.validate(), Ok(()), "{label}");
    // Bounds hold: each pruned-search bound is at most what the grid's
    // compile of the same candidate gave.
    let (mut by_memory, mut screened_over) = (0, 0);
    for (g, p) in grid.weighed.iter().zip(&pruned.weighed) {
        assert_eq!(g.candidate.index, p.candidate.index);
        let (Some(step), Some(peak)) = (g.step_time_s, g.peak_bytes) else {
            continue;
        };
        assert!(
            p.bound_s <= step * (1.0 + 1e-12),
            "{label}: {} time bound {} > step {step}",
            p.candidate.short(),
            p.bound_s
        );
        assert!(
            p.bound_bytes <= peak,
            "{label}: {} memory bound {} > peak {peak}",
            p.candidate.short(),
            p.bound_bytes
        );
        if matches!(p.verdict, Verdict::MemoryBound { .. }) {
            by_memory += 1;
            assert!(peak > cluster.memory_bytes, "{label}: pruned one that fits");
        }
        // A screened candidate's peak is the compiled one, exactly.
        if let (None, Some(screened)) = (p.step_time_s, p.peak_bytes) {
            assert_eq!(
                screened,
                peak,
                "{label}: {} screened peak",
                p.candidate.short()
            );
            if matches!(p.verdict, Verdict::OverMemory { .. }) {
                screened_over += 1;
            }
        }
    }
    let r = &pruned.record;
    assert_eq!(
        r.compiled + r.pruned_by_memory + r.pruned_by_time + screened_over,
        space.len() as u64,
        "{label}: every candidate compiled, pruned or screened over memory"
    );
    assert_eq!(r.pruned_by_memory, by_memory, "{label}");
    // With a gap the chosen step is within it of the fastest, for no more
    // compiles than the exact search.
    for gap in [0.005, 0.05] {
        let near = Search::new(&program, &info, &cluster, &base, &space)
            .with_gap(gap)
            .run()
            .expect("search with a gap finds a plan");
        let fastest = grid.plan.estimates.step_time_s;
        assert!(
            near.plan.estimates.step_time_s <= fastest * (1.0 + gap),
            "{label}, gap {gap}: {} > {fastest} x (1 + gap)",
            near.plan.estimates.step_time_s
        );
        assert!(near.record.compiled <= r.compiled, "{label}, gap {gap}");
        assert_eq!(near.record.gap, gap);
    }
    assert!(r.compiled < space.len() as u64, "{label}: something pruned");
    eprintln!(
        "{label}: {} candidates, {} compiled, {} pruned by memory, {} by time; chosen {}",
        r.candidates,
        r.compiled,
        r.pruned_by_memory,
        r.pruned_by_time,
        chosen(&pruned).1.strategy.name()
    );
}

#[test]
fn pruned_search_finds_the_exhaustive_grids_best() {
    check_same_best("gpt-mini", "cpu-local", 4, None, false);
    check_same_best(FOUR_LAYERS, "a100-80g-roce", 8, None, true);
}

/// With tensor parallelism the bounds count one member's program (its
/// FLOPs and its parts of the parameters): they still hold, and the pruned
/// search still finds the grid's best.
#[test]
fn pruned_search_finds_the_grids_best_under_tensor_parallelism() {
    check_same_best_at(FOUR_LAYERS, "cpu-local", 4, None, false, 2);
    check_same_best_at(FOUR_LAYERS, "a100-80g-roce", 8, None, true, 2);
}

/// The schedule knobs change only what a plan waits for: every member of
/// a class runs the same instructions in the same order on each stream, so
/// they share one relaxed step (`Quick::class_s`), which bounds the step of
/// each of them. The search bounds a class by its first member's, without
/// screening the others; here every knob of the full space is screened.
#[test]
fn every_member_of_a_class_has_its_relaxed_step() {
    for (spec, t, preset) in [
        (FOUR_LAYERS, 1, "h100-80g-ib"),
        (FOUR_LAYERS, 2, "h100-80g-ib"),
        ("llama-mini", 1, "h100-80g-ib"),
        // Contention: the bound is the busiest stream's work.
        (FOUR_LAYERS, 1, "cpu-local"),
    ] {
        let (program, info) = load(spec);
        let cluster = fsdpc_planner::preset(preset, 8, 4).expect("preset");
        let base = tensor(t);
        let space = Space::around(&base, &program, 8 / t, &Fixed::default(), true).expect("space");
        let per = space.backward_prefetch.len()
            * space.forward_prefetch.len()
            * space.prefetch_depth.len()
            * space.limit_all_gathers.len();
        assert!(per >= 24, "{spec}: the full knob set ({per})");
        let all = fsdpc_planner::auto::candidates(&space, &base);
        // Every fifth class: strategies, F, offload and checkpointing vary.
        for class in all.chunks(per).step_by(5) {
            let mut relaxed: Option<(f64, String)> = None;
            for c in class {
                let q = match fsdpc_planner::quick(
                    program.clone(),
                    info.clone(),
                    &cluster,
                    &c.config,
                ) {
                    Ok(q) => q,
                    Err(_) => continue,
                };
                assert!(
                    q.class_s <= q.step_lower_s * (1.0 + 1e-12),
                    "{spec} T={t} on {preset} {}: relaxed {} > step {}",
                    c.short(),
                    q.class_s,
                    q.step_lower_s
                );
                match &relaxed {
                    None => relaxed = Some((q.class_s, c.short())),
                    Some((r, first)) => assert!(
                        (q.class_s - r).abs() <= 1e-12 * r.max(1e-30),
                        "{spec} T={t} on {preset}: {} relaxed {} against {first}'s {r}",
                        c.short(),
                        q.class_s
                    ),
                }
            }
        }
    }
}

#[test]
fn pruned_search_agrees_when_memory_is_tight() {
    let (program, info) = load(FOUR_LAYERS);
    // Capacity between the leanest and the no_shard peak, so memory
    // bounds, over-memory candidates and fitting ones all occur.
    let cluster = fsdpc_planner::preset("cpu-local", 4, 4).expect("preset");
    let peak = |cfg: FsdpConfig| {
        fsdpc_planner::compile_unchecked(program.clone(), info.clone(), &cluster, &cfg)
            .expect("compiles")
            .memory
            .peak_bytes
    };
    let ddp = peak(FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy: Strategy::NoShard,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    });
    let sharded = peak(FsdpConfig::default());
    assert!(sharded < ddp);
    check_same_best(
        FOUR_LAYERS,
        "cpu-local",
        4,
        Some((sharded + ddp) / 2),
        false,
    );
}

#[test]
fn fits_nowhere_names_the_smallest_world_that_fits() {
    let (program, info) = load(FOUR_LAYERS);
    let world = 2;
    let mut cluster = fsdpc_planner::preset("cpu-local", world, 1).expect("preset");
    let base = FsdpConfig {
        settings: fsdpc_plan::Settings {
            activation_checkpointing: CheckpointPolicy::Units,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let fixed = Fixed {
        checkpointing: true,
        cpu_offload: true,
        ..Fixed::default()
    };
    let space = Space::around(&base, &program, world, &fixed, false).expect("space");
    // Capacity: what the leanest plan needs at world 6, so world 2 is too
    // small.
    let shape = cluster.clone();
    let at = |w: u32, cfg: &FsdpConfig| -> Plan {
        let c = shape.with_world(w).expect("world");
        fsdpc_planner::compile_unchecked(program.clone(), info.clone(), &c, cfg).expect("compiles")
    };
    let lean = |w: u32| FsdpConfig {
        settings: fsdpc_plan::Settings {
            wrap: space.wraps.last().cloned().expect("a wrap"),
            limit_all_gathers: 1,
            backward_prefetch: BackwardPrefetch::None,
            forward_prefetch: false,
            ..base.settings.clone()
        },
        shard_factor: Some(w),
        check_fits: false,
        ..base.clone()
    };
    cluster.memory_bytes = at(6, &lean(6)).memory.peak_bytes;
    let search = Search::new(&program, &info, &cluster, &base, &space);
    let err = search.run().expect_err("nothing fits at world 2");
    let text = err.to_string();
    eprintln!("{text}");
    let AutoError::FitsNowhere {
        smallest_world: Some(w),
        over_by,
        capacity_bytes,
        ..
    } = err
    else {
        panic!("expected FitsNowhere with a world: {text}");
    };
    assert!(over_by > 0 && capacity_bytes == cluster.memory_bytes);
    assert!(w > world && w <= 6, "smallest world {w}");
    assert!(text.contains(&format!("world {w}")), "{text}");
    assert!(text.contains("CPU offload"), "{text}");
    // Checked by compiling: the leanest configuration fits at w, not at
    // w - 1.
    assert!(at(w, &lean(w)).memory.peak_bytes <= cluster.memory_bytes);
    assert!(at(w - 1, &lean(w - 1)).memory.peak_bytes > cluster.memory_bytes);
}

#[test]
fn fixed_flags_fix_their_dimensions() {
    let (program, _) = load("gpt-mini");
    let base = FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy: Strategy::HybridShard,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let fixed = Fixed {
        strategy: Some(Strategy::HybridShard),
        precision: true,
        prefetch_depth: true,
        ..Fixed::default()
    };
    let s = Space::around(&base, &program, 8, &fixed, true).expect("space");
    assert_eq!(
        s.shardings,
        vec![(Strategy::HybridShard, 2), (Strategy::HybridShard, 4)]
    );
    assert_eq!(s.precisions, vec![(DType::F32, DType::F32)]);
    assert_eq!(s.prefetch_depth, vec![1]);
    assert_eq!(s.checkpointing.len(), 3);
    let bad = Fixed {
        shard_factor: Some(3),
        ..Fixed::default()
    };
    let e = Space::around(&base, &program, 8, &bad, false).expect_err("3 does not divide 8");
    assert!(e.to_string().contains("1, 2, 4, 8"), "{e}");
}

#[test]
fn chosen_plan_trains_like_one_rank() {
    // The same global batch: 2 ranks of batch 2, one rank of batch 4.
    let spec = |batch: u32| format!("gpt:layers=2,hidden=32,heads=2,seq=16,vocab=64,batch={batch}");
    let (program, info) = load(&spec(2));
    let cluster = fsdpc_planner::preset("cpu-local", 2, 2).expect("preset");
    let space = small_space(&program, 2, false);
    let base = FsdpConfig::default();
    let r = Search::new(&program, &info, &cluster, &base, &space)
        .run()
        .expect("a plan");
    assert_eq!(r.plan.validate(), Ok(()));
    let record = r.plan.config.auto.as_ref().expect("auto record");
    assert_eq!(record.compiled, r.record.compiled);
    // The record survives the plan's JSON round trip.
    let back = Plan::from_json(&r.plan.to_json_pretty().expect("json")).expect("loads");
    assert_eq!(back.config.auto, r.plan.config.auto);
    // Same wrap, so the parameters come in the same order.
    let reference = common::plan(&spec(4), 1, Strategy::NoShard, r.plan.config.wrap.clone());
    let steps = 3;
    let a = train(&reference, steps, ExecMode::Arena);
    let b = train(&r.plan, steps, ExecMode::Arena);
    let loss = max_loss_rel_diff(&a, &b);
    let (abs, _) = max_param_diff(&a, &b);
    let chosen = r
        .weighed
        .iter()
        .find(|w| w.verdict == Verdict::Chosen)
        .expect("one chosen");
    eprintln!(
        "chosen {}: loss rel {loss:e}, param abs {abs:e}",
        chosen.candidate.short()
    );
    assert!(loss <= 1e-6, "losses differ by {loss:e}");
    assert!(abs <= 2e-5, "parameters differ by {abs:e}");
}

fn fsdpc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_fsdpc"))
        .args(args)
        .output()
        .expect("fsdpc runs")
}

/// Without --verbose, --auto prints the chosen plan, the fastest few that
/// fit and a count per rejection reason, not a line per candidate; the
/// counts cover every candidate. --verbose prints the whole table, --json
/// every candidate.
#[test]
fn cli_auto_summarises_and_keeps_the_full_table_behind_flags() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("auto.json");
    let out_s = out.to_str().expect("utf-8 path");
    let base = [
        "compile",
        "gpt-mini",
        "--world",
        "4",
        "--cluster",
        "cpu-local",
        "--auto",
        "-o",
        out_s,
    ];
    let run = |extra: &[&str]| {
        let mut a = base.to_vec();
        a.extend(extra);
        let o = fsdpc(&a);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let json: serde_json::Value = serde_json::from_str(&run(&["--json"])).expect("--json is JSON");
    let rows = json["candidates"].as_array().expect("candidates");
    let total = json["record"]["candidates"].as_u64().expect("record");
    assert_eq!(rows.len() as u64, total);
    let chosen = json["chosen"].as_u64().expect("a chosen candidate");
    let fit = rows
        .iter()
        .filter(|r| r["verdict"] == "chosen" || r["verdict"] == "slower")
        .count();
    assert_eq!(
        rows.iter().filter(|r| r["verdict"] == "chosen").count(),
        1,
        "{json:#}"
    );
    let text = run(&[]);
    // Header lines, the best few (the chosen first), the counts: a short
    // text however many candidates.
    let best: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("the fastest "))
        .skip(2)
        .take_while(|l| !l.starts_with("set aside:"))
        .collect();
    assert_eq!(best.len(), fit.min(5), "{text}");
    assert!(
        best[0].trim_start().starts_with(&format!("{chosen} ")),
        "{text}"
    );
    assert!(best[0].ends_with("chosen"), "{text}");
    let counted: u64 = text
        .lines()
        .skip_while(|l| !l.starts_with("set aside:"))
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.split_whitespace().next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(counted + 1, total, "{text}");
    assert!(text.contains("chosen: "), "{text}");
    assert!(
        (text.lines().count() as u64) < total,
        "{total} candidates:\n{text}"
    );
    let verbose = run(&["--verbose"]);
    assert!(!verbose.contains("set aside:"), "{verbose}");
    assert!(verbose.lines().count() > text.lines().count(), "{verbose}");
    for r in rows.iter().filter(|r| !r["step_time_s"].is_null()) {
        let idx = r["index"].as_u64().unwrap();
        assert!(
            verbose
                .lines()
                .any(|l| l.trim_start().starts_with(&format!("{idx} "))),
            "compiled candidate {idx} in the table:\n{verbose}"
        );
    }
    // --json with the plan on standard output is one clear error.
    let mut a = base.to_vec();
    a.pop();
    a.extend(["-", "--json"]);
    let o = fsdpc(&a);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("--json") && err.contains("-o -"), "{err}");
    let o = fsdpc(&[
        "compile",
        "gpt-mini",
        "--world",
        "2",
        "--verbose",
        "-o",
        out_s,
    ]);
    assert!(!o.status.success(), "--verbose without --auto");
}

#[test]
fn cli_auto_prints_the_table_and_writes_the_plan() {
    let dir = tempfile::tempdir().expect("tmp");
    let out = dir.path().join("auto.json");
    let out_s = out.to_str().expect("utf-8 path");
    let args = [
        "compile",
        "gpt-mini",
        "--world",
        "2",
        "--cluster",
        "cpu-local",
        "--auto",
        "--prefetch-depth",
        "1",
        "--forward-prefetch",
        "true",
        "--auto-gap",
        "0",
        "-o",
        out_s,
    ];
    let o = fsdpc(&args);
    let stdout = String::from_utf8_lossy(&o.stdout);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    for needle in [
        "auto: gpt-mini on cpu-local, world 2",
        "candidates",
        "compiled",
        "pruned by the memory bound",
        "chosen",
        "step (s)",
        "slower than the chosen by",
        "the fastest of the space",
        "searched  sharding: no_shard@1 full_shard@2 shard_grad_op@2",
        "the flags' only (--auto-precision bf16 also searches bf16)",
    ] {
        assert!(stdout.contains(needle), "`{needle}` in:\n{stdout}");
    }
    assert!(!stdout.contains("searched  prefetch_depth"), "{stdout}");
    let plan =
        Plan::from_json(&std::fs::read_to_string(&out).expect("plan written")).expect("a plan");
    assert!(plan.config.auto.is_some());
    assert_eq!(plan.config.prefetch_depth, 1);
    let o = fsdpc(&["inspect", out_s]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("chosen    by fsdpc compile --auto"),
        "inspect:\n{text}"
    );
    // A fixed strategy; bad flags are one clear error.
    let o = fsdpc(&[
        "compile",
        "gpt-mini",
        "--world",
        "2",
        "--cluster",
        "cpu-local",
        "--auto",
        "--strategy",
        "full_shard",
        "--prefetch-depth",
        "1",
        "-o",
        out_s,
    ]);
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.contains("searched  sharding"), "{text}");
    assert!(
        text.contains("at most 0.5% slower than the fastest of the space (--auto-gap)"),
        "{text}"
    );
    for (extra, needle) in [
        (vec!["--auto-precision", "fp8"], "expected given or bf16"),
        (vec!["--no-fit-check"], "--no-fit-check does not apply"),
        (vec!["--shard-factor", "3"], "must divide the world"),
        (vec!["--auto-gap", "150"], "--auto-gap must be a percentage"),
    ] {
        let mut a = vec![
            "compile",
            "gpt-mini",
            "--world",
            "2",
            "--cluster",
            "cpu-local",
            "--auto",
            "-o",
            out_s,
        ];
        a.extend(extra);
        let o = fsdpc(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success(), "{a:?}");
        assert!(err.contains(needle), "{a:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // Nothing fits: a cpu-local cluster file of one rank per node with a
    // quarter of what the leanest configuration of the space needs at
    // world 6 (the smallest world itself is checked by
    // fits_nowhere_names_the_smallest_world_that_fits).
    let (program, info) = load(FOUR_LAYERS);
    let space = Space::around(
        &FsdpConfig::default(),
        &program,
        2,
        &Fixed::default(),
        false,
    )
    .expect("space");
    let lean = FsdpConfig {
        settings: fsdpc_plan::Settings {
            wrap: space.wraps.last().cloned().expect("a wrap"),
            activation_checkpointing: CheckpointPolicy::Units,
            cpu_offload: true,
            limit_all_gathers: 1,
            backward_prefetch: BackwardPrefetch::None,
            forward_prefetch: false,
            ..fsdpc_plan::Settings::default()
        },
        shard_factor: Some(6),
        check_fits: false,
        ..FsdpConfig::default()
    };
    let six = fsdpc_planner::preset("cpu-local", 6, 1).expect("preset");
    let cap = fsdpc_planner::compile_unchecked(program, info, &six, &lean)
        .expect("compiles")
        .memory
        .peak_bytes;
    let file = dir.path().join("small.json");
    let file_s = file.to_str().expect("utf-8 path");
    let o = fsdpc(&[
        "cluster",
        "cpu-local",
        "--ranks-per-node",
        "1",
        "-o",
        file_s,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).expect("cluster file")).expect("json");
    json["memory_bytes_per_rank"] = serde_json::json!(cap / 4);
    std::fs::write(&file, json.to_string()).expect("write");
    let o = fsdpc(&[
        "compile",
        FOUR_LAYERS,
        "--world",
        "2",
        "--cluster",
        file_s,
        "--auto",
        "-o",
        out_s,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(err.contains("no configuration fits"), "{err}");
    assert!(err.contains("over by"), "{err}");
    assert!(
        err.contains("more ranks: world") || err.contains("no world size makes it fit"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

/// The tensor-parallel degrees: each searched over its data ranks and
/// compared by tokens per second per rank. With the capacity between the
/// leanest plans of T = 1 and T = 2 (each member holds half of the split
/// activations), only T = 2 fits and is chosen, and T = 1 is listed with
/// why; with room for both, the choice is the most tokens per second per
/// rank.
#[test]
fn the_search_chooses_the_tensor_parallel_degree() {
    use fsdpc_planner::auto::{search_mesh, tensor_degrees};
    let spec = "gpt:layers=2,hidden=64,heads=4,seq=256,vocab=64,batch=8";
    let (program, info) = load(spec);
    let mut cluster = fsdpc_planner::preset("cpu-local", 4, 4).expect("preset");
    assert_eq!(tensor_degrees(&cluster, None), [1, 2, 4]);
    assert_eq!(tensor_degrees(&cluster, Some(2)), [2]);
    let lean = |t: u32| {
        let mut c = tensor(t);
        c.activation_checkpointing = CheckpointPolicy::Units;
        c.cpu_offload = true;
        fsdpc_planner::compile_unchecked(program.clone(), info.clone(), &cluster, &c)
            .expect("compiles")
            .memory
            .peak_bytes
    };
    let (one, two) = (lean(1), lean(2));
    assert!(two < one, "T = 2 holds less: {two} against {one}");
    let base = FsdpConfig::default();
    let fixed = Fixed::default();
    let roomy = search_mesh(
        &program,
        &info,
        &cluster,
        &base,
        &fixed,
        false,
        0.0,
        &[1, 2],
    )
    .expect("something fits");
    let best = roomy
        .rows
        .iter()
        .filter_map(|r| {
            r.outcome
                .as_ref()
                .ok()
                .map(|b| (r.degree, b.tokens_per_s_per_rank))
        })
        .fold((0, 0.0), |a, b| if b.1 > a.1 { b } else { a });
    assert_eq!(roomy.degree, best.0, "{:?}", roomy.rows);
    assert_eq!(roomy.result.plan.config.tensor_parallel, roomy.degree);
    // The other degrees search against the first's best: the choice is
    // the one independent searches of every degree give.
    let independent = [1, 2]
        .map(|t| {
            let cfg = tensor(t);
            let space = Space::around(&cfg, &program, 4 / t, &fixed, false).expect("space");
            let r = Search::new(&program, &info, &cluster, &cfg, &space)
                .run()
                .expect("each degree fits");
            let tokens =
                info.tokens_per_rank_step as f64 / (f64::from(t) * r.plan.estimates.step_time_s);
            (t, tokens, r.plan.estimates.step_time_s)
        })
        .into_iter()
        .fold((0, 0.0, 0.0), |a, b| if b.1 > a.1 { b } else { a });
    assert_eq!(roomy.degree, independent.0, "{:?}", roomy.rows);
    assert_eq!(roomy.result.plan.estimates.step_time_s, independent.2);
    // A degree that does not divide the world is its one error, not a
    // search that fits nowhere.
    let bad = search_mesh(&program, &info, &cluster, &base, &fixed, false, 0.0, &[3]);
    assert!(
        matches!(&bad, Err(e) if e.to_string().contains("tensor_parallel") && e.to_string().contains("must divide the world")),
        "{bad:?}"
    );
    // A step no candidate can beat: nothing is compiled, and the search
    // says so.
    let space = Space::around(&tensor(1), &program, 4, &fixed, false).expect("space");
    let outpaced = Search::new(&program, &info, &cluster, &tensor(1), &space)
        .with_incumbent(1e-12)
        .run();
    assert!(
        matches!(outpaced, Err(AutoError::Outpaced { compiled: 0, .. })),
        "{outpaced:?}"
    );
    cluster.memory_bytes = (one + two) / 2;
    let tight = search_mesh(
        &program,
        &info,
        &cluster,
        &base,
        &fixed,
        false,
        0.0,
        &[1, 2],
    )
    .expect("T = 2 fits");
    assert_eq!(tight.degree, 2, "{:?}", tight.rows);
    assert!(tight.result.plan.memory.peak_bytes <= cluster.memory_bytes);
    let why = tight.rows[0]
        .outcome
        .as_ref()
        .expect_err("T = 1 does not fit");
    assert!(why.contains("no configuration fits"), "{why}");
    assert!(tight.result.record.searched[0].starts_with("tensor_parallel: 1 2"));
}
