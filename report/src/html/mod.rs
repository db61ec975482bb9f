//! `fsdpc report`: one self-contained HTML page about a plan on a cluster
//! (and, given a `fsdpc train --trace` file, about a run of it): the key
//! figures, memory over the simulated step and its breakdown by buffer
//! kind, the stream timeline with overlapped communication shaded and
//! exposed waits marked, the units, the collectives by group, and
//! predicted against measured.
//!
//! Conventions: the page is inline CSS and SVG only, no script and nothing
//! fetched, and well-formed XML (void elements closed), so a test can
//! parse it; every string from the model, a trace or a cluster file is
//! escaped (`svg::esc`). The memory chart and the timeline share one time
//! axis: seconds from the step's start over the longer of the predicted
//! and the measured step. Plots are 1060 px wide on a 1240 px page.
//! Sections: `svg` (helpers), `memory`, `timeline`, `tables`, `measured`
//! (reading the trace).

pub mod measured;
pub mod memory;
pub mod svg;
pub mod tables;
pub mod timeline;

use crate::compare::{compare, CompareError, Comparison};
use fsdpc_plan::cluster::Cluster;
use fsdpc_plan::readable::{human_bytes, human_count};
use fsdpc_plan::{BufferKind, Plan};
use fsdpc_planner::simulate::{run as simulate_run, simulate, Simulation};
use serde_json::Value;
use std::fmt::Write;
use svg::{esc, secs, Scale};

/// Left and right edge of every plot, pixels.
pub const PLOT_X0: f64 = 160.0;
pub const PLOT_X1: f64 = 1220.0;

/// Why a report cannot be written.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ReportError {
    /// The measured trace cannot be compared with the plan's prediction
    /// (not a trace, the wrong kind, another plan's).
    #[error("the measured trace: {0}")]
    Compare(#[from] CompareError),
    /// The measured trace cannot be drawn.
    #[error("the measured trace: {reason}")]
    Measured { reason: String },
}

/// The report of `plan` simulated on `cluster` (the plan's world and
/// shape, the cluster's speeds), with `measured` (a `fsdpc train --trace`
/// file of this plan) drawn beside the prediction.
pub fn render(
    plan: &Plan,
    cluster: &Cluster,
    measured: Option<&Value>,
) -> Result<String, ReportError> {
    let tl = simulate(plan, cluster);
    let sim = simulate_run(plan, cluster);
    let (run, comparison) = match measured {
        Some(m) => {
            let c = compare_on(plan, cluster, m)?;
            (Some(measured::read(plan, m)?), Some(c))
        }
        None => (None, None),
    };
    let domain_s = run
        .as_ref()
        .map_or(0.0, |r| r.step_time_s)
        .max(tl.step_time_s);
    let x = Scale::new(0.0, domain_s, PLOT_X0, PLOT_X1);
    let mut lanes = timeline::predicted_lanes(plan, &tl);
    if let Some(r) = &run {
        lanes.extend(timeline::measured_lanes(plan, r));
    }
    let curve = memory::curve(plan, &tl, &x, (PLOT_X1 - PLOT_X0) as usize);
    let traffic = fsdpc_planner::cost::traffic(plan, cluster);

    let mut out = String::with_capacity(1 << 16);
    head(&mut out, plan);
    header(&mut out, plan, cluster, &sim, comparison.as_ref());
    let extra = memory::Extra {
        capacity: cluster.memory_bytes,
        measured: run.as_ref().map(|r| (r.rank, r.memory.as_slice())),
    };
    memory::section(&mut out, plan, &curve, &x, domain_s, &extra);
    timeline::section(&mut out, plan, &lanes, &x, domain_s);
    if let Some(c) = &comparison {
        tables::comparison(&mut out, c);
    }
    tables::units(&mut out, plan);
    tables::collectives(&mut out, plan, &traffic, &lanes);
    out.push_str("</main></body></html>\n");
    Ok(out)
}

