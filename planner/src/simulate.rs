//! A discrete-event simulation of the plan's streams: each instruction starts
//! when its stream is free and the events it waits on have been recorded
//! (a `Wait` waits for the latest `Record` of its event before it in the
//! instruction list); gives the step time, the communication the compute
//! stream waits on, and the memory-over-time curve.
//!
//! Contention: on a cluster whose ranks share cores with their own
//! collectives (`Hardware::comm_compute_contention`), a collective and a
//! kernel on other streams slow each other while both run: each progresses
//! at `1 / slowdown` of its speed alone for the overlap, with the factors
//! measured for one collective beside a kernel, two beside a kernel
//! (backward's prefetch and reduction) and two beside each other
//! (`Contention::rates`). Work that does not overlap runs at full speed. Without contention the simulation is one
//! pass over the instructions; with it, a deterministic event loop over
//! the streams' progress (`schedule`). Seconds throughout.

use crate::cost;
use fsdpc_plan::cluster::{Cluster, Contention};
use fsdpc_plan::*;

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
    let mut tl = Timeline::default();
    let costs = costs(plan, cluster);
    match &cluster.hardware.comm_compute_contention {
        Some(c) if c.slows() => {
            let items = items(plan, &costs);
            let s = schedule(&items, c);
            tl.start = s.start;
            tl.end = s.end;
            tl.exposed_comm_s = s.exposed_s;
        }
        _ => one_pass(plan, &costs, &mut tl),
    }
    for (ins, (_, bytes)) in plan.instructions.iter().zip(&costs) {
        tl.comm_bytes += bytes;
        if let InstrOp::Kernel { node, .. } = ins.op {
            let g = &plan.training.graph;
            if let Some(n) = g.try_node(node) {
                let flops = cost::node_flops(g, node);
                tl.flops += flops;
                if !crate::recompute::is_recompute(n) {
                    tl.model_flops += flops;
                }
            }
        }
    }
    tl.step_time_s = tl.end.iter().copied().fold(0.0, f64::max);
    tl
}

/// Whether `simulate` slows overlapping work on `cluster` (contention
/// factors above 1), so that its event loop, not one pass, gives the step.
pub fn contends(cluster: &Cluster) -> bool {
    cluster
        .hardware
        .comm_compute_contention
        .as_ref()
        .is_some_and(Contention::slows)
}

/// Seconds of work on the plan's busiest stream, each instruction at its
/// cost alone: no schedule of these instructions takes less.
pub fn busiest_stream_s(plan: &Plan, cluster: &Cluster) -> f64 {
    let costs = costs(plan, cluster);
    busiest(plan, &costs)
}

/// What bounds a plan's step before memory planning adds its fences
/// (`bounds`).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct Bounds {
    /// The busiest stream's work, each instruction at its cost alone: no
    /// schedule of these instructions takes less, with contention or not.
    pub busy_s: f64,
    /// Without contention, the streams' work with only its data
    /// dependencies: each stream runs its instructions in its order, and
    /// an instruction starts once its stream is free and the last writer
    /// of every buffer it reads has finished; `Wait`s are ignored; a
    /// gather that could be in a bucket (`bucketable_gather`) is charged
    /// its transfer without the call's latency, as a bucket's member is.
    /// Every plan whose streams run the same collectives and kernels in
    /// the same orders, whatever it waits for (prefetch, rate limits,
    /// fences) and however it buckets its gathers, takes at least this.
    /// With contention, the busiest stream's work so charged.
    pub relaxed_s: f64,
    /// Without contention, the simulated step of the plan as it is (its
    /// waits, no fences yet): memory planning only adds waits, so the
    /// compiled step is at least this. With contention, `busy_s`.
    pub step_s: f64,
}

/// The bounds of `plan`'s step on `cluster` (`Bounds`), from one pass over
/// its costs.
pub fn bounds(plan: &Plan, cluster: &Cluster) -> Bounds {
    let costs = costs(plan, cluster);
    let busy_s = busiest(plan, &costs);
    let unbucketed = unbucketed(plan, cluster, &costs);
    if contends(cluster) {
        return Bounds {
            busy_s,
            relaxed_s: busiest(plan, &unbucketed),
            step_s: busy_s,
        };
    }
    let mut tl = Timeline::default();
    one_pass(plan, &costs, &mut tl);
    Bounds {
        busy_s,
        relaxed_s: relaxed(plan, &unbucketed),
        step_s: tl.end.iter().copied().fold(0.0, f64::max),
    }
}

