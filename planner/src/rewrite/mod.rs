//! Pass 3a: collective rewrites with egg. Every all-gather, reduce-scatter
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

use crate::cost::{algorithm_time, hierarchical_time_with, layout_of, ring_collective_time};
use crate::error::PlanError;
use crate::schedule::Schedule;
use egg::{
    define_language, rewrite, Analysis, CostFunction, DidMerge, EGraph, Extractor, Id, Language,
    RecExpr, Rewrite, Runner, StopReason, Symbol,
};
use fsdpc_ir::DType;
use fsdpc_plan::cluster::{Cluster, CollectiveKind};
use fsdpc_plan::{
    hier_gather_staging_bytes, hier_reduce_staging_bytes, hierarchical_shape, Buffer, BufferId,
    BufferKind, Collective, CollectiveAlgorithm, Group, InstrOp, RewriteReport, RuleFired,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

mod bucket;

/// The runner's limits per collective: the rules here saturate in two or
/// three iterations on a dozen e-nodes.
pub const ITER_LIMIT: usize = 8;
pub const NODE_LIMIT: usize = 256;
pub const TIME_LIMIT: Duration = Duration::from_millis(20);
/// The most gathers one bucketing run considers (a longer run is cut):
/// its e-graph holds a class per contiguous stretch of members.
pub const RUN_LIMIT: usize = 8;

/// A named rewrite rule.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    CastBeforeGather,
    HierarchicalAllGather,
    HierarchicalReduceScatter,
    AllReduceAsReduceScatterAllGather,
    BucketAllGathers,
}

