//! The collective rewrites with egg. Every all-gather, reduce-scatter
//! and all-reduce of the schedule is written as a term, named rules grow
//! its e-graph with equivalent forms, and the form the cost model charges
//! least (the calibrated one of the plan's cluster) is extracted and
//! written back as the instruction's dtype on the wire and
//! `CollectiveAlgorithm`, with its stream's `Staging` buffer where the
//! form needs one (persistent, sized for the stream's largest). The
//! chosen form therefore depends on the cluster.
//!
//! Terms (`Coll`): `(shard D N)` is this rank's N elements of dtype D;
//! `(ag x)` gathers `x` over the group (n members: n N elements), `(rs x)`
//! reduce-scatters it (N / n), `(ar x)` all-reduces it; `(hag x)` and
//! `(hrs x)` are the two-level forms; `(cast D x)` casts before sending,
//! `(recv D x)` converts on receipt. A mixed-precision gather starts as
//! `(recv bf16 (ag (shard f32 N)))`: the shard moves in f32.
//!
//! Rules (`Rule`), each enabled by `FsdpConfig::rewrites` and applied only
//! where the runtime can run its form:
//! - `cast-before-gather`: `(recv D (ag x))` → `(ag (cast D x))`;
//! - `hierarchical-all-gather`: `(ag x)` → `(hag x)` and
//!   `hierarchical-reduce-scatter`: `(rs x)` → `(hrs x)`, on shard groups
//!   of k > 1 ranks on each of m > 1 nodes (F a multiple of the ranks per
//!   node);
//! - `all-reduce-as-reduce-scatter-all-gather`: `(ar x)` → `(ag (rs x))`,
//!   where n divides the buffer;
//! - `bucket-all-gathers`, over a run of all-gathers that a stream issues
//!   back to back (only records between them, no other stream waiting on
//!   those records in between: the gathers a prefetch point or the step's
//!   start issues together): `(then (ag x) (ag y))` → `(ag (cat x y))`,
//!   one call for both. Its extraction cost is not the stream's time
//!   (bucketing always saves the second call's latency) but the sum of the
//!   times at which each member's parameters are ready: a bucket saves the
//!   later members a latency and delays the earlier ones by the later
//!   ones' transfer, so small gathers on a high-latency group are bucketed
//!   and large ones are not. The members the extraction groups are
//!   written as `bucketed` gathers joining the call of the bucket's last
//!   member, and the records between them move after it. This stage runs
//!   after the per-collective one, on gathers that chose one native ring
//!   over the shard group from a persistent shard, of one wire dtype.
//!
//! Every distinct collective (kind, dtypes, elements, group shape, rules)
//! runs once, and every distinct run of gathers (at most `RUN_LIMIT`
//! members) once, with the runner's limits (`ITER_LIMIT`, `NODE_LIMIT`,
//! `TIME_LIMIT`); the report (`Plan::rewrites`) counts the runs that
//! saturated and those a limit stopped.
//!
//! The pass by decision: `rules` (the named rules and the sets a compile
//! enables), `lang` (the terms' e-graph language and the analysis that
//! sizes them), `choose` (the form the cost model charges least, and what
//! each rule saves), `write` (the chosen form written into the
//! instruction, with its staging buffer), `bucket` (the runs of gathers
//! and their grouping); this module finds the collectives, applies the
//! chosen forms and reports.

use crate::cost::layout_of;
use crate::error::PlanError;
use crate::schedule::Schedule;
use fsdpc_ir::DType;
use fsdpc_plan::cluster::{Cluster, CollectiveKind};
use fsdpc_plan::{
    hierarchical_shape, BufferId, Collective, Group, InstrOp, RewriteReport, RuleFired,
};
use std::collections::HashMap;
use std::time::Duration;

mod bucket;
mod choose;
mod lang;
mod rules;
mod write;

use choose::{choose, Form, Site};
pub use rules::{Rule, Rules};
use write::{write_back, Stagings};

/// The runner's limits per collective: the rules here saturate in two or
/// three iterations on a dozen e-nodes.
pub const ITER_LIMIT: usize = 8;
pub const NODE_LIMIT: usize = 256;
pub const TIME_LIMIT: Duration = Duration::from_millis(20);
/// The most gathers one bucketing run considers (a longer run is cut):
/// its e-graph holds a class per contiguous stretch of members.
pub const RUN_LIMIT: usize = 8;
/// What the pass needs of the plan.
pub struct RewriteInput<'a> {
    pub cluster: &'a Cluster,
    pub shard_factor: u32,
    pub rules: &'a Rules,
}

