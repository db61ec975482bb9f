//! Plan checks of the wire formats (see `wire`): a collective is quantized
//! exactly when it names a scratch buffer; the format is the plan's for its
//! kind of collective and one it supports there; the scratch is a `Wire`
//! buffer of its unit on the device, of the size the layout gives, touched
//! by no other instruction than its collective and its `Free`.

use super::PlanViolation;
use crate::wire::MAX_BLOCK;
use crate::*;

/// Appends a violation for every wire-format problem of `plan`.
pub(crate) fn check(plan: &Plan, out: &mut Vec<PlanViolation>) {
    let f = u64::from(plan.config.shard_factor.max(1));
    for (i, ins) in plan.instructions.iter().enumerate() {
        let mut push = |reason: String| {
            out.push(PlanViolation::Wire {
                instr: i as u32,
                reason,
            })
        };
        let (unit, wire, scratch, expected, bytes) = match &ins.op {
            InstrOp::AllGather {
                c:
                    Collective {
                        unit,
                        group,
                        wire,
                        wire_buffer,
                        ..
                    },
                ..
            } => {
                let planned = match group {
                    Group::Shard => plan.config.allgather_wire,
                    _ => Wire::Native,
                };
                let shard = plan.units.get(unit.index()).map_or(0, |u| u.shard_numel);
                (
                    *unit,
                    *wire,
                    *wire_buffer,
                    planned,
                    wire.gather_scratch_bytes(shard, f),
                )
            }
            InstrOp::ReduceScatter {
                c:
                    Collective {
                        unit,
                        wire,
                        wire_buffer,
                        ..
                    },
            } => {
                if matches!(wire, Wire::Fp8E4m3 { .. }) {
                    push("a reduce-scatter cannot travel in fp8".into());
                }
                let flat = plan
                    .units
                    .get(unit.index())
                    .map_or(0, |u| u.trainable_numel());
                (
                    *unit,
                    *wire,
                    *wire_buffer,
                    plan.config.reduce_scatter_wire,
                    wire.reduce_scratch_bytes(flat, f),
                )
            }
            InstrOp::Free { .. } => continue,
            op => {
                for b in op.reads().into_iter().chain(op.writes()) {
                    if kind(plan, b) == Some(BufferKind::Wire) {
                        push(format!(
                            "wire scratch {b} is touched by an instruction other than its collective"
                        ));
                    }
                }
                continue;
            }
        };
        if wire != expected {
            push(format!(
                "the collective travels as {}, the plan's setting for it is {}",
                wire.name(),
                expected.name()
            ));
        }
        if let Wire::Int8Block { block } = wire {
            if block == 0 || block > MAX_BLOCK {
                push(format!("int8 block size {block} is not 1 ..= {MAX_BLOCK}"));
            }
        }
        match (wire.is_native(), scratch) {
            (true, None) => {}
            (true, Some(b)) => push(format!("a native collective names wire scratch {b}")),
            (false, None) => push(format!("a {} collective has no scratch", wire.name())),
            (false, Some(b)) => match plan.buffers.get(b.index()) {
                Some(buf)
                    if buf.kind == BufferKind::Wire
                        && buf.unit == Some(unit)
                        && buf.location == Location::Device
                        && buf.bytes == bytes => {}
                Some(buf) => push(format!(
                    "wire scratch {b} is a {:?} buffer of unit {:?} in {:?} memory with {} bytes; \
                     expected a Wire buffer of unit {unit} on the device with {bytes}",
                    buf.kind, buf.unit, buf.location, buf.bytes
                )),
                None => push(format!("wire scratch {b} does not exist")),
            },
        }
    }
}

fn kind(plan: &Plan, b: BufferId) -> Option<BufferKind> {
    plan.buffers.get(b.index()).map(|b| b.kind)
}