/// `costs` with every gather that could be in a bucket
/// (`bucketable_gather`) charged as a bucket's member is: its transfer
/// without the call's latency.
fn unbucketed(plan: &Plan, cluster: &Cluster, costs: &[(f64, u64)]) -> Vec<(f64, u64)> {
    plan.instructions
        .iter()
        .zip(costs)
        .map(|(ins, &cost)| match &ins.op {
            InstrOp::AllGather { c, bucketed: false }
                if bucketable_gather(&ins.op, &plan.buffers).is_some() =>
            {
                let member = Instr {
                    stream: ins.stream,
                    op: InstrOp::AllGather {
                        c: c.clone(),
                        bucketed: true,
                    },
                };
                cost::instr_cost(plan, cluster, &member)
            }
            _ => cost,
        })
        .collect()
}

fn costs(plan: &Plan, cluster: &Cluster) -> Vec<(f64, u64)> {
    plan.instructions
        .iter()
        .map(|ins| cost::instr_cost(plan, cluster, ins))
        .collect()
}

fn busiest(plan: &Plan, costs: &[(f64, u64)]) -> f64 {
    let mut busy = [0f64; Stream::ALL.len()];
    for (ins, &(dt, _)) in plan.instructions.iter().zip(costs) {
        busy[ins.stream.index()] += dt;
    }
    busy.into_iter().fold(0.0, f64::max)
}

/// `Bounds::relaxed_s` without contention, from `unbucketed` costs.
fn relaxed(plan: &Plan, costs: &[(f64, u64)]) -> f64 {
    let mut t = [0f64; Stream::ALL.len()];
    let mut ready = vec![0f64; plan.buffers.len()];
    for (ins, &(dt, _)) in plan.instructions.iter().zip(costs) {
        if matches!(ins.op, InstrOp::Wait { .. } | InstrOp::Record { .. }) {
            continue;
        }
        let s = ins.stream.index();
        let start = ins
            .op
            .reads()
            .into_iter()
            .filter_map(|b| ready.get(b.index()).copied())
            .fold(t[s], f64::max);
        t[s] = start + dt;
        for b in ins.op.writes() {
            if let Some(r) = ready.get_mut(b.index()) {
                *r = t[s];
            }
        }
    }
    t.into_iter().fold(0.0, f64::max)
}

/// Seconds of the compute stream's kernels and tensor-parallel
/// collectives, each at its cost alone: what every plan of the same
/// prepared program (`crate::Prepared`) runs on its compute stream,
/// whatever its strategy, sharding factor, offload and schedule knobs, so
/// a bound on the step of each.
pub fn program_work_s(plan: &Plan, cluster: &Cluster) -> f64 {
    plan.instructions
        .iter()
        .filter(|ins| {
            ins.stream == Stream::Compute
                && matches!(
                    ins.op,
                    InstrOp::Kernel { .. }
                        | InstrOp::TensorAllReduce { .. }
                        | InstrOp::TensorChunks { .. }
                )
        })
        .map(|ins| cost::instr_cost(plan, cluster, ins).0)
        .sum()
}

/// The simulation without contention: one pass in instruction order.
fn one_pass(plan: &Plan, costs: &[(f64, u64)], tl: &mut Timeline) {
    let mut t = [0f64; Stream::ALL.len()];
    let mut event = vec![0f64; plan.events as usize];
    for (ins, &(dt, _)) in plan.instructions.iter().zip(costs) {
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
        tl.start.push(t[s]);
        t[s] += dt;
        tl.end.push(t[s]);
    }
}

/// What an instruction occupies, for contention.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Work {
    /// A collective: the communicator's copies and reductions.
    Comm,
    /// A kernel or another computation on the rank's cores.
    Compute,
    /// Neither (bookkeeping, host copies).
    Other,
}

/// One instruction as the event loop sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    /// Index of its stream (`Stream::index`).
    pub stream: usize,
    /// Seconds it takes alone.
    pub work: f64,
    pub kind: Work,
    /// For a `Wait`: the item (the latest `Record` of its event before it)
    /// whose completion it waits for.
    pub waits_for: Option<usize>,
    /// Whether blocking here counts as exposed communication (a `Wait` on
    /// the compute stream).
    pub exposed: bool,
}

