//! The candidate table `fsdpc compile --auto` prints.

use super::*;

impl AutoResult {
    /// The candidate table: every compiled candidate on its own line, and
    /// runs of pruned candidates of one class (the schedule-knob variants)
    /// on one line with their count, in enumeration order.
    pub fn table(&self) -> String {
        render(&self.weighed, self.knobs_per_class)
    }
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
    let _ = writeln!(
        out,
        "  {:<11} {:<84} {:>10} {:>10}  {:<4} verdict",
        "#", "config", "step (s)", "peak", "fits"
    );
    let per = knobs_per_class.max(1);
    let mut i = 0;
    while i < weighed.len() {
        let w = &weighed[i];
        if w.compiled() {
            let peak = w.peak_bytes.unwrap_or(0);
            let fits = !matches!(w.verdict, Verdict::OverMemory { .. });
            let _ = writeln!(
                out,
                "  {:<11} {:<84} {:>10.4} {:>10}  {:<4} {}",
                w.candidate.index,
                w.candidate.short(),
                w.step_time_s.unwrap_or(0.0),
                human_bytes(peak),
                if fits { "yes" } else { "no" },
                verdict_text(w)
            );
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
