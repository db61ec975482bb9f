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
//!   as `compile` checks it; time is `simulate::estimate_on`.

use crate::cluster::Cluster;
use crate::config::FsdpConfig;
use crate::error::PlanError;
use crate::inspect::human_bytes;
use crate::plan::*;
use crate::simulate;
use fsdpc_ir::{DType, TrainingProgram};
use std::collections::BTreeMap;
use thiserror::Error;

/// The values each dimension may take. A dimension the user fixed has one
/// value; the order of values is the tie-break order.
#[derive(Clone, Debug, PartialEq)]
pub struct Space {
    /// (param dtype, reduce dtype) pairs.
    pub precisions: Vec<(DType, DType)>,
    pub wraps: Vec<WrapPolicy>,
    /// (strategy, F) pairs; F divides the world.
    pub shardings: Vec<(Strategy, u32)>,
    pub checkpointing: Vec<CheckpointPolicy>,
    pub cpu_offload: Vec<bool>,
    pub backward_prefetch: Vec<BackwardPrefetch>,
    pub forward_prefetch: Vec<bool>,
    pub prefetch_depth: Vec<u32>,
    pub limit_all_gathers: Vec<u32>,
}

/// Which dimensions the user fixed (a flag given with `--auto`); the rest
/// are searched.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Fixed {
    pub precision: bool,
    /// `Some`: only this strategy; F still searched unless `shard_factor`.
    pub strategy: Option<Strategy>,
    pub shard_factor: Option<u32>,
    pub wrap: bool,
    pub checkpointing: bool,
    pub cpu_offload: bool,
    pub backward_prefetch: bool,
    pub forward_prefetch: bool,
    pub prefetch_depth: bool,
    pub limit_all_gathers: bool,
}

impl Space {
    /// The default space around `base` for `world` ranks, `rpn` to a node:
    /// every dimension not in `fixed` searched over its default values, a
    /// fixed one kept at `base`'s value. Precision: `base`'s, and with
    /// `allow_bf16` also bf16 parameters with f32 reduction (precision
    /// changes the numerics, so only when the user allows it).
    ///
    /// Defaults: wrap `blocks` and `size:` half a block's parameters (each
    /// block split in its attention and MLP); strategy and F: no_shard (F 1),
    /// full_shard and shard_grad_op at F = world, hybrid_shard and
    /// hybrid_shard_zero2 at every other divisor of the world; checkpointing
    /// none, every:2, all; offload off and on; backward prefetch pre, post,
    /// none; forward prefetch on, off; depth 1, 2; limit 2, 1, 4.
    pub fn around(
        base: &FsdpConfig,
        program: &TrainingProgram,
        world: u32,
        fixed: &Fixed,
        allow_bf16: bool,
    ) -> Result<Space, PlanError> {
        let mut precisions = vec![(base.param_dtype, base.reduce_dtype)];
        if allow_bf16 && !fixed.precision && base.param_dtype == DType::F32 {
            precisions.push((DType::Bf16, DType::F32));
        }
        let wraps = if fixed.wrap {
            vec![base.wrap.clone()]
        } else {
            let mut w = vec![WrapPolicy::Blocks];
            if let Some(half) = half_block(program) {
                w.push(WrapPolicy::Size { min_numel: half });
            }
            w
        };
        let shardings = shardings(world, fixed)?;
        Ok(Space {
            precisions,
            wraps,
            shardings,
            checkpointing: pick(
                fixed.checkpointing,
                base.activation_checkpointing.clone(),
                vec![
                    CheckpointPolicy::None,
                    CheckpointPolicy::Every(2),
                    CheckpointPolicy::Units,
                ],
            ),
            cpu_offload: pick(fixed.cpu_offload, base.cpu_offload, vec![false, true]),
            backward_prefetch: pick(
                fixed.backward_prefetch,
                base.backward_prefetch,
                vec![
                    BackwardPrefetch::Pre,
                    BackwardPrefetch::Post,
                    BackwardPrefetch::None,
                ],
            ),
            forward_prefetch: pick(
                fixed.forward_prefetch,
                base.forward_prefetch,
                vec![true, false],
            ),
            prefetch_depth: pick(fixed.prefetch_depth, base.prefetch_depth, vec![1, 2]),
            limit_all_gathers: pick(
                fixed.limit_all_gathers,
                base.limit_all_gathers,
                vec![2, 1, 4],
            ),
        })
    }