/// The plan's instructions as event-loop items.
fn items(plan: &Plan, costs: &[(f64, u64)]) -> Vec<Item> {
    let mut last_record = vec![None; plan.events as usize];
    let mut out = Vec::with_capacity(plan.instructions.len());
    for (i, (ins, &(work, _))) in plan.instructions.iter().zip(costs).enumerate() {
        let mut waits_for = None;
        let kind = match ins.op {
            InstrOp::Wait { event } => {
                waits_for = last_record.get(event.index()).copied().flatten();
                Work::Other
            }
            InstrOp::Record { event } => {
                if let Some(slot) = last_record.get_mut(event.index()) {
                    *slot = Some(i);
                }
                Work::Other
            }
            InstrOp::AllGather { .. }
            | InstrOp::ReduceScatter { .. }
            | InstrOp::AllReduce { .. }
            | InstrOp::NormAllReduce { .. }
            | InstrOp::FoundInfAllReduce { .. } => Work::Comm,
            InstrOp::Copy { .. } | InstrOp::Free { .. } => Work::Other,
            _ => Work::Compute,
        };
        out.push(Item {
            stream: ins.stream.index(),
            work,
            kind,
            waits_for,
            exposed: matches!(ins.op, InstrOp::Wait { .. }) && ins.stream == Stream::Compute,
        });
    }
    out
}

/// Start and end of every item of an event-loop schedule, and the time
/// items marked `exposed` spent blocked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Schedule {
    pub start: Vec<f64>,
    pub end: Vec<f64>,
    pub exposed_s: f64,
}

/// The event loop: every stream runs its items in list order; a `Wait`
/// item starts once the item it waits for has ended; while `Comm` items
/// run beside each other or beside a `Compute` item, each progresses at
/// the rate `Contention::rates` gives for how many run. An item
/// waiting for one that never ends (not in a valid plan) is released at the
/// time every stream is stuck, so the loop always ends.
pub fn schedule(items: &[Item], contention: &Contention) -> Schedule {
    let streams = items.iter().map(|it| it.stream + 1).max().unwrap_or(0);
    let mut queues: Vec<Vec<usize>> = vec![Vec::new(); streams];
    for (i, it) in items.iter().enumerate() {
        queues[it.stream].push(i);
    }
    let mut next = vec![0usize; streams];
    // Per stream: the running item and its remaining work (seconds alone).
    let mut running: Vec<Option<(usize, f64)>> = vec![None; streams];
    let mut free_since = vec![0f64; streams];
    let mut done = vec![false; items.len()];
    let mut out = Schedule {
        start: vec![0.0; items.len()],
        end: vec![0.0; items.len()],
        exposed_s: 0.0,
    };
    let mut now = 0.0f64;
    let mut release = false;
    loop {
        // Start (and finish, when they take no time) every item that can.
        let mut progressed = true;
        while progressed {
            progressed = false;
            for s in 0..streams {
                while running[s].is_none() {
                    let Some(&i) = queues[s].get(next[s]) else {
                        break;
                    };
                    let it = &items[i];
                    if let Some(w) = it.waits_for {
                        if !done.get(w).copied().unwrap_or(true) && !release {
                            break;
                        }
                    }
                    if it.exposed {
                        out.exposed_s += now - free_since[s];
                    }
                    out.start[i] = now;
                    next[s] += 1;
                    progressed = true;
                    if it.work > 0.0 {
                        running[s] = Some((i, it.work));
                    } else {
                        out.end[i] = now;
                        done[i] = true;
                        free_since[s] = now;
                    }
                }
            }
        }
        release = false;
        let active: Vec<usize> = (0..streams).filter(|&s| running[s].is_some()).collect();
        if active.is_empty() {
            if (0..streams).all(|s| next[s] >= queues[s].len()) {
                break;
            }
            release = true;
            continue;
        }
        let runs = |k: Work| {
            active
                .iter()
                .filter(|&&s| running[s].is_some_and(|(i, _)| items[i].kind == k))
                .count()
        };
        let (comm_rate, compute_rate) = contention.rates(runs(Work::Comm), runs(Work::Compute) > 0);
        let rate = |k: Work| match k {
            Work::Comm => comm_rate,
            Work::Compute => compute_rate,
            Work::Other => 1.0,
        };
        let dt = active
            .iter()
            .filter_map(|&s| running[s].map(|(i, rem)| rem / rate(items[i].kind)))
            .fold(f64::INFINITY, f64::min);
        now += dt;
        for &s in &active {
            if let Some((i, rem)) = running[s] {
                let left = rem - dt * rate(items[i].kind);
                if left <= items[i].work * 1e-12 {
                    running[s] = None;
                    out.end[i] = now;
                    done[i] = true;
                    free_since[s] = now;
                } else {
                    running[s] = Some((i, left));
                }
            }
        }
    }
    out
}

