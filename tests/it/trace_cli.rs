//! `fsdpc train --trace`, `--metrics`' step_time_s and `fsdpc compare`:
//! the measured trace has every instruction of the plan on every rank and
//! stream and a live-memory counter; compare reports every class and the
//! step; bad input is a clear error. No timed assertions.

use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::common::cli::{check_error, dir, ok, s};

use fsdpc_report::trace::CLASSES;

fn read_json(p: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(p).expect("file written")).expect("JSON")
}

/// Per rank: the complete events' count, the streams (tids) they are on
/// and the steps they belong to; and the ranks with a memory counter.
#[derive(Default)]
struct Seen {
    events: BTreeMap<u64, usize>,
    streams: BTreeMap<u64, BTreeSet<u64>>,
    steps: BTreeSet<u64>,
    counters: BTreeSet<u64>,
}

fn seen(trace: &Value) -> Seen {
    let mut out = Seen::default();
    for e in trace["traceEvents"].as_array().expect("traceEvents") {
        let pid = e["pid"].as_u64().expect("pid");
        match e["ph"].as_str() {
            Some("X") => {
                *out.events.entry(pid).or_default() += 1;
                out.streams
                    .entry(pid)
                    .or_default()
                    .insert(e["tid"].as_u64().expect("tid"));
                out.steps.insert(e["args"]["step"].as_u64().expect("step"));
                for f in ["instr", "bytes", "class", "stream"] {
                    assert!(!e["args"][f].is_null(), "event without {f}: {e}");
                }
            }
            Some("C") => {
                assert!(e["args"]["bytes"].as_i64().expect("counter bytes") > 0);
                out.counters.insert(pid);
            }
            _ => {}
        }
    }
    out
}

/// The streams (indices) the plan's instructions use and their count.
fn plan_streams(plan: &Value) -> (BTreeSet<u64>, usize) {
    let index: BTreeMap<String, u64> = plan["streams"]
        .as_array()
        .expect("streams")
        .iter()
        .enumerate()
        .map(|(i, s)| (s.as_str().expect("stream").to_string(), i as u64))
        .collect();
    let instrs = plan["instructions"].as_array().expect("instructions");
    let used = instrs
        .iter()
        .map(|i| index[i["stream"].as_str().expect("stream")])
        .collect();
    (used, instrs.len())
}

#[test]
fn train_trace_has_every_instruction_of_every_rank_and_compare_reads_it() {
    let d = dir("gpt-mini");
    let (plan, measured, predicted, metrics) = (
        d.join("plan.json"),
        d.join("measured.json"),
        d.join("predicted.json"),
        d.join("m.jsonl"),
    );
    ok(&["compile", "gpt-mini", "--world", "2", "-o", s(&plan)]);
    ok(&[
        "train",
        s(&plan),
        "--steps",
        "3",
        "--trace",
        s(&measured),
        "--metrics",
        s(&metrics),
    ]);
    let (streams, n) = plan_streams(&read_json(&plan));
    let t = seen(&read_json(&measured));
    // Every instruction of the last step, on both ranks, on its stream.
    for rank in [0, 1] {
        assert_eq!(t.events.get(&rank), Some(&n), "rank {rank}");
        assert_eq!(t.streams.get(&rank), Some(&streams), "rank {rank}");
    }
    assert_eq!(t.steps, BTreeSet::from([2]));
    assert_eq!(t.counters, BTreeSet::from([0, 1]));
    // Every metrics line has the step's measured time.
    let lines = std::fs::read_to_string(&metrics).expect("metrics");
    assert_eq!(lines.lines().count(), 3);
    for l in lines.lines() {
        let v: Value = serde_json::from_str(l).expect("JSON line");
        assert!(v["step_time_s"].as_f64().expect("step_time_s") > 0.0, "{l}");
        // The trace buffers are not the rank's memory: the measured peak
        // stays within the plan's, as `tests/it/memory.rs` requires untraced.
        let measured = v["measured_peak_bytes"].as_f64().expect("measured peak");
        let planned = v["planned_peak_bytes"].as_f64().expect("planned peak");
        assert!(measured <= planned * 1.02, "{l}");
    }

    ok(&["trace", s(&plan), "-o", s(&predicted)]);
    let text = ok(&["compare", s(&predicted), s(&measured)]);
    for class in CLASSES.iter().chain(&["step"]) {
        assert!(
            text.lines().any(|l| l.starts_with(class)),
            "no `{class}` line in:\n{text}"
        );
    }
    let json: Value =
        serde_json::from_str(&ok(&["compare", s(&predicted), s(&measured), "--json"]))
            .expect("compare --json");
    assert_eq!(
        json["classes"].as_array().map(Vec::len),
        Some(CLASSES.len())
    );
    assert!(json["step"]["measured_s"].as_f64().expect("measured") > 0.0);
    assert!(json["step"]["predicted_s"].as_f64().expect("predicted") > 0.0);
    assert_eq!(json["ranks"], 2);

    // Bad input: not JSON, not a trace, swapped, another plan's trace.
    let junk = d.join("junk.json");
    std::fs::write(&junk, "not json").expect("write");
    check_error(&["compare", s(&junk), s(&measured)], "is not a trace");
    check_error(&["compare", s(&plan), s(&measured)], "not an fsdpc trace");
    check_error(
        &["compare", s(&measured), s(&predicted)],
        "is a measured trace",
    );
    let (plan1, pred1) = (d.join("plan1.json"), d.join("pred1.json"));
    ok(&["compile", "gpt-mini", "--world", "1", "-o", s(&plan1)]);
    ok(&["trace", s(&plan1), "-o", s(&pred1)]);
    check_error(&["compare", s(&pred1), s(&measured)], "different plans");
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn trace_steps_and_debug_mode() {
    let d = dir("steps");
    let (plan, measured) = (d.join("plan.json"), d.join("measured.json"));
    let tiny = "gpt:layers=2,hidden=16,heads=2,seq=4,vocab=32,batch=2";
    ok(&["compile", tiny, "--world", "2", "-o", s(&plan)]);
    let (_, n) = plan_streams(&read_json(&plan));
    let args = ["train", s(&plan), "--steps", "4", "--trace", s(&measured)];
    ok(&[&args[..], &["--trace-steps", "2"]].concat());
    let t = seen(&read_json(&measured));
    assert_eq!(t.events.get(&1), Some(&(2 * n)));
    assert_eq!(t.steps, BTreeSet::from([2, 3]));
    // Debug mode records every instruction too, serially.
    ok(&[&args[..], &["--debug-alloc"]].concat());
    let t = seen(&read_json(&measured));
    assert_eq!(t.events.get(&0), Some(&n));
    check_error(
        &[&args[..], &["--trace-steps", "0"]].concat(),
        "--trace-steps must be at least 1",
    );
    check_error(
        &["train", s(&plan), "--steps", "1", "--trace-steps", "2"],
        "--trace",
    );
    let _ = std::fs::remove_dir_all(&d);
}
