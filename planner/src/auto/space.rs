//! The search space of the auto-planner: the values of each dimension,
//! the classes (a candidate without its schedule knobs) and candidates in
//! enumeration order, and the short form of a configuration.

use crate::config::FsdpConfig;
use crate::error::PlanError;
use fsdpc_ir::{DType, TrainingProgram};
use fsdpc_plan::*;

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

    pub(super) fn knobs_len(&self) -> usize {
        self.backward_prefetch.len()
            * self.forward_prefetch.len()
            * self.prefetch_depth.len()
            * self.limit_all_gathers.len()
    }

    /// The classes in enumeration order.
    pub(super) fn classes(&self) -> Vec<Class> {
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
    pub(super) fn knobs(&self) -> Vec<Knobs> {
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
    pub(super) fn least_memory_knobs(&self) -> Knobs {
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
pub(super) struct Class {
    pub(super) precision: (DType, DType),
    pub(super) wrap: WrapPolicy,
    pub(super) sharding: (Strategy, u32),
    pub(super) ckpt: CheckpointPolicy,
    pub(super) offload: bool,
}

impl Class {
    /// The structure key: the class without F (and with the strategy
    /// reduced to whether it reshards after forward and whether it shards).
    pub(super) fn structure(&self) -> String {
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
pub(super) struct Knobs {
    pub(super) bwd: BackwardPrefetch,
    pub(super) fwd: bool,
    pub(super) depth: u32,
    pub(super) limit: u32,
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
        "{}/{} {} {}{} F={} ckpt={}{} bwd={} fwd={} d={} lim={}",
        cfg.param_dtype,
        cfg.reduce_dtype,
        wrap,
        match cfg.tensor_parallel {
            0 | 1 => String::new(),
            t => format!("T={t} "),
        },
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

pub(super) fn apply(base: &FsdpConfig, c: &Class, k: Knobs) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
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
            activation_checkpointing: c.ckpt.clone(),
            cpu_offload: c.offload,
            backward_prefetch: k.bwd,
            forward_prefetch: k.fwd,
            prefetch_depth: k.depth,
            limit_all_gathers: k.limit,
            ..base.settings.clone()
        },
        shard_factor: Some(c.sharding.1),
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
                        settings: fsdpc_plan::Settings {
                            wrap: w.clone(),
                            ..fsdpc_plan::Settings::default()
                        },
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
