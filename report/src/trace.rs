//! Chrome / Perfetto traces of a plan's step: the simulated one
//! (`chrome_trace`, `fsdpc trace`) and a measured one (`measured_trace`,
//! `fsdpc train --trace`), in one format so they open side by side in
//! ui.perfetto.dev or chrome://tracing and `compare` can read both.
//!
//! Conventions: times in microseconds; one process per rank (`pid` = the
//! rank; the predicted trace is rank 0, any rank of the SPMD plan) and one
//! thread per stream (`tid` = `Stream::index`); every instruction a
//! complete event ("X") named by `slice_name`, its `args` holding `instr`
//! (index in the plan), `unit`, `bytes` (`instr_bytes`), `class`
//! (`instr_class`), `stream`, and in a measured trace the `step`; a counter
//! ("C") "live memory (bytes)" per rank: in the predicted trace the plan's
//! live buffer bytes, in a measured one the rank's heap bytes counted by
//! the runtime's allocator at the end of each instruction. `otherData`
//! names the kind of trace and the plan it came from (`plan_identity`).

use fsdpc_plan::{Collective, InstrOp, Plan};
use fsdpc_planner::simulate::simulate;
use serde_json::{json, Value};

/// `otherData.fsdpc_trace` of a trace `chrome_trace` writes.
pub const PREDICTED: &str = "predicted";
/// `otherData.fsdpc_trace` of a trace `measured_trace` writes.
pub const MEASURED: &str = "measured";

/// The trace of one simulated step of `plan` on its own cluster record, in the
/// Chrome trace-event JSON format (times in microseconds).
pub fn chrome_trace(plan: &Plan) -> Value {
    let cluster = plan.cluster.clone();
    let tl = simulate(plan, &cluster);
    let live = fsdpc_plan::memory::live_bytes(&plan.buffers, plan.instructions.len());
    let name = format!("{} rank (any of {})", plan.model.name, plan.cluster.world);
    let mut events = thread_names(plan, 0, &name);
    // The simulator starts a wait when its event is ready; the slice spans
    // the time the stream was blocked, from its previous instruction's end,
    // as a measured wait does.
    let mut stream_end = [0f64; fsdpc_plan::Stream::ALL.len()];
    for (i, ins) in plan.instructions.iter().enumerate() {
        let end = tl.end[i] * 1e6;
        let prev = stream_end.get(ins.stream.index()).copied().unwrap_or(0.0);
        let start = match ins.op {
            InstrOp::Wait { .. } => prev.min(end),
            _ => tl.start[i] * 1e6,
        };
        if let Some(e) = stream_end.get_mut(ins.stream.index()) {
            *e = end;
        }
        events.push(slice(plan, i, 0, start, end, None));
        if let Some(bytes) = live.get(i) {
            events.push(counter(0, start, *bytes as i64));
        }
    }
    json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": { "fsdpc_trace": PREDICTED, "plan": plan_identity(plan) },
    })
}

/// One measured instruction (`measured_trace`'s input).
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct MeasuredSpan {
    /// The rank that ran it.
    pub rank: usize,
    /// The step it belonged to.
    pub step: u64,
    /// Its index in the plan's instruction list.
    pub instr: usize,
    /// Start and end, seconds since any origin shared by the spans.
    pub start_s: f64,
    pub end_s: f64,
    /// The rank's live heap bytes at its end, if measured.
    pub live_bytes: Option<i64>,
}

/// A measured run of `plan` as a trace in the format of `chrome_trace`:
/// one process per rank, times from the earliest span. A span naming an
/// instruction the plan does not have is an error.
pub fn measured_trace(plan: &Plan, spans: &[MeasuredSpan]) -> Result<Value, String> {
    let origin = spans
        .iter()
        .map(|s| s.start_s)
        .fold(f64::INFINITY, f64::min);
    let mut ranks: Vec<usize> = spans.iter().map(|s| s.rank).collect();
    ranks.sort_unstable();
    ranks.dedup();
    let mut events = Vec::with_capacity(2 * spans.len() + 8 * ranks.len());
    for &r in &ranks {
        events.extend(thread_names(
            plan,
            r,
            &format!("{} rank {r}", plan.model.name),
        ));
    }
    for s in spans {
        if s.instr >= plan.instructions.len() {
            return Err(format!(
                "rank {} ran instruction {}, the plan has {}",
                s.rank,
                s.instr,
                plan.instructions.len()
            ));
        }
        let (start, end) = ((s.start_s - origin) * 1e6, (s.end_s - origin) * 1e6);
        events.push(slice(plan, s.instr, s.rank, start, end, Some(s.step)));
        if let Some(bytes) = s.live_bytes {
            events.push(counter(s.rank, end, bytes));
        }
    }
    Ok(json!({
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": { "fsdpc_trace": MEASURED, "plan": plan_identity(plan) },
    }))
}

