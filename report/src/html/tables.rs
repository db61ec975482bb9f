//! The report's tables: the units (what the plan records per unit), the
//! collectives by operation and group (`cost::traffic`, with their time on
//! the simulated step), and predicted against measured by class
//! (`compare::Comparison`, drawn as paired bars).
//!
//! Conventions: bytes in binary units (`inspect::human_bytes`), counts in
//! decimal ones, times in s/ms/µs; module paths are escaped.

use super::svg::{esc, secs, Scale};
use super::timeline::Lane;
use crate::compare::Comparison;
use fsdpc_plan::readable::{human_bytes, human_count};
use fsdpc_plan::{BufferKind, Collective, Plan, ReshardAfterForward, UnitId};
use fsdpc_planner::cost::Traffic;
use std::fmt::Write;

/// Bytes of the first buffer of `kind` for unit `u`, if any.
fn unit_buffer(plan: &Plan, u: UnitId, kind: BufferKind) -> Option<u64> {
    plan.buffers
        .iter()
        .find(|b| b.kind == kind && b.unit == Some(u))
        .map(|b| b.bytes)
}

fn reshard_text(r: ReshardAfterForward) -> String {
    match r {
        ReshardAfterForward::Full => "free".into(),
        ReshardAfterForward::Keep => "keep".into(),
        ReshardAfterForward::To(n) => format!("keep 1/{n}"),
    }
}

