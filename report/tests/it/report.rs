//! The HTML report (`report::render`): a well-formed page with every
//! section that escapes what the model names; a memory curve whose
//! maximum is the planned peak, downsampled or not; one rectangle per
//! timeline entry of a pixel or more and merged slivers that account for
//! every other instruction; exposed waits that add up to the simulator's
//! exposed communication; overlap inside both compute and communication;
//! measured traces drawn, and refused when they are another plan's or
//! name instructions the plan lacks.

use crate::common::{plan, TINY_GPT};
use fsdpc_plan::*;
use fsdpc_planner::simulate::simulate;
use fsdpc_planner::*;
use fsdpc_report::html::svg::Scale;
use fsdpc_report::html::timeline::{merge, overlap, predicted_lanes, Lane};
use fsdpc_report::html::{memory, render, ReportError, PLOT_X0, PLOT_X1};
use fsdpc_report::trace::{measured_trace, MeasuredSpan};
use serde_json::Value;

const HOSTILE: &str = r#"h.<0>&"x"'</td>"#;

fn cluster(p: &Plan) -> Cluster {
    p.cluster.clone()
}

fn tiny(world: u32, cfg: FsdpConfig) -> Plan {
    plan(TINY_GPT, world, &cfg).expect("plans")
}

/// The page parsed as XML (the doctype line removed).
fn parse(html: &str) -> roxmltree::Document<'_> {
    let body = html
        .strip_prefix("<!DOCTYPE html>\n")
        .expect("starts with the doctype");
    roxmltree::Document::parse(body).expect("the page is well-formed XML")
}

fn by_id<'a>(doc: &'a roxmltree::Document, id: &str) -> roxmltree::Node<'a, 'a> {
    doc.descendants()
        .find(|n| n.attribute("id") == Some(id))
        .unwrap_or_else(|| panic!("no element #{id}"))
}

#[test]
fn page_is_well_formed_has_every_section_and_escapes_model_names() {
    let mut p = tiny(2, FsdpConfig::default());
    p.units[1].module = HOSTILE.to_string();
    p.model.name = "gpt<script>alert(1)</script>".to_string();
    let node = p
        .instructions
        .iter()
        .find_map(|i| match i.op {
            InstrOp::Kernel { node, .. } => Some(node),
            _ => None,
        })
        .expect("a kernel");
    std::sync::Arc::make_mut(&mut p.training)
        .graph
        .node_mut(node)
        .name = HOSTILE.to_string();
    let html = render(&p, &cluster(&p), None).expect("report");
    let doc = parse(&html);
    for id in [
        "summary",
        "memory",
        "memory-chart",
        "memory-curve",
        "breakdown-bar",
        "timeline",
        "timeline-chart",
        "units",
        "collectives",
    ] {
        by_id(&doc, id);
    }
    assert!(doc.descendants().all(|n| n.tag_name().name() != "script"));
    assert!(!html.contains("<script"), "unescaped model name");
    // The hostile names come back intact as text: in the unit table and
    // in a timeline tooltip.
    let texts: Vec<&str> = doc.descendants().filter_map(|n| n.text()).collect();
    assert!(texts.contains(&HOSTILE), "module path not in a cell");
    assert!(
        texts.iter().any(|t| t.contains(&format!(" {HOSTILE} — "))),
        "node name not in a tooltip"
    );
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("gpt<script>alert(1)</script> — ")),
        "model name not in the title"
    );
    // Every SVG is sized and the curve has a path.
    let d = by_id(&doc, "memory-curve").attribute("d").unwrap_or("");
    assert!(d.starts_with('M') && d.len() > 20, "curve path: {d}");
    // No comparison without a measured trace.
    assert!(doc
        .descendants()
        .all(|n| n.attribute("id") != Some("comparison")));
}

