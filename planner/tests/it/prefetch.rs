//! `backward_prefetch` changes when a backward all-gather runs in the
//! simulated step, not only where it sits in the instruction list, with the
//! trade-off PyTorch documents for `BackwardPrefetch`: `pre` overlaps the
//! next unit's all-gather with the current unit's gradient computation (least
//! exposed communication, highest peak), `post` issues it after the current
//! unit's gradient computation (less overlap, lower peak), `none` when it is
//! needed (most exposed communication, lowest peak).
//!
//! The model is a GPT whose gathers cross a slow link: 16 A100s on two nodes
//! joined by 25 GB/s RoCE per GPU, where gathering one block (50 MB) takes
//! about as long as computing its gradients. Its vocabulary puts the peak at
//! the turn from forward to backward, where `post` already holds the first
//! backward unit (gathered after the last forward unit is freed) and `pre`
//! holds the next one as well; with a much smaller vocabulary the peak falls
//! inside a backward unit, where `post` holds no more than `none`.

use crate::common;

use fsdpc_plan::*;
use fsdpc_planner::simulate::{simulate, Timeline};
use fsdpc_planner::*;

const GPT: &str = "gpt:layers=4,hidden=1024,heads=16,seq=512,vocab=24000,batch=2";

const SETTINGS: [BackwardPrefetch; 3] = [
    BackwardPrefetch::Pre,
    BackwardPrefetch::Post,
    BackwardPrefetch::None,
];

/// `GPT` at world 16, 8 ranks per node, with `backward_prefetch`.
fn plan(backward_prefetch: BackwardPrefetch) -> Plan {
    let (program, info) = common::program(GPT);
    let cluster = fsdpc_planner::preset("a100-80g-roce", 16, 8).expect("preset");
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            backward_prefetch,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    compile(program, info, &cluster, &cfg).expect("the GPT plans at world 16")
}

fn timeline(plan: &Plan) -> Timeline {
    simulate(plan, &plan.cluster)
}

#[test]
fn exposed_communication_falls_and_peak_rises_from_none_to_post_to_pre() {
    let plans = SETTINGS.map(plan);
    for (bp, p) in SETTINGS.iter().zip(&plans) {
        println!(
            "{bp:?}: step {:.2} ms, exposed communication {:.2} ms, peak {:.1} MiB",
            p.estimates.step_time_s * 1e3,
            p.estimates.exposed_comm_s * 1e3,
            p.memory.peak_bytes as f64 / (1 << 20) as f64
        );
    }
    let [pre, post, none] = &plans;
    let exposed = |p: &Plan| p.estimates.exposed_comm_s;
    assert!(
        exposed(pre) < exposed(post) && exposed(post) < exposed(none),
        "exposed communication pre {} post {} none {}",
        exposed(pre),
        exposed(post),
        exposed(none)
    );
    let peak = |p: &Plan| p.memory.peak_bytes;
    assert!(
        peak(pre) > peak(post) && peak(post) > peak(none),
        "peak pre {} post {} none {}",
        peak(pre),
        peak(post),
        peak(none)
    );
}

/// A backward all-gather in a simulated step.
struct Gather {
    unit: UnitId,
    start: f64,
    end: f64,
    /// When the previous window's gathered parameters are freed.
    prev_freed: f64,
}

/// The backward gathers (a unit's second; the root unit is gathered once),
/// each with the free of the window gathered just before it.
fn backward_gathers(plan: &Plan, tl: &Timeline) -> Vec<Gather> {
    let freed = |buffer: BufferId| {
        plan.instructions
            .iter()
            .position(|i| i.op == InstrOp::Free { buffer })
            .map(|j| tl.end[j])
            .expect("every gathered buffer is freed")
    };
    let mut seen = std::collections::HashSet::new();
    let mut prev: Option<BufferId> = None;
    let mut out = Vec::new();
    for (i, ins) in plan.instructions.iter().enumerate() {
        let InstrOp::AllGather {
            c: Collective { unit, dst, .. },
            ..
        } = ins.op
        else {
            continue;
        };
        if let (false, Some(p)) = (seen.insert(unit), prev) {
            out.push(Gather {
                unit,
                start: tl.start[i],
                end: tl.end[i],
                prev_freed: freed(p),
            });
        }
        prev = Some(dst);
    }
    out
}

/// Compute-stream kernel time inside `[start, end)`.
fn overlapped_compute(plan: &Plan, tl: &Timeline, start: f64, end: f64) -> f64 {
    plan.instructions
        .iter()
        .enumerate()
        .filter(|(_, i)| i.stream == Stream::Compute && matches!(i.op, InstrOp::Kernel { .. }))
        .map(|(j, _)| (tl.end[j].min(end) - tl.start[j].max(start)).max(0.0))
        .sum()
}