impl Rule {
    pub const ALL: [Rule; 5] = [
        Rule::CastBeforeGather,
        Rule::HierarchicalAllGather,
        Rule::HierarchicalReduceScatter,
        Rule::AllReduceAsReduceScatterAllGather,
        Rule::BucketAllGathers,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Rule::CastBeforeGather => "cast-before-gather",
            Rule::HierarchicalAllGather => "hierarchical-all-gather",
            Rule::HierarchicalReduceScatter => "hierarchical-reduce-scatter",
            Rule::AllReduceAsReduceScatterAllGather => "all-reduce-as-reduce-scatter-all-gather",
            Rule::BucketAllGathers => "bucket-all-gathers",
        }
    }

    fn rewrites(self) -> Vec<Rewrite<Coll, Payloads>> {
        match self {
            Rule::CastBeforeGather => {
                vec![rewrite!("cast-before-gather"; "(recv ?d (ag ?x))" => "(ag (cast ?d ?x))")]
            }
            Rule::HierarchicalAllGather => {
                vec![rewrite!("hierarchical-all-gather"; "(ag ?x)" => "(hag ?x)")]
            }
            Rule::HierarchicalReduceScatter => {
                vec![rewrite!("hierarchical-reduce-scatter"; "(rs ?x)" => "(hrs ?x)")]
            }
            Rule::AllReduceAsReduceScatterAllGather => {
                vec![
                    rewrite!("all-reduce-as-reduce-scatter-all-gather"; "(ar ?x)" => "(ag (rs ?x))"),
                ]
            }
            // The run is right-nested: the last two members, or the first
            // two of a longer rest. Every contiguous grouping is reachable.
            Rule::BucketAllGathers => vec![
                rewrite!("bucket-all-gathers"; "(then (ag ?x) (ag ?y))" => "(ag (cat ?x ?y))"),
                rewrite!("bucket-all-gathers-rest";
                    "(then (ag ?x) (then (ag ?y) ?z))" => "(then (ag (cat ?x ?y)) ?z)"),
            ],
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The rules a compile may use (`--rewrites all|none|RULE,RULE`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rules(pub BTreeSet<Rule>);

impl Default for Rules {
    fn default() -> Rules {
        Rules(Rule::ALL.into_iter().collect())
    }
}

impl Rules {
    pub fn none() -> Rules {
        Rules(BTreeSet::new())
    }

    pub fn has(&self, r: Rule) -> bool {
        self.0.contains(&r)
    }

    /// `all`, `none`, or rule names separated by commas.
    pub fn parse(s: &str) -> Result<Rules, PlanError> {
        match s.trim() {
            "all" => return Ok(Rules::default()),
            "none" | "" => return Ok(Rules::none()),
            _ => {}
        }
        let mut out = BTreeSet::new();
        for name in s.split(',').map(str::trim) {
            let r = Rule::ALL
                .into_iter()
                .find(|r| r.name() == name)
                .ok_or_else(|| PlanError::BadConfig {
                    what: "rewrites",
                    value: s.to_string(),
                    reason: format!(
                        "no rewrite rule `{name}`; the rules: all, none, {}",
                        Rule::ALL.map(Rule::name).join(", ")
                    ),
                })?;
            out.insert(r);
        }
        Ok(Rules(out))
    }
}

/// A dtype leaf of a term.
#[derive(Copy, Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Ty(DType);

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for Ty {
    type Err = ();
    fn from_str(s: &str) -> Result<Ty, ()> {
        [DType::F32, DType::Bf16, DType::F16]
            .into_iter()
            .find(|d| d.to_string() == s)
            .map(Ty)
            .ok_or(())
    }
}

define_language! {
    enum Coll {
        "shard" = Shard([Id; 2]),
        "ag" = Ag([Id; 1]),
        "hag" = HierAg([Id; 1]),
        "rs" = Rs([Id; 1]),
        "hrs" = HierRs([Id; 1]),
        "ar" = Ar([Id; 1]),
        "cast" = Cast([Id; 2]),
        "recv" = Recv([Id; 2]),
        "cat" = Cat([Id; 2]),
        "then" = Then([Id; 2]),
        Num(u64),
        Ty(Ty),
        Other(Symbol),
    }
}

/// What an e-class holds: a count, a dtype, or a value of `numel`
/// elements (this rank's) of `dtype`, made of `parts` gathers' payloads
/// (more than one where buckets concatenate them).
#[derive(Copy, Clone, Debug, PartialEq)]
enum Data {
    Num(u64),
    Ty(DType),
    Val {
        numel: u64,
        dtype: DType,
        parts: u32,
    },
    None,
}

/// The analysis: `n`, the members of the collective's group.
struct Payloads {
    n: u64,
}

impl Analysis<Coll> for Payloads {
    type Data = Data;

    fn make(egraph: &mut EGraph<Coll, Self>, enode: &Coll, _id: Id) -> Data {
        let n = egraph.analysis.n.max(1);
        let d = |i: &Id| egraph[*i].data;
        let val = |i: &Id| match d(i) {
            Data::Val {
                numel,
                dtype,
                parts,
            } => Some((numel, dtype, parts)),
            _ => None,
        };
        let of = |v: Option<(u64, DType, u32)>| {
            v.map_or(Data::None, |(numel, dtype, parts)| Data::Val {
                numel,
                dtype,
                parts,
            })
        };
        match enode {
            Coll::Num(x) => Data::Num(*x),
            Coll::Ty(t) => Data::Ty(t.0),
            Coll::Other(_) | Coll::Then(_) => Data::None,
            Coll::Shard([t, x]) => match (d(t), d(x)) {
                (Data::Ty(dtype), Data::Num(numel)) => Data::Val {
                    numel,
                    dtype,
                    parts: 1,
                },
                _ => Data::None,
            },
            Coll::Ag([x]) | Coll::HierAg([x]) => of(val(x).map(|(e, t, p)| (e * n, t, p))),
            Coll::Rs([x]) | Coll::HierRs([x]) => of(val(x).map(|(e, t, p)| (e / n, t, p))),
            Coll::Ar([x]) => of(val(x)),
            Coll::Cast([t, x]) | Coll::Recv([t, x]) => match (d(t), val(x)) {
                (Data::Ty(dtype), Some((numel, _, parts))) => Data::Val {
                    numel,
                    dtype,
                    parts,
                },
                _ => Data::None,
            },
            // One dtype per run (`runs`): a concatenation of two.
            Coll::Cat([a, b]) => match (val(a), val(b)) {
                (Some((ea, ta, pa)), Some((eb, tb, pb))) if ta == tb => Data::Val {
                    numel: ea + eb,
                    dtype: ta,
                    parts: pa + pb,
                },
                _ => Data::None,
            },
        }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        // Equal classes hold equal values; keep whichever is known.
        if *a == Data::None && b != Data::None {
            *a = b;
            return DidMerge(true, false);
        }
        DidMerge(false, b == Data::None && *a != Data::None)
    }
}

/// The extraction cost: seconds by the cost model on the plan's cluster,
/// for a group of `k` ranks on each of `m` nodes.
struct Seconds<'a> {
    egraph: &'a EGraph<Coll, Payloads>,
    cluster: &'a Cluster,
    k: u32,
    m: u32,
}

impl Seconds<'_> {
    fn val(&self, id: Id) -> (f64, DType) {
        match self.egraph[id].data {
            Data::Val { numel, dtype, .. } => (numel as f64, dtype),
            _ => (0.0, DType::F32),
        }
    }

    /// `op` of `bytes` (the full buffer) by `algorithm`.
    fn coll(&self, op: CollectiveKind, algorithm: CollectiveAlgorithm, bytes: f64) -> f64 {
        algorithm_time(op, algorithm, self.k, self.m, bytes, self.cluster)
    }
}

impl CostFunction<Coll> for Seconds<'_> {
    type Cost = f64;

    fn cost<C>(&mut self, enode: &Coll, mut costs: C) -> f64
    where
        C: FnMut(Id) -> f64,
    {
        let own: f64 = enode.children().iter().map(|&c| costs(c)).sum();
        let n = f64::from(self.k * self.m);
        let hw = &self.cluster.hardware;
        let here = match enode {
            Coll::Num(_) | Coll::Ty(_) | Coll::Other(_) | Coll::Shard(_) | Coll::Recv(_) => 0.0,
            // Not in a single collective's term.
            Coll::Cat(_) | Coll::Then(_) => f64::INFINITY,
            Coll::Cast([t, x]) => {
                let (e, from) = self.val(*x);
                let to = match self.egraph[*t].data {
                    Data::Ty(d) => d,
                    _ => from,
                };
                let bytes = e * (from.size() + to.size()) as f64;
                hw.kernel_overhead_s + bytes / hw.kernel_bandwidth_for("unary", bytes).max(1.0)
            }
            Coll::Ag([x]) | Coll::HierAg([x]) => {
                let (e, t) = self.val(*x);
                let algorithm = match enode {
                    Coll::HierAg(_) => CollectiveAlgorithm::Hierarchical,
                    _ => CollectiveAlgorithm::Ring,
                };
                self.coll(
                    CollectiveKind::AllGather,
                    algorithm,
                    e * n * t.size() as f64,
                )
            }
            Coll::Rs([x]) => {
                let (e, t) = self.val(*x);
                self.coll(
                    CollectiveKind::ReduceScatter,
                    CollectiveAlgorithm::Ring,
                    e * t.size() as f64,
                )
            }
            Coll::HierRs([x]) => {
                let (e, t) = self.val(*x);
                let bytes = e * t.size() as f64;
                let scale = 4.0 / t.size() as f64;
                hierarchical_time_with(
                    CollectiveKind::ReduceScatter,
                    self.k,
                    self.m,
                    bytes,
                    scale,
                    self.cluster,
                )
                .unwrap_or_else(|| {
                    ring_collective_time(
                        CollectiveKind::ReduceScatter,
                        self.k,
                        self.m,
                        bytes,
                        self.cluster,
                    )
                })
            }
            Coll::Ar([x]) => {
                let (e, t) = self.val(*x);
                self.coll(
                    CollectiveKind::AllReduce,
                    CollectiveAlgorithm::Ring,
                    e * t.size() as f64,
                )
            }
        };
        // A second collective call costs its launch.
        let launch = match enode {
            Coll::Ag([x])
                if self.egraph[*x]
                    .nodes
                    .iter()
                    .any(|n| matches!(n, Coll::Rs(_))) =>
            {
                hw.kernel_overhead_s
            }
            _ => 0.0,
        };
        own + here + launch
    }
}

