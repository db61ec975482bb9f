//! The exhaustive grid (the tests' reference) and the error for a space
//! where nothing fits: the closest candidate, the smallest world (compiled
//! there), and whether bf16 or offload would fit.

use super::*;

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
            let w = self.record(cand, r, &mut t, 0.0, 0);
            t.weighed.push(Some(w));
        }
        self.finish(t)
    }

    /// The error for a space where nothing fits: the closest candidate, the
    /// smallest world at which a structure of the space fits (checked by
    /// compiling there), and whether bf16 or offload, when the space did
    /// not include them, would fit at this world.
    pub(super) fn fits_nowhere(&self, weighed: &[Weighed], compiled: usize) -> AutoError {
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
                Ok(Ok((plan, _))) if plan.memory.device_peak_bytes() <= cap => {
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
                    settings: fsdpc_plan::Settings {
                        param_dtype: DType::Bf16,
                        reduce_dtype: DType::F32,
                        buffer_dtype: DType::F32,
                        ..lean.settings.clone()
                    },
                    ..lean.clone()
                },
            ));
        }
        if !lean.cpu_offload {
            out.push((
                "CPU offload (--cpu-offload)",
                FsdpConfig {
                    settings: fsdpc_plan::Settings {
                        cpu_offload: true,
                        ..lean.settings.clone()
                    },
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
            if plan.memory.device_peak_bytes() <= cap {
                return Some((w, cfg, plan.memory.peak_bytes));
            }
            k += 1;
        }
        None
    }
}
