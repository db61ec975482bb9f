//! FSDP units and their flat parameters: what each rank keeps of a unit
//! (its shard of each segment), and what a unit does after forward.

use crate::config::ReshardAfterForward;
use crate::ids::UnitId;
use crate::serde_default::{is_zero, yes};
use fsdpc_ir::ParamId;
use serde::{Deserialize, Serialize};

/// One FSDP unit: a flat parameter and the modules whose parameters it holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Unit {
    pub id: UnitId,
    /// The module path that defines the unit (`h.2`; empty for the root unit).
    pub module: String,
    pub kind: String,
    /// Elements of all parameters laid end to end.
    pub flat_numel: u64,
    /// `flat_numel` rounded up to a multiple of F.
    pub padded_numel: u64,
    /// `padded_numel / F`: what each rank keeps.
    pub shard_numel: u64,
    /// Elements of the frozen segment at the end of the flat parameter
    /// (frozen parameters, padded to a multiple of F; see `flat`). 0 when
    /// every parameter is trainable (and in plans written before freezing
    /// existed).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub frozen_numel: u64,
    /// This unit's own `reshard_after_forward` where it differs from the
    /// plan's (FSDP2's per-module setting); absent: the plan's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reshard_after_forward: Option<ReshardAfterForward>,
    /// Trainable parameters first (offsets below `trainable_numel()`), then
    /// frozen ones.
    pub params: Vec<FlatParam>,
}

/// One contiguous part of a flat parameter that is sharded on its own: the
/// trainable or the frozen segment (see `flat`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Segment {
    /// First element in the flat parameter.
    pub flat_offset: u64,
    /// First element in each rank's shard.
    pub shard_offset: u64,
    /// Elements in the flat parameter (a multiple of F).
    pub numel: u64,
}

/// What unit `u` of `units` does after forward, `default` being the plan's
/// setting (see `Plan::unit_reshard`).
pub fn unit_reshard(
    units: &[Unit],
    u: UnitId,
    default: ReshardAfterForward,
) -> ReshardAfterForward {
    if u == UnitId(0) {
        return ReshardAfterForward::Keep;
    }
    units
        .get(u.index())
        .and_then(|unit| unit.reshard_after_forward)
        .unwrap_or(default)
}

/// The n of `Group::Reshard` for `units` and the plan's `default`.
pub fn reshard_group(units: &[Unit], default: ReshardAfterForward) -> Option<u32> {
    std::iter::once(default)
        .chain(units.iter().filter_map(|u| u.reshard_after_forward))
        .find_map(|r| match r {
            ReshardAfterForward::To(n) => Some(n),
            _ => None,
        })
}

impl Unit {
    /// Elements of the trainable segment (padded): what the flat gradient
    /// holds.
    pub fn trainable_numel(&self) -> u64 {
        self.padded_numel.saturating_sub(self.frozen_numel)
    }

    /// The sharding factor the layout was made for (`padded / shard`; 1 for
    /// an empty unit).
    pub fn factor(&self) -> u64 {
        self.padded_numel
            .checked_div(self.shard_numel)
            .map_or(1, |f| f.max(1))
    }

    /// Elements of each rank's shard in the trainable segment: what its
    /// gradient shard and each optimizer-state buffer hold. The optimizer
    /// updates the first this many elements of the parameter shard.
    pub fn trainable_shard_numel(&self) -> u64 {
        self.trainable_numel() / self.factor()
    }

    /// The non-empty segments, trainable first. A rank's shard is its part
    /// of each segment, end to end: `[trainable shard | frozen shard]`.
    pub fn segments(&self) -> Vec<Segment> {
        let f = self.factor();
        let t = self.trainable_numel();
        [
            Segment {
                flat_offset: 0,
                shard_offset: 0,
                numel: t,
            },
            Segment {
                flat_offset: t,
                shard_offset: t / f,
                numel: self.frozen_numel,
            },
        ]
        .into_iter()
        .filter(|s| s.numel > 0)
        .collect()
    }

    /// The elements of the trainable part of the shard at position `pos`
    /// (`0..trainable_shard_numel`) that belong to parameters weight decay
    /// does not apply to (`FlatParam::decay`), as sorted, disjoint ranges.
    pub fn undecayed(&self, pos: u64) -> Vec<std::ops::Range<u64>> {
        let n = self.trainable_shard_numel();
        let base = (pos % self.factor()) * n;
        self.params
            .iter()
            .filter(|p| p.requires_grad && !p.decay)
            .filter_map(|p| {
                let lo = p.offset.max(base);
                let hi = (p.offset + p.numel).min(base + n);
                (lo < hi).then(|| lo - base..hi - base)
            })
            .collect()
    }

    /// The flat elements the shard at position `pos` holds, as
    /// `(flat offset, shard offset, elements)` per segment.
    pub fn shard_ranges(&self, pos: u64) -> Vec<(u64, u64, u64)> {
        let f = self.factor();
        self.segments()
            .into_iter()
            .map(|s| {
                let n = s.numel / f;
                (s.flat_offset + pos * n, s.shard_offset, n)
            })
            .collect()
    }

    /// The elements of the shard at position `pos` that belong to the
    /// parameters `keep` selects, as `(shard offset, elements)` runs in
    /// shard order.
    pub fn shard_elements_of(
        &self,
        pos: u64,
        keep: impl Fn(&FlatParam) -> bool,
    ) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for (lo, at, n) in self.shard_ranges(pos) {
            for p in self.params.iter().filter(|p| keep(p)) {
                let (a, b) = (p.offset.max(lo), (p.offset + p.numel).min(lo + n));
                if a >= b {
                    continue;
                }
                let start = at + (a - lo);
                match out.last_mut() {
                    Some((s, len)) if *s + *len == start => *len += b - a,
                    _ => out.push((start, b - a)),
                }
            }
        }
        out
    }
}

/// Where one original parameter sits inside its unit's flat parameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FlatParam {
    pub param: ParamId,
    pub name: String,
    pub shape: Vec<usize>,
    /// Element offset in the flat parameter.
    pub offset: u64,
    pub numel: u64,
    pub requires_grad: bool,
    /// Whether the optimizer's weight decay applies to it (absent in plans
    /// written before: yes). Not for norms, biases and embedding tables
    /// unless `Settings::decay_all`.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub decay: bool,
}

fn is_true(x: &bool) -> bool {
    *x
}