#[test]
fn curve_maximum_is_the_planned_peak() {
    let cfgs = [
        FsdpConfig::default(),
        FsdpConfig {
            settings: fsdpc_plan::Settings {
                strategy: Strategy::NoShard,
                ..fsdpc_plan::Settings::default()
            },
            ..FsdpConfig::default()
        },
        FsdpConfig {
            settings: fsdpc_plan::Settings {
                cpu_offload: true,
                ..fsdpc_plan::Settings::default()
            },
            ..FsdpConfig::default()
        },
    ];
    for cfg in cfgs {
        let p = tiny(2, cfg);
        let c = cluster(&p);
        let tl = simulate(&p, &c);
        let x = Scale::new(0.0, tl.step_time_s, PLOT_X0, PLOT_X1);
        let full = memory::curve(&p, &tl, &x, 10_000);
        assert_eq!(full.points.len(), p.instructions.len());
        assert_eq!(full.max(), p.memory.peak_bytes, "{:?}", p.config.strategy);
        // The stack's kinds at the curve's maximum are the peak's breakdown.
        let at = (0..full.points.len())
            .max_by_key(|&j| (full.total(j), std::cmp::Reverse(j)))
            .expect("points");
        let mut kinds: Vec<(BufferKind, u64)> = full
            .kinds
            .iter()
            .copied()
            .zip(full.points[at].1.iter().copied())
            .filter(|(_, b)| *b > 0)
            .collect();
        kinds.sort();
        assert_eq!(kinds, p.memory.breakdown);
        // Downsampled to 40 columns: at most two points a column, same peak,
        // times still in order.
        let small = memory::curve(&p, &tl, &x, 40);
        assert!(small.points.len() <= 2 * 40, "{}", small.points.len());
        assert_eq!(small.max(), p.memory.peak_bytes);
        assert!(small.points.windows(2).all(|w| w[0].0 <= w[1].0));
    }
}

/// Counts of `attr="` occurrences and the sum of their values.
fn attr_sum(html: &str, attr: &str) -> (usize, u64) {
    let key = format!(" {attr}=\"");
    let mut n = 0;
    let mut sum = 0;
    for part in html.split(&key).skip(1) {
        n += 1;
        sum += part
            .split('"')
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .expect("a number");
    }
    (n, sum)
}

#[test]
fn one_rectangle_per_wide_entry_and_merged_slivers_count_every_instruction() {
    // Twelve layers: many kernels under a pixel of a 1060 px axis.
    let p = plan(
        "gpt:layers=12,hidden=32,heads=2,seq=8,vocab=64,batch=2",
        2,
        &FsdpConfig::default(),
    )
    .expect("plans");
    let c = cluster(&p);
    let tl = simulate(&p, &c);
    let lanes = predicted_lanes(&p, &tl);
    let x = Scale::new(0.0, tl.step_time_s, PLOT_X0, PLOT_X1);
    let (mut wide, mut merged_rects, mut merged_instrs, mut drawn) = (0, 0, 0u64, 0);
    for l in &lanes {
        let d = merge(&l.entries, x.density());
        let w = l
            .entries
            .iter()
            .filter(|e| (e.end_s - e.start_s) * x.density() >= 1.0)
            .count();
        let singles = d.iter().filter(|d| d.instrs.len() == 1).count();
        let n: usize = d.iter().map(|d| d.instrs.len()).sum();
        assert_eq!(n, l.entries.len(), "every entry drawn once");
        // A merged single sliver is a rectangle of one instruction too.
        assert!(singles >= w);
        wide += singles;
        merged_rects += d.len() - singles;
        merged_instrs += d
            .iter()
            .filter(|d| d.instrs.len() > 1)
            .map(|d| d.instrs.len() as u64)
            .sum::<u64>();
        drawn += n;
    }
    assert!(merged_rects > 0, "the plan has slivers to merge");
    let html = render(&p, &c, None).expect("report");
    assert_eq!(attr_sum(&html, "data-i").0, wide);
    assert_eq!(attr_sum(&html, "data-n"), (merged_rects, merged_instrs));
    // What is drawn is every instruction of non-zero duration except waits.
    let timed = p
        .instructions
        .iter()
        .enumerate()
        .filter(|(i, ins)| tl.end[*i] > tl.start[*i] && !matches!(ins.op, InstrOp::Wait { .. }))
        .count();
    assert_eq!(drawn, timed);
}

fn exposed(lanes: &[Lane]) -> f64 {
    lanes
        .iter()
        .flat_map(|l| &l.exposed)
        .map(|(s, e)| e - s)
        .sum()
}

