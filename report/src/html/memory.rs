//! The memory section: device bytes live over the simulated step, stacked
//! by buffer kind, with the rank's capacity, the peak marked and, with a
//! measured trace, the measured rank's live heap over it; then the
//! breakdown at the peak.
//!
//! Conventions: the curve is `simulate::memory_curve`'s (live bytes at
//! each instruction, by the memory plan's definition, placed at the
//! instruction's simulated start) restricted to the device arena, as
//! `MemorySummary::peak_bytes` is, so its maximum is the planned peak;
//! points are in time order (instruction order where times tie) and drawn
//! as a step function. With more points than twice the plot's width in
//! pixels, each pixel column keeps its lowest and highest point (in time
//! order): the envelope, the peak included, survives.

use super::svg::{byte_axis, esc, secs, time_axis, Scale};
use fsdpc_plan::memory::live_bytes;
use fsdpc_plan::readable::human_bytes;
use fsdpc_plan::{Buffer, BufferKind, Location, Plan};
use fsdpc_planner::simulate::Timeline;
use std::collections::BTreeMap;
use std::fmt::Write;

/// The curve: per point its time and the live bytes of each kind.
#[derive(Clone, Debug, PartialEq)]
pub struct Curve {
    /// Kinds with any live bytes, bottom of the stack first.
    pub kinds: Vec<BufferKind>,
    /// `(time_s, bytes per kind in `kinds` order)`, in time order.
    pub points: Vec<(f64, Vec<u64>)>,
}

impl Curve {
    /// Total bytes of point `j`.
    pub fn total(&self, j: usize) -> u64 {
        self.points.get(j).map_or(0, |p| p.1.iter().sum())
    }

    /// The largest total.
    pub fn max(&self) -> u64 {
        (0..self.points.len())
            .map(|j| self.total(j))
            .max()
            .unwrap_or(0)
    }
}

/// Stack order: what lives the whole step at the bottom.
fn stack_rank(k: BufferKind) -> (bool, BufferKind) {
    (!k.is_persistent(), k)
}

/// The device curve of `plan` on timeline `tl`; with more than
/// `2 * columns` points, downsampled to `columns` equal columns of `x`'s
/// range (the lowest and highest point of each).
pub fn curve(plan: &Plan, tl: &Timeline, x: &Scale, columns: usize) -> Curve {
    let n = plan.instructions.len();
    let mut by_kind: BTreeMap<(bool, BufferKind), Vec<Buffer>> = BTreeMap::new();
    for b in plan
        .buffers
        .iter()
        .filter(|b| b.location == Location::Device)
    {
        by_kind
            .entry(stack_rank(b.kind))
            .or_default()
            .push(b.clone());
    }
    let mut kinds = Vec::new();
    let mut live: Vec<Vec<u64>> = Vec::new();
    for ((_, kind), bufs) in by_kind {
        let l = live_bytes(&bufs, n);
        if l.iter().any(|&b| b > 0) {
            kinds.push(kind);
            live.push(l);
        }
    }
    let mut order: Vec<usize> = (0..n.min(tl.start.len())).collect();
    order.sort_by(|&a, &b| tl.start[a].total_cmp(&tl.start[b]).then(a.cmp(&b)));
    let total = |i: usize| -> u64 { live.iter().map(|l| l[i]).sum() };
    let columns = columns.max(1);
    let width = (x.r1 - x.r0).abs().max(1.0);
    let column = |i: usize| ((x.px(tl.start[i]) - x.r0) / width * columns as f64).floor();
    let keep = if order.len() > 2 * columns {
        envelope(&order, column, total)
    } else {
        order
    };
    let points = keep
        .into_iter()
        .map(|i| (tl.start[i], live.iter().map(|l| l[i]).collect()))
        .collect();
    Curve { kinds, points }
}

/// Per column of `order` (in time order; `column` numbers them), its
/// lowest and highest point, in time order.
fn envelope(
    order: &[usize],
    column: impl Fn(usize) -> f64,
    total: impl Fn(usize) -> u64,
) -> Vec<usize> {
    let mut out = Vec::new();
    let mut k = 0;
    while k < order.len() {
        let col = column(order[k]);
        let (mut lo, mut hi) = (k, k);
        let mut j = k;
        while j < order.len() && column(order[j]) == col {
            if total(order[j]) < total(order[lo]) {
                lo = j;
            }
            if total(order[j]) > total(order[hi]) {
                hi = j;
            }
            j += 1;
        }
        out.push(order[lo.min(hi)]);
        if lo != hi {
            out.push(order[lo.max(hi)]);
        }
        k = j;
    }
    out
}

