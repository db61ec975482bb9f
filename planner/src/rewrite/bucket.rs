//! The bucketing stage of the collective rewrites (`bucket-all-gathers`,
//! see the parent module): the runs of gathers a stream issues back to
//! back, their grouping by egg with the members' ready times as the cost,
//! and the rewritten instruction list.

use super::lang::{unrewritten, Coll, Data, Payloads};
use super::rules::Rule;
use super::{ITER_LIMIT, NODE_LIMIT, RUN_LIMIT, TIME_LIMIT};
use crate::cost::ring_collective_time;
use crate::error::PlanError;
use crate::schedule::Schedule;
use egg::{CostFunction, EGraph, Extractor, Id, RecExpr, Runner, StopReason};
use fsdpc_ir::DType;
use fsdpc_plan::cluster::{Cluster, CollectiveKind};
use fsdpc_plan::{bucketable_gather, Buffer, Instr, InstrOp, Stream};
use std::collections::HashMap;

/// The extraction cost of a run: `sum_s`, the sum over its members of
/// the time from the run's start at which each member's parameters
/// are gathered (the objective); `busy_s`, the stream's time; `count`,
/// the members.
#[derive(Copy, Clone, Debug, PartialEq, PartialOrd)]
pub(super) struct Ready {
    pub sum_s: f64,
    pub busy_s: f64,
    pub count: f64,
}

struct Readiness<'a> {
    egraph: &'a EGraph<Coll, Payloads>,
    cluster: &'a Cluster,
    k: u32,
    m: u32,
}

impl CostFunction<Coll> for Readiness<'_> {
    type Cost = Ready;

    fn cost<C>(&mut self, enode: &Coll, mut costs: C) -> Ready
    where
        C: FnMut(Id) -> Ready,
    {
        let zero = Ready {
            sum_s: 0.0,
            busy_s: 0.0,
            count: 0.0,
        };
        match enode {
            Coll::Num(_) | Coll::Ty(_) | Coll::Shard(_) | Coll::Cat(_) => zero,
            // One call gathers the whole (concatenated) payload; every
            // member is ready when it ends.
            Coll::Ag([x]) => match self.egraph[*x].data {
                Data::Val {
                    numel,
                    dtype,
                    parts,
                } => {
                    let n = f64::from(self.k * self.m);
                    let bytes = numel as f64 * n * dtype.size() as f64;
                    let t = ring_collective_time(
                        CollectiveKind::AllGather,
                        self.k,
                        self.m,
                        bytes,
                        self.cluster,
                    );
                    Ready {
                        sum_s: f64::from(parts) * t,
                        busy_s: t,
                        count: f64::from(parts),
                    }
                }
                _ => Ready {
                    sum_s: f64::INFINITY,
                    ..zero
                },
            },
            // The rest starts when the first has ended.
            Coll::Then([a, b]) => {
                let (a, b) = (costs(*a), costs(*b));
                Ready {
                    sum_s: a.sum_s + b.count * a.busy_s + b.sum_s,
                    busy_s: a.busy_s + b.busy_s,
                    count: a.count + b.count,
                }
            }
            _ => Ready {
                sum_s: f64::INFINITY,
                ..zero
            },
        }
    }
}

/// One run: its members' wire dtype and shard elements.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct RunKey {
    dtype: DType,
    numels: Vec<u64>,
}

/// The grouping chosen for a run: the members per bucket, in order;
/// the stream time saved; whether the runner saturated.
#[derive(Clone, Debug)]
struct Grouping {
    sizes: Vec<usize>,
    saved_s: f64,
    saturated: bool,
}

fn run_term(key: &RunKey) -> String {
    let ag = |e: &u64| format!("(ag (shard {} {e}))", key.dtype);
    let mut t = ag(key.numels.last().expect("a run has members"));
    for e in key.numels.iter().rev().skip(1) {
        t = format!("(then {} {t})", ag(e));
    }
    t
}

/// The members per call of the extracted form, in order.
fn bucket_sizes(expr: &RecExpr<Coll>) -> Vec<usize> {
    fn walk(expr: &RecExpr<Coll>, id: Id, out: &mut Vec<usize>, leaves: &dyn Fn(&Coll) -> u32) {
        match &expr[id] {
            Coll::Then([a, b]) => {
                walk(expr, *a, out, leaves);
                walk(expr, *b, out, leaves);
            }
            n @ Coll::Ag(_) => out.push(leaves(n) as usize),
            _ => {}
        }
    }
    // The leaves under a gather: the shards its term concatenates.
    let leaves = |n: &Coll| -> u32 {
        fn count(expr: &RecExpr<Coll>, id: Id) -> u32 {
            match &expr[id] {
                Coll::Shard(_) => 1,
                Coll::Cat([a, b]) => count(expr, *a) + count(expr, *b),
                _ => 0,
            }
        }
        match n {
            Coll::Ag([x]) => count(expr, *x),
            _ => 0,
        }
    };
    let mut out = Vec::new();
    walk(expr, Id::from(expr.as_ref().len() - 1), &mut out, &leaves);
    out
}

