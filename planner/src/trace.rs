//! Chrome / Perfetto trace of a plan's simulated step: one track per stream
//! with every instruction as a slice, and a counter track of live memory. Open
//! the file in ui.perfetto.dev or chrome://tracing.

use crate::cluster::Cluster;
use crate::plan::{InstrOp, Plan};
use crate::simulate::simulate;
use serde_json::{json, Value};

/// The trace of one simulated step of `plan` on its own cluster record, in the
/// Chrome trace-event JSON format (times in microseconds).
pub fn chrome_trace(plan: &Plan) -> Value {
    let cluster = Cluster::from_info(&plan.cluster);
    let tl = simulate(plan, &cluster);
    let live = crate::memory::live_bytes(&plan.buffers, plan.instructions.len());
    let mut events = thread_names(plan);
    for (i, ins) in plan.instructions.iter().enumerate() {
        let (start, end) = (tl.start[i] * 1e6, tl.end[i] * 1e6);
        events.push(json!({
            "name": slice_name(plan, &ins.op),
            "cat": format!("{:?}", ins.stream).to_lowercase(),
            "ph": "X",
            "ts": start,
            "dur": end - start,
            "pid": 0,
            "tid": ins.stream.index(),
            "args": { "instr": i },
        }));
        if let Some(bytes) = live.get(i) {
            events.push(json!({
                "name": "live memory (bytes)", "ph": "C", "ts": start, "pid": 0,
                "args": { "bytes": bytes },
            }));
        }
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

fn thread_names(plan: &Plan) -> Vec<Value> {
    let mut v = vec![json!({
        "name": "process_name", "ph": "M", "pid": 0,
        "args": { "name": format!("{} rank (any of {})", plan.model.name, plan.cluster.world) },
    })];
    for s in &plan.streams {
        v.push(json!({
            "name": "thread_name", "ph": "M", "pid": 0, "tid": s.index(),
            "args": { "name": format!("{s:?}").to_lowercase() },
        }));
    }
    v
}

/// A short label: the kernel and its node, or the collective and its unit.
fn slice_name(plan: &Plan, op: &InstrOp) -> String {
    match op {
        InstrOp::Kernel { node, kernel, .. } => {
            let name = plan
                .training
                .graph
                .try_node(*node)
                .map_or("?", |n| n.name.as_str());
            format!("{kernel} {name}")
        }
        InstrOp::AllGather { unit, .. } => format!("all_gather unit {unit}"),
        InstrOp::ReduceScatter { unit, .. } => format!("reduce_scatter unit {unit}"),
        InstrOp::AllReduce { unit, .. } => format!("all_reduce unit {unit}"),
        InstrOp::Reshard { unit, .. } => format!("reshard unit {unit}"),
        InstrOp::Copy { unit, dst, .. } => {
            match plan.buffers.get(dst.index()).map(|b| b.location) {
                Some(crate::plan::Location::Host) => format!("copy to host unit {unit}"),
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
        InstrOp::Free { buffer } => format!("free {buffer}"),
        InstrOp::Record { event } => format!("record {event}"),
        InstrOp::Wait { event } => format!("wait {event}"),
    }
}
