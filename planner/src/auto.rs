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
//!   whose time bound cannot beat the best found so far by more than the
//!   optimality gap (`Search::with_gap`; `--auto-gap`, 0.5% by default), is
//!   pruned without compiling. `exhaustive` compiles every candidate; the tests check that
//!   both give the same best candidate and that no bound exceeded what its
//!   compile gave.
//! - Memory is `Plan::memory.peak_bytes` against `Cluster::memory_bytes`,
//!   as `compile` checks it; time is the step `compile` simulated on the
//!   cluster (`Plan::estimates`, after the overlap pass).

use crate::config::FsdpConfig;
use crate::error::PlanError;
use fsdpc_ir::{DType, TrainingProgram};
use fsdpc_plan::cluster::Cluster;
use fsdpc_plan::config::TensorRecord;
use fsdpc_plan::readable::human_bytes;
use fsdpc_plan::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use thiserror::Error;

mod grid;
mod mesh;
mod space;
mod table;

pub use mesh::{search_mesh, tensor_degrees, MeshBest, MeshChoice, MeshRow};

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
    /// Not compiled: its time bound cannot beat the best step by more than
    /// the search's gap (`Search::with_gap`).
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
    /// No candidate beats the step another search reached
    /// (`Search::with_incumbent`).
    #[error(
        "no configuration beats a step of {best_s:.4} s, what another tensor-parallel degree's \
         fastest plan gives in tokens per second per rank ({candidates} weighed, {compiled} compiled)"
    )]
    Outpaced {
        best_s: f64,
        candidates: usize,
        compiled: usize,
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

/// A search: its inputs (`Search::new`), its optimality gap, and the
/// programs it prepared.
pub struct Search<'a> {
    program: &'a TrainingProgram,
    model: &'a ModelInfo,
    cluster: &'a Cluster,
    base: &'a FsdpConfig,
    space: &'a Space,
    gap: f64,
    prepared: Prepare,
    /// With tensor parallelism: the `tensor` pass's output for the base's
    /// degree, one member's program (whose FLOPs and parameters the bounds
    /// count), from which every candidate is prepared.
    split: Option<(TrainingProgram, Option<TensorRecord>)>,
    /// A step another search reached (`with_incumbent`).
    incumbent: Option<f64>,
}

impl<'a> Search<'a> {
    /// A search of `space` around `base` for `program` on `cluster`, exact
    /// (gap 0).
    pub fn new(
        program: &'a TrainingProgram,
        model: &'a ModelInfo,
        cluster: &'a Cluster,
        base: &'a FsdpConfig,
        space: &'a Space,
    ) -> Search<'a> {
        let split = (base.tensor_parallel > 1)
            .then(|| {
                crate::tensor::apply(
                    program.clone(),
                    base.tensor_parallel,
                    base.sequence_parallel,
                )
                .ok()
            })
            .flatten();
        Search {
            program,
            model,
            cluster,
            base,
            space,
            gap: 0.0,
            prepared: Prepare::default(),
            split,
            incumbent: None,
        }
    }

    /// A step another search already reached, in this search's units (a
    /// tensor-parallel degree's best, scaled to this degree's tokens):
    /// candidates whose step bound cannot beat it by more than the gap are
    /// pruned like those that cannot beat this search's own best, and when
    /// no candidate beats it `run` says so (`AutoError::Outpaced`).
    pub fn with_incumbent(self, step_s: f64) -> Search<'a> {
        Search {
            incumbent: Some(step_s),
            ..self
        }
    }

    /// The program one rank computes: its FLOPs and parameters bound the
    /// candidates'.
    fn rank_program(&self) -> &TrainingProgram {
        self.split.as_ref().map_or(self.program, |(p, _)| p)
    }

    /// The optimality gap, a fraction: a candidate is not compiled when
    /// its step's lower bound is at least the best step found divided by
    /// `1 + gap`, so the chosen step is at most `1 + gap` times the fastest
    /// of the space. 0: the fastest exactly (as `exhaustive` finds it).
    pub fn with_gap(self, gap: f64) -> Search<'a> {
        Search { gap, ..self }
    }
}

/// How many candidates the search compiles at once (in parallel): a
/// constant, so that which are compiled does not depend on the threads.
const COMPILE_BATCH: usize = 2;

/// A screened candidate that fits, waiting to be compiled.
struct Ready {
    /// The larger of its class's bound and its own screen's.
    lower: f64,
    index: usize,
    peak_bytes: u64,
    bound_bytes: u64,
    candidate: Candidate,
}

/// The space's candidates with their verdicts, and the best index.
struct Table {
    weighed: Vec<Option<Weighed>>,
    best: Option<(f64, usize)>,
    plans: BTreeMap<usize, Plan>,
}