/// The plan's estimates on its own cluster record.
pub fn estimate(plan: &Plan) -> Estimates {
    estimate_on(plan, &plan.cluster)
}

/// What `fsdpc simulate` reports: the estimates of a plan on a cluster and
/// how busy each stream is.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Simulation {
    /// The cluster's name (a preset or a cluster file's `name`).
    pub cluster: String,
    /// Whose kernels the operators were priced as (`fsdpc`,
    /// `pytorch-eager`).
    pub kernels: &'static str,
    pub world: u32,
    pub step_time_s: f64,
    pub exposed_comm_s: f64,
    /// Model FLOP/s per rank, in TFLOP/s (recomputation not counted).
    pub tflops_per_rank: f64,
    /// Model FLOPs utilisation (recomputation not counted).
    pub mfu: f64,
    /// Hardware FLOPs utilisation (recomputation counted).
    pub hfu: f64,
    /// Model FLOPs per rank and step (recomputation not counted).
    pub model_flops_per_rank_step: f64,
    /// Executed FLOPs per rank and step (recomputation counted).
    pub executed_flops_per_rank_step: f64,
    pub peak_bytes_per_rank: u64,
    /// On a cluster of GPUs, the device memory a rank holds outside the
    /// arena (`MemorySummary::outside_arena`), counted with the peak
    /// against the capacity.
    pub outside_arena_bytes: u64,
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
                // From +0.0: `sum` of nothing is -0.0, printed "-0.0%".
                .fold(0.0, |a, b| a + b);
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
        cluster: cluster.name.clone(),
        kernels: cluster.kernels.name(),
        world: plan.cluster.world,
        step_time_s: e.step_time_s,
        exposed_comm_s: e.exposed_comm_s,
        tflops_per_rank: e.tflops_per_rank,
        mfu: e.mfu,
        hfu: e.hfu,
        model_flops_per_rank_step: e.model_flops_per_rank_step,
        executed_flops_per_rank_step: e.flops_per_rank_step,
        peak_bytes_per_rank: e.peak_bytes_per_rank,
        outside_arena_bytes: crate::device::outside_arena(plan, &cluster.hardware)
            .iter()
            .map(|o| o.bytes)
            .sum(),
        comm_bytes_per_step: e.comm_bytes_per_step,
        busy,
    }
}

/// The plan's estimates on `cluster`.
pub fn estimate_on(plan: &Plan, cluster: &Cluster) -> Estimates {
    let tl = simulate(plan, cluster);
    estimates(plan, cluster, &tl)
}

/// The estimates of `plan` from its simulated timeline `tl` on `cluster`.
pub fn estimates(plan: &Plan, cluster: &Cluster, tl: &Timeline) -> Estimates {
    let peak = cluster.hardware.peak_flops(plan.config.param_dtype);
    let per_s = |flops: f64| {
        if tl.step_time_s > 0.0 {
            flops / tl.step_time_s
        } else {
            0.0
        }
    };
    let of_peak = |rate: f64| if peak > 0.0 { rate / peak } else { 0.0 };
    let (model, executed) = (per_s(tl.model_flops), per_s(tl.flops));
    Estimates {
        peak_bytes_per_rank: plan.memory.peak_bytes,
        comm_bytes_per_step: tl.comm_bytes,
        flops_per_rank_step: tl.flops,
        model_flops_per_rank_step: tl.model_flops,
        step_time_s: tl.step_time_s,
        exposed_comm_s: tl.exposed_comm_s,
        tflops_per_rank: model / 1e12,
        mfu: of_peak(model),
        hfu: of_peak(executed),
        eval_s: eval_time(plan, tl),
    }
}

/// The simulated time of one evaluation batch (`Estimates::eval_s`): the
/// latest end of an instruction of the evaluation prefix (`eval::prefix`
/// of the instruction list `tl` simulated) in `tl`; 0 without one.
pub fn eval_time(plan: &Plan, tl: &Timeline) -> f64 {
    let n = crate::eval::prefix(plan).map_or(0, |e| e.instructions as usize);
    tl.end.iter().take(n).fold(0.0, |a: f64, &b| a.max(b))
}

