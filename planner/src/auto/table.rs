//! What `fsdpc compile --auto` prints of the candidates: a summary (the
//! best few that fit, a count per rejection reason) and the full table
//! (`--verbose`), and each candidate as JSON (`--json`).

use super::*;

impl AutoResult {
    /// The candidate table: every compiled candidate on its own line, and
    /// runs of pruned candidates of one class (the schedule-knob variants)
    /// on one line with their count, in enumeration order.
    pub fn table(&self) -> String {
        render(&self.weighed, self.knobs_per_class)
    }

    /// The `best` fastest candidates that fit (the chosen first), then how
    /// many candidates each rejection reason (`Verdict::reason`) set aside,
    /// most first: a few lines however large the space.
    pub fn summary(&self, best: usize) -> String {
        use std::fmt::Write;
        let mut fit: Vec<&Weighed> = self
            .weighed
            .iter()
            .filter(|w| matches!(w.verdict, Verdict::Chosen | Verdict::Slower { .. }))
            .collect();
        fit.sort_by(|a, b| {
            let not_chosen = |w: &Weighed| !matches!(w.verdict, Verdict::Chosen);
            (not_chosen(a), a.step_time_s.unwrap_or(f64::INFINITY))
                .partial_cmp(&(not_chosen(b), b.step_time_s.unwrap_or(f64::INFINITY)))
                .unwrap_or(std::cmp::Ordering::Equal)
                .then(a.candidate.index.cmp(&b.candidate.index))
        });
        let mut out = String::new();
        let _ = writeln!(
            out,
            "the fastest {} of {} that fit (--verbose: every candidate):",
            fit.len().min(best),
            fit.len()
        );
        let _ = writeln!(out, "{}", header());
        for w in fit.iter().take(best) {
            out.push_str(&compiled_row(w));
        }
        let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
        for w in &self.weighed {
            if let Some(r) = w.verdict.reason() {
                *reasons.entry(r).or_default() += 1;
            }
        }
        let mut reasons: Vec<(String, usize)> = reasons.into_iter().collect();
        reasons.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        if !reasons.is_empty() {
            let _ = writeln!(out, "set aside:");
        }
        for (reason, n) in reasons {
            let _ = writeln!(out, "  {n:>8}  {reason}");
        }
        out
    }

    /// Every candidate as JSON, in enumeration order: `index`, `config`
    /// (short form), `verdict` (`chosen`, `slower`, `over_memory`,
    /// `memory_bound`, `time_bound`, `refused`), `detail` (the table's
    /// verdict text), `step_time_s` and `peak_bytes` (the arena's live
    /// peak; null when not compiled), `bound_s`, `bound_bytes`.
    pub fn candidates_json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .weighed
            .iter()
            .map(|w| {
                serde_json::json!({
                    "index": w.candidate.index,
                    "config": w.candidate.short(),
                    "verdict": w.verdict.kind(),
                    "detail": verdict_text(w),
                    "step_time_s": w.step_time_s,
                    "peak_bytes": w.peak_bytes,
                    "bound_s": w.bound_s,
                    "bound_bytes": w.bound_bytes,
                })
            })
            .collect();
        serde_json::Value::Array(rows)
    }
}

impl Verdict {
    /// The verdict's name in `AutoResult::candidates_json`.
    pub fn kind(&self) -> &'static str {
        match self {
            Verdict::Chosen => "chosen",
            Verdict::Slower { .. } => "slower",
            Verdict::OverMemory { .. } => "over_memory",
            Verdict::MemoryBound { .. } => "memory_bound",
            Verdict::TimeBound { .. } => "time_bound",
            Verdict::Refused { .. } => "refused",
        }
    }

    /// Why the search set a candidate aside, one phrase per reason that
    /// `AutoResult::summary` counts (`None`: the chosen one).
    pub fn reason(&self) -> Option<String> {
        Some(match self {
            Verdict::Chosen => return None,
            Verdict::Slower { .. } => "fit, slower than the chosen".into(),
            Verdict::OverMemory { .. } => "compiled, over memory".into(),
            Verdict::MemoryBound { .. } => "bound-pruned: the memory bound is over memory".into(),
            Verdict::TimeBound { .. } => "bound-pruned: the step bound cannot beat the best".into(),
            Verdict::Refused { reason } => format!("refused: {reason}"),
        })
    }
}

fn header() -> String {
    format!(
        "  {:<11} {:<84} {:>10} {:>10}  {:<4} verdict",
        "#", "config", "step (s)", "arena peak", "fits"
    )
}

fn compiled_row(w: &Weighed) -> String {
    let fits = !matches!(w.verdict, Verdict::OverMemory { .. });
    format!(
        "  {:<11} {:<84} {:>10.4} {:>10}  {:<4} {}\n",
        w.candidate.index,
        w.candidate.short(),
        w.step_time_s.unwrap_or(0.0),
        human_bytes(w.peak_bytes.unwrap_or(0)),
        if fits { "yes" } else { "no" },
        verdict_text(w)
    )
}

fn verdict_text(w: &Weighed) -> String {
    match &w.verdict {
        Verdict::Chosen => "chosen".into(),
        Verdict::Slower { by } => format!("slower than the chosen by {:.1}%", by * 100.0),
        Verdict::OverMemory { by_bytes } => format!("over memory by {}", human_bytes(*by_bytes)),
        Verdict::MemoryBound { by_bytes } => format!(
            "bound-pruned: memory >= {} (over by {})",
            human_bytes(w.bound_bytes),
            human_bytes(*by_bytes)
        ),
        Verdict::TimeBound { bound_s, best_s } if bound_s < best_s => format!(
            "bound-pruned: step >= {bound_s:.4} s, within the gap of the best {best_s:.4} s"
        ),
        Verdict::TimeBound { bound_s, best_s } => {
            format!("bound-pruned: step >= {bound_s:.4} s, best {best_s:.4} s")
        }
        Verdict::Refused { reason } => format!("refused: {reason}"),
    }
}

fn render(weighed: &[Weighed], knobs_per_class: usize) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(out, "{}", header());
    let per = knobs_per_class.max(1);
    let mut i = 0;
    while i < weighed.len() {
        let w = &weighed[i];
        if w.compiled() {
            out.push_str(&compiled_row(w));
            i += 1;
            continue;
        }
        // A run of pruned (or refused) candidates of one class and kind.
        let class = w.candidate.index / per;
        let kind = std::mem::discriminant(&w.verdict);
        let mut j = i + 1;
        while j < weighed.len()
            && !weighed[j].compiled()
            && weighed[j].candidate.index / per == class
            && std::mem::discriminant(&weighed[j].verdict) == kind
        {
            j += 1;
        }
        let last = &weighed[j - 1];
        let (idx, cfg) = if j - i == 1 {
            (w.candidate.index.to_string(), w.candidate.short())
        } else {
            let s = w.candidate.short();
            let head = s.split(" bwd=").next().unwrap_or(&s).to_string();
            (
                format!("{}-{}", w.candidate.index, last.candidate.index),
                format!("{head} ({} schedule variants)", j - i),
            )
        };
        let _ = writeln!(
            out,
            "  {:<11} {:<84} {:>10} {:>10}  {:<4} {}",
            idx,
            cfg,
            "-",
            "-",
            "-",
            verdict_text(w)
        );
        i = j;
    }
    out
}