#[test]
fn exposed_waits_add_up_and_overlap_is_inside_compute_and_communication() {
    let p = tiny(
        2,
        FsdpConfig {
            settings: fsdpc_plan::Settings {
                forward_prefetch: false,
                backward_prefetch: BackwardPrefetch::None,
                ..fsdpc_plan::Settings::default()
            },
            ..FsdpConfig::default()
        },
    );
    let c = cluster(&p);
    let tl = simulate(&p, &c);
    let lanes = predicted_lanes(&p, &tl);
    assert!(tl.exposed_comm_s > 0.0, "no prefetch: compute waits");
    assert!((exposed(&lanes) - tl.exposed_comm_s).abs() <= 1e-9 * tl.step_time_s);

    let p = tiny(2, FsdpConfig::default());
    let tl = simulate(&p, &cluster(&p));
    let lanes = predicted_lanes(&p, &tl);
    let o = overlap(&lanes);
    assert!(!o.is_empty(), "prefetched gathers overlap compute");
    // Each interval is covered by compute kernels (one stream: they do
    // not overlap one another) and by collectives (several streams: they
    // may).
    let covered = |s: f64, e: f64, comm: bool| -> f64 {
        lanes
            .iter()
            .flat_map(|l| l.entries.iter().map(move |x| (l, x)))
            .filter(|(l, x)| {
                if comm {
                    x.class.is_comm()
                } else {
                    l.stream == Stream::Compute && !x.class.is_comm()
                }
            })
            .map(|(_, x)| (x.end_s.min(e) - x.start_s.max(s)).max(0.0))
            .sum()
    };
    let eps = 1e-9 * tl.step_time_s;
    for &(s, e) in &o {
        assert!(e > s, "{s}..{e}");
        assert!((covered(s, e, false) - (e - s)).abs() <= eps, "{s}..{e}");
        assert!(covered(s, e, true) >= e - s - eps, "{s}..{e}");
    }
    // One rank: no collectives, nothing overlapped.
    let p1 = tiny(1, FsdpConfig::default());
    let tl1 = simulate(&p1, &cluster(&p1));
    assert!(overlap(&predicted_lanes(&p1, &tl1)).is_empty());
}

/// A measured trace of `p` in which every instruction takes `scale` times
/// its simulated time on ranks 0 and 1, with a heap counter.
fn fake_measured(p: &Plan, scale: f64) -> Value {
    let tl = simulate(p, &cluster(p));
    let spans: Vec<MeasuredSpan> = (0..2)
        .flat_map(|rank| {
            let tl = &tl;
            (0..p.instructions.len()).map(move |i| MeasuredSpan {
                rank,
                step: 1,
                instr: i,
                start_s: tl.start[i] * scale,
                end_s: tl.end[i] * scale,
                live_bytes: Some(1000 + i as i64),
            })
        })
        .collect();
    measured_trace(p, &spans).expect("trace")
}

#[test]
fn measured_trace_is_drawn_and_bad_ones_are_refused() {
    let p = tiny(2, FsdpConfig::default());
    let c = cluster(&p);
    let m = fake_measured(&p, 2.0);
    let html = render(&p, &c, Some(&m)).expect("report with a measured trace");
    let doc = parse(&html);
    by_id(&doc, "comparison");
    by_id(&doc, "comparison-chart");
    let d = by_id(&doc, "measured-memory").attribute("d").unwrap_or("");
    assert!(d.starts_with('M'), "measured memory path: {d}");
    let measured_lanes = doc
        .descendants()
        .filter(|n| n.attribute("data-measured") == Some("true"))
        .count();
    let streams = Stream::ALL
        .iter()
        .filter(|s| p.instructions.iter().any(|i| i.stream == **s))
        .count();
    assert_eq!(measured_lanes, streams);

    // Another plan's trace: refused by the comparison.
    let other = tiny(1, FsdpConfig::default());
    let err = render(&other, &cluster(&other), Some(&m)).expect_err("another plan");
    assert!(matches!(err, ReportError::Compare(_)), "{err}");
    assert!(err.to_string().contains("different plans"), "{err}");
    // A predicted trace where the measured one belongs.
    let predicted = fsdpc_report::trace::chrome_trace(&p);
    assert!(matches!(
        render(&p, &c, Some(&predicted)),
        Err(ReportError::Compare(_))
    ));
    // An instruction the plan lacks.
    let mut bad = m.clone();
    let ev = bad["traceEvents"]
        .as_array_mut()
        .expect("events")
        .iter_mut()
        .find(|e| e["ph"] == "X")
        .expect("a span");
    ev["args"]["instr"] = Value::from(1_000_000u64);
    let err = render(&p, &c, Some(&bad)).expect_err("bad instruction");
    assert!(matches!(err, ReportError::Measured { .. }), "{err}");
    assert!(err.to_string().contains("instruction 1000000"), "{err}");
}