/// `compare` of the prediction on `cluster` with `measured`.
fn compare_on(plan: &Plan, cluster: &Cluster, measured: &Value) -> Result<Comparison, ReportError> {
    let predicted = if plan.cluster == *cluster {
        crate::trace::chrome_trace(plan)
    } else {
        // `chrome_trace` simulates on the plan's own cluster record.
        let mut p = plan.clone();
        p.cluster = cluster.clone();
        crate::trace::chrome_trace(&p)
    };
    Ok(compare(&predicted, measured)?)
}

const CSS: &str = "
body{font:14px/1.4 system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;color:#1d1d1f;margin:0;background:#fff}
main{width:1240px;margin:0 auto;padding:12px 16px}
h1{font-size:22px;margin:8px 0 4px}h2{font-size:18px;margin:28px 0 6px;border-bottom:1px solid #ddd}h3{font-size:15px;margin:14px 0 4px}
.sub{color:#555;margin:0 0 10px}.note{color:#555;margin:4px 0 8px;max-width:1200px}
.cards{display:flex;flex-wrap:wrap;gap:8px}.card{border:1px solid #ddd;border-radius:6px;padding:6px 12px;min-width:150px}
.card b{display:block;font-size:18px}.card span{color:#555;font-size:12px}.bad b{color:#c62828}
.legend{display:flex;flex-wrap:wrap;gap:4px 16px;margin:4px 0 4px 160px;font-size:12px}
.sw{display:inline-block;width:12px;height:12px;margin-right:5px;vertical-align:-2px;border-radius:2px}
table{border-collapse:collapse;margin:6px 0}th,td{border-bottom:1px solid #eee;padding:3px 10px;text-align:left}
th{background:#f5f5f7;font-weight:600}table.num td{font-variant-numeric:tabular-nums}td.path{font-family:ui-monospace,monospace;font-size:12px}
svg text{font:11px system-ui,sans-serif;fill:#333}svg .at{font-size:12px;fill:#111}svg .ll{font-size:12px}
.axis{stroke:#333;stroke-width:1}.tick{stroke:#333}.grid{stroke:#e5e5e5}
.curve{fill:none;stroke:#111;stroke-width:1.5}.measured-curve{fill:none;stroke:#6a1b9a;stroke-width:1.5;stroke-dasharray:5 3}
.capacity{stroke:#d32f2f;stroke-width:1.5;stroke-dasharray:6 4}.cl{fill:#d32f2f}.peak{fill:#111}.pl{font-weight:600}
.area{stroke:none;opacity:.9}.lanebg{fill:none;stroke:#d0d0d0}
.overlap{fill:#66bb6a;opacity:.25;background:#43a047}.overlap-strip{fill:#43a047;background:#43a047}
.exposed{fill:#e53935;fill-opacity:.35;stroke:#c62828;stroke-width:.5;background:#e57373}
.line-total{background:#111;height:3px;vertical-align:3px}.line-cap{background:#d32f2f;height:3px;vertical-align:3px}.line-measured{background:#6a1b9a;height:3px;vertical-align:3px}
.c-matmul{fill:#1565c0;background:#1565c0}.c-kernel{fill:#64b5f6;background:#64b5f6}.c-ag{fill:#ef6c00;background:#ef6c00}
.c-rs{fill:#8e24aa;background:#8e24aa}.c-ar{fill:#c2185b;background:#c2185b}.c-copy{fill:#8d6e63;background:#8d6e63}
.c-opt{fill:#2e7d32;background:#2e7d32}.c-wait{fill:#bdbdbd;background:#bdbdbd}.c-other{fill:#9e9e9e;background:#9e9e9e}
.pred{fill:#1565c0;background:#1565c0}.meas{fill:#ef6c00;background:#ef6c00}
";

/// Colors of the buffer kinds (by `BufferKind` order).
const KIND_COLORS: [&str; 16] = [
    "#1e88e5", "#fb8c00", "#ffb74d", "#8e24aa", "#a1887f", "#ce93d8", "#43a047", "#f06292",
    "#7cb342", "#26a69a", "#78909c", "#455a64", "#bcaaa4", "#90a4ae", "#cfd8dc", "#5c6bc0",
];

fn kind_styles(plan: &Plan) -> String {
    let mut kinds: Vec<BufferKind> = plan.buffers.iter().map(|b| b.kind).collect();
    kinds.sort();
    kinds.dedup();
    let mut s = String::new();
    for k in kinds {
        let color = KIND_COLORS[(k as usize) % KIND_COLORS.len()];
        let _ = writeln!(
            s,
            ".{}{{fill:{color};background:{color}}}",
            memory::kind_css(k)
        );
    }
    s
}

fn head(out: &mut String, plan: &Plan) {
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/><meta name=\"viewport\" content=\"width=1280\"/><title>fsdpc report: {}</title><style>{CSS}{}</style></head><body><main>",
        esc(&plan.model.name),
        kind_styles(plan)
    );
}

fn card(out: &mut String, value: &str, label: &str, bad: bool) {
    let _ = write!(
        out,
        r#"<div class="card{}"><b>{}</b><span>{}</span></div>"#,
        if bad { " bad" } else { "" },
        esc(value),
        esc(label)
    );
}

fn header(
    out: &mut String,
    plan: &Plan,
    cluster: &Cluster,
    sim: &Simulation,
    c: Option<&Comparison>,
) {
    let cfg = &plan.config;
    let _ = write!(
        out,
        r#"<header id="summary"><h1>{} — {} parameters</h1><p class="sub">{} on {} ranks ({} node(s) × {} ranks), shard factor F = {}, parameters in {:?}, gradients reduced in {:?}; simulated on cluster <b>{}</b>; {} instructions on {} stream(s).</p><div class="cards">"#,
        esc(&plan.model.name),
        human_count(plan.model.params),
        esc(cfg.strategy.name()),
        plan.cluster.world,
        cluster.nodes(),
        cluster.ranks_per_node,
        cfg.shard_factor,
        cfg.param_dtype,
        cfg.reduce_dtype,
        esc(&cluster.name),
        plan.instructions.len(),
        plan.streams.len()
    );
    card(out, &secs(sim.step_time_s), "predicted step time", false);
    let share = if sim.step_time_s > 0.0 {
        sim.exposed_comm_s / sim.step_time_s * 100.0
    } else {
        0.0
    };
    card(
        out,
        &format!("{} ({share:.1}%)", secs(sim.exposed_comm_s)),
        "exposed communication",
        false,
    );
    card(
        out,
        &format!("{:.1}%", sim.mfu * 100.0),
        "MFU (model FLOPs, no recomputation)",
        false,
    );
    card(
        out,
        &format!("{:.1}%", sim.hfu * 100.0),
        "HFU (executed FLOPs, recomputation counted)",
        false,
    );
    card(
        out,
        &format!("{:.3}", sim.tflops_per_rank),
        "TFLOP/s per rank",
        false,
    );
    let over = sim.peak_bytes_per_rank + sim.outside_arena_bytes > cluster.memory_bytes;
    card(
        out,
        &format!(
            "{} / {}",
            human_bytes(sim.peak_bytes_per_rank + sim.outside_arena_bytes),
            human_bytes(cluster.memory_bytes)
        ),
        if over {
            "planned peak per rank / capacity: DOES NOT FIT"
        } else {
            "planned peak per rank / capacity"
        },
        over,
    );
    card(
        out,
        &human_bytes(sim.comm_bytes_per_step),
        "sent per rank and step",
        false,
    );
    if let Some(c) = c {
        let err = c
            .step
            .error_pct
            .map_or_else(String::new, |e| format!(" (prediction {e:+.1}%)"));
        card(
            out,
            &format!("{}{err}", secs(c.step.measured_s)),
            "measured step time",
            false,
        );
    }
    out.push_str("</div></header>");
}
