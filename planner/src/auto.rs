//! The auto-planner (`fsdpc compile --auto`): a search over the FSDP
//! configurations of a `Space` for the fastest simulated step that fits a
//! rank's memory, pruned with bounds so that only a few candidates are
//! compiled.
//!
//! Conventions:
//! - A candidate is the base `FsdpConfig` with one value per dimension of
//!   the space. Candidates are enumerated in a fixed nested order
//!   (outermost first): precision, wrap, sharding (strategy, F), activation
//!   checkpointing, offload, then the schedule knobs backward prefetch,
//!   forward prefetch, prefetch depth, limit_all_gathers. Each dimension's
//!   values are listed in `Space` order. `Candidate::index` is the position.
//! - The best candidate is the one that fits with the smallest simulated
//!   step time; ties go to the smaller index (the earlier in the order
//!   above), so the result does not depend on the order of evaluation.
//! - A *class* is a candidate without its schedule knobs: its members run
//!   the same instructions (only their order and waits differ), so the
//!   busiest stream of any compiled member bounds every member's step from
//!   below. A *structure* is a class without its shard factor: its members'
//!   non-persistent bytes at the peak (gathered parameters, flat gradients,
//!   activations) do not depend on F, while persistent ones (shards,
//!   reduced gradients, optimizer state) scale as 1/F (the insight of
//!   `fit`).
//! - Bounds (each a lower bound of what a compile would give):
//!   compute: the program's FLOPs at the cluster's peak rate for the
//!   precision; busy: the busiest stream of a compiled class member;
//!   persistent memory: every parameter's f32 master shard and optimizer
//!   state at F (none of it on the device with offload); structure memory:
//!   the transient bytes of the structure's least-memory member (schedule
//!   knobs least first: no prefetch, depth 1, limit 1) plus the persistent
//!   bytes at F. A candidate whose memory bound exceeds the capacity, or
//!   whose time bound cannot beat the best found so far, is pruned without
//!   compiling. `exhaustive` compiles every candidate; the tests check that
//!   both give the same best candidate and that no bound exceeded what its
//!   compile gave.
//! - Memory is `Plan::memory.peak_bytes` against `Cluster::memory_bytes`,
//!   as `compile` checks it; time is the step `compile` simulated on the
//!   cluster (`Plan::estimates`, after the overlap pass).

use crate::cluster::Cluster;
use crate::config::FsdpConfig;
use crate::error::PlanError;
use crate::inspect::human_bytes;
use crate::plan::*;
use fsdpc_ir::{DType, TrainingProgram};
use std::collections::BTreeMap;
use thiserror::Error;

mod grid;
mod space;
mod table;

use space::{apply, Class, Knobs};
pub use space::{candidates, short, Candidate, Fixed, Space};

/// Why a candidate was not chosen, or that it was.
#[derive(Clone, Debug, PartialEq)]
pub enum Verdict {
    /// The fastest candidate that fits.
    Chosen,
    /// Fits, but its step is slower than the chosen one's by this fraction.
    Slower { by: f64 },
    /// Compiled: its peak exceeds the capacity by this many bytes.
    OverMemory { by_bytes: u64 },
    /// Not compiled: its memory bound exceeds the capacity by this much.
    MemoryBound { by_bytes: u64 },
    /// Not compiled: its time bound is no better than the best step found
    /// when it was reached.
    TimeBound { bound_s: f64, best_s: f64 },
    /// The planner refused it (e.g. a policy that does not apply).
    Refused { reason: String },
}

/// One candidate as the search weighed it.
#[derive(Clone, Debug, PartialEq)]
pub struct Weighed {
    pub candidate: Candidate,
    pub verdict: Verdict,
    /// Simulated step time, when compiled.
    pub step_time_s: Option<f64>,
    /// Peak bytes per rank, when compiled.
    pub peak_bytes: Option<u64>,
    /// The time and memory lower bounds it had when it was reached.
    pub bound_s: f64,
    pub bound_bytes: u64,
}

impl Weighed {
    /// Whether it was compiled (not pruned by a bound).
    pub fn compiled(&self) -> bool {
        self.step_time_s.is_some()
    }
}

