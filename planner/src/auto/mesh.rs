//! The tensor-parallel dimension of the auto-planner: one search per
//! degree T over the world / T data ranks, and the choice between them.
//!
//! Conventions:
//! - The program's batch is per rank, and the T members of a tensor group
//!   compute on the same samples: at degree T the global batch is the
//!   per-rank batch times world / T. Degrees are therefore compared by
//!   tokens per second per rank (`tokens_per_rank_step / (T x step)`), not
//!   by step time; ties go to the smaller T.
//! - The degrees searched divide both the ranks of a node (a tensor group
//!   never spans nodes unless the user asks for it with
//!   `--tensor-parallel`) and the world; a fixed degree is searched alone.
//! - Each degree's search is a whole `Search` with its own bounds (over the
//!   member's program) and optimality gap. The first degree is searched
//!   first; the others run against its best (`Search::with_incumbent`,
//!   scaled to their tokens), so a candidate that cannot give more tokens
//!   per rank is not compiled. A degree whose search finds nothing that
//!   fits, or nothing that beats the first, is listed with why.

use super::{AutoError, AutoResult, Fixed, Search, Space};
use crate::config::FsdpConfig;
use fsdpc_ir::TrainingProgram;
use fsdpc_plan::cluster::Cluster;
use fsdpc_plan::ModelInfo;
use rayon::prelude::*;

/// One degree's outcome, as the choice weighed it.
#[derive(Clone, Debug, PartialEq)]
pub struct MeshRow {
    /// T.
    pub degree: u32,
    /// Its fastest plan that fits, or why none does.
    pub outcome: Result<MeshBest, String>,
}

/// A degree's fastest plan that fits.
#[derive(Clone, Debug, PartialEq)]
pub struct MeshBest {
    /// The configuration in short form (`auto::short`).
    pub config: String,
    pub step_time_s: f64,
    /// `tokens_per_rank_step / (T x step)`.
    pub tokens_per_s_per_rank: f64,
    pub peak_bytes: u64,
}

/// The chosen degree's search, and every degree's outcome.
#[derive(Debug)]
pub struct MeshChoice {
    /// The chosen degree.
    pub degree: u32,
    /// Its search.
    pub result: AutoResult,
    /// Every degree searched, in `degrees` order.
    pub rows: Vec<MeshRow>,
}

/// The tensor-parallel degrees to search on `cluster`: `fixed` alone when
/// given, otherwise 1 and every power of two that divides both the ranks
/// of a node and the world.
pub fn tensor_degrees(cluster: &Cluster, fixed: Option<u32>) -> Vec<u32> {
    if let Some(t) = fixed {
        return vec![t];
    }
    let rpn = cluster.ranks_per_node.max(1);
    let mut out = vec![1];
    let mut t = 2;
    while t <= rpn {
        if rpn.is_multiple_of(t) && cluster.world.is_multiple_of(t) {
            out.push(t);
        }
        t *= 2;
    }
    out
}

/// Searches every degree of `degrees` (each over the world / T data ranks,
/// the other dimensions as `fixed` and `allow_bf16` say, optimality gap
/// `gap`) and chooses the one with the most tokens per second per rank.
/// When no degree fits, the first degree's error.
#[allow(clippy::too_many_arguments)]
pub fn search_mesh(
    program: &TrainingProgram,
    model: &ModelInfo,
    cluster: &Cluster,
    base: &FsdpConfig,
    fixed: &Fixed,
    allow_bf16: bool,
    gap: f64,
    degrees: &[u32],
) -> Result<MeshChoice, AutoError> {
    // `normalized`: the best step times its degree (what a degree's step
    // must beat, times that degree, to give more tokens per rank).
    let one = |t: u32,
               normalized: Option<f64>|
     -> Result<(u32, Result<AutoResult, AutoError>), AutoError> {
        let mut cfg = base.clone();
        cfg.tensor_parallel = t;
        // What every candidate of this degree would be refused for (a T
        // that does not divide the world): the degree's one error, not a
        // search that fits nowhere.
        if let Err(e) = crate::check(cluster, &cfg) {
            return Ok((t, Err(e.into())));
        }
        let space = Space::around(&cfg, program, cluster.world / t.max(1), fixed, allow_bf16)?;
        let mut search = Search::new(program, model, cluster, &cfg, &space).with_gap(gap);
        if let Some(n) = normalized {
            search = search.with_incumbent(n / f64::from(t.max(1)));
        }
        Ok((t, search.run()))
    };
    // The first degree alone, then the others against its best.
    let Some((&first, rest)) = degrees.split_first() else {
        return Err(AutoError::Plan(crate::error::PlanError::Program {
            reason: "no tensor-parallel degree to search".into(),
        }));
    };
    let mut results = vec![one(first, None)?];
    let normalized = results[0]
        .1
        .as_ref()
        .ok()
        .map(|r| r.plan.estimates.step_time_s * f64::from(first.max(1)));
    results.extend(
        rest.par_iter()
            .map(|&t| one(t, normalized))
            .collect::<Result<Vec<_>, AutoError>>()?,
    );
    let tokens = |t: u32, r: &AutoResult| {
        let step = r.plan.estimates.step_time_s;
        if step > 0.0 {
            model.tokens_per_rank_step as f64 / (f64::from(t) * step)
        } else {
            f64::INFINITY
        }
    };
    let rows: Vec<MeshRow> = results
        .iter()
        .map(|(t, r)| MeshRow {
            degree: *t,
            outcome: match r {
                Ok(r) => Ok(MeshBest {
                    config: super::short(&FsdpConfig {
                        settings: r.plan.config.settings.clone(),
                        shard_factor: Some(r.plan.config.shard_factor),
                        ..base.clone()
                    }),
                    step_time_s: r.plan.estimates.step_time_s,
                    tokens_per_s_per_rank: tokens(*t, r),
                    peak_bytes: r.plan.memory.peak_bytes,
                }),
                Err(AutoError::Outpaced {
                    best_s,
                    candidates,
                    compiled,
                }) => Err(format!(
                    "nothing gives more tokens/s per rank than T={first}'s plan (a step under \
                     {best_s:.4} s at this degree): {candidates} weighed, {compiled} compiled"
                )),
                Err(e) => Err(e.to_string()),
            },
        })
        .collect();
    // The most tokens per second per rank; ties to the smaller degree.
    let mut best: Option<(usize, f64)> = None;
    for (i, row) in rows.iter().enumerate() {
        if let Ok(b) = &row.outcome {
            if best.is_none_or(|(_, v)| b.tokens_per_s_per_rank > v) {
                best = Some((i, b.tokens_per_s_per_rank));
            }
        }
    }
    match best {
        Some((i, _)) => {
            let (degree, r) = results.swap_remove(i);
            let mut result = r?;
            if degrees.len() > 1 {
                let all: Vec<String> = degrees.iter().map(|d| d.to_string()).collect();
                result
                    .record
                    .searched
                    .insert(0, format!("tensor_parallel: {}", all.join(" ")));
                if let Some(a) = result.plan.config.auto.as_mut() {
                    a.searched = result.record.searched.clone();
                }
            }
            Ok(MeshChoice {
                degree,
                result,
                rows,
            })
        }
        None => match results.swap_remove(0).1 {
            Err(e) => Err(e),
            Ok(r) => Ok(MeshChoice {
                degree: degrees.first().copied().unwrap_or(1),
                result: r,
                rows,
            }),
        },
    }
}