#[test]
fn each_setting_starts_backward_gathers_where_it_issues_them() {
    let mut overlap = Vec::new();
    for bp in SETTINGS {
        let plan = plan(bp);
        let tl = timeline(&plan);
        let gathers = backward_gathers(&plan, &tl);
        assert_eq!(gathers.len(), 4, "{bp:?}: one backward gather per block");
        let mut total = 0.0;
        for g in &gathers {
            let during = overlapped_compute(&plan, &tl, g.start, g.end);
            match bp {
                // Before the previous window's parameters are freed: while
                // its gradients are computed.
                BackwardPrefetch::Pre => assert!(
                    g.start < g.prev_freed && during > 0.0,
                    "pre: unit {} gathered at {} ({} s of compute under it), previous freed at {}",
                    g.unit,
                    g.start,
                    during,
                    g.prev_freed
                ),
                BackwardPrefetch::Post => assert!(
                    g.start >= g.prev_freed,
                    "post: unit {} gathered at {}, before the previous window's free at {}",
                    g.unit,
                    g.start,
                    g.prev_freed
                ),
                BackwardPrefetch::None => assert!(
                    g.start >= g.prev_freed && during == 0.0,
                    "none: unit {} gathered at {} with {} s of compute under it",
                    g.unit,
                    g.start,
                    during
                ),
            }
            total += during;
        }
        println!(
            "{bp:?}: {:.2} ms of compute under backward gathers",
            total * 1e3
        );
        overlap.push(total);
    }
    assert!(
        overlap[0] > overlap[1] && overlap[1] > overlap[2],
        "compute overlapped by backward gathers, pre/post/none: {overlap:?}"
    );
}

/// `GPT` at world 16 with forward prefetch on or off, a prefetch depth and
/// a rate limit.
fn plan_depth(forward_prefetch: bool, prefetch_depth: u32, limit_all_gathers: u32) -> Plan {
    let (program, info) = common::program(GPT);
    let cluster = fsdpc_planner::preset("a100-80g-roce", 16, 8).expect("preset");
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            forward_prefetch,
            prefetch_depth,
            limit_all_gathers,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    compile(program, info, &cluster, &cfg).expect("the GPT plans at world 16")
}

/// Instruction indices of the all-gathers and of the first compute
/// instruction reading each gathered buffer.
fn gather_lead(plan: &Plan) -> Vec<usize> {
    let mut leads = Vec::new();
    for (i, ins) in plan.instructions.iter().enumerate() {
        let InstrOp::AllGather {
            c: Collective { dst, .. },
            ..
        } = ins.op
        else {
            continue;
        };
        let first_use = plan.instructions[i..]
            .iter()
            .position(|x| x.stream == Stream::Compute && x.op.reads().contains(&dst))
            .expect("a gathered buffer is read");
        leads.push(first_use);
    }
    leads
}

/// Without forward prefetch every forward gather is issued at its unit's
/// first use, so compute waits for it: more exposed communication and no
/// more memory. A deeper prefetch (with a limiter that lets it) issues
/// gathers further ahead and holds more memory, and exposes less
/// communication than no prefetch; with the default limit of 2 the limiter
/// holds depth 3 back to what depth 1 does. (On this communication-bound
/// plan depth 3 does not beat depth 1: the unshard stream is busy either
/// way, and the overlap pass's layouts differ.)
#[test]
fn forward_prefetch_and_depth_trade_exposed_communication_for_memory() {
    let on = plan_depth(true, 1, 2);
    let off = plan_depth(false, 1, 2);
    let deep = plan_depth(true, 3, 4);
    let limited = plan_depth(true, 3, 2);
    for (name, p) in [
        ("on", &on),
        ("off", &off),
        ("depth 3 limit 4", &deep),
        ("depth 3 limit 2", &limited),
    ] {
        println!(
            "forward prefetch {name}: step {:.2} ms, exposed communication {:.2} ms, peak {:.1} MiB",
            p.estimates.step_time_s * 1e3,
            p.estimates.exposed_comm_s * 1e3,
            p.memory.peak_bytes as f64 / (1 << 20) as f64
        );
        p.validate().expect("validates");
    }
    assert!(off.estimates.exposed_comm_s > on.estimates.exposed_comm_s);
    assert!(off.memory.peak_bytes <= on.memory.peak_bytes);
    assert!(deep.estimates.exposed_comm_s < off.estimates.exposed_comm_s);
    assert!(deep.memory.peak_bytes > on.memory.peak_bytes);
    // Deeper prefetch issues gathers further ahead of their first use.
    let ahead = |p: &Plan| gather_lead(p).iter().sum::<usize>();
    assert!(ahead(&deep) > ahead(&on));
    assert!(ahead(&off) < ahead(&on));
    assert!(limited.memory.peak_bytes <= deep.memory.peak_bytes);
}