/// The search's result: the chosen plan and every candidate's verdict.
#[derive(Clone, Debug)]
pub struct AutoResult {
    pub plan: Plan,
    pub weighed: Vec<Weighed>,
    pub record: AutoRecord,
    /// Schedule-knob variants per class (rows of one class in the table).
    pub knobs_per_class: usize,
}

/// A search that found nothing that fits.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum AutoError {
    /// Every candidate is over memory.
    #[error(
        "no configuration fits in {} per rank ({candidates} weighed, {compiled} compiled): the \
         closest, {closest}, needs {} (over by {}); {suggestion}",
        human_bytes(*capacity_bytes), human_bytes(*needed_bytes), human_bytes(*over_by)
    )]
    FitsNowhere {
        candidates: usize,
        compiled: usize,
        /// The candidate with the smallest peak, in short form.
        closest: String,
        needed_bytes: u64,
        capacity_bytes: u64,
        over_by: u64,
        /// The smallest world (a multiple of the ranks per node) at which a
        /// structure of the space fits, checked by compiling there.
        smallest_world: Option<u32>,
        suggestion: String,
    },
    /// A candidate's compile failed for a reason other than its
    /// configuration (a bug or a program the planner cannot lower).
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// What the compiled bounds of the search know.
#[derive(Default)]
struct Known {
    /// Structure -> (transient bytes, probe plan's persistent layout).
    structure: BTreeMap<String, Probe>,
}

/// A structure's least-memory member, compiled.
struct Probe {
    transient: u64,
    /// (flat numel, bytes per shard element) of each persistent unit buffer,
    /// and bytes of the persistent buffers that do not scale with F.
    scaled: Vec<(u64, f64)>,
    fixed: u64,
}

impl Probe {
    fn from_plan(plan: &Plan) -> Probe {
        let mut scaled = Vec::new();
        let mut fixed = 0u64;
        let mut slack = 0u64;
        for b in plan
            .buffers
            .iter()
            .filter(|b| b.persistent() && b.location == Location::Device)
        {
            match (b.kind, b.unit.and_then(|u| plan.units.get(u.index()))) {
                (BufferKind::Loss, _) | (_, None) => fixed += b.bytes,
                (_, Some(u)) if u.shard_numel > 0 => {
                    scaled.push((u.flat_numel, b.bytes as f64 / u.shard_numel as f64));
                }
                _ => fixed += b.bytes,
            }
        }
        // Staged shards (offload) are not persistent but scale as 1/F: the
        // ones live at the peak are not counted as transient.
        slack += plan
            .memory
            .breakdown
            .iter()
            .filter(|(k, _)| matches!(k, BufferKind::StagedParams | BufferKind::StagedGrads))
            .map(|(_, b)| *b)
            .sum::<u64>();
        for u in &plan.units {
            // Padding of gathered buffers (parameters and gradients, at
            // most 4 bytes an element) depends on F: not counted as
            // transient, so the bound holds at every F.
            slack += (u.padded_numel - u.flat_numel) * 8;
        }
        let f = u64::from(plan.config.shard_factor.max(1));
        let mut p = Probe {
            transient: 0,
            scaled,
            fixed,
        };
        p.transient = plan
            .memory
            .peak_bytes
            .saturating_sub(p.persistent(f))
            .saturating_sub(slack);
        p
    }

    /// Persistent device bytes at shard factor `f`.
    fn persistent(&self, f: u64) -> u64 {
        self.fixed
            + self
                .scaled
                .iter()
                .map(|&(flat, per)| (flat.div_ceil(f.max(1)) as f64 * per).floor() as u64)
                .sum::<u64>()
    }

    fn bound(&self, f: u32) -> u64 {
        self.transient + self.persistent(u64::from(f))
    }
}

/// A compiled candidate and its step time, or the planner's refusal.
type Evaluated = Result<(Plan, f64), String>;

/// A screened candidate (`crate::quick`: exact peak, step lower bound), or
/// the planner's refusal.
type Screened = Result<crate::Quick, String>;

/// The inputs of a search.
pub struct Search<'a> {
    pub program: &'a TrainingProgram,
    pub model: &'a ModelInfo,
    pub cluster: &'a Cluster,
    pub base: &'a FsdpConfig,
    pub space: &'a Space,
}

/// The space's candidates with their verdicts, and the best index.
struct Table {
    weighed: Vec<Option<Weighed>>,
    best: Option<(f64, usize)>,
    plans: BTreeMap<usize, Plan>,
}