/// Prepared programs by `Prepared::key`: candidates that differ only in
/// strategy, F, offload or schedule knobs share one.
#[derive(Default)]
struct Prepare(Mutex<BTreeMap<String, Arc<crate::Prepared>>>);

impl Prepare {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<crate::Prepared>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A copy of `cfg`'s prepared program, prepared (`Search::prepare`) on
    /// first use.
    fn get(&self, search: &Search, cfg: &FsdpConfig) -> Result<crate::Prepared, PlanError> {
        let key = crate::Prepared::key(cfg);
        let known = self.lock().get(&key).cloned();
        let p = match known {
            Some(p) => p,
            None => {
                let p = Arc::new(search.prepare(cfg)?);
                self.lock().insert(key, p.clone());
                p
            }
        };
        Ok((*p).clone())
    }
}

impl Search<'_> {
    /// `cfg`'s prepared program: from the split program when `cfg` has the
    /// base's degree and sequence setting (every candidate of the search).
    fn prepare(&self, cfg: &FsdpConfig) -> Result<crate::Prepared, PlanError> {
        match &self.split {
            Some((program, record))
                if cfg.tensor_parallel == self.base.tensor_parallel
                    && cfg.sequence_parallel == self.base.sequence_parallel =>
            {
                crate::prepare_split(program.clone(), record.clone(), cfg)
            }
            _ => crate::prepare(self.program.clone(), cfg),
        }
    }

    fn compile(&self, cfg: &FsdpConfig) -> Result<Plan, PlanError> {
        crate::check(self.cluster, cfg)?;
        let prepared = self.prepared.get(self, cfg)?;
        crate::compile_prepared(prepared, self.model.clone(), self.cluster, cfg)
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
        let quick = || -> Result<crate::Quick, PlanError> {
            crate::check(self.cluster, cfg)?;
            let prepared = self.prepared.get(self, cfg)?;
            crate::quick_prepared(prepared, self.model.clone(), self.cluster, cfg)
        };
        match quick() {
            Ok(q) => Ok(Ok(q)),
            Err(e @ (PlanError::BadConfig { .. } | PlanError::Program { .. })) => {
                Ok(Err(e.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The compute bound of a precision: the program's FLOPs (`flops`) at
    /// the peak rate of the fastest dtype it computes in.
    fn compute_bound(&self, flops: f64, precision: (DType, DType)) -> f64 {
        let hw = &self.cluster.hardware;
        let peak = hw.peak_flops(precision.0).max(hw.peak_flops(DType::F32));
        if peak > 0.0 {
            flops / peak
        } else {
            0.0
        }
    }

    /// The FLOPs of one rank's program.
    fn flops(&self) -> f64 {
        let g = &self.rank_program().graph;
        g.node_ids().map(|n| crate::cost::node_flops(g, n)).sum()
    }

    /// The persistent bytes every candidate of a class holds at least: f32
    /// master shards, and optimizer state of trainable parameters.
    fn persistent_bound(&self, class: &Class) -> u64 {
        if class.offload {
            return 0;
        }
        let slots = self.program.optimizer.state_slots() as u64;
        let f = u64::from(class.sharding.1.max(1));
        self.rank_program()
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

    /// Runs the pruned search: every candidate is screened (`screen`: its
    /// exact peak and a step lower bound) before it is compiled, and
    /// compiled only while its lower bound can beat the best step found by
    /// more than the gap (`Search::gap`).
    ///
    /// 0. When another degree's step is there to beat: one screen per
    ///    prepared program, whose compute-stream work (kernels and tensor
    ///    collectives, the same in every class that prepares that program)
    ///    bounds its classes; classes it rules out are not screened.
    /// 1. One screen per class, in parallel: first the least-memory member
    ///    of each structure's first class (in order of compute bound, then
    ///    index) whose persistent bytes fit (it bounds the memory of the
    ///    whole structure at every F), then the first member of every
    ///    other class whose memory bound fits. Each gives its class's busy
    ///    bound and a first candidate to compile.
    /// 2. Best first: the screened candidate with the smallest lower bound
    ///    is compiled when no class still unexplored has a bound smaller by
    ///    more than the gap; otherwise the class with the smallest bound is
    ///    explored (its other members screened, in parallel). Candidates
    ///    are compiled `COMPILE_BATCH` at a time, in parallel, each one
    ///    that would be compiled next on its own. The search
    ///    stops when neither can beat the best; the rest are pruned. Ties
    ///    go to the smaller index, and the result and the table do not
    ///    depend on the number of threads.
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
            // Another search's step stands as a best no candidate index
            // precedes; one that beats it replaces it.
            best: self.incumbent.map(|s| (s, usize::MAX)),
            plans: BTreeMap::new(),
        };
        let flops = self.flops();
        let mut bound: Vec<f64> = classes
            .iter()
            .map(|c| self.compute_bound(flops, c.precision))
            .collect();
        let mut mem = vec![0u64; classes.len()];
        let mut ready: Vec<Ready> = Vec::new();
        let mut order: Vec<usize> = (0..classes.len()).collect();
        order.sort_by(|&a, &b| bound[a].total_cmp(&bound[b]).then(a.cmp(&b)));
        let mut first: BTreeMap<usize, (usize, Screened)> = BTreeMap::new();
        // 0. With a step to beat already (another degree's): one screen
        // per prepared program, of its first class in order at the
        // least-memory knobs, whose compute-stream work bounds every class
        // that prepares the same program; classes that cannot beat the
        // step are screened no further.
        if t.best.is_some() {
            let key = |ci: usize| crate::Prepared::key(&apply(self.base, &classes[ci], least));
            let mut seen = std::collections::BTreeSet::new();
            let reps: Vec<usize> = order
                .iter()
                .copied()
                .filter(|&ci| seen.insert(key(ci)))
                .collect();
            let mut work: BTreeMap<String, f64> = BTreeMap::new();
            for (ci, r) in self.screen_each(&reps, |ci| apply(self.base, &classes[ci], least))? {
                if let Ok(q) = &r {
                    work.insert(
                        key(ci),
                        crate::simulate::program_work_s(&q.plan, self.cluster),
                    );
                }
                first.insert(ci, (least_at, r));
            }
            for (ci, b) in bound.iter_mut().enumerate() {
                *b = b.max(work.get(&key(ci)).copied().unwrap_or(0.0));
            }
            order.sort_by(|&a, &b| bound[a].total_cmp(&bound[b]).then(a.cmp(&b)));
        }
        let live = |ci: usize, bound: &[f64]| !self.pruned(t.best, bound[ci], ci * per);
        // 1a. One probe per structure: its first class in order whose
        // persistent bytes fit (and that may beat the step to beat),
        // screened at the least-memory knobs.
        let floor: Vec<u64> = classes.iter().map(|c| self.persistent_bound(c)).collect();
        let mut probes: Vec<usize> = Vec::new();
        let mut seen = std::collections::BTreeSet::new();
        for &ci in &order {
            if floor[ci] <= cap && live(ci, &bound) && seen.insert(classes[ci].structure()) {
                probes.push(ci);
            }
        }
        let todo: Vec<usize> = probes
            .iter()
            .copied()
            .filter(|ci| !first.contains_key(ci))
            .collect();
        for (ci, r) in self.screen_each(&todo, |ci| apply(self.base, &classes[ci], least))? {
            first.insert(ci, (least_at, r));
        }
        for &ci in &probes {
            if let Some((_, Ok(q))) = first.get(&ci) {
                known
                    .structure
                    .insert(classes[ci].structure(), Probe::from_plan(&q.plan));
            }
        }
        for ci in 0..classes.len() {
            mem[ci] = known
                .structure
                .get(&classes[ci].structure())
                .map_or(0, |p| p.bound(classes[ci].sharding.1))
                .max(floor[ci]);
        }
        // 1b. Every other class that may fit: its first member.
        let rest: Vec<usize> = order
            .iter()
            .copied()
            .filter(|&ci| !first.contains_key(&ci) && mem[ci] <= cap && live(ci, &bound))
            .collect();
        for (ci, r) in self.screen_each(&rest, |ci| apply(self.base, &classes[ci], knobs[0]))? {
            first.insert(ci, (0, r));
        }
        for (ci, (ki, r)) in first {
            if let Ok(q) = &r {
                bound[ci] = bound[ci].max(q.class_s);
            }
            let cand = Candidate {
                index: ci * per + ki,
                config: apply(self.base, &classes[ci], knobs[ki]),
            };
            self.admit(cand, r, &mut t, &mut ready, bound[ci], mem[ci]);
        }
        // Classes left to explore, by bound then index.
        let mut open: Vec<usize> = (0..classes.len()).filter(|&ci| mem[ci] <= cap).collect();
        open.sort_by(|&a, &b| bound[b].total_cmp(&bound[a]).then(b.cmp(&a)));
        ready.sort_by(|a, b| b.lower.total_cmp(&a.lower).then(b.index.cmp(&a.index)));
        loop {
            // Both lists are sorted largest first: the last is the next.
            let s = ready
                .last()
                .filter(|r| !self.pruned(t.best, r.lower, r.index));
            let c = open
                .last()
                .copied()
                .filter(|&ci| !self.pruned(t.best, bound[ci], ci * per));
            let compile_next = match (s, c) {
                (None, None) => break,
                (Some(r), c) => c.is_none_or(|ci| r.lower <= bound[ci] * (1.0 + self.gap)),
                (None, Some(_)) => false,
            };
            if compile_next {
                // Up to `COMPILE_BATCH` candidates at once, each of which
                // would be compiled next on its own: the batch does not
                // depend on the number of threads.
                let mut batch = Vec::new();
                while batch.len() < COMPILE_BATCH {
                    let next = ready.last().filter(|r| {
                        !self.pruned(t.best, r.lower, r.index)
                            && c.is_none_or(|ci| r.lower <= bound[ci] * (1.0 + self.gap))
                    });
                    if next.is_none() && !batch.is_empty() {
                        break;
                    }
                    let Some(r) = ready.pop() else { break };
                    batch.push(r);
                }
                use rayon::prelude::*;
                let evaluated: Vec<Result<Evaluated, AutoError>> = batch
                    .par_iter()
                    .map(|r| self.evaluate(&r.candidate.config))
                    .collect();
                for (r, e) in batch.into_iter().zip(evaluated) {
                    let index = r.candidate.index;
                    let w = self.record(r.candidate, e?, &mut t, r.lower, r.bound_bytes);
                    t.weighed[index] = Some(w);
                }
            } else if let Some(ci) = c {
                open.pop();
                let todo: Vec<usize> = (0..per)
                    .filter(|&ki| t.weighed[ci * per + ki].is_none())
                    .filter(|&ki| !ready.iter().any(|r| r.candidate.index == ci * per + ki))
                    .collect();
                for (ki, r) in self.screen_all(&classes[ci], &knobs, &todo)? {
                    let cand = Candidate {
                        index: ci * per + ki,
                        config: apply(self.base, &classes[ci], knobs[ki]),
                    };
                    self.admit(cand, r, &mut t, &mut ready, bound[ci], mem[ci]);
                }
                ready.sort_by(|a, b| b.lower.total_cmp(&a.lower).then(b.index.cmp(&a.index)));
            }
        }
        // Whatever is left was pruned: screened candidates by their own
        // bound, the rest by their class's.
        let best_s = t.best.map_or(f64::INFINITY, |b| b.0);
        for r in ready {
            let index = r.candidate.index;
            t.weighed[index] = Some(Weighed {
                candidate: r.candidate,
                verdict: Verdict::TimeBound {
                    bound_s: r.lower,
                    best_s,
                },
                step_time_s: None,
                peak_bytes: Some(r.peak_bytes),
                bound_s: r.lower,
                bound_bytes: r.bound_bytes,
            });
        }
        for (ci, class) in classes.iter().enumerate() {
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
                        best_s,
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

    /// Whether a candidate at `index` whose step is at least `bound` need
    /// not be compiled: it cannot beat `best` by more than the gap.
    fn pruned(&self, best: Option<(f64, usize)>, bound: f64, index: usize) -> bool {
        beaten(best, bound * (1.0 + self.gap), index)
    }

    /// Takes a screened candidate in: refused and over-memory ones (the
    /// screen's peak is the compiled one) get their row; the others wait in
    /// `ready` with their lower bound, the larger of the class's and their
    /// own.
    fn admit(
        &self,
        cand: Candidate,
        r: Screened,
        t: &mut Table,
        ready: &mut Vec<Ready>,
        bound_s: f64,
        bound_bytes: u64,
    ) {
        let index = cand.index;
        let row = |cand, verdict, peak_bytes| Weighed {
            candidate: cand,
            verdict,
            step_time_s: None,
            peak_bytes,
            bound_s,
            bound_bytes,
        };
        match r {
            Err(reason) => t.weighed[index] = Some(row(cand, Verdict::Refused { reason }, None)),
            Ok(q) if q.device_peak_bytes > self.cluster.memory_bytes => {
                let by_bytes = q.device_peak_bytes - self.cluster.memory_bytes;
                let verdict = Verdict::OverMemory { by_bytes };
                t.weighed[index] = Some(row(cand, verdict, Some(q.peak_bytes)));
            }
            Ok(q) => ready.push(Ready {
                lower: bound_s.max(q.step_lower_s),
                index,
                peak_bytes: q.peak_bytes,
                bound_bytes,
                candidate: cand,
            }),
        }
    }

    /// Screens `config(i)` for each `i` of `items` in parallel, in `items`
    /// order.
    fn screen_each(
        &self,
        items: &[usize],
        config: impl Fn(usize) -> FsdpConfig + Sync,
    ) -> Result<Vec<(usize, Screened)>, AutoError> {
        use rayon::prelude::*;
        items
            .par_iter()
            .map(|&i| Ok((i, self.screen(&config(i))?)))
            .collect()
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
        let device = plan.memory.device_peak_bytes();
        let verdict = if device > cap {
            Verdict::OverMemory {
                by_bytes: device - cap,
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
        if best_i == usize::MAX {
            return Err(AutoError::Outpaced {
                best_s,
                candidates: weighed.len(),
                compiled,
            });
        }
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
            gap: self.gap,
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