/// A collective as the pass sees it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Site {
    kind: CollectiveKind,
    /// The payload's dtype as the schedule holds it (a gather: the shard's;
    /// a reduction: the buffer's).
    from: DType,
    /// A gather's destination dtype (the reduction's own dtype otherwise).
    to: DType,
    numel: u64,
    k: u32,
    m: u32,
    rules: Vec<Rule>,
}

/// The form chosen for a `Site`.
#[derive(Clone, Debug)]
struct Form {
    /// A gather sends `to` (cast first), not `from`.
    cast_first: bool,
    algorithm: CollectiveAlgorithm,
    /// The rules the chosen form uses, each with the time it saves: the
    /// best form without that rule less the chosen one.
    fired: Vec<(Rule, f64)>,
    /// The chosen form's cost.
    cost_s: f64,
    saturated: bool,
}

fn start_term(site: &Site) -> String {
    let leaf = format!("(shard {} {})", site.from, site.numel);
    match site.kind {
        CollectiveKind::AllGather if site.from != site.to => {
            format!("(recv {} (ag {leaf}))", site.to)
        }
        CollectiveKind::AllGather => format!("(ag {leaf})"),
        CollectiveKind::ReduceScatter => format!("(rs {leaf})"),
        CollectiveKind::AllReduce => format!("(ar {leaf})"),
    }
}

