//! Which form each collective takes: its start term grown by the enabled
//! rules, the form the cost model charges least extracted (`Seconds`, the
//! calibrated cost of the plan's cluster), and what each rule that form
//! uses saves.

use super::lang::{unrewritten, Coll, Data, Payloads};
use super::rules::Rule;
use super::{ITER_LIMIT, NODE_LIMIT, TIME_LIMIT};
use crate::cost::{algorithm_time, hierarchical_time_with, ring_collective_time};
use crate::error::PlanError;
use egg::{CostFunction, EGraph, Extractor, Id, Language, RecExpr, Rewrite, Runner, StopReason};
use fsdpc_ir::DType;
use fsdpc_plan::cluster::{Cluster, CollectiveKind};
use fsdpc_plan::CollectiveAlgorithm;

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
pub(super) struct Site {
    pub(super) kind: CollectiveKind,
    /// The payload's dtype as the schedule holds it (a gather: the shard's;
    /// a reduction: the buffer's).
    pub(super) from: DType,
    /// A gather's destination dtype (the reduction's own dtype otherwise).
    pub(super) to: DType,
    pub(super) numel: u64,
    pub(super) k: u32,
    pub(super) m: u32,
    pub(super) rules: Vec<Rule>,
}

/// The form chosen for a `Site`.
#[derive(Clone, Debug)]
pub(super) struct Form {
    /// A gather sends `to` (cast first), not `from`.
    pub(super) cast_first: bool,
    pub(super) algorithm: CollectiveAlgorithm,
    /// The rules the chosen form uses, each with the time it saves: the
    /// best form without that rule less the chosen one.
    pub(super) fired: Vec<(Rule, f64)>,
    /// The chosen form's cost.
    pub(super) cost_s: f64,
    pub(super) saturated: bool,
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

pub(super) fn choose(site: &Site, cluster: &Cluster) -> Result<Form, PlanError> {
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
