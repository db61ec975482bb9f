//! The stream timeline: one lane per stream of the simulated step (and,
//! with a measured trace, one per stream of the measured rank's step
//! below them), each instruction a rectangle colored by its class.
//!
//! Conventions: x is seconds from the step's start on the shared scale
//! of the page; bookkeeping instructions of zero duration (records, frees,
//! waits in the simulator) are not drawn. Entries narrower than one pixel
//! that follow one another within a pixel are merged into one rectangle
//! (`data-n` instructions, colored by the class with most time in it), so
//! a plan of many thousand instructions stays a page of reasonable size;
//! every entry of a pixel or more is its own rectangle (`data-i`, its
//! instruction index). A wait of the compute stream that blocks it
//! (exposed communication) is marked from the stream's previous end to
//! the wait's end. Shaded behind the lanes: the time where a collective
//! (any stream) runs while the compute stream computes.

use super::measured::Run;
use super::svg::{esc, secs, time_axis, Scale};
use fsdpc_plan::{Instr, InstrOp, Plan, Stream};
use fsdpc_planner::simulate::Timeline;
use std::fmt::Write;

/// What a rectangle's color says.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    Matmul,
    Kernel,
    AllGather,
    ReduceScatter,
    AllReduce,
    Copy,
    Optimizer,
    Wait,
    Other,
}

impl Class {
    /// Every class, in legend order.
    pub const ALL: [Class; 9] = [
        Class::Matmul,
        Class::Kernel,
        Class::AllGather,
        Class::ReduceScatter,
        Class::AllReduce,
        Class::Copy,
        Class::Optimizer,
        Class::Wait,
        Class::Other,
    ];

    /// The CSS class of its fill.
    pub fn css(self) -> &'static str {
        match self {
            Class::Matmul => "c-matmul",
            Class::Kernel => "c-kernel",
            Class::AllGather => "c-ag",
            Class::ReduceScatter => "c-rs",
            Class::AllReduce => "c-ar",
            Class::Copy => "c-copy",
            Class::Optimizer => "c-opt",
            Class::Wait => "c-wait",
            Class::Other => "c-other",
        }
    }

    /// Its name in legends and tooltips.
    pub fn label(self) -> &'static str {
        match self {
            Class::Matmul => "matrix product",
            Class::Kernel => "other kernel",
            Class::AllGather => "all-gather",
            Class::ReduceScatter => "reduce-scatter",
            Class::AllReduce => "all-reduce",
            Class::Copy => "copy",
            Class::Optimizer => "optimizer",
            Class::Wait => "wait",
            Class::Other => "other",
        }
    }

    /// Whether it is a collective.
    pub fn is_comm(self) -> bool {
        matches!(
            self,
            Class::AllGather | Class::ReduceScatter | Class::AllReduce
        )
    }

    /// Whether it is computation (what overlapped communication hides behind).
    fn is_compute(self) -> bool {
        matches!(self, Class::Matmul | Class::Kernel | Class::Optimizer)
    }
}

/// The class of an instruction: `trace::instr_class`'s, with the
/// optimizer tail (steps, gradient-norm clipping, loss-scale updates) a
/// class of its own.
pub fn class_of(plan: &Plan, ins: &Instr) -> Class {
    match ins.op {
        InstrOp::OptimizerStep { .. }
        | InstrOp::GradNormSq { .. }
        | InstrOp::ClipGrads { .. }
        | InstrOp::UnscaleGrads { .. }
        | InstrOp::UpdateScale { .. } => return Class::Optimizer,
        _ => {}
    }
    match crate::trace::instr_class(plan, ins) {
        "matmul" => Class::Matmul,
        "kernel" => Class::Kernel,
        "all_gather" => Class::AllGather,
        "reduce_scatter" => Class::ReduceScatter,
        "all_reduce" => Class::AllReduce,
        "copy" => Class::Copy,
        "exposed_wait" | "wait" => Class::Wait,
        _ => Class::Other,
    }
}

/// One instruction on a lane.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Entry {
    pub instr: usize,
    pub start_s: f64,
    pub end_s: f64,
    pub class: Class,
}