/// Rewrites every native collective of `s` (see the module docs) and
/// returns the report.
pub fn apply(s: &mut Schedule, input: &RewriteInput<'_>) -> Result<RewriteReport, PlanError> {
    let f = input.shard_factor.max(1);
    let c = input.cluster;
    let shape = |g| layout_of(g, c.world, f, c.ranks_per_node, None);
    let (shard_shape, replicate_shape) = (shape(Group::Shard), shape(Group::Replicate));
    let hier = hierarchical_shape(f, c.ranks_per_node);
    let mut cache: HashMap<Site, Form> = HashMap::new();
    let mut report = RewriteReport {
        enabled: input.rules.0.iter().map(|r| r.name().to_string()).collect(),
        ..RewriteReport::default()
    };
    let mut fired: HashMap<Rule, (u32, f64)> = HashMap::new();
    let mut stagings = Stagings::default();
    let old = std::mem::take(&mut s.instructions);
    let mut out = Vec::with_capacity(old.len());
    for mut ins in old {
        let dtype_of = |b: BufferId| s.buffers.get(b.index()).map(|b| b.dtype);
        let numel_of = |b: BufferId| {
            s.buffers
                .get(b.index())
                .map_or(0, |b| b.bytes / b.dtype.size().max(1) as u64)
        };
        let site = match &ins.op {
            InstrOp::AllGather {
                c:
                    Collective {
                        src,
                        dst,
                        group: Group::Shard,
                        wire,
                        ..
                    },
                ..
            } if wire.is_native() => {
                let (Some(from), Some(to)) = (dtype_of(*src), dtype_of(*dst)) else {
                    out.push(ins);
                    continue;
                };
                let mut rules = Vec::new();
                if from != to && input.rules.has(Rule::CastBeforeGather) {
                    rules.push(Rule::CastBeforeGather);
                }
                if hier.is_some() && input.rules.has(Rule::HierarchicalAllGather) {
                    rules.push(Rule::HierarchicalAllGather);
                }
                Some(Site {
                    kind: CollectiveKind::AllGather,
                    from,
                    to,
                    numel: numel_of(*src),
                    k: shard_shape.0,
                    m: shard_shape.1,
                    rules,
                })
            }
            InstrOp::ReduceScatter {
                c:
                    Collective {
                        src,
                        dtype,
                        group: Group::Shard,
                        wire,
                        ..
                    },
            } if wire.is_native() => {
                let numel = numel_of(*src);
                let mut rules = Vec::new();
                if hier.is_some()
                    && numel.is_multiple_of(u64::from(f))
                    && input.rules.has(Rule::HierarchicalReduceScatter)
                {
                    rules.push(Rule::HierarchicalReduceScatter);
                }
                Some(Site {
                    kind: CollectiveKind::ReduceScatter,
                    from: *dtype,
                    to: *dtype,
                    numel,
                    k: shard_shape.0,
                    m: shard_shape.1,
                    rules,
                })
            }
            InstrOp::AllReduce {
                buffer,
                dtype,
                group,
                ..
            } => {
                let (k, m) = match group {
                    Group::Shard => shard_shape,
                    _ => replicate_shape,
                };
                let numel = numel_of(*buffer);
                let n = u64::from(k * m);
                // The layout rounds up where the replicas do not fill
                // whole nodes; split only where it is the member count.
                let members = u64::from(match group {
                    Group::Shard => f,
                    _ => c.world.max(1) / f,
                });
                let mut rules = Vec::new();
                if n > 1
                    && n == members
                    && numel.is_multiple_of(n)
                    && dtype_of(*buffer) == Some(*dtype)
                    && input.rules.has(Rule::AllReduceAsReduceScatterAllGather)
                {
                    rules.push(Rule::AllReduceAsReduceScatterAllGather);
                }
                Some(Site {
                    kind: CollectiveKind::AllReduce,
                    from: *dtype,
                    to: *dtype,
                    numel,
                    k,
                    m,
                    rules,
                })
            }
            _ => None,
        };
        let float = |d: DType| matches!(d, DType::F32 | DType::Bf16 | DType::F16);
        let Some(site) = site.filter(|s| float(s.from) && float(s.to)) else {
            out.push(ins);
            continue;
        };
        let form = match cache.get(&site) {
            Some(f) => f.clone(),
            None => {
                let form = choose(&site, input.cluster)?;
                if !site.rules.is_empty() {
                    if form.saturated {
                        report.saturated += 1;
                    } else {
                        report.limited += 1;
                    }
                }
                cache.insert(site.clone(), form.clone());
                form
            }
        };
        for &(r, saved) in &form.fired {
            let e = fired.entry(r).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += saved;
        }
        let stream = ins.stream;
        write_back(&mut ins.op, &site, &form, f, &mut |bytes| {
            stagings.need(&mut s.buffers, stream, bytes)
        });
        out.push(ins);
    }
    s.instructions = out;
    if input.rules.has(Rule::BucketAllGathers) {
        let (k, m) = shard_shape;
        let (calls, saved, counts) = bucket::apply(s, c, k, m)?;
        if calls > 0 {
            fired.insert(Rule::BucketAllGathers, (calls, saved));
        }
        report.saturated += counts.0;
        report.limited += counts.1;
    }
    report.fired = Rule::ALL
        .into_iter()
        .filter_map(|r| {
            fired.get(&r).map(|&(count, saved_s)| RuleFired {
                rule: r.name().to_string(),
                count,
                saved_s,
            })
        })
        .collect();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hierarchical_needs_whole_nodes() {
        assert_eq!(hierarchical_shape(16, 8), Some((8, 2)));
        assert_eq!(hierarchical_shape(8, 8), None);
        assert_eq!(hierarchical_shape(12, 8), None);
        assert_eq!(hierarchical_shape(4, 1), None);
    }
}
