//! Partial CPU offload: which units `--cpu-offload` moves to host memory
//! (`--cpu-offload all|every:K|paths:a,b|kind:CLASS`) and what of them
//! (`--offload-what params|optimizer`). The schedule's side is
//! `schedule::offload`.
//!
//! The names follow the two families users know: FSDP1's
//! `CPUOffload(offload_params=True)` is `params`: the unit's parameter
//! shard, gradient shard and optimizer state live on the host, the shard
//! is copied in before each all-gather and the reduced gradient out after
//! each reduction, and the optimizer steps on the host (DeepSpeed's
//! `offload_param` together with `offload_optimizer`). `optimizer` keeps
//! the parameter and gradient shards on the device and only the optimizer
//! state (AdamW's moments: two thirds of the persistent bytes) on the host,
//! as DeepSpeed's `offload_optimizer` does; unlike DeepSpeed, which steps
//! on the CPU from an fp32 master copy there, fsdpc's master copy is the
//! device shard, so the state is copied in just before the unit's
//! optimizer step and out right after it (on the offload stream) and the
//! step runs on the device (`stage_state`).

use crate::config::FsdpConfig;
use crate::error::PlanError;
use crate::schedule::Schedule;
use crate::units::UnitAssignment;
use fsdpc_plan::{
    Buffer, BufferId, BufferKind, EventId, Instr, InstrOp, OffloadUnits, OffloadWhat, Stream,
    UnitId,
};
use std::collections::BTreeSet;

/// The units `which` selects, in unit order; a path that names no unit,
/// a class no unit has or `every:0` is `PlanError::BadConfig`, listing
/// what there is.
pub fn select_units(
    which: &OffloadUnits,
    assign: &UnitAssignment,
) -> Result<BTreeSet<UnitId>, PlanError> {
    let all = || {
        assign
            .units
            .iter()
            .enumerate()
            .map(|(i, u)| (UnitId(i as u32), u))
    };
    let bad = |reason: String| PlanError::BadConfig {
        what: "cpu offload",
        value: which.name(),
        reason,
    };
    let path_of = |p: &str| if p.is_empty() { "root" } else { p }.to_string();
    match which {
        OffloadUnits::All => Ok(all().map(|(id, _)| id).collect()),
        OffloadUnits::Every(0) => Err(bad("K must be at least 1".into())),
        OffloadUnits::Every(k) => Ok(all()
            .skip(1)
            .enumerate()
            .filter(|(i, _)| i % *k as usize == 0)
            .map(|(_, (id, _))| id)
            .collect()),
        OffloadUnits::Paths(paths) => paths
            .iter()
            .map(|p| {
                all()
                    .find(|(_, u)| path_of(&u.path) == *p)
                    .map(|(id, _)| id)
                    .ok_or_else(|| {
                        let known: Vec<String> = all().map(|(_, u)| path_of(&u.path)).collect();
                        bad(format!(
                            "`{p}` is not the module path of a unit; the units are: {}",
                            known.join(", ")
                        ))
                    })
            })
            .collect(),
        OffloadUnits::Kind(kind) => {
            let out: BTreeSet<UnitId> = all()
                .skip(1)
                .filter(|(_, u)| u.kind == *kind)
                .map(|(id, _)| id)
                .collect();
            if out.is_empty() {
                let kinds: BTreeSet<&str> = all().skip(1).map(|(_, u)| u.kind.as_str()).collect();
                return Err(bad(format!(
                    "no unit is a `{kind}`; the units' classes are: {}",
                    kinds.into_iter().collect::<Vec<_>>().join(", ")
                )));
            }
            Ok(out)
        }
    }
}

/// What one compile offloads: the selected units and what of them (empty
/// without `cpu_offload`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnitOffload {
    pub units: BTreeSet<UnitId>,
    pub what: OffloadWhat,
}

impl UnitOffload {
    /// The units `cfg` offloads among `assign`'s (none without
    /// `cpu_offload`).
    pub fn select(cfg: &FsdpConfig, assign: &UnitAssignment) -> Result<UnitOffload, PlanError> {
        if !cfg.cpu_offload {
            return Ok(UnitOffload::default());
        }
        Ok(UnitOffload {
            units: select_units(&cfg.offload_units, assign)?,
            what: cfg.offload_what,
        })
    }

    /// What unit `u` offloads, if it does.
    pub fn of(&self, u: UnitId) -> Option<OffloadWhat> {
        self.units.contains(&u).then_some(self.what)
    }
}

/// `--offload-what optimizer`: stages the host optimizer state of each
/// offloaded unit around its optimizer step, on the final optimizer tail
/// (after clipping and the loss scaler rewrote it). Before the step compute
/// `Record`s, the offload stream `Wait`s, `Copy`s each state slot into a
/// `StagedState` device buffer and `Record`s, and compute `Wait`s; the step
/// reads and writes the staged slots; after it compute `Record`s and the
/// offload stream `Wait`s, copies each slot back and `Free`s it. One
/// unit's state is staged at a time, only around its step.
pub fn stage_state(s: &mut Schedule, offload: &UnitOffload) {
    if offload.what != OffloadWhat::Optimizer || offload.units.is_empty() {
        return;
    }
    let old = std::mem::take(&mut s.instructions);
    let mut out: Vec<Instr> = Vec::with_capacity(old.len() + 16);
    let push = |out: &mut Vec<Instr>, stream, op| out.push(Instr { stream, op });
    for mut ins in old {
        let InstrOp::OptimizerStep { unit, state, .. } = &mut ins.op else {
            out.push(ins);
            continue;
        };
        let unit = *unit;
        if offload.of(unit).is_none() || state.is_empty() {
            out.push(ins);
            continue;
        }
        let host = state.clone();
        let staged: Vec<BufferId> = host
            .iter()
            .map(|&h| {
                let b = &s.buffers[h.index()];
                let (dtype, bytes) = (b.dtype, b.bytes);
                Buffer::add(&mut s.buffers, BufferKind::StagedState, dtype, bytes)
                    .of_unit(Some(unit))
                    .id
            })
            .collect();
        let mut event = || {
            s.events += 1;
            EventId(s.events - 1)
        };
        let (issued, copied, stepped) = (event(), event(), event());
        push(&mut out, Stream::Compute, InstrOp::Record { event: issued });
        push(&mut out, Stream::Offload, InstrOp::Wait { event: issued });
        for (&src, &dst) in host.iter().zip(&staged) {
            push(&mut out, Stream::Offload, InstrOp::Copy { unit, src, dst });
        }
        push(&mut out, Stream::Offload, InstrOp::Record { event: copied });
        push(&mut out, Stream::Compute, InstrOp::Wait { event: copied });
        *state = staged.clone();
        out.push(ins);
        push(
            &mut out,
            Stream::Compute,
            InstrOp::Record { event: stepped },
        );
        push(&mut out, Stream::Offload, InstrOp::Wait { event: stepped });
        for (&src, &dst) in staged.iter().zip(&host) {
            push(&mut out, Stream::Offload, InstrOp::Copy { unit, src, dst });
        }
        for &buffer in &staged {
            push(&mut out, Stream::Offload, InstrOp::Free { buffer });
        }
    }
    s.instructions = out;
}
