//! Predicted against measured: reads a trace of the simulated step
//! (`trace::chrome_trace`) and one of a run (`trace::measured_trace`) and
//! gives the time of each instruction class (`trace::CLASSES`) and of the
//! whole step in both, with the prediction's error.
//!
//! Conventions: a class's time is the sum of its instructions' durations
//! on one rank in one step, every stream together (overlapped time counts
//! on each stream); measured figures are the mean over every traced
//! (rank, step). The step time is the span from a step's first
//! instruction to its last: predicted, of the one simulated step; measured,
//! the slowest rank's per step, averaged over the traced steps. The error
//! is (predicted - measured) / measured, in percent; `None` when nothing
//! was measured.

use crate::trace::{CLASSES, MEASURED, PREDICTED};
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// Why two traces cannot be compared.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CompareError {
    /// The file is not a trace fsdpc wrote.
    #[error("the {which} trace is not an fsdpc trace: {reason}")]
    NotATrace { which: &'static str, reason: String },
    /// The trace is of the other kind (the arguments swapped, or twice the
    /// same kind).
    #[error("the {which} trace is a {found} trace; give `fsdpc trace`'s output first and `fsdpc train --trace`'s second")]
    WrongKind { which: &'static str, found: String },
    /// The traces come from different plans.
    #[error("the traces come from different plans: {field} is {predicted} in the predicted trace and {measured} in the measured one")]
    Mismatch {
        field: String,
        predicted: String,
        measured: String,
    },
    /// A trace without a single instruction.
    #[error("the {which} trace has no instructions")]
    Empty { which: &'static str },
}

/// One row of the comparison.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// An instruction class, or `step`.
    pub class: String,
    pub predicted_s: f64,
    pub measured_s: f64,
    /// (predicted - measured) / measured, in percent.
    pub error_pct: Option<f64>,
}

/// Predicted against measured, by class and for the step.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    /// One row per class of `trace::CLASSES`, in that order.
    pub classes: Vec<Row>,
    /// The whole step.
    pub step: Row,
    /// Ranks in the measured trace.
    pub ranks: usize,
    /// Steps in the measured trace.
    pub steps: usize,
}

/// Per (rank, step): the time of each class and the step's span.
#[derive(Default)]
struct Group {
    class: BTreeMap<String, f64>,
    first: f64,
    last: f64,
    seen: bool,
}

/// Compares a predicted trace with a measured one (see the module header).
pub fn compare(predicted: &Value, measured: &Value) -> Result<Comparison, CompareError> {
    let p_plan = header(predicted, "predicted", PREDICTED)?;
    let m_plan = header(measured, "measured", MEASURED)?;
    same_plan(p_plan, m_plan)?;
    let p = groups(predicted, "predicted")?;
    let m = groups(measured, "measured")?;
    let mean = |g: &BTreeMap<(u64, u64), Group>, c: &str| {
        g.values()
            .map(|g| g.class.get(c).copied().unwrap_or(0.0))
            .sum::<f64>()
            / g.len() as f64
    };
    let classes = CLASSES
        .iter()
        .map(|c| row(c, mean(&p, c), mean(&m, c)))
        .collect();
    let step_p = p.values().map(|g| g.last - g.first).fold(0.0, f64::max);
    let mut per_step: BTreeMap<u64, f64> = BTreeMap::new();
    for (&(_, step), g) in &m {
        let t = per_step.entry(step).or_insert(0.0);
        *t = t.max(g.last - g.first);
    }
    let step_m = per_step.values().sum::<f64>() / per_step.len() as f64;
    let mut ranks: Vec<u64> = m.keys().map(|k| k.0).collect();
    ranks.dedup();
    Ok(Comparison {
        classes,
        step: row("step", step_p, step_m),
        ranks: ranks.len(),
        steps: per_step.len(),
    })
}

fn row(class: &str, predicted_s: f64, measured_s: f64) -> Row {
    Row {
        class: class.to_string(),
        predicted_s,
        measured_s,
        error_pct: (measured_s > 0.0).then(|| (predicted_s - measured_s) / measured_s * 100.0),
    }
}

/// The trace's plan identity, after checking it is an fsdpc trace of `kind`.
fn header<'v>(t: &'v Value, which: &'static str, kind: &str) -> Result<&'v Value, CompareError> {
    let not = |reason: &str| CompareError::NotATrace {
        which,
        reason: reason.to_string(),
    };
    if !t.get("traceEvents").is_some_and(Value::is_array) {
        return Err(not("no traceEvents array"));
    }
    let other = t
        .get("otherData")
        .ok_or_else(|| not("no otherData naming the plan (a trace from another tool?)"))?;
    let found = other
        .get("fsdpc_trace")
        .and_then(Value::as_str)
        .ok_or_else(|| not("otherData.fsdpc_trace is missing"))?;
    if found != kind {
        return Err(CompareError::WrongKind {
            which,
            found: found.to_string(),
        });
    }
    other
        .get("plan")
        .filter(|p| p.is_object())
        .ok_or_else(|| not("otherData.plan is missing"))
}