/// An e-graph of `start` alone, over a group of `n`: its only form is the
/// start term (whose cost the rules' savings are measured against).
fn unrewritten(start: &RecExpr<Coll>, n: u64) -> (EGraph<Coll, Payloads>, Id) {
    let mut eg = EGraph::<Coll, Payloads>::new(Payloads { n });
    let at = eg.add_expr(start);
    eg.rebuild();
    (eg, at)
}

fn choose(site: &Site, cluster: &Cluster) -> Result<Form, PlanError> {
    let start: RecExpr<Coll> = start_term(site).parse().map_err(|e| PlanError::Program {
        reason: format!("collective rewrite: the term of a collective does not parse: {e}"),
    })?;
    let rules: Vec<Rewrite<Coll, Payloads>> =
        site.rules.iter().flat_map(|r| r.rewrites()).collect();
    let runner = Runner::<Coll, Payloads>::new(Payloads {
        n: u64::from(site.k * site.m),
    })
    .with_iter_limit(ITER_LIMIT)
    .with_node_limit(NODE_LIMIT)
    .with_time_limit(TIME_LIMIT)
    .with_expr(&start)
    .run(&rules);
    let saturated = matches!(runner.stop_reason, Some(StopReason::Saturated));
    let root = runner.roots[0];
    fn cost<'a>(eg: &'a EGraph<Coll, Payloads>, cluster: &'a Cluster, site: &Site) -> Seconds<'a> {
        Seconds {
            egraph: eg,
            cluster,
            k: site.k,
            m: site.m,
        }
    }
    let (best, expr) =
        Extractor::new(&runner.egraph, cost(&runner.egraph, cluster, site)).find_best(root);
    // The start term's own cost: the only form of a fresh e-graph.
    let (fresh, at) = unrewritten(&start, u64::from(site.k * site.m));
    let (start_cost, _) = Extractor::new(&fresh, cost(&fresh, cluster, site)).find_best(at);
    let nodes = expr.as_ref();
    let has = |f: &dyn Fn(&Coll) -> bool| nodes.iter().any(f);
    let cast_first = has(&|n| matches!(n, Coll::Cast(_)));
    let hier = has(&|n| matches!(n, Coll::HierAg(_) | Coll::HierRs(_)));
    let rs_ag = site.kind == CollectiveKind::AllReduce && !has(&|n| matches!(n, Coll::Ar(_)));
    let algorithm = if rs_ag {
        CollectiveAlgorithm::ReduceScatterAllGather
    } else if hier {
        CollectiveAlgorithm::Hierarchical
    } else {
        CollectiveAlgorithm::Ring
    };
    let mut fired = Vec::new();
    if cast_first {
        fired.push(Rule::CastBeforeGather);
    }
    if hier {
        fired.push(match site.kind {
            CollectiveKind::ReduceScatter => Rule::HierarchicalReduceScatter,
            _ => Rule::HierarchicalAllGather,
        });
    }
    if rs_ag {
        fired.push(Rule::AllReduceAsReduceScatterAllGather);
    }
    let fired = if fired.len() == 1 {
        vec![(fired[0], (start_cost - best).max(0.0))]
    } else {
        // Each rule's share: what the best form without it costs more.
        let mut out = Vec::new();
        for &r in &fired {
            let without = Site {
                rules: site.rules.iter().copied().filter(|&x| x != r).collect(),
                ..site.clone()
            };
            out.push((r, (choose(&without, cluster)?.cost_s - best).max(0.0)));
        }
        out
    };
    Ok(Form {
        cast_first,
        algorithm,
        fired,
        cost_s: best,
        saturated,
    })
}

