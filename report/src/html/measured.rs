//! The measured run the report draws beside the prediction: one rank's
//! last traced step read from a `fsdpc train --trace` file
//! (`trace::measured_trace`'s format).
//!
//! Conventions: the rank drawn is the lowest rank in the trace and the step
//! its last traced one; times are seconds from that step's first
//! instruction; the memory counter is the rank's live heap bytes (the
//! runtime's counting allocator) at the end of each instruction of that
//! step. The comparison by class (`compare::compare`) covers every rank
//! and step; this is only what is drawn.

use super::ReportError;
use fsdpc_plan::Plan;
use serde_json::Value;

/// One measured instruction.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Span {
    /// Index in the plan's instruction list.
    pub instr: usize,
    pub start_s: f64,
    pub end_s: f64,
}

/// One rank's step of a measured trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    pub rank: u64,
    pub step: u64,
    /// In start order.
    pub spans: Vec<Span>,
    /// `(time_s, live heap bytes)`, in time order.
    pub memory: Vec<(f64, u64)>,
    /// From the first span's start to the last span's end.
    pub step_time_s: f64,
}

/// Reads the drawn rank and step of `trace`, a trace of `plan`: a span
/// naming an instruction the plan does not have is an error.
pub fn read(plan: &Plan, trace: &Value) -> Result<Run, ReportError> {
    let bad = |reason: String| ReportError::Measured { reason };
    let events = trace
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no traceEvents array".into()))?;
    let num = |e: &Value, f: &str| e.get(f).and_then(Value::as_f64);
    let step_of = |e: &Value| e.pointer("/args/step").and_then(Value::as_u64);
    let complete = || {
        events
            .iter()
            .filter(|e| e.get("ph").and_then(Value::as_str) == Some("X"))
    };
    let rank = complete()
        .filter_map(|e| e.get("pid").and_then(Value::as_u64))
        .min()
        .ok_or_else(|| bad("no instructions".into()))?;
    let on_rank = |e: &&Value| e.get("pid").and_then(Value::as_u64) == Some(rank);
    let step = complete()
        .filter(on_rank)
        .filter_map(step_of)
        .max()
        .unwrap_or(0);
    let mut spans = Vec::new();
    for (k, e) in complete().enumerate() {
        if !on_rank(&e) || step_of(e).unwrap_or(0) != step {
            continue;
        }
        let (Some(ts), Some(dur)) = (num(e, "ts"), num(e, "dur")) else {
            return Err(bad(format!("event {k} has no numeric ts and dur")));
        };
        let instr = e
            .pointer("/args/instr")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad(format!("event {k} has no args.instr")))?;
        if instr as usize >= plan.instructions.len() || !(ts.is_finite() && dur.is_finite()) {
            return Err(bad(format!(
                "event {k}: instruction {instr} at {ts} µs for {dur} µs (the plan has {} instructions)",
                plan.instructions.len()
            )));
        }
        spans.push(Span {
            instr: instr as usize,
            start_s: ts * 1e-6,
            end_s: (ts + dur.max(0.0)) * 1e-6,
        });
    }
    spans.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    let first = spans.first().map_or(0.0, |s| s.start_s);
    let last = spans.iter().map(|s| s.end_s).fold(first, f64::max);
    let mut memory: Vec<(f64, u64)> = events
        .iter()
        .filter(|e| e.get("ph").and_then(Value::as_str) == Some("C") && on_rank(e))
        .filter_map(|e| Some((num(e, "ts")? * 1e-6, e.pointer("/args/bytes")?.as_f64()?)))
        .filter(|&(t, b)| t >= first && t <= last && b.is_finite() && b >= 0.0)
        .map(|(t, b)| (t - first, b as u64))
        .collect();
    memory.sort_by(|a, b| a.0.total_cmp(&b.0));
    for s in &mut spans {
        s.start_s -= first;
        s.end_s -= first;
    }
    Ok(Run {
        rank,
        step,
        spans,
        memory,
        step_time_s: last - first,
    })
}