/// What identifies the plan a trace came from, for `compare` to refuse
/// traces of different plans: its model, world, strategy and the sizes of
/// its instruction list, buffers and events.
pub fn plan_identity(plan: &Plan) -> Value {
    json!({
        "model": plan.model.name,
        "world": plan.cluster.world,
        "strategy": plan.config.strategy.name(),
        "instructions": plan.instructions.len(),
        "buffers": plan.buffers.len(),
        "events": plan.events,
    })
}

/// Instruction `i` as a complete event on rank `pid`'s track of its stream.
fn slice(plan: &Plan, i: usize, pid: usize, start: f64, end: f64, step: Option<u64>) -> Value {
    let ins = &plan.instructions[i];
    let stream = format!("{:?}", ins.stream).to_lowercase();
    let mut args = json!({
        "instr": i,
        "unit": instr_unit(&ins.op),
        "bytes": instr_bytes(plan, &ins.op),
        "class": instr_class(plan, ins),
        "stream": stream,
    });
    if let Some(step) = step {
        args["step"] = json!(step);
    }
    json!({
        "name": slice_name(plan, &ins.op),
        "cat": stream,
        "ph": "X",
        "ts": start,
        "dur": end - start,
        "pid": pid,
        "tid": ins.stream.index(),
        "args": args,
    })
}

fn counter(pid: usize, ts: f64, bytes: i64) -> Value {
    json!({
        "name": "live memory (bytes)", "ph": "C", "ts": ts, "pid": pid,
        "args": { "bytes": bytes },
    })
}

fn thread_names(plan: &Plan, pid: usize, name: &str) -> Vec<Value> {
    let mut v = vec![json!({
        "name": "process_name", "ph": "M", "pid": pid,
        "args": { "name": name },
    })];
    for s in &plan.streams {
        v.push(json!({
            "name": "thread_name", "ph": "M", "pid": pid, "tid": s.index(),
            "args": { "name": format!("{s:?}").to_lowercase() },
        }));
    }
    v
}

/// The classes `instr_class` sorts instructions into, in report order.
pub const CLASSES: [&str; 9] = [
    "matmul",
    "kernel",
    "all_gather",
    "reduce_scatter",
    "all_reduce",
    "copy",
    "exposed_wait",
    "wait",
    "other",
];

/// What an instruction is, for comparing predicted and measured time:
/// `matmul` (matrix-product kernels), `kernel` (every other kernel, the
/// optimizer, accumulation, clipping and loss-scaling arithmetic), one
/// class per collective kind (`all_gather`, `reduce_scatter`, `all_reduce`,
/// the last including the grad-norm and found-inf scalars), `copy`
/// (offload copies and reshard slices), `exposed_wait` (the compute stream
/// blocked on an event: exposed communication), `wait` (another stream
/// blocked: idle) and `other` (data loading, records, frees).
pub fn instr_class(plan: &Plan, ins: &fsdpc_plan::Instr) -> &'static str {
    let op = &ins.op;
    match op {
        InstrOp::Kernel { node, .. } => {
            let matmul = plan
                .training
                .graph
                .try_node(*node)
                .is_some_and(|n| matches!(n.op, fsdpc_ir::Op::MatMul { .. }));
            if matmul {
                "matmul"
            } else {
                "kernel"
            }
        }
        InstrOp::AllGather { .. }
        | InstrOp::TensorChunks {
            kind: fsdpc_plan::ChunkKind::Gather,
            ..
        } => "all_gather",
        InstrOp::ReduceScatter { .. }
        | InstrOp::TensorChunks {
            kind: fsdpc_plan::ChunkKind::ReduceScatter,
            ..
        } => "reduce_scatter",
        InstrOp::TensorChunks {
            kind: fsdpc_plan::ChunkKind::Split,
            ..
        } => "copy",
        InstrOp::AllReduce { .. }
        | InstrOp::NormAllReduce { .. }
        | InstrOp::FoundInfAllReduce { .. }
        | InstrOp::TensorAllReduce { .. } => "all_reduce",
        InstrOp::Copy { .. } | InstrOp::Reshard { .. } | InstrOp::WriteBuffer { .. } => "copy",
        InstrOp::Accumulate { .. }
        | InstrOp::OptimizerStep { .. }
        | InstrOp::GradNormSq { .. }
        | InstrOp::ClipGrads { .. }
        | InstrOp::ScaleSeed { .. }
        | InstrOp::UnscaleGrads { .. }
        | InstrOp::UpdateScale { .. } => "kernel",
        InstrOp::Wait { .. } if ins.stream == fsdpc_plan::Stream::Compute => "exposed_wait",
        InstrOp::Wait { .. } => "wait",
        InstrOp::LoadInput { .. } | InstrOp::Free { .. } | InstrOp::Record { .. } => "other",
    }
}

/// The unit an instruction works for, if any.
fn instr_unit(op: &InstrOp) -> Option<u32> {
    match op {
        InstrOp::AllGather {
            c: Collective { unit, .. },
            ..
        }
        | InstrOp::ReduceScatter {
            c: Collective { unit, .. },
        }
        | InstrOp::Reshard { unit, .. }
        | InstrOp::AllReduce { unit, .. }
        | InstrOp::OptimizerStep { unit, .. }
        | InstrOp::ClipGrads { unit, .. }
        | InstrOp::Copy { unit, .. } => Some(unit.0),
        InstrOp::Accumulate { unit, .. } => unit.map(|u| u.0),
        _ => None,
    }
}