fn choose(key: &RunKey, cluster: &Cluster, k: u32, m: u32) -> Result<Grouping, PlanError> {
    let start: RecExpr<Coll> = run_term(key).parse().map_err(|e| PlanError::Program {
        reason: format!("collective rewrite: the term of a run of gathers does not parse: {e}"),
    })?;
    let n = u64::from(k * m);
    let runner = Runner::<Coll, Payloads>::new(Payloads { n })
        .with_iter_limit(ITER_LIMIT.max(key.numels.len() + 2))
        .with_node_limit(NODE_LIMIT * 4)
        .with_time_limit(TIME_LIMIT)
        .with_expr(&start)
        .run(&Rule::BucketAllGathers.rewrites());
    let saturated = matches!(runner.stop_reason, Some(StopReason::Saturated));
    let cost = |eg| Readiness {
        egraph: eg,
        cluster,
        k,
        m,
    };
    let (best, expr) =
        Extractor::new(&runner.egraph, cost(&runner.egraph)).find_best(runner.roots[0]);
    let sizes = bucket_sizes(&expr);
    // The stream time of one call per member, less the chosen form's.
    let (fresh, at) = unrewritten(&start, n);
    let (unbucketed, _) = Extractor::new(&fresh, cost(&fresh)).find_best(at);
    Ok(Grouping {
        sizes,
        saved_s: (unbucketed.busy_s - best.busy_s).max(0.0),
        saturated,
    })
}

/// Whether instruction `ins` may join a run (not already bucketed).
fn member(ins: &Instr, buffers: &[Buffer]) -> Option<(DType, u64)> {
    match ins.op {
        InstrOp::AllGather { bucketed: true, .. } => None,
        _ => bucketable_gather(&ins.op, buffers),
    }
}

/// The runs of `instructions`: per stream, gathers of one wire dtype
/// with only records between them, cut where another stream waits on
/// one of those records and at `RUN_LIMIT` members.
fn runs(instructions: &[Instr], buffers: &[Buffer]) -> Vec<(RunKey, Vec<usize>)> {
    struct Open {
        dtype: DType,
        members: Vec<(usize, u64)>,
        events: Vec<fsdpc_plan::EventId>,
    }
    let mut open: HashMap<Stream, Open> = HashMap::new();
    let mut done = Vec::new();
    let close = |o: Open, done: &mut Vec<(RunKey, Vec<usize>)>| {
        if o.members.len() > 1 {
            done.push((
                RunKey {
                    dtype: o.dtype,
                    numels: o.members.iter().map(|m| m.1).collect(),
                },
                o.members.iter().map(|m| m.0).collect(),
            ));
        }
    };
    for (i, ins) in instructions.iter().enumerate() {
        if let InstrOp::Wait { event } = &ins.op {
            let waited: Vec<Stream> = open
                .iter()
                .filter(|(s, o)| **s != ins.stream && o.events.contains(event))
                .map(|(s, _)| *s)
                .collect();
            for s in waited {
                if let Some(o) = open.remove(&s) {
                    close(o, &mut done);
                }
            }
        }
        match (member(ins, buffers), &ins.op) {
            (Some((dtype, numel)), _) => {
                let joins = open
                    .get(&ins.stream)
                    .is_some_and(|o| o.dtype == dtype && o.members.len() < RUN_LIMIT);
                if joins {
                    if let Some(o) = open.get_mut(&ins.stream) {
                        o.members.push((i, numel));
                    }
                } else {
                    let fresh = Open {
                        dtype,
                        members: vec![(i, numel)],
                        events: Vec::new(),
                    };
                    if let Some(o) = open.insert(ins.stream, fresh) {
                        close(o, &mut done);
                    }
                }
            }
            (None, InstrOp::Record { event }) => {
                if let Some(o) = open.get_mut(&ins.stream) {
                    o.events.push(*event);
                }
            }
            (None, _) => {
                if let Some(o) = open.remove(&ins.stream) {
                    close(o, &mut done);
                }
            }
        }
    }
    for (_, o) in open {
        close(o, &mut done);
    }
    done.sort_by_key(|(_, m)| m[0]);
    done
}