/// The streams' staging buffers (`BufferKind::Staging`), made on first
/// use and grown to the most any collective of the stream needs.
#[derive(Default)]
struct Stagings(Vec<(fsdpc_plan::Stream, BufferId)>);

impl Stagings {
    fn need(
        &mut self,
        buffers: &mut Vec<Buffer>,
        stream: fsdpc_plan::Stream,
        bytes: u64,
    ) -> BufferId {
        let id = match self.0.iter().find(|(s, _)| *s == stream) {
            Some(&(_, id)) => id,
            None => {
                let id = Buffer::add(buffers, BufferKind::Staging, DType::Bool, 0)
                    .on_stream(stream)
                    .id;
                self.0.push((stream, id));
                id
            }
        };
        let b = &mut buffers[id.index()];
        b.bytes = b.bytes.max(bytes);
        id
    }
}

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

/// Writes `form` into the instruction, with the stream's staging buffer
/// (`staging(bytes)`) where the form needs one.
fn write_back(
    op: &mut InstrOp,
    site: &Site,
    form: &Form,
    f: u32,
    staging: &mut dyn FnMut(u64) -> BufferId,
) {
    match op {
        InstrOp::AllGather {
            c:
                Collective {
                    dtype,
                    algorithm,
                    staging: st,
                    ..
                },
            ..
        } => {
            // Without the cast the shard moves in its own dtype.
            *dtype = if form.cast_first { site.to } else { site.from };
            *algorithm = form.algorithm;
            if form.algorithm == CollectiveAlgorithm::Hierarchical {
                *st = Some(staging(hier_gather_staging_bytes(
                    site.numel, site.m, site.to,
                )));
            }
        }
        InstrOp::ReduceScatter {
            c:
                Collective {
                    algorithm,
                    staging: st,
                    ..
                },
        } => {
            *algorithm = form.algorithm;
            if form.algorithm == CollectiveAlgorithm::Hierarchical {
                let shard = site.numel / u64::from(f.max(1));
                *st = Some(staging(hier_reduce_staging_bytes(shard, site.m)));
            }
        }
        InstrOp::AllReduce {
            algorithm,
            staging: st,
            ..
        } => {
            *algorithm = form.algorithm;
            if form.algorithm == CollectiveAlgorithm::ReduceScatterAllGather {
                let n = u64::from((site.k * site.m).max(1));
                *st = Some(staging(site.numel / n * site.from.size() as u64));
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_names_parse_and_round_trip() {
        assert_eq!(Rules::parse("all").unwrap(), Rules::default());
        assert_eq!(Rules::parse("none").unwrap(), Rules::none());
        let r = Rules::parse("cast-before-gather, hierarchical-all-gather").unwrap();
        assert!(r.has(Rule::CastBeforeGather) && r.has(Rule::HierarchicalAllGather));
        assert!(!r.has(Rule::HierarchicalReduceScatter));
        let e = Rules::parse("bucket").unwrap_err().to_string();
        assert!(
            e.contains("no rewrite rule `bucket`") && e.contains("cast-before-gather"),
            "{e}"
        );
    }

    #[test]
    fn the_analysis_sizes_every_form() {
        let mut eg = EGraph::<Coll, Payloads>::new(Payloads { n: 4 });
        let e: RecExpr<Coll> = "(ag (cast bf16 (shard f32 100)))".parse().unwrap();
        let id = eg.add_expr(&e);
        assert_eq!(
            eg[id].data,
            Data::Val {
                numel: 400,
                dtype: DType::Bf16,
                parts: 1
            }
        );
        let e: RecExpr<Coll> = "(ag (rs (shard f32 400)))".parse().unwrap();
        let id = eg.add_expr(&e);
        assert_eq!(
            eg[id].data,
            Data::Val {
                numel: 400,
                dtype: DType::F32,
                parts: 1
            }
        );
    }

    #[test]
    fn hierarchical_needs_whole_nodes() {
        assert_eq!(hierarchical_shape(16, 8), Some((8, 2)));
        assert_eq!(hierarchical_shape(8, 8), None);
        assert_eq!(hierarchical_shape(12, 8), None);
        assert_eq!(hierarchical_shape(4, 1), None);
    }
}