    /// Number of candidates (offload is not combined with no_shard).
    pub fn len(&self) -> usize {
        self.classes().len() * self.knobs_len()
    }

    /// Whether the space has no candidate.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn knobs_len(&self) -> usize {
        self.backward_prefetch.len()
            * self.forward_prefetch.len()
            * self.prefetch_depth.len()
            * self.limit_all_gathers.len()
    }

    /// The classes in enumeration order.
    fn classes(&self) -> Vec<Class> {
        let mut out = Vec::new();
        for &precision in &self.precisions {
            for wrap in &self.wraps {
                for &sharding in &self.shardings {
                    for ckpt in &self.checkpointing {
                        for &offload in &self.cpu_offload {
                            if offload && sharding.0 == Strategy::NoShard {
                                continue;
                            }
                            out.push(Class {
                                precision,
                                wrap: wrap.clone(),
                                sharding,
                                ckpt: ckpt.clone(),
                                offload,
                            });
                        }
                    }
                }
            }
        }
        out
    }

    /// The schedule knobs in enumeration order.
    fn knobs(&self) -> Vec<Knobs> {
        let mut out = Vec::new();
        for &bwd in &self.backward_prefetch {
            for &fwd in &self.forward_prefetch {
                for &depth in &self.prefetch_depth {
                    for &limit in &self.limit_all_gathers {
                        out.push(Knobs {
                            bwd,
                            fwd,
                            depth,
                            limit,
                        });
                    }
                }
            }
        }
        out
    }

    /// The knobs that hold the least memory (no prefetch, smallest depth
    /// and limit), used to probe a structure's transient bytes.
    fn least_memory_knobs(&self) -> Knobs {
        let rank = |b: &BackwardPrefetch| match b {
            BackwardPrefetch::None => 0,
            BackwardPrefetch::Post => 1,
            BackwardPrefetch::Pre => 2,
        };
        Knobs {
            bwd: self
                .backward_prefetch
                .iter()
                .copied()
                .min_by_key(rank)
                .unwrap_or(BackwardPrefetch::None),
            fwd: !self.forward_prefetch.contains(&false),
            depth: self.prefetch_depth.iter().copied().min().unwrap_or(1),
            limit: self.limit_all_gathers.iter().copied().min().unwrap_or(1),
        }
    }
}

/// `[value]` when the user fixed the dimension, else `all`.
fn pick<T>(given: bool, value: T, all: Vec<T>) -> Vec<T> {
    if given {
        vec![value]
    } else {
        all
    }
}