/// The bytes an instruction moves: a kernel's inputs and outputs
/// (`cost::node_bytes`), a collective's or copy's full buffer (gathered
/// parameter, unreduced gradient, reduced buffer, copied shard), an
/// optimizer step's parameter shard; 0 for the rest.
pub fn instr_bytes(plan: &Plan, op: &InstrOp) -> u64 {
    let buf = |b: &fsdpc_plan::BufferId| plan.buffers.get(b.index()).map_or(0, |b| b.bytes);
    match op {
        InstrOp::Kernel { node, .. } => match plan.training.graph.try_node(*node) {
            Some(_) => fsdpc_planner::cost::node_bytes(&plan.training.graph, *node) as u64,
            None => 0,
        },
        InstrOp::AllGather {
            c: Collective { dst, .. },
            ..
        }
        | InstrOp::Reshard { dst, .. }
        | InstrOp::Copy { dst, .. }
        | InstrOp::Accumulate { dst, .. } => buf(dst),
        InstrOp::ReduceScatter {
            c: Collective { src, .. },
        } => buf(src),
        InstrOp::AllReduce { buffer, .. }
        | InstrOp::NormAllReduce { buffer, .. }
        | InstrOp::FoundInfAllReduce { buffer, .. } => buf(buffer),
        InstrOp::OptimizerStep { params, .. } => buf(params),
        InstrOp::ClipGrads { grads, .. } => buf(grads),
        _ => 0,
    }
}

/// A short label: the kernel and its node, or the collective and its unit.
pub fn slice_name(plan: &Plan, op: &InstrOp) -> String {
    match op {
        InstrOp::Kernel { node, kernel, .. } => {
            let name = plan
                .training
                .graph
                .try_node(*node)
                .map_or("?", |n| n.name.as_str());
            format!("{kernel} {name}")
        }
        InstrOp::AllGather {
            c: Collective { unit, .. },
            bucketed: true,
            ..
        } => format!("all_gather unit {unit} (bucketed into the next)"),
        InstrOp::AllGather {
            c: Collective { unit, .. },
            ..
        } => format!("all_gather unit {unit}"),
        InstrOp::ReduceScatter {
            c: Collective { unit, .. },
        } => format!("reduce_scatter unit {unit}"),
        InstrOp::AllReduce { unit, .. } => format!("all_reduce unit {unit}"),
        InstrOp::TensorAllReduce { node, .. } => {
            let name = plan
                .training
                .graph
                .try_node(*node)
                .map_or("?", |n| n.name.as_str());
            format!("tensor all_reduce {name}")
        }
        InstrOp::TensorChunks { kind, node, .. } => {
            let name = plan
                .training
                .graph
                .try_node(*node)
                .map_or("?", |n| n.name.as_str());
            let what = match kind {
                fsdpc_plan::ChunkKind::Gather => "all_gather",
                fsdpc_plan::ChunkKind::ReduceScatter => "reduce_scatter",
                fsdpc_plan::ChunkKind::Split => "split",
            };
            format!("tensor {what} {name}")
        }
        InstrOp::Reshard { unit, .. } => format!("reshard unit {unit}"),
        InstrOp::Copy { unit, dst, .. } => {
            match plan.buffers.get(dst.index()).map(|b| b.location) {
                Some(fsdpc_plan::Location::Host) => format!("copy to host unit {unit}"),
                _ => format!("copy to device unit {unit}"),
            }
        }
        InstrOp::Accumulate { unit: Some(u), .. } => format!("accumulate grads unit {u}"),
        InstrOp::Accumulate { unit: None, .. } => "accumulate loss".to_string(),
        InstrOp::OptimizerStep { unit, .. } => format!("optimizer unit {unit}"),
        InstrOp::GradNormSq { .. } => "grad_norm_sq".to_string(),
        InstrOp::NormAllReduce { .. } => "all_reduce grad norm".to_string(),
        InstrOp::ClipGrads { unit, .. } => format!("clip_grads unit {unit}"),
        InstrOp::ScaleSeed { .. } => "seed backward with the loss scale".to_string(),
        InstrOp::UnscaleGrads { .. } => "unscale_grads".to_string(),
        InstrOp::FoundInfAllReduce { .. } => "all_reduce found_inf".to_string(),
        InstrOp::UpdateScale { .. } => "update_scale".to_string(),
        InstrOp::LoadInput { name, .. } => format!("load {name}"),
        InstrOp::WriteBuffer { node, .. } => {
            let name = plan
                .training
                .graph
                .try_node(*node)
                .map_or("?", |n| n.name.as_str());
            format!("write_buffer {name}")
        }
        InstrOp::Free { buffer } => format!("free {buffer}"),
        InstrOp::Record { event } => format!("record {event}"),
        InstrOp::Wait { event } => format!("wait {event}"),
    }
}