impl Search<'_> {
    fn compile(&self, cfg: &FsdpConfig) -> Result<Plan, PlanError> {
        crate::compile_unchecked(self.program.clone(), self.model.clone(), self.cluster, cfg)
    }

    /// Compiles one candidate: its plan, or the planner's refusal of its
    /// configuration. Errors other than a refused configuration end the
    /// search.
    fn evaluate(&self, cfg: &FsdpConfig) -> Result<Evaluated, AutoError> {
        match self.compile(cfg) {
            Ok(plan) => {
                // `compile` simulated the plan on this cluster already.
                let step = plan.estimates.step_time_s;
                Ok(Ok((plan, step)))
            }
            Err(e @ (PlanError::BadConfig { .. } | PlanError::Program { .. })) => {
                Ok(Err(e.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Screens one candidate: every pass but memory planning, giving its
    /// exact peak and a lower bound of its step (`crate::quick`), or the
    /// planner's refusal of its configuration.
    fn screen(&self, cfg: &FsdpConfig) -> Result<Screened, AutoError> {
        match crate::quick(self.program.clone(), self.model.clone(), self.cluster, cfg) {
            Ok(q) => Ok(Ok(q)),
            Err(e @ (PlanError::BadConfig { .. } | PlanError::Program { .. })) => {
                Ok(Err(e.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The compute bound of a precision: the program's FLOPs at the peak
    /// rate of the fastest dtype it computes in.
    fn compute_bound(&self, precision: (DType, DType)) -> f64 {
        let hw = &self.cluster.hardware;
        let peak = hw.peak_flops(precision.0).max(hw.peak_flops(DType::F32));
        let g = &self.program.graph;
        let flops: f64 = g.node_ids().map(|n| crate::cost::node_flops(g, n)).sum();
        if peak > 0.0 {
            flops / peak
        } else {
            0.0
        }
    }

    /// The persistent bytes every candidate of a class holds at least: f32
    /// master shards, and optimizer state of trainable parameters.
    fn persistent_bound(&self, class: &Class) -> u64 {
        if class.offload {
            return 0;
        }
        let slots = self.program.optimizer.state_slots() as u64;
        let f = u64::from(class.sharding.1.max(1));
        self.program
            .graph
            .params
            .iter()
            .filter(|p| p.tied_to.is_none())
            .map(|p| {
                let state = if p.requires_grad && self.base.freeze.is_empty() {
                    slots
                } else {
                    0
                };
                (p.ty.numel() / f) * 4 * (1 + state)
            })
            .sum()
    }

    /// Runs the pruned search, in two passes over the classes. A candidate
    /// is screened (`screen`: its exact peak and a step lower bound) before
    /// it is compiled, and compiled only when it fits and its lower bound
    /// can beat the best step found.
    ///
    /// 1. In order of compute bound, then index: the structure's
    ///    least-memory member when the structure has no probe yet (it
    ///    bounds the memory of the whole structure at every F), else the
    ///    class's first member no bound prunes. Each gives its class's busy
    ///    bound and, compiled, a first best.
    /// 2. In order of the classes' time bounds, then index: every member no
    ///    class bound prunes is screened (in parallel); those that fit are
    ///    weighed in order of their own lower bound, then index, and
    ///    compiled until the bound cannot beat the best. The rest are
    ///    pruned. The result and the table do not depend on the number of
    ///    threads.
    pub fn run(&self) -> Result<AutoResult, AutoError> {
        let classes = self.space.classes();
        let knobs = self.space.knobs();
        let least = self.space.least_memory_knobs();
        let least_at = knobs.iter().position(|k| *k == least).unwrap_or(0);
        let per = knobs.len();
        let cap = self.cluster.memory_bytes;
        let mut known = Known::default();
        let mut t = Table {
            weighed: vec![None; classes.len() * per],
            best: None,
            plans: BTreeMap::new(),
        };
        let mut bound: Vec<f64> = classes
            .iter()
            .map(|c| self.compute_bound(c.precision))
            .collect();
        let mut mem = vec![0u64; classes.len()];
        let mut order: Vec<usize> = (0..classes.len()).collect();
        order.sort_by(|&a, &b| bound[a].total_cmp(&bound[b]).then(a.cmp(&b)));
        for &ci in &order {
            let class = &classes[ci];
            let key = class.structure();
            let floor = self.persistent_bound(class);
            let probe = !known.structure.contains_key(&key)
                && floor <= cap
                && !beaten(t.best, bound[ci], ci * per + least_at);
            let first = if probe {
                let r = self.screen(&apply(self.base, class, least))?;
                if let Ok(q) = &r {
                    known
                        .structure
                        .insert(key.clone(), Probe::from_plan(&q.plan));
                }
                Some((least_at, r))
            } else {
                None
            };
            mem[ci] = known
                .structure
                .get(&key)
                .map_or(0, |p| p.bound(class.sharding.1))
                .max(floor);
            let first = match first {
                Some(x) => Some(x),
                None => match (0..per)
                    .find(|&ki| mem[ci] <= cap && !beaten(t.best, bound[ci], ci * per + ki))
                {
                    Some(ki) => Some((ki, self.screen(&apply(self.base, class, knobs[ki]))?)),
                    None => None,
                },
            };
            if let Some((ki, r)) = first {
                if let Ok(q) = &r {
                    bound[ci] = bound[ci].max(q.busy_s);
                }
                let cand = Candidate {
                    index: ci * per + ki,
                    config: apply(self.base, class, knobs[ki]),
                };
                let w = self.weigh(cand, r, &mut t, bound[ci], mem[ci])?;
                t.weighed[ci * per + ki] = Some(w);
            }
        }
        order.sort_by(|&a, &b| bound[a].total_cmp(&bound[b]).then(a.cmp(&b)));
        for &ci in &order {
            let class = &classes[ci];
            let todo: Vec<usize> = (0..per)
                .filter(|&ki| t.weighed[ci * per + ki].is_none())
                .filter(|&ki| mem[ci] <= cap && !beaten(t.best, bound[ci], ci * per + ki))
                .collect();
            let mut screened = self.screen_all(class, &knobs, &todo)?;
            let lower = |r: &Screened| r.as_ref().map_or(0.0, |q| q.step_lower_s);
            screened.sort_by(|a, b| lower(&a.1).total_cmp(&lower(&b.1)).then(a.0.cmp(&b.0)));
            for (ki, r) in screened {
                let cand = Candidate {
                    index: ci * per + ki,
                    config: apply(self.base, class, knobs[ki]),
                };
                let w = self.weigh(cand, r, &mut t, bound[ci], mem[ci])?;
                t.weighed[ci * per + ki] = Some(w);
            }
            // Whatever is left was pruned.
            for (ki, &k) in knobs.iter().enumerate() {
                let index = ci * per + ki;
                if t.weighed[index].is_some() {
                    continue;
                }
                let verdict = if mem[ci] > cap {
                    Verdict::MemoryBound {
                        by_bytes: mem[ci] - cap,
                    }
                } else {
                    Verdict::TimeBound {
                        bound_s: bound[ci],
                        best_s: t.best.map_or(f64::INFINITY, |b| b.0),
                    }
                };
                t.weighed[index] = Some(Weighed {
                    candidate: Candidate {
                        index,
                        config: apply(self.base, class, k),
                    },
                    verdict,
                    step_time_s: None,
                    peak_bytes: None,
                    bound_s: bound[ci],
                    bound_bytes: mem[ci],
                });
            }
        }
        self.finish(t)
    }

    /// Screens the members `todo` of `class` in parallel, in `todo` order.
    fn screen_all(
        &self,
        class: &Class,
        knobs: &[Knobs],
        todo: &[usize],
    ) -> Result<Vec<(usize, Screened)>, AutoError> {
        use rayon::prelude::*;
        todo.par_iter()
            .map(|&ki| Ok((ki, self.screen(&apply(self.base, class, knobs[ki]))?)))
            .collect()
    }

    /// Weighs a screened candidate: refused; over memory (the screen's
    /// peak is the compiled one); pruned by its own lower bound (or the
    /// class's, whichever is larger) when that cannot beat the best; else
    /// compiled and recorded.
    fn weigh(
        &self,
        cand: Candidate,
        r: Screened,
        t: &mut Table,
        bound_s: f64,
        bound_bytes: u64,
    ) -> Result<Weighed, AutoError> {
        let cap = self.cluster.memory_bytes;
        let row = |verdict, peak_bytes, bound_s| Weighed {
            candidate: cand.clone(),
            verdict,
            step_time_s: None,
            peak_bytes,
            bound_s,
            bound_bytes,
        };
        let q = match r {
            Err(reason) => return Ok(row(Verdict::Refused { reason }, None, bound_s)),
            Ok(q) => q,
        };
        if q.peak_bytes > cap {
            let by_bytes = q.peak_bytes - cap;
            return Ok(row(
                Verdict::OverMemory { by_bytes },
                Some(q.peak_bytes),
                bound_s,
            ));
        }
        let lower = bound_s.max(q.step_lower_s);
        if beaten(t.best, lower, cand.index) {
            let best_s = t.best.map_or(f64::INFINITY, |b| b.0);
            let verdict = Verdict::TimeBound {
                bound_s: lower,
                best_s,
            };
            return Ok(row(verdict, Some(q.peak_bytes), lower));
        }
        let r = self.evaluate(&cand.config)?;
        Ok(self.record(cand, r, t, lower, bound_bytes))
    }

    /// Records a compiled (or refused) candidate; returns its row.
    fn record(
        &self,
        cand: Candidate,
        r: Evaluated,
        t: &mut Table,
        bound_s: f64,
        bound_bytes: u64,
    ) -> Weighed {
        let cap = self.cluster.memory_bytes;
        let (plan, step) = match r {
            Err(reason) => {
                return Weighed {
                    candidate: cand,
                    verdict: Verdict::Refused { reason },
                    step_time_s: None,
                    peak_bytes: None,
                    bound_s,
                    bound_bytes,
                }
            }
            Ok(x) => x,
        };
        let peak = plan.memory.peak_bytes;
        let verdict = if peak > cap {
            Verdict::OverMemory {
                by_bytes: peak - cap,
            }
        } else {
            if t.best.is_none_or(|b| (step, cand.index) < b) {
                t.best = Some((step, cand.index));
                t.plans.clear();
                t.plans.insert(cand.index, plan);
            }
            Verdict::Slower { by: 0.0 }
        };
        Weighed {
            candidate: cand,
            verdict,
            step_time_s: Some(step),
            peak_bytes: Some(peak),
            bound_s,
            bound_bytes,
        }
    }

    /// The chosen plan and the final verdicts, or why nothing fits.
    fn finish(&self, t: Table) -> Result<AutoResult, AutoError> {
        let mut weighed: Vec<Weighed> = t.weighed.into_iter().flatten().collect();
        let compiled = weighed.iter().filter(|w| w.compiled()).count();
        let Some((best_s, best_i)) = t.best else {
            return Err(self.fits_nowhere(&weighed, compiled));
        };
        for w in &mut weighed {
            if let (Verdict::Slower { by }, Some(s)) = (&mut w.verdict, w.step_time_s) {
                if w.candidate.index == best_i {
                    w.verdict = Verdict::Chosen;
                } else {
                    *by = if best_s > 0.0 { s / best_s - 1.0 } else { 0.0 };
                }
            }
        }
        let count = |f: fn(&Verdict) -> bool| weighed.iter().filter(|w| f(&w.verdict)).count();
        let record = AutoRecord {
            candidates: weighed.len() as u64,
            compiled: compiled as u64,
            screened: weighed
                .iter()
                .filter(|w| !w.compiled() && w.peak_bytes.is_some())
                .count() as u64,
            pruned_by_memory: count(|v| matches!(v, Verdict::MemoryBound { .. })) as u64,
            pruned_by_time: count(|v| matches!(v, Verdict::TimeBound { .. })) as u64,
            searched: self.space.searched(),
        };
        let mut plan = t
            .plans
            .into_values()
            .next()
            .ok_or_else(|| PlanError::Program {
                reason: "the auto-planner lost its chosen plan".into(),
            })?;
        plan.config.auto = Some(record.clone());
        Ok(AutoResult {
            plan,
            weighed,
            record,
            knobs_per_class: self.space.knobs_len(),
        })
    }
}

/// Whether a candidate at `index` with time bound `bound` cannot beat
/// `best` (step, index): a larger bound, or an equal one and a later index.
fn beaten(best: Option<(f64, usize)>, bound: f64, index: usize) -> bool {
    best.is_some_and(|(s, i)| bound > s || (bound == s && index > i))
}
