//! A discrete-event simulation of the plan's streams: each instruction starts
//! when its stream is free and the events it waits on have been recorded;
//! gives the step time, the communication the compute stream waits on, and
//! the memory-over-time curve.

use crate::cluster::Cluster;
use crate::cost;
use crate::plan::*;

/// Start and end time of every instruction, and totals.
#[derive(Clone, Debug, Default)]
pub struct Timeline {
    pub start: Vec<f64>,
    pub end: Vec<f64>,
    pub step_time_s: f64,
    /// Time the compute stream spends blocked in `Wait`s.
    pub exposed_comm_s: f64,
    pub comm_bytes: u64,
    /// FLOPs of every kernel, recomputation included.
    pub flops: f64,
    /// FLOPs of the model: `flops` less activation-checkpointing
    /// recomputation (what MFU counts).
    pub model_flops: f64,
}

/// Simulates one step of `plan` on `cluster`.
pub fn simulate(plan: &Plan, cluster: &Cluster) -> Timeline {
    let mut t = [0f64; Stream::ALL.len()];
    let mut event = vec![0f64; plan.events as usize];
    let mut tl = Timeline::default();
    for ins in &plan.instructions {
        let s = ins.stream.index();
        match ins.op {
            InstrOp::Wait { event: e } => {
                let ready = event.get(e.index()).copied().unwrap_or(0.0);
                if ready > t[s] && ins.stream == Stream::Compute {
                    tl.exposed_comm_s += ready - t[s];
                }
                t[s] = t[s].max(ready);
            }
            InstrOp::Record { event: e } => {
                if let Some(slot) = event.get_mut(e.index()) {
                    *slot = t[s];
                }
            }
            _ => {}
        }
        let (dt, bytes) = cost::instr_cost(plan, cluster, ins);
        tl.start.push(t[s]);
        t[s] += dt;
        tl.end.push(t[s]);
        tl.comm_bytes += bytes;
        if let InstrOp::Kernel { node, .. } = ins.op {
            let g = &plan.training.graph;
            if let Some(n) = g.try_node(node) {
                let flops = cost::node_flops(g, node);
                tl.flops += flops;
                if !crate::checkpoint::is_recompute(n) {
                    tl.model_flops += flops;
                }
            }
        }
    }
    tl.step_time_s = t.iter().copied().fold(0.0, f64::max);
    tl
}

/// The plan's estimates on its own cluster record.
pub fn estimate(plan: &Plan) -> Estimates {
    estimate_on(plan, &Cluster::from_info(&plan.cluster))
}

/// What `fsdpc simulate` reports: the estimates of a plan on a cluster and
/// how busy each stream is.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Simulation {
    /// The cluster's name (a preset or a cluster file's `name`).
    pub cluster: String,
    pub world: u32,
    pub step_time_s: f64,
    pub exposed_comm_s: f64,
    pub tflops_per_rank: f64,
    pub mfu: f64,
    pub peak_bytes_per_rank: u64,
    pub comm_bytes_per_step: u64,
    /// Per stream: the fraction of the step it runs instructions.
    pub busy: Vec<(Stream, f64)>,
}

/// Simulates `plan` on `cluster` (the plan's world and shape; the
/// cluster's speeds).
pub fn run(plan: &Plan, cluster: &Cluster) -> Simulation {
    let tl = simulate(plan, cluster);
    let e = estimates(plan, cluster, &tl);
    let busy = Stream::ALL
        .iter()
        .map(|&s| {
            let t: f64 = plan
                .instructions
                .iter()
                .enumerate()
                .filter(|(_, ins)| ins.stream == s)
                .map(|(i, _)| tl.end[i] - tl.start[i])
                .sum();
            (
                s,
                if tl.step_time_s > 0.0 {
                    t / tl.step_time_s
                } else {
                    0.0
                },
            )
        })
        .collect();
    Simulation {
        cluster: cluster.preset.clone(),
        world: plan.cluster.world,
        step_time_s: e.step_time_s,
        exposed_comm_s: e.exposed_comm_s,
        tflops_per_rank: e.tflops_per_rank,
        mfu: e.mfu,
        peak_bytes_per_rank: e.peak_bytes_per_rank,
        comm_bytes_per_step: e.comm_bytes_per_step,
        busy,
    }
}

/// The plan's estimates on `cluster`.
pub fn estimate_on(plan: &Plan, cluster: &Cluster) -> Estimates {
    let tl = simulate(plan, cluster);
    estimates(plan, cluster, &tl)
}

fn estimates(plan: &Plan, cluster: &Cluster, tl: &Timeline) -> Estimates {
    let peak = cluster.hardware.peak_flops(plan.config.param_dtype);
    let achieved = if tl.step_time_s > 0.0 {
        tl.model_flops / tl.step_time_s
    } else {
        0.0
    };
    Estimates {
        peak_bytes_per_rank: plan.memory.peak_bytes,
        comm_bytes_per_step: tl.comm_bytes,
        flops_per_rank_step: tl.flops,
        step_time_s: tl.step_time_s,
        exposed_comm_s: tl.exposed_comm_s,
        tflops_per_rank: achieved / 1e12,
        mfu: if peak > 0.0 { achieved / peak } else { 0.0 },
    }
}

/// Live bytes over simulated time: one `(time_s, bytes)` point per
/// instruction, at its start.
pub fn memory_curve(plan: &Plan, cluster: &Cluster) -> Vec<(f64, u64)> {
    let tl = simulate(plan, cluster);
    let live = crate::memory::live_bytes(&plan.buffers, plan.instructions.len());
    tl.start.into_iter().zip(live).collect()
}
