//! The quantize pass: puts the wire formats (`fsdpc_plan::wire`, where
//! their semantics and scratch layouts are) on a schedule's collectives,
//! each quantized one with its `Wire` scratch buffer; and what a quantized
//! collective costs in bytes.

use crate::error::PlanError;
use crate::schedule::Schedule;
use fsdpc_ir::DType;
use fsdpc_plan::wire::MAX_BLOCK;
use fsdpc_plan::*;

/// The wire formats a compile puts on its collectives.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Wires {
    pub all_gather: Wire,
    pub reduce_scatter: Wire,
}

/// Checks a configuration's wire formats: fp8 only for all-gathers, int8
/// blocks of 1 ..= `MAX_BLOCK` elements, and a strategy with the
/// collectives they apply to.
pub fn check(wires: Wires, strategy: Strategy) -> Result<(), PlanError> {
    let bad = |what, w: Wire, reason: String| PlanError::BadConfig {
        what,
        value: w.name(),
        reason,
    };
    for (what, w) in [
        ("allgather_wire", wires.all_gather),
        ("reduce_scatter_wire", wires.reduce_scatter),
    ] {
        if let Wire::Int8Block { block } = w {
            if block == 0 || block > MAX_BLOCK {
                return Err(bad(
                    what,
                    w,
                    format!("the block size must be 1 ..= {MAX_BLOCK} elements"),
                ));
            }
        }
        if !w.is_native() && strategy == Strategy::NoShard {
            return Err(bad(
                what,
                w,
                "no_shard communicates by all-reduce; the wire formats apply to the \
                 all-gathers and reduce-scatters of sharded strategies"
                    .into(),
            ));
        }
    }
    if let w @ Wire::Fp8E4m3 { .. } = wires.reduce_scatter {
        return Err(bad(
            "reduce_scatter_wire",
            w,
            "gradients need more range than e4m3 gives without loss scaling: use int8".into(),
        ));
    }
    Ok(())
}

/// Puts the wire formats on the schedule's collectives: every all-gather
/// from a parameter shard (or its staged copy) over the shard group takes
/// `wires.all_gather`, every reduce-scatter `wires.reduce_scatter`; each
/// quantized one gets its `Wire` scratch buffer, freed right after it on
/// its stream. `units` give the sizes, `f` the group size.
pub fn apply(s: &mut Schedule, units: &[Unit], f: u32, wires: Wires) {
    if wires.all_gather.is_native() && wires.reduce_scatter.is_native() {
        return;
    }
    let f = u64::from(f.max(1));
    let old = std::mem::take(&mut s.instructions);
    let mut out = Vec::with_capacity(old.len() + 64);
    for mut ins in old {
        let scratch = match &mut ins.op {
            InstrOp::AllGather {
                c:
                    Collective {
                        unit,
                        group: Group::Shard,
                        wire,
                        wire_buffer,
                        ..
                    },
                ..
            } if !wires.all_gather.is_native() => units.get(unit.index()).map(|u| {
                *wire = wires.all_gather;
                let bytes = wire.gather_scratch_bytes(u.shard_numel, f);
                let b = new_scratch(&mut s.buffers, *unit, bytes);
                *wire_buffer = Some(b);
                b
            }),
            InstrOp::ReduceScatter {
                c:
                    Collective {
                        unit,
                        wire,
                        wire_buffer,
                        ..
                    },
            } if !wires.reduce_scatter.is_native() => units.get(unit.index()).map(|u| {
                *wire = wires.reduce_scatter;
                let bytes = wire.reduce_scratch_bytes(u.trainable_numel(), f);
                let b = new_scratch(&mut s.buffers, *unit, bytes);
                *wire_buffer = Some(b);
                b
            }),
            _ => None,
        };
        let stream = ins.stream;
        out.push(ins);
        if let Some(buffer) = scratch {
            out.push(Instr {
                stream,
                op: InstrOp::Free { buffer },
            });
        }
    }
    s.instructions = out;
}

fn new_scratch(buffers: &mut Vec<Buffer>, unit: UnitId, bytes: u64) -> BufferId {
    Buffer::add(buffers, BufferKind::Wire, DType::Bool, bytes)
        .of_unit(Some(unit))
        .id
}

/// Bytes a quantized collective's own encode and decode read and write
/// (the bandwidth term of its kernels; 0 for a native one): an all-gather
/// reads the shard, writes its payload, reads the F payloads and writes
/// the gathered parameters (fp8: and reads the shard once more for the
/// amax); a reduce-scatter reads the flat gradient, writes the F payloads,
/// reads the F received ones and writes the shard.
pub fn codec_bytes(plan: &Plan, ins: &Instr) -> u64 {
    let bytes_of = |b: &BufferId| plan.buffers.get(b.index()).map_or(0, |b| b.bytes);
    match &ins.op {
        InstrOp::AllGather {
            c:
                Collective {
                    src,
                    dst,
                    wire,
                    wire_buffer: Some(w),
                    ..
                },
            ..
        } => {
            let amax = match wire {
                Wire::Fp8E4m3 { .. } => bytes_of(src),
                _ => 0,
            };
            bytes_of(src) + amax + bytes_of(w) + bytes_of(dst)
        }
        InstrOp::ReduceScatter {
            c:
                Collective {
                    src,
                    dst,
                    wire_buffer: Some(w),
                    ..
                },
        } => bytes_of(src) + bytes_of(w) + bytes_of(dst),
        _ => 0,
    }
}

/// The bytes of a quantized collective's payloads that the alpha-beta
/// model charges as its size (`None` for a native one), and for fp8 the
/// bytes of its amax all-gather.
pub fn charged_bytes(plan: &Plan, ins: &Instr) -> Option<(u64, u64)> {
    let f = u64::from(plan.config.shard_factor.max(1));
    let unit = |u: &UnitId| plan.units.get(u.index());
    match &ins.op {
        InstrOp::AllGather {
            c:
                Collective {
                    unit: u,
                    wire,
                    wire_buffer: Some(_),
                    ..
                },
            ..
        } => unit(u).map(|x| {
            let amax = match wire {
                Wire::Fp8E4m3 { .. } => 4 * f,
                _ => 0,
            };
            (wire.gathered_bytes(x.shard_numel, f), amax)
        }),
        InstrOp::ReduceScatter {
            c:
                Collective {
                    unit: u,
                    wire,
                    wire_buffer: Some(_),
                    ..
                },
        } => unit(u).map(|x| (wire.scattered_bytes(x.trainable_numel(), f), 0)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_refuses_what_no_collective_takes() {
        let fp8 = Wire::Fp8E4m3 {
            scale: Fp8Scale::PerUnit,
        };
        let refused = |w: Wires, s| check(w, s).is_err();
        assert!(refused(
            Wires {
                all_gather: Wire::Native,
                reduce_scatter: fp8
            },
            Strategy::FullShard
        ));
        assert!(refused(
            Wires {
                all_gather: Wire::Int8Block { block: 0 },
                reduce_scatter: Wire::Native
            },
            Strategy::FullShard
        ));
        assert!(refused(
            Wires {
                all_gather: fp8,
                reduce_scatter: Wire::Native
            },
            Strategy::NoShard
        ));
        assert!(check(
            Wires {
                all_gather: fp8,
                reduce_scatter: Wire::Int8Block { block: 128 }
            },
            Strategy::HybridShard
        )
        .is_ok());
    }
}