/// Buckets the runs of `s` where the extraction groups them. Returns
/// the gathers that joined another's call, the stream time saved, and
/// the runs that saturated and those a limit stopped.
pub(super) fn apply(
    s: &mut Schedule,
    cluster: &Cluster,
    k: u32,
    m: u32,
) -> Result<(u32, f64, (u32, u32)), PlanError> {
    let mut cache: HashMap<RunKey, Grouping> = HashMap::new();
    let (mut joined, mut saved, mut sat, mut lim) = (0u32, 0.0, 0u32, 0u32);
    // Records to move: (record's index, the index it goes after).
    let mut moves: HashMap<usize, usize> = HashMap::new();
    for (key, members) in runs(&s.instructions, &s.buffers) {
        let g = match cache.get(&key) {
            Some(g) => g.clone(),
            None => {
                let g = choose(&key, cluster, k, m)?;
                if g.saturated {
                    sat += 1;
                } else {
                    lim += 1;
                }
                cache.insert(key.clone(), g.clone());
                g
            }
        };
        if g.sizes.iter().sum::<usize>() != members.len() {
            return Err(PlanError::Program {
                reason: "collective rewrite: a bucketing does not cover its run".into(),
            });
        }
        if g.sizes.len() < members.len() {
            saved += g.saved_s;
        }
        let mut at = 0;
        for &size in &g.sizes {
            let bucket = &members[at..at + size];
            at += size;
            let (first, last) = (bucket[0], bucket[size - 1]);
            if size < 2 {
                continue;
            }
            let stream = s.instructions[first].stream;
            for &i in &bucket[..size - 1] {
                if let InstrOp::AllGather { bucketed, .. } = &mut s.instructions[i].op {
                    *bucketed = true;
                    joined += 1;
                }
            }
            for i in first + 1..last {
                let ins = &s.instructions[i];
                if ins.stream == stream && matches!(ins.op, InstrOp::Record { .. }) {
                    moves.insert(i, last);
                }
            }
        }
    }
    if !moves.is_empty() {
        let old = std::mem::take(&mut s.instructions);
        let mut after: HashMap<usize, Vec<Instr>> = HashMap::new();
        let mut kept = Vec::with_capacity(old.len());
        for (i, ins) in old.into_iter().enumerate() {
            match moves.get(&i) {
                Some(&to) => after.entry(to).or_default().push(ins),
                None => kept.push((i, ins)),
            }
        }
        for (i, ins) in kept {
            s.instructions.push(ins);
            s.instructions.extend(after.remove(&i).unwrap_or_default());
        }
    }
    Ok((joined, saved, (sat, lim)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(latency_s: f64) -> Cluster {
        let mut c = crate::preset("a100-80g-roce", 4, 4).expect("preset");
        c.hardware.collective_fits.clear();
        c.hardware.intra_latency_s = latency_s;
        c
    }

    #[test]
    fn latency_against_transfer_decides() {
        // 1 M f32 elements per rank: 16 MB gathered over 4 ranks, about
        // 50 us at NVLink's bandwidth.
        let key = RunKey {
            dtype: DType::F32,
            numels: vec![1 << 20, 1 << 20, 1 << 20],
        };
        // A ring's latency far above the transfer: one call.
        let slow = choose(&key, &cluster(1e-3), 4, 1).unwrap();
        assert_eq!(slow.sizes, vec![3]);
        assert!(slow.saturated && slow.saved_s > 0.0);
        // Far below: each gather alone (a bucket would delay the first).
        let fast = choose(&key, &cluster(1e-8), 4, 1).unwrap();
        assert_eq!(fast.sizes, vec![1, 1, 1]);
        assert_eq!(fast.saved_s, 0.0);
    }

    #[test]
    fn readiness_is_the_sum_of_completion_times() {
        // Two gathers of times a and b one after the other are ready at a
        // and a + b; one call of both at t(a + b) for each.
        let c = cluster(1e-4);
        let key = RunKey {
            dtype: DType::F32,
            numels: vec![1000, 4000],
        };
        let start: RecExpr<Coll> = run_term(&key).parse().unwrap();
        let (eg, at) = unrewritten(&start, 4);
        let cost = Readiness {
            egraph: &eg,
            cluster: &c,
            k: 4,
            m: 1,
        };
        let (r, _) = Extractor::new(&eg, cost).find_best(at);
        let t = |e: f64| ring_collective_time(CollectiveKind::AllGather, 4, 1, e * 4.0 * 4.0, &c);
        let (a, b) = (t(1000.0), t(4000.0));
        assert!((r.sum_s - (2.0 * a + b)).abs() < 1e-12, "{r:?}");
        assert!((r.busy_s - (a + b)).abs() < 1e-12);
        assert_eq!(r.count, 2.0);
    }
}