/// Live bytes over simulated time: one `(time_s, bytes)` point per
/// instruction, at its start.
pub fn memory_curve(plan: &Plan, cluster: &Cluster) -> Vec<(f64, u64)> {
    let tl = simulate(plan, cluster);
    let live = fsdpc_plan::memory::live_bytes(&plan.buffers, plan.instructions.len());
    tl.start.into_iter().zip(live).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(stream: usize, work: f64, kind: Work, waits_for: Option<usize>) -> Item {
        Item {
            stream,
            work,
            kind,
            waits_for,
            exposed: false,
        }
    }

    #[test]
    fn contention_slows_only_the_overlap() {
        // A kernel (1 s alone) and a collective (1 s alone) on two streams
        // at once, the collective x2 slower and the kernel x1.5 beside each
        // other: the kernel ends at 1.5 s, when the collective has done
        // 0.75 s of its work; the rest runs alone, to 1.75 s.
        let both = [
            item(0, 1.0, Work::Compute, None),
            item(1, 1.0, Work::Comm, None),
        ];
        let s = schedule(&both, &slow(2.0, 1.5));
        assert_eq!(s.start, vec![0.0, 0.0]);
        assert!((s.end[0] - 1.5).abs() < 1e-12, "{:?}", s.end);
        assert!((s.end[1] - 1.75).abs() < 1e-12, "{:?}", s.end);
        // Without contention both end at 1 s.
        let s = schedule(&both, &slow(1.0, 1.0));
        assert_eq!(s.end, vec![1.0, 1.0]);
        // The same two in sequence (the collective waits for a record after
        // the kernel): no overlap, no slowdown.
        let seq = [
            item(0, 1.0, Work::Compute, None),
            item(0, 0.0, Work::Other, None),
            Item {
                exposed: true,
                ..item(1, 0.0, Work::Other, Some(1))
            },
            item(1, 1.0, Work::Comm, None),
        ];
        let s = schedule(&seq, &slow(2.0, 1.5));
        assert_eq!(s.end[0], 1.0);
        assert_eq!(s.start[3], 1.0);
        assert_eq!(s.end[3], 2.0);
        assert_eq!(s.exposed_s, 1.0);
    }

    #[test]
    fn two_kernels_do_not_contend() {
        let s = schedule(
            &[
                item(0, 1.0, Work::Compute, None),
                item(1, 2.0, Work::Compute, None),
            ],
            &slow(3.0, 3.0),
        );
        assert_eq!(s.end, vec![1.0, 2.0]);
    }

    #[test]
    fn two_collectives_beside_a_kernel_use_their_own_factors() {
        // An all-gather and a reduce-scatter (1 s alone each) beside a
        // kernel (1 s alone): x4 each and the kernel x2 while all three
        // run; the kernel ends at 2 s with each collective half done,
        // then the two beside each other (x1.5 each) end at 2.75 s.
        let three = [
            item(0, 1.0, Work::Compute, None),
            item(1, 1.0, Work::Comm, None),
            item(2, 1.0, Work::Comm, None),
        ];
        let c = Contention {
            two_comm_slowdown: 4.0,
            two_compute_slowdown: 2.0,
            comm_pair_slowdown: 1.5,
            ..slow(2.0, 1.5)
        };
        let s = schedule(&three, &c);
        assert!((s.end[0] - 2.0).abs() < 1e-12, "{:?}", s.end);
        assert!((s.end[1] - 2.75).abs() < 1e-12, "{:?}", s.end);
        assert!((s.end[2] - 2.75).abs() < 1e-12, "{:?}", s.end);
        // Unmeasured (0), they fall back to the one-collective factors and
        // no pair slowdown: the kernel at 1.5 s, each collective 0.75 s
        // done, then 0.25 s alone.
        let s = schedule(&three, &slow(2.0, 1.5));
        assert!((s.end[0] - 1.5).abs() < 1e-12, "{:?}", s.end);
        assert!((s.end[1] - 1.75).abs() < 1e-12, "{:?}", s.end);
    }

    fn slow(comm_slowdown: f64, compute_slowdown: f64) -> Contention {
        Contention {
            comm_slowdown,
            compute_slowdown,
            ..Contention::default()
        }
    }
}