/// A step path through `(time, bytes)` points, held to `end_s`.
pub fn step_path(points: &[(f64, u64)], x: &Scale, y: &Scale, end_s: f64) -> String {
    let mut d = String::new();
    for (j, &(t, b)) in points.iter().enumerate() {
        let (px, py) = (x.px(t), y.px(b as f64));
        if j == 0 {
            let _ = write!(d, "M{px:.1} {py:.1}");
        } else {
            let _ = write!(d, "H{px:.1}V{py:.1}");
        }
    }
    if !points.is_empty() {
        let _ = write!(d, "H{:.1}", x.px(end_s));
    }
    d
}

/// The breakdown's color of a kind (a CSS class).
pub fn kind_css(k: BufferKind) -> String {
    format!("m-{}", kind_name(k).replace('_', "-"))
}

/// The kind's name as the plan spells it.
pub fn kind_name(k: BufferKind) -> String {
    serde_json::to_value(k)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{k:?}"))
}

/// What the memory chart draws besides the plan: the rank's capacity and a
/// measured heap counter.
pub struct Extra<'a> {
    pub capacity: u64,
    /// `(rank, points)` of the measured run.
    pub measured: Option<(u64, &'a [(f64, u64)])>,
}

const TOP: f64 = 20.0;
const PLOT_H: f64 = 300.0;

/// The section: the stacked chart and the breakdown at the peak.
pub fn section(out: &mut String, plan: &Plan, c: &Curve, x: &Scale, domain_s: f64, extra: &Extra) {
    let peak = plan.memory.peak_bytes;
    let measured_max = extra
        .measured
        .map_or(0, |(_, m)| m.iter().map(|p| p.1).max().unwrap_or(0));
    let data_max = c.max().max(peak).max(measured_max) as f64;
    // The capacity is drawn when it is within 1.5 times the data; above
    // that the curve would be a flat line at the bottom.
    let cap_shown = extra.capacity > 0 && (extra.capacity as f64) <= 1.5 * data_max.max(1.0);
    let top_bytes = if cap_shown {
        data_max.max(extra.capacity as f64)
    } else {
        data_max
    } * 1.08;
    let y = Scale::new(0.0, top_bytes.max(1.0), TOP + PLOT_H, TOP);
    let cap_note = if cap_shown {
        String::new()
    } else {
        format!(
            " The rank's capacity, {}, is above the chart.",
            human_bytes(extra.capacity)
        )
    };
    let _ = write!(
        out,
        r#"<section id="memory"><h2>Memory per rank over the step</h2><p class="note">Device bytes live at each instruction (the memory plan's definition) at its simulated start, stacked by buffer kind; black line: the total; dashed red: the rank's capacity.{}</p>"#,
        esc(&cap_note)
    );
    memory_legend(out, &c.kinds, extra.measured.map(|m| m.0));
    let height = TOP + PLOT_H + 50.0;
    let _ = write!(
        out,
        r#"<svg id="memory-chart" width="1240" height="{height:.0}" viewBox="0 0 1240 {height:.0}" xmlns="http://www.w3.org/2000/svg"><title>Memory per rank over the step</title>"#
    );
    byte_axis(out, &y, x.r0, x.r1, top_bytes, "live bytes per rank");
    stacked_areas(out, c, x, &y, domain_s);
    let totals: Vec<(f64, u64)> = (0..c.points.len())
        .map(|j| (c.points[j].0, c.total(j)))
        .collect();
    let _ = write!(
        out,
        r#"<path id="memory-curve" class="curve" data-max-bytes="{}" d="{}"/>"#,
        c.max(),
        step_path(&totals, x, &y, domain_s)
    );
    if let Some((rank, m)) = extra.measured {
        let _ = write!(
            out,
            r#"<path id="measured-memory" class="measured-curve" d="{}"><title>measured live heap of rank {rank}</title></path>"#,
            step_path(m, x, &y, domain_s)
        );
    }
    if cap_shown {
        let py = y.px(extra.capacity as f64);
        let _ = write!(
            out,
            r#"<line class="capacity" x1="{:.1}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}"/><text class="cl" x="{:.1}" y="{:.1}" text-anchor="end">capacity {}</text>"#,
            x.r0,
            x.r1,
            x.r1 - 4.0,
            py - 5.0,
            human_bytes(extra.capacity)
        );
    }
    peak_marker(out, plan, c, x, &y);
    time_axis(
        out,
        x,
        TOP + PLOT_H,
        domain_s,
        "simulated time from the step's start",
    );
    out.push_str("</svg>");
    breakdown(out, plan);
    out.push_str("</section>");
}