/// One rectangle of a lane: a single instruction or merged slivers.
#[derive(Clone, Debug, PartialEq)]
pub struct Drawn {
    pub start_s: f64,
    pub end_s: f64,
    pub class: Class,
    /// The instructions it stands for (one unless merged).
    pub instrs: Vec<usize>,
}

/// A lane: a stream of the predicted or the measured step.
#[derive(Clone, Debug)]
pub struct Lane {
    pub stream: Stream,
    pub measured: bool,
    /// Drawn entries (non-zero duration, not waits), in time order.
    pub entries: Vec<Entry>,
    /// Blocked intervals of the compute stream (exposed waits).
    pub exposed: Vec<(f64, f64)>,
}

/// The predicted lanes: every stream the plan uses, from the simulator's
/// start and end times.
pub fn predicted_lanes(plan: &Plan, tl: &Timeline) -> Vec<Lane> {
    let spans = plan
        .instructions
        .iter()
        .enumerate()
        .filter_map(|(i, _)| Some((i, *tl.start.get(i)?, *tl.end.get(i)?)));
    lanes(plan, spans, false)
}

/// The measured rank's lanes.
pub fn measured_lanes(plan: &Plan, run: &Run) -> Vec<Lane> {
    let spans = run.spans.iter().map(|s| (s.instr, s.start_s, s.end_s));
    lanes(plan, spans, true)
}

fn lanes(plan: &Plan, spans: impl Iterator<Item = (usize, f64, f64)>, measured: bool) -> Vec<Lane> {
    let mut out: Vec<Lane> = Stream::ALL
        .iter()
        .filter(|s| plan.instructions.iter().any(|i| i.stream == **s))
        .map(|&stream| Lane {
            stream,
            measured,
            entries: Vec::new(),
            exposed: Vec::new(),
        })
        .collect();
    let mut prev_end = [0f64; Stream::ALL.len()];
    for (i, start, end) in spans {
        let Some(ins) = plan.instructions.get(i) else {
            continue;
        };
        let Some(lane) = out.iter_mut().find(|l| l.stream == ins.stream) else {
            continue;
        };
        let prev = &mut prev_end[ins.stream.index()];
        if matches!(ins.op, InstrOp::Wait { .. }) {
            // The simulator gives a wait no duration and starts it when its
            // event is ready; a measured wait spans the blocked time.
            let from = if measured { start } else { *prev };
            if ins.stream == Stream::Compute && end > from {
                lane.exposed.push((from, end));
            }
        } else if end > start {
            lane.entries.push(Entry {
                instr: i,
                start_s: start,
                end_s: end,
                class: class_of(plan, ins),
            });
        }
        *prev = prev.max(end);
    }
    for l in &mut out {
        l.entries.sort_by(|a, b| a.start_s.total_cmp(&b.start_s));
    }
    out
}

/// The lane's rectangles at `px_per_s`: entries of a pixel or more alone,
/// narrower ones merged with their narrow neighbours less than a pixel
/// apart (see the module header).
pub fn merge(entries: &[Entry], px_per_s: f64) -> Vec<Drawn> {
    let mut out: Vec<Drawn> = Vec::new();
    // Time per class inside the open merged rectangle.
    let mut open: Option<(Drawn, [f64; Class::ALL.len()])> = None;
    let close = |open: &mut Option<(Drawn, [f64; 9])>, out: &mut Vec<Drawn>| {
        if let Some((mut d, time)) = open.take() {
            let best = (0..time.len()).fold(0, |b, k| if time[k] > time[b] { k } else { b });
            d.class = Class::ALL[best];
            out.push(d);
        }
    };
    for e in entries {
        let wide = (e.end_s - e.start_s) * px_per_s >= 1.0;
        if wide {
            close(&mut open, &mut out);
            out.push(Drawn {
                start_s: e.start_s,
                end_s: e.end_s,
                class: e.class,
                instrs: vec![e.instr],
            });
            continue;
        }
        if let Some((d, _)) = &open {
            if (e.start_s - d.end_s) * px_per_s >= 1.0 {
                close(&mut open, &mut out);
            }
        }
        let (d, time) = open.get_or_insert_with(|| {
            (
                Drawn {
                    start_s: e.start_s,
                    end_s: e.end_s,
                    class: e.class,
                    instrs: Vec::new(),
                },
                [0.0; 9],
            )
        });
        d.end_s = d.end_s.max(e.end_s);
        d.instrs.push(e.instr);
        let k = Class::ALL.iter().position(|c| *c == e.class).unwrap_or(0);
        time[k] += e.end_s - e.start_s;
    }
    close(&mut open, &mut out);
    out
}