/// Refuses traces whose plan identities differ, naming the first field.
fn same_plan(p: &Value, m: &Value) -> Result<(), CompareError> {
    let (Some(po), Some(mo)) = (p.as_object(), m.as_object()) else {
        return Ok(());
    };
    for (field, pv) in po {
        let mv = mo.get(field).unwrap_or(&Value::Null);
        if pv != mv {
            return Err(CompareError::Mismatch {
                field: field.clone(),
                predicted: pv.to_string(),
                measured: mv.to_string(),
            });
        }
    }
    Ok(())
}

/// The complete events of a trace grouped by (rank, step), in seconds.
fn groups(t: &Value, which: &'static str) -> Result<BTreeMap<(u64, u64), Group>, CompareError> {
    let bad = |reason: String| CompareError::NotATrace { which, reason };
    let events = t
        .get("traceEvents")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("no traceEvents array".into()))?;
    let mut out: BTreeMap<(u64, u64), Group> = BTreeMap::new();
    for (k, e) in events.iter().enumerate() {
        if e.get("ph").and_then(Value::as_str) != Some("X") {
            continue;
        }
        let num = |f: &str| e.get(f).and_then(Value::as_f64);
        let (Some(ts), Some(dur)) = (num("ts"), num("dur")) else {
            return Err(bad(format!("event {k} has no numeric ts and dur")));
        };
        if !(ts.is_finite() && dur.is_finite() && dur >= 0.0) {
            return Err(bad(format!("event {k} has ts {ts} and dur {dur}")));
        }
        let args = e.get("args");
        let class = args
            .and_then(|a| a.get("class"))
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("event {k} has no args.class")))?;
        let pid = e.get("pid").and_then(Value::as_u64).unwrap_or(0);
        let step = args
            .and_then(|a| a.get("step"))
            .and_then(Value::as_u64)
            .unwrap_or(0);
        let (start, end) = (ts * 1e-6, (ts + dur) * 1e-6);
        let g = out.entry((pid, step)).or_default();
        *g.class.entry(class.to_string()).or_insert(0.0) += dur * 1e-6;
        if g.seen {
            g.first = g.first.min(start);
            g.last = g.last.max(end);
        } else {
            (g.first, g.last, g.seen) = (start, end, true);
        }
    }
    if out.is_empty() {
        return Err(CompareError::Empty { which });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn trace(kind: &str, world: u32, events: Value) -> Value {
        json!({
            "traceEvents": events,
            "otherData": { "fsdpc_trace": kind, "plan": { "model": "m", "world": world } },
        })
    }

    fn x(pid: u64, step: u64, ts: f64, dur: f64, class: &str) -> Value {
        json!({ "ph": "X", "pid": pid, "ts": ts, "dur": dur,
                "args": { "class": class, "step": step } })
    }

    #[test]
    fn classes_and_step_are_averaged_over_ranks_and_steps() {
        let p = trace(PREDICTED, 2, json!([x(0, 0, 0.0, 100.0, "matmul")]));
        let m = trace(
            MEASURED,
            2,
            json!([
                x(0, 0, 0.0, 200.0, "matmul"),
                x(1, 0, 0.0, 100.0, "matmul"),
                x(1, 0, 100.0, 300.0, "wait"),
            ]),
        );
        let c = compare(&p, &m).unwrap();
        let mm = &c.classes[0];
        assert_eq!(mm.class, "matmul");
        assert!((mm.measured_s - 150e-6).abs() < 1e-12);
        assert!((mm.error_pct.unwrap() + 100.0 / 3.0).abs() < 1e-9);
        // The slowest rank's span: 400 us.
        assert!((c.step.measured_s - 400e-6).abs() < 1e-12);
        assert_eq!((c.ranks, c.steps), (2, 1));
        assert_eq!(c.classes.len(), CLASSES.len());
    }

    #[test]
    fn refuses_swapped_foreign_and_mismatched_traces() {
        let p = trace(PREDICTED, 2, json!([x(0, 0, 0.0, 1.0, "kernel")]));
        let m = trace(MEASURED, 4, json!([x(0, 0, 0.0, 1.0, "kernel")]));
        assert!(matches!(
            compare(&m, &p),
            Err(CompareError::WrongKind {
                which: "predicted",
                ..
            })
        ));
        assert!(matches!(
            compare(&p, &json!({"traceEvents": []})),
            Err(CompareError::NotATrace {
                which: "measured",
                ..
            })
        ));
        assert!(matches!(
            compare(&p, &json!([1, 2])),
            Err(CompareError::NotATrace { .. })
        ));
        assert_eq!(
            compare(&p, &m),
            Err(CompareError::Mismatch {
                field: "world".into(),
                predicted: "2".into(),
                measured: "4".into()
            })
        );
        let empty = trace(MEASURED, 2, json!([]));
        assert_eq!(
            compare(&p, &empty),
            Err(CompareError::Empty { which: "measured" })
        );
    }
}