/// The unit table.
pub fn units(out: &mut String, plan: &Plan) {
    out.push_str(r#"<section id="units"><h2>Units</h2><p class="note">Shard: this rank's f32 master shard of the unit's flat parameter; gathered: the flat parameter after its all-gather, in the gather dtype. After forward: what a unit does with its gathered parameters (free, keep, or keep a 1/n slice).</p><table class="num"><thead><tr><th>#</th><th>module</th><th>kind</th><th>parameters</th><th>elements</th><th>frozen</th><th>shard</th><th>gathered</th><th>after forward</th><th>checkpointed</th><th>offloaded</th></tr></thead><tbody>"#);
    for u in &plan.units {
        let module = if u.module.is_empty() {
            "(root)"
        } else {
            &u.module
        };
        let frozen: u64 = u
            .params
            .iter()
            .filter(|p| !p.requires_grad)
            .map(|p| p.numel)
            .sum();
        let bytes = |k| unit_buffer(plan, u.id, k).map_or_else(|| "—".to_string(), human_bytes);
        let _ = write!(
            out,
            r#"<tr><td>{}</td><td class="path">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            u.id.0,
            esc(module),
            esc(&u.kind),
            u.params.len(),
            human_count(u.flat_numel),
            if frozen > 0 {
                human_count(frozen)
            } else {
                "—".into()
            },
            bytes(BufferKind::ShardParams),
            bytes(BufferKind::GatheredParams),
            reshard_text(plan.unit_reshard(u.id)),
            if plan.config.checkpointed_units.contains(&u.id) {
                "yes"
            } else {
                "—"
            },
            if plan.config.cpu_offload {
                "yes"
            } else {
                "—"
            }
        );
    }
    out.push_str("</tbody></table></section>");
}

/// The collectives table: `traffic` with each row's time on its stream in
/// the simulated step (from the predicted `lanes`).
pub fn collectives(out: &mut String, plan: &Plan, traffic: &[Traffic], lanes: &[Lane]) {
    out.push_str(r#"<section id="collectives"><h2>Collectives by group</h2><p class="note">Per rank and step: how many collectives of each kind run over each group, the bytes a rank sends in them (ring algorithms) and their simulated time.</p><table class="num"><thead><tr><th>operation</th><th>group</th><th>ranks</th><th>spans</th><th>count</th><th>bytes sent</th><th>time</th></tr></thead><tbody>"#);
    for t in traffic {
        let time: f64 = lanes
            .iter()
            .filter(|l| !l.measured)
            .flat_map(|l| &l.entries)
            .filter(|e| {
                plan.instructions
                    .get(e.instr)
                    .is_some_and(|ins| collective_of(&ins.op) == Some((t.op, t.group)))
            })
            .map(|e| e.end_s - e.start_s)
            .sum();
        let _ = write!(
            out,
            r#"<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>"#,
            t.op.replace('_', "-"),
            format!("{:?}", t.group).to_lowercase(),
            t.ranks,
            if t.inter_node { "nodes" } else { "one node" },
            t.count,
            human_bytes(t.bytes_sent),
            secs(time)
        );
    }
    if traffic.is_empty() {
        out.push_str(r#"<tr><td colspan="7">no collectives (one rank)</td></tr>"#);
    }
    out.push_str("</tbody></table></section>");
}

/// The `(op, group)` of a collective, as `cost::traffic` names them.
fn collective_of(op: &fsdpc_plan::InstrOp) -> Option<(&'static str, fsdpc_plan::Group)> {
    use fsdpc_plan::InstrOp;
    match *op {
        InstrOp::AllGather {
            c: Collective { group, .. },
            ..
        } => Some(("all_gather", group)),
        InstrOp::ReduceScatter {
            c: Collective { group, .. },
        } => Some(("reduce_scatter", group)),
        InstrOp::AllReduce { group, .. }
        | InstrOp::NormAllReduce { group, .. }
        | InstrOp::FoundInfAllReduce { group, .. } => Some(("all_reduce", group)),
        _ => None,
    }
}

/// Predicted against measured: paired bars and the table.
pub fn comparison(out: &mut String, c: &Comparison) {
    let _ = write!(
        out,
        r#"<section id="comparison"><h2>Predicted against measured</h2><p class="note">Time per class on one rank in one step, all streams together (overlapped time counts on each stream); measured: the mean over {} rank(s) and {} traced step(s); the step: the slowest rank's span (fsdpc compare).</p>"#,
        c.ranks, c.steps
    );
    let rows: Vec<_> = c.classes.iter().chain(std::iter::once(&c.step)).collect();
    let max = rows
        .iter()
        .map(|r| r.predicted_s.max(r.measured_s))
        .fold(0.0, f64::max);
    let row_h = 30.0;
    let height = rows.len() as f64 * row_h + 10.0;
    let x = Scale::new(0.0, max, 160.0, 1000.0);
    let _ = write!(
        out,
        r#"<div class="legend"><span><i class="sw pred"></i>predicted</span><span><i class="sw meas"></i>measured</span></div><svg id="comparison-chart" width="1240" height="{height:.0}" viewBox="0 0 1240 {height:.0}" xmlns="http://www.w3.org/2000/svg"><title>Predicted against measured time per class</title>"#
    );
    for (k, r) in rows.iter().enumerate() {
        let y = 5.0 + k as f64 * row_h;
        let err = r
            .error_pct
            .map_or_else(|| "—".to_string(), |e| format!("{e:+.1}%"));
        let _ = write!(
            out,
            r#"<text class="ll" x="152" y="{:.1}" text-anchor="end">{}</text><rect class="pred" x="160" y="{y:.1}" width="{:.1}" height="11"/><rect class="meas" x="160" y="{:.1}" width="{:.1}" height="11"/><text class="tl" x="{:.1}" y="{:.1}">{} / {} ({err})</text>"#,
            y + 15.0,
            esc(&r.class),
            x.px(r.predicted_s) - 160.0,
            y + 12.0,
            x.px(r.measured_s) - 160.0,
            x.px(r.predicted_s.max(r.measured_s)) + 6.0,
            y + 15.0,
            secs(r.predicted_s),
            secs(r.measured_s)
        );
    }
    out.push_str(r#"</svg><table class="num"><thead><tr><th>class</th><th>predicted</th><th>measured</th><th>error</th></tr></thead><tbody>"#);
    for r in rows {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&r.class),
            secs(r.predicted_s),
            secs(r.measured_s),
            r.error_pct
                .map_or_else(|| "—".to_string(), |e| format!("{e:+.1}%"))
        );
    }
    out.push_str("</tbody></table></section>");
}