/// Sorted, disjoint union of intervals.
fn union(mut v: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::with_capacity(v.len());
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Where a collective (on any of `lanes`) runs while the compute stream
/// computes: sorted, disjoint intervals.
pub fn overlap(lanes: &[Lane]) -> Vec<(f64, f64)> {
    let pick = |f: fn(&Lane, &Entry) -> bool| {
        union(
            lanes
                .iter()
                .flat_map(|l| l.entries.iter().filter(move |e| f(l, e)))
                .map(|e| (e.start_s, e.end_s))
                .collect(),
        )
    };
    let compute = pick(|l, e| l.stream == Stream::Compute && e.class.is_compute());
    let comm = pick(|_, e| e.class.is_comm());
    let (mut i, mut j, mut out) = (0, 0, Vec::new());
    while i < compute.len() && j < comm.len() {
        let (s, e) = (compute[i].0.max(comm[j].0), compute[i].1.min(comm[j].1));
        if e > s {
            out.push((s, e));
        }
        if compute[i].1 < comm[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    out
}

/// Time of all communication on the lanes (union over streams).
pub fn comm_time(lanes: &[Lane]) -> f64 {
    union(
        lanes
            .iter()
            .flat_map(|l| &l.entries)
            .filter(|e| e.class.is_comm())
            .map(|e| (e.start_s, e.end_s))
            .collect(),
    )
    .iter()
    .map(|(s, e)| e - s)
    .sum()
}

/// Layout of the timeline SVG.
const LANE_H: f64 = 24.0;
const LANE_GAP: f64 = 8.0;
const GROUP_GAP: f64 = 30.0;
const OVERLAP_H: f64 = 10.0;

/// The section: legend, SVG and a caption with the overlap figures.
pub fn section(out: &mut String, plan: &Plan, lanes: &[Lane], x: &Scale, domain_s: f64) {
    let predicted: Vec<Lane> = lanes.iter().filter(|l| !l.measured).cloned().collect();
    let overlapped = overlap(&predicted);
    let overlap_s: f64 = overlapped.iter().map(|(s, e)| e - s).sum();
    let exposed_s: f64 = predicted
        .iter()
        .flat_map(|l| &l.exposed)
        .map(|(s, e)| e - s)
        .sum();
    let _ = write!(
        out,
        r#"<section id="timeline"><h2>Stream timeline</h2><p class="note">One lane per stream; each rectangle an instruction (hover for its name). Green (the top strip, and shaded behind the predicted lanes): a collective runs while the compute stream computes ({} of {} communication overlapped). Red: the compute stream blocked on communication (exposed: {}). Rectangles under a pixel wide are merged with their neighbours.</p>"#,
        secs(overlap_s),
        secs(comm_time(&predicted)),
        secs(exposed_s)
    );
    legend(out);
    let measured = lanes.iter().any(|l| l.measured);
    let n = lanes.len() as f64;
    let height = 30.0
        + OVERLAP_H
        + LANE_GAP
        + n * (LANE_H + LANE_GAP)
        + if measured { GROUP_GAP } else { 0.0 }
        + 50.0;
    let _ = write!(
        out,
        r#"<svg id="timeline-chart" width="1240" height="{height:.0}" viewBox="0 0 1240 {height:.0}" xmlns="http://www.w3.org/2000/svg"><title>Stream timeline</title>"#
    );
    // The overlap: a strip of its own above the lanes, and a light band
    // behind the predicted lanes.
    let top = 20.0 + OVERLAP_H + LANE_GAP;
    let pred_h = predicted.len() as f64 * (LANE_H + LANE_GAP);
    let _ = write!(
        out,
        r#"<text class="ll" x="{:.1}" y="{:.1}" text-anchor="end">overlapped</text><rect class="lanebg" x="{:.1}" y="20" width="{:.1}" height="{OVERLAP_H:.1}"/>"#,
        x.r0 - 8.0,
        20.0 + OVERLAP_H - 1.0,
        x.r0,
        x.r1 - x.r0
    );
    for (s, e) in &overlapped {
        let (x0, w) = (x.px(*s), (x.px(*e) - x.px(*s)).max(0.5));
        let _ = write!(
            out,
            r#"<rect class="overlap-strip" x="{x0:.1}" y="20" width="{w:.1}" height="{OVERLAP_H:.1}"><title>collective overlapped with compute: {} at {}</title></rect><rect class="overlap" x="{x0:.1}" y="{:.1}" width="{w:.1}" height="{pred_h:.1}"/>"#,
            secs(e - s),
            secs(*s),
            top - LANE_GAP / 2.0
        );
    }
    let mut y = top;
    for (k, lane) in lanes.iter().enumerate() {
        if lane.measured && k > 0 && !lanes[k - 1].measured {
            y += GROUP_GAP;
        }
        lane_svg(out, plan, lane, x, y);
        y += LANE_H + LANE_GAP;
    }
    time_axis(out, x, y + 4.0, domain_s, "time from the step's start");
    out.push_str("</svg></section>");
}

fn legend(out: &mut String) {
    out.push_str(r#"<div class="legend">"#);
    for c in Class::ALL {
        let _ = write!(
            out,
            r#"<span><i class="sw {}"></i>{}</span>"#,
            c.css(),
            c.label()
        );
    }
    out.push_str(r#"<span><i class="sw overlap-strip"></i>collective overlapped with compute</span><span><i class="sw exposed"></i>compute blocked (exposed wait)</span></div>"#);
}

fn lane_svg(out: &mut String, plan: &Plan, lane: &Lane, x: &Scale, y: f64) {
    let name = format!("{:?}", lane.stream).to_lowercase();
    let label = if lane.measured {
        format!("measured · {name}")
    } else {
        format!("predicted · {name}")
    };
    let _ = write!(
        out,
        r#"<g class="lane" data-stream="{name}" data-measured="{}"><text class="ll" x="{:.1}" y="{:.1}" text-anchor="end">{label}</text><rect class="lanebg" x="{:.1}" y="{y:.1}" width="{:.1}" height="{LANE_H:.1}"/>"#,
        lane.measured,
        x.r0 - 8.0,
        y + LANE_H / 2.0 + 4.0,
        x.r0,
        x.r1 - x.r0
    );
    for d in merge(&lane.entries, x.density()) {
        let (x0, x1) = (x.px(d.start_s), x.px(d.end_s));
        let w = (x1 - x0).max(1.0);
        let (id, title) = match d.instrs.as_slice() {
            [i] => (
                format!(r#"data-i="{i}""#),
                format!(
                    "{} — {}, {} at {}",
                    esc(&plan
                        .instructions
                        .get(*i)
                        .map_or_else(String::new, |ins| crate::trace::slice_name(plan, &ins.op))),
                    d.class.label(),
                    secs(d.end_s - d.start_s),
                    secs(d.start_s)
                ),
            ),
            many => (
                format!(r#"data-n="{}""#, many.len()),
                format!(
                    "{} instructions under a pixel each, mostly {}, {} from {}",
                    many.len(),
                    d.class.label(),
                    secs(d.end_s - d.start_s),
                    secs(d.start_s)
                ),
            ),
        };
        let _ = write!(
            out,
            r#"<rect class="ins {}" {id} x="{x0:.1}" y="{:.1}" width="{w:.1}" height="{:.1}"><title>{title}</title></rect>"#,
            d.class.css(),
            y + 2.0,
            LANE_H - 4.0
        );
    }
    for (s, e) in &lane.exposed {
        let (x0, x1) = (x.px(*s), x.px(*e));
        let _ = write!(
            out,
            r#"<rect class="exposed" x="{x0:.1}" y="{y:.1}" width="{:.1}" height="{LANE_H:.1}"><title>compute blocked {} at {}</title></rect>"#,
            (x1 - x0).max(1.0),
            secs(e - s),
            secs(*s)
        );
    }
    out.push_str("</g>");
}