fn memory_legend(out: &mut String, kinds: &[BufferKind], measured_rank: Option<u64>) {
    out.push_str(r#"<div class="legend">"#);
    for k in kinds {
        let _ = write!(
            out,
            r#"<span><i class="sw {}"></i>{}</span>"#,
            kind_css(*k),
            kind_name(*k)
        );
    }
    out.push_str(r#"<span><i class="sw line-total"></i>total</span><span><i class="sw line-cap"></i>capacity</span>"#);
    if let Some(r) = measured_rank {
        let _ = write!(
            out,
            r#"<span><i class="sw line-measured"></i>measured live heap, rank {r}</span>"#
        );
    }
    out.push_str("</div>");
}

fn stacked_areas(out: &mut String, c: &Curve, x: &Scale, y: &Scale, end_s: f64) {
    let mut below: Vec<u64> = vec![0; c.points.len()];
    for (k, kind) in c.kinds.iter().enumerate() {
        let above: Vec<u64> = c
            .points
            .iter()
            .zip(&below)
            .map(|(p, b)| b + p.1.get(k).copied().unwrap_or(0))
            .collect();
        let upper: Vec<(f64, u64)> = c
            .points
            .iter()
            .map(|p| p.0)
            .zip(above.iter().copied())
            .collect();
        let mut d = step_path(&upper, x, y, end_s);
        // Back along the lower edge, right to left.
        let _ = write!(d, "V{:.1}", y.px(below.last().copied().unwrap_or(0) as f64));
        for j in (0..c.points.len()).rev() {
            let _ = write!(d, "H{:.1}", x.px(c.points[j].0));
            if j > 0 {
                let _ = write!(d, "V{:.1}", y.px(below[j - 1] as f64));
            }
        }
        d.push('Z');
        let _ = write!(
            out,
            r#"<path class="area {}" d="{d}"><title>{}</title></path>"#,
            kind_css(*kind),
            kind_name(*kind)
        );
        below = above;
    }
}

fn peak_marker(out: &mut String, plan: &Plan, c: &Curve, x: &Scale, y: &Scale) {
    let Some(j) = (0..c.points.len()).max_by_key(|&j| (c.total(j), std::cmp::Reverse(j))) else {
        return;
    };
    let (px, py) = (x.px(c.points[j].0), y.px(c.total(j) as f64));
    let anchor = if px > (x.r0 + x.r1) / 2.0 {
        "end"
    } else {
        "start"
    };
    let dx = if anchor == "end" { -8.0 } else { 8.0 };
    let _ = write!(
        out,
        r#"<circle class="peak" cx="{px:.1}" cy="{py:.1}" r="4"/><text class="pl" x="{:.1}" y="{:.1}" text-anchor="{anchor}">peak {} at {} (instruction {})</text>"#,
        px + dx,
        (py - 8.0).max(12.0),
        human_bytes(plan.memory.peak_bytes),
        secs(c.points[j].0),
        plan.memory.peak_at
    );
}

/// The breakdown at the peak: one stacked bar and its table.
fn breakdown(out: &mut String, plan: &Plan) {
    let total: u64 = plan.memory.breakdown.iter().map(|(_, b)| b).sum();
    let _ = write!(
        out,
        r#"<h3>At the peak (instruction {}): {}</h3><svg id="breakdown-bar" width="1240" height="34" viewBox="0 0 1240 34" xmlns="http://www.w3.org/2000/svg">"#,
        plan.memory.peak_at,
        human_bytes(total)
    );
    let x = Scale::new(0.0, total.max(1) as f64, 160.0, 1220.0);
    let mut at = 0u64;
    for (kind, bytes) in &plan.memory.breakdown {
        let _ = write!(
            out,
            r#"<rect class="{}" x="{:.1}" y="4" width="{:.1}" height="26"><title>{}: {}</title></rect>"#,
            kind_css(*kind),
            x.px(at as f64),
            (x.px((at + bytes) as f64) - x.px(at as f64)).max(0.0),
            kind_name(*kind),
            human_bytes(*bytes)
        );
        at += bytes;
    }
    out.push_str(r#"</svg><table class="num"><thead><tr><th>buffer kind</th><th>bytes at the peak</th><th>share</th></tr></thead><tbody>"#);
    for (kind, bytes) in &plan.memory.breakdown {
        let _ = write!(
            out,
            r#"<tr><td><i class="sw {}"></i>{}</td><td>{}</td><td>{:.1}%</td></tr>"#,
            kind_css(*kind),
            kind_name(*kind),
            human_bytes(*bytes),
            *bytes as f64 / total.max(1) as f64 * 100.0
        );
    }
    let _ = write!(
        out,
        "</tbody></table><p class=\"note\">Arena {} per rank; with the matrix-product library's own heap ({}): {} per rank.</p>",
        human_bytes(plan.memory.arena_bytes),
        human_bytes(plan.memory.heap_bytes),
        human_bytes(plan.memory.rank_bytes)
    );
}