/// The sharding values searched: fixed strategy and F if given.
fn shardings(world: u32, fixed: &Fixed) -> Result<Vec<(Strategy, u32)>, PlanError> {
    let world = world.max(1);
    let divisors: Vec<u32> = (1..=world).filter(|d| world.is_multiple_of(*d)).collect();
    let mut out = Vec::new();
    for &f in &divisors {
        let strategies: &[Strategy] = if f == 1 {
            &[Strategy::NoShard]
        } else if f == world {
            &[Strategy::FullShard, Strategy::ShardGradOp]
        } else {
            &[Strategy::HybridShard, Strategy::HybridShardZero2]
        };
        for &s in strategies {
            out.push((s, f));
        }
    }
    if let Some(s) = fixed.strategy {
        // A fixed strategy keeps its own F choices: 1 for no_shard, the
        // world for full_shard and shard_grad_op, the other divisors for
        // the hybrid ones; a fixed F overrides them.
        let fs: Vec<u32> = match (s, fixed.shard_factor) {
            (_, Some(f)) => vec![f],
            (Strategy::NoShard, None) => vec![1],
            (s, None) if s.is_hybrid() => {
                let inner: Vec<u32> = divisors
                    .iter()
                    .copied()
                    .filter(|&d| d > 1 && d < world)
                    .collect();
                if inner.is_empty() {
                    vec![world]
                } else {
                    inner
                }
            }
            (_, None) => vec![world],
        };
        out = fs.into_iter().map(|f| (s, f)).collect();
    }
    if let Some(f) = fixed.shard_factor {
        out.retain(|&(_, g)| g == f);
    }
    out.retain(|&(_, g)| divisors.contains(&g));
    if out.is_empty() {
        return Err(PlanError::BadConfig {
            what: "auto search",
            value: format!(
                "{}{}",
                fixed.strategy.map_or("any strategy", |s| s.name()),
                fixed
                    .shard_factor
                    .map_or(String::new(), |f| format!(" at F = {f}"))
            ),
            reason: format!(
                "no sharding to search at world {world}: F must divide the world (one of {})",
                divisors
                    .iter()
                    .map(|d| d.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    Ok(out)
}

/// Half the parameters of the program's largest block (`blocks` units),
/// the `size:` threshold that splits each block in two; `None` when the
/// model has no blocks.
fn half_block(program: &TrainingProgram) -> Option<u64> {
    let assign = crate::units::assign_units(&program.graph, &WrapPolicy::Blocks).ok()?;
    let largest = assign
        .units
        .iter()
        .skip(1)
        .map(|u| {
            u.params
                .iter()
                .filter_map(|p| program.graph.params.get(p.0 as usize))
                .map(|p| p.ty.numel())
                .sum::<u64>()
        })
        .max()?;
    (largest >= 4).then_some(largest / 2)
}

/// A candidate without its schedule knobs.
#[derive(Clone, Debug, PartialEq)]
struct Class {
    precision: (DType, DType),
    wrap: WrapPolicy,
    sharding: (Strategy, u32),
    ckpt: CheckpointPolicy,
    offload: bool,
}

impl Class {
    /// The structure key: the class without F (and with the strategy
    /// reduced to whether it reshards after forward and whether it shards).
    fn structure(&self) -> String {
        format!(
            "{:?}|{:?}|{}|{}|{}|{}",
            self.precision,
            self.wrap,
            self.ckpt.name(),
            self.offload,
            self.sharding.0.reshards_after_forward(),
            self.sharding.0 == Strategy::NoShard
        )
    }
}

#[derive(Copy, Clone, Debug, PartialEq)]
struct Knobs {
    bwd: BackwardPrefetch,
    fwd: bool,
    depth: u32,
    limit: u32,
}

/// One point of the space.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// Position in the enumeration order (the tie-break).
    pub index: usize,
    pub config: FsdpConfig,
}

impl Candidate {
    /// The configuration in short form, e.g.
    /// `bf16/f32 blocks full_shard F=512 ckpt=all offload bwd=pre fwd=on d=1 lim=2`.
    pub fn short(&self) -> String {
        short(&self.config)
    }
}

/// `cfg` in the short form of the candidate table.
pub fn short(cfg: &FsdpConfig) -> String {
    let wrap = match &cfg.wrap {
        WrapPolicy::Blocks => "blocks".to_string(),
        WrapPolicy::Kind { kind } => format!("kind:{kind}"),
        WrapPolicy::Size { min_numel } => format!("size:{min_numel}"),
        WrapPolicy::Paths { paths } => format!("paths:{}", paths.len()),
    };
    format!(
        "{}/{} {} {} F={} ckpt={}{} bwd={} fwd={} d={} lim={}",
        cfg.param_dtype,
        cfg.reduce_dtype,
        wrap,
        cfg.strategy.name(),
        cfg.shard_factor
            .map_or("default".to_string(), |f| f.to_string()),
        cfg.activation_checkpointing.name(),
        if cfg.cpu_offload { " offload" } else { "" },
        format!("{:?}", cfg.backward_prefetch).to_lowercase(),
        if cfg.forward_prefetch { "on" } else { "off" },
        cfg.prefetch_depth,
        cfg.limit_all_gathers
    )
}

fn apply(base: &FsdpConfig, c: &Class, k: Knobs) -> FsdpConfig {
    FsdpConfig {
        param_dtype: c.precision.0,
        reduce_dtype: c.precision.1,
        // bf16 compute keeps f32 constants unless the user chose otherwise.
        buffer_dtype: if c.precision.0 == base.param_dtype {
            base.buffer_dtype
        } else {
            DType::F32
        },
        wrap: c.wrap.clone(),
        strategy: c.sharding.0,
        shard_factor: Some(c.sharding.1),
        activation_checkpointing: c.ckpt.clone(),
        cpu_offload: c.offload,
        backward_prefetch: k.bwd,
        forward_prefetch: k.fwd,
        prefetch_depth: k.depth,
        limit_all_gathers: k.limit,
        check_fits: false,
        ..base.clone()
    }
}

/// Every candidate of `space` around `base`, in enumeration order.
pub fn candidates(space: &Space, base: &FsdpConfig) -> Vec<Candidate> {
    let knobs = space.knobs();
    let mut out = Vec::new();
    for c in space.classes() {
        for &k in &knobs {
            out.push(Candidate {
                index: out.len(),
                config: apply(base, &c, k),
            });
        }
    }
    out
}

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
                let step = simulate::estimate_on(&plan, self.cluster).step_time_s;
                Ok(Ok((plan, step)))
            }
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

    /// Runs the pruned search, in two passes over the classes.
    ///
    /// 1. In order of compute bound, then index: the structure's
    ///    least-memory member when the structure has no probe yet (it
    ///    bounds the memory of the whole structure at every F), else the
    ///    class's first member no bound prunes. Each gives its class's busy
    ///    bound and a first best.
    /// 2. In order of the classes' time bounds, then index: every member no
    ///    bound prunes, compiled in parallel and recorded in index order
    ///    (so the result and the table do not depend on the number of
    ///    threads). The rest are pruned.
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
                let r = self.evaluate(&apply(self.base, class, least))?;
                if let Ok((plan, _)) = &r {
                    known.structure.insert(key.clone(), Probe::from_plan(plan));
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
                    Some(ki) => Some((ki, self.evaluate(&apply(self.base, class, knobs[ki]))?)),
                    None => None,
                },
            };
            if let Some((ki, r)) = first {
                let cand = Candidate {
                    index: ci * per + ki,
                    config: apply(self.base, class, knobs[ki]),
                };
                let (w, busy) = self.record(cand, r, &mut t, bound[ci], mem[ci]);
                t.weighed[ci * per + ki] = Some(w);
                bound[ci] = bound[ci].max(busy.unwrap_or(0.0));
            }
        }
        order.sort_by(|&a, &b| bound[a].total_cmp(&bound[b]).then(a.cmp(&b)));
        for &ci in &order {
            let class = &classes[ci];
            let todo: Vec<usize> = (0..per)
                .filter(|&ki| t.weighed[ci * per + ki].is_none())
                .filter(|&ki| mem[ci] <= cap && !beaten(t.best, bound[ci], ci * per + ki))
                .collect();
            for (ki, r) in self.evaluate_all(class, &knobs, &todo)? {
                let cand = Candidate {
                    index: ci * per + ki,
                    config: apply(self.base, class, knobs[ki]),
                };
                let (w, _) = self.record(cand, r, &mut t, bound[ci], mem[ci]);
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

    /// Compiles the members `todo` of `class` in parallel, in `todo`
    /// order.
    fn evaluate_all(
        &self,
        class: &Class,
        knobs: &[Knobs],
        todo: &[usize],
    ) -> Result<Vec<(usize, Evaluated)>, AutoError> {
        use rayon::prelude::*;
        todo.par_iter()
            .map(|&ki| Ok((ki, self.evaluate(&apply(self.base, class, knobs[ki]))?)))
            .collect()
    }

    /// Records a compiled (or refused) candidate; returns its row and the
    /// busiest stream's seconds.
    fn record(
        &self,
        cand: Candidate,
        r: Evaluated,
        t: &mut Table,
        bound_s: f64,
        bound_bytes: u64,
    ) -> (Weighed, Option<f64>) {
        let cap = self.cluster.memory_bytes;
        let (plan, step) = match r {
            Err(reason) => {
                return (
                    Weighed {
                        candidate: cand,
                        verdict: Verdict::Refused { reason },
                        step_time_s: None,
                        peak_bytes: None,
                        bound_s,
                        bound_bytes,
                    },
                    None,
                )
            }
            Ok(x) => x,
        };
        let peak = plan.memory.peak_bytes;
        let sim = simulate::run(&plan, self.cluster);
        let busy = sim
            .busy
            .iter()
            .map(|(_, f)| f * sim.step_time_s)
            .fold(0.0, f64::max);
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
        (
            Weighed {
                candidate: cand,
                verdict,
                step_time_s: Some(step),
                peak_bytes: Some(peak),
                bound_s,
                bound_bytes,
            },
            Some(busy),
        )
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

impl Search<'_> {
    /// Every candidate compiled, no bound used: the reference the pruned
    /// search must agree with (same chosen index, same step time).
    pub fn exhaustive(&self) -> Result<AutoResult, AutoError> {
        let mut t = Table {
            weighed: Vec::new(),
            best: None,
            plans: BTreeMap::new(),
        };
        for cand in candidates(self.space, self.base) {
            let r = self.evaluate(&cand.config)?;
            let (w, _) = self.record(cand, r, &mut t, 0.0, 0);
            t.weighed.push(Some(w));
        }
        self.finish(t)
    }

    /// The error for a space where nothing fits: the closest candidate, the
    /// smallest world at which a structure of the space fits (checked by
    /// compiling there), and whether bf16 or offload, when the space did
    /// not include them, would fit at this world.
    fn fits_nowhere(&self, weighed: &[Weighed], compiled: usize) -> AutoError {
        let cap = self.cluster.memory_bytes;
        let closest = weighed
            .iter()
            .filter_map(|w| w.peak_bytes.map(|p| (p, w)))
            .min_by_key(|(p, w)| (*p, w.candidate.index))
            .or_else(|| {
                weighed
                    .iter()
                    .map(|w| (w.bound_bytes, w))
                    .min_by_key(|(p, w)| (*p, w.candidate.index))
            });
        let (needed, closest) = match closest {
            Some((p, w)) => (p, w.candidate.short()),
            None => (0, "none".to_string()),
        };
        let (smallest_world, mut suggestion) = match self.smallest_world() {
            Some((w, cfg, peak)) => (
                Some(w),
                format!(
                    "more ranks: world {w} ({} nodes of {}) fits with {} (peak {})",
                    w / self.cluster.ranks_per_node.max(1),
                    self.cluster.ranks_per_node,
                    short(&cfg),
                    human_bytes(peak)
                ),
            ),
            None => (
                None,
                "no world size makes it fit: the unsharded working set alone exceeds a rank's \
                 memory (try a smaller batch)"
                    .to_string(),
            ),
        };
        for (label, alt) in self.alternatives() {
            match self.evaluate(&alt) {
                Ok(Ok((plan, _))) if plan.memory.peak_bytes <= cap => {
                    suggestion.push_str(&format!(
                        "; {label} fits at this world ({}, peak {})",
                        short(&alt),
                        human_bytes(plan.memory.peak_bytes)
                    ))
                }
                Ok(Ok((plan, _))) => suggestion.push_str(&format!(
                    "; {label} alone does not fit (peak {})",
                    human_bytes(plan.memory.peak_bytes)
                )),
                _ => {}
            }
        }
        AutoError::FitsNowhere {
            candidates: weighed.len(),
            compiled,
            closest,
            needed_bytes: needed,
            capacity_bytes: cap,
            over_by: needed.saturating_sub(cap),
            smallest_world,
            suggestion,
        }
    }

    /// The least-memory configuration of the space at F = `world`: fully
    /// sharded, every unit checkpointed if the space allows, the
    /// least-memory knobs.
    fn leanest(&self, f: u32) -> FsdpConfig {
        let s = self.space;
        let ckpt = if s.checkpointing.contains(&CheckpointPolicy::Units) {
            CheckpointPolicy::Units
        } else {
            s.checkpointing.first().cloned().unwrap_or_default()
        };
        let class = Class {
            precision: *s
                .precisions
                .iter()
                .min_by_key(|(p, _)| p.size())
                .unwrap_or(&(self.base.param_dtype, self.base.reduce_dtype)),
            wrap: s.wraps.last().cloned().unwrap_or(WrapPolicy::Blocks),
            sharding: (Strategy::FullShard, f),
            ckpt,
            offload: s.cpu_offload.contains(&true),
        };
        apply(self.base, &class, s.least_memory_knobs())
    }

    /// What the space lacks that could make it fit at this world: bf16
    /// parameters and CPU offload, each added to the leanest configuration.
    fn alternatives(&self) -> Vec<(&'static str, FsdpConfig)> {
        let lean = self.leanest(self.cluster.world);
        let mut out = Vec::new();
        if lean.param_dtype.size() > 2 {
            out.push((
                "a lower precision (--auto-precision bf16)",
                FsdpConfig {
                    param_dtype: DType::Bf16,
                    reduce_dtype: DType::F32,
                    buffer_dtype: DType::F32,
                    ..lean.clone()
                },
            ));
        }
        if !lean.cpu_offload {
            out.push((
                "CPU offload (--cpu-offload)",
                FsdpConfig {
                    cpu_offload: true,
                    ..lean
                },
            ));
        }
        out
    }

    /// The smallest world, a multiple of the ranks per node, at which the
    /// leanest configuration of the space fits: estimated from its
    /// transient and persistent bytes, then compiled there (and at the
    /// next sizes up while it does not fit, a few at most).
    fn smallest_world(&self) -> Option<(u32, FsdpConfig, u64)> {
        let world = self.cluster.world;
        let lean = self.leanest(world);
        let (plan, _) = self.evaluate(&lean).ok()?.ok()?;
        let probe = Probe::from_plan(&plan);
        let cap = self.cluster.memory_bytes;
        if probe.transient >= cap {
            return None;
        }
        let rpn = self.cluster.ranks_per_node.max(1);
        let mut k = 1u32;
        while probe.bound(k.checked_mul(rpn)?) > cap {
            k = k.checked_mul(2)?;
        }
        let mut lo = 1u32;
        while lo < k {
            let mid = lo + (k - lo) / 2;
            if probe.bound(mid * rpn) <= cap {
                k = mid;
            } else {
                lo = mid + 1;
            }
        }
        for _ in 0..4 {
            let w = k.checked_mul(rpn)?;
            let cluster = self.cluster.with_world(w).ok()?;
            let cfg = FsdpConfig {
                shard_factor: Some(w),
                ..lean.clone()
            };
            let plan =
                crate::compile_unchecked(self.program.clone(), self.model.clone(), &cluster, &cfg)
                    .ok()?;
            if plan.memory.peak_bytes <= cap {
                return Some((w, cfg, plan.memory.peak_bytes));
            }
            k += 1;
        }
        None
    }
}

/// Whether a candidate at `index` with time bound `bound` cannot beat
/// `best` (step, index): a larger bound, or an equal one and a later index.
fn beaten(best: Option<(f64, usize)>, bound: f64, index: usize) -> bool {
    best.is_some_and(|(s, i)| bound > s || (bound == s && index > i))
}

impl Space {
    /// The dimensions with more than one value, by name and values, for
    /// the plan's record.
    pub fn searched(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut dim = |name: &str, vals: Vec<String>| {
            if vals.len() > 1 {
                out.push(format!("{name}: {}", vals.join(" ")));
            }
        };
        dim(
            "precision",
            self.precisions
                .iter()
                .map(|(p, r)| format!("{p}/{r}"))
                .collect(),
        );
        dim(
            "wrap",
            self.wraps
                .iter()
                .map(|w| {
                    short(&FsdpConfig {
                        wrap: w.clone(),
                        ..FsdpConfig::default()
                    })
                })
                .map(|s| s.split(' ').nth(1).unwrap_or_default().to_string())
                .collect(),
        );
        dim(
            "sharding",
            self.shardings
                .iter()
                .map(|(s, f)| format!("{}@{f}", s.name()))
                .collect(),
        );
        dim(
            "checkpointing",
            self.checkpointing.iter().map(|c| c.name()).collect(),
        );
        dim(
            "cpu_offload",
            self.cpu_offload.iter().map(|o| o.to_string()).collect(),
        );
        dim(
            "backward_prefetch",
            self.backward_prefetch
                .iter()
                .map(|b| format!("{b:?}").to_lowercase())
                .collect(),
        );
        dim(
            "forward_prefetch",
            self.forward_prefetch
                .iter()
                .map(|b| b.to_string())
                .collect(),
        );
        dim(
            "prefetch_depth",
            self.prefetch_depth.iter().map(|b| b.to_string()).collect(),
        );
        dim(
            "limit_all_gathers",
            self.limit_all_gathers
                .iter()
                .map(|b| b.to_string())
                .collect(),
        );
        out
    }
}

impl AutoResult {
    /// The candidate table: every compiled candidate on its own line, and
    /// runs of pruned candidates of one class (the schedule-knob variants)
    /// on one line with their count, in enumeration order.
    pub fn table(&self) -> String {
        render(&self.weighed, self.knobs_per_class)
    }
}

fn verdict_text(w: &Weighed) -> String {
    match &w.verdict {
        Verdict::Chosen => "chosen".into(),
        Verdict::Slower { by } => format!("slower than the chosen by {:.1}%", by * 100.0),
        Verdict::OverMemory { by_bytes } => format!("over memory by {}", human_bytes(*by_bytes)),
        Verdict::MemoryBound { by_bytes } => format!(
            "bound-pruned: memory >= {} (over by {})",
            human_bytes(w.bound_bytes),
            human_bytes(*by_bytes)
        ),
        Verdict::TimeBound { bound_s, best_s } => {
            format!("bound-pruned: step >= {bound_s:.4} s, best so far {best_s:.4} s")
        }
        Verdict::Refused { reason } => format!("refused: {reason}"),
    }
}

fn render(weighed: &[Weighed], knobs_per_class: usize) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "  {:<11} {:<84} {:>10} {:>10}  {:<4} verdict",
        "#", "config", "step (s)", "peak", "fits"
    );
    let per = knobs_per_class.max(1);
    let mut i = 0;
    while i < weighed.len() {
        let w = &weighed[i];
        if w.compiled() {
            let peak = w.peak_bytes.unwrap_or(0);
            let fits = !matches!(w.verdict, Verdict::OverMemory { .. });
            let _ = writeln!(
                out,
                "  {:<11} {:<84} {:>10.4} {:>10}  {:<4} {}",
                w.candidate.index,
                w.candidate.short(),
                w.step_time_s.unwrap_or(0.0),
                human_bytes(peak),
                if fits { "yes" } else { "no" },
                verdict_text(w)
            );
            i += 1;
            continue;
        }
        // A run of pruned (or refused) candidates of one class and kind.
        let class = w.candidate.index / per;
        let kind = std::mem::discriminant(&w.verdict);
        let mut j = i + 1;
        while j < weighed.len()
            && !weighed[j].compiled()
            && weighed[j].candidate.index / per == class
            && std::mem::discriminant(&weighed[j].verdict) == kind
        {
            j += 1;
        }
        let last = &weighed[j - 1];
        let (idx, cfg) = if j - i == 1 {
            (w.candidate.index.to_string(), w.candidate.short())
        } else {
            let s = w.candidate.short();
            let head = s.split(" bwd=").next().unwrap_or(&s).to_string();
            (
                format!("{}-{}", w.candidate.index, last.candidate.index),
                format!("{head} ({} schedule variants)", j - i),
            )
        };
        let _ = writeln!(
            out,
            "  {:<11} {:<84} {:>10} {:>10}  {:<4} {}",
            idx,
            cfg,
            "-",
            "-",
            "-",
            verdict_text(w)
        );
        i = j;
    }
    out
}
