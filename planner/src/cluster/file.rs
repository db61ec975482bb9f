//! Cluster files (`--cluster FILE`, `fsdpc.cluster/v1`): a cluster as
//! JSON, with where each figure came from; read, checked figure by figure,
//! and turned into a `Cluster` at a world size.

use super::hardware::unmeasured_as_1;
use super::presets::PRESETS;
use super::{check_shape, Cluster, Hardware};
use crate::error::PlanError;
use serde::{Deserialize, Serialize};

/// The schema of cluster files.
pub const CLUSTER_SCHEMA: &str = "fsdpc.cluster/v1";

/// A cluster as a file (`--cluster FILE`): its shape, per-rank memory and
/// speeds, and where each figure came from. `fsdpc cluster PRESET` writes a
/// preset in this form to start from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// Always `CLUSTER_SCHEMA`.
    pub schema: String,
    /// What plans record as the cluster's name.
    pub name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    pub ranks_per_node: u32,
    /// Nodes: with `ranks_per_node`, the world when a command gives none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<u32>,
    pub memory_bytes_per_rank: u64,
    pub hardware: Hardware,
    /// Where each figure came from, by field name (`"mem_bw": "datasheet"`,
    /// `"matmul_efficiency": "fsdpc calibrate on host x"`).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub sources: std::collections::BTreeMap<String, String>,
}

impl ClusterFile {
    /// Parses and checks a cluster file.
    pub fn from_json(text: &str) -> Result<ClusterFile, PlanError> {
        let bad = |reason: String| PlanError::BadCluster { reason };
        let f: ClusterFile =
            serde_json::from_str(text).map_err(|e| bad(format!("not a cluster file: {e}")))?;
        if f.schema != CLUSTER_SCHEMA {
            return Err(bad(format!(
                "schema `{}` is not `{CLUSTER_SCHEMA}`",
                f.schema
            )));
        }
        f.check()?;
        Ok(f)
    }

    /// The preset `name` as a file, `ranks_per_node` per node, with the
    /// sources of its figures.
    pub fn preset(name: &str, ranks_per_node: u32) -> Result<ClusterFile, PlanError> {
        let c = Cluster::preset(name, ranks_per_node, ranks_per_node)?;
        let description = PRESETS
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, d)| d.to_string())
            .unwrap_or_default();
        let source = match name {
            "cpu-local" => "nominal figures for a 2-core VM (measure yours with fsdpc calibrate)",
            _ => {
                "vendor datasheet (see the preset's doc comment in planner/src/cluster/presets.rs)"
            }
        };
        let sources = [
            "peak_flops_f32",
            "peak_flops_bf16",
            "mem_bw",
            "intra_bw",
            "inter_bw",
            "host_bw",
        ]
        .into_iter()
        .map(|k| (k.to_string(), source.to_string()))
        .chain([
            (
                "intra_latency_s".to_string(),
                "assumed: one NCCL ring step inside a node".to_string(),
            ),
            (
                "inter_latency_s".to_string(),
                "assumed: one NCCL ring step across nodes".to_string(),
            ),
            (
                "host_mem_bw".to_string(),
                "assumed: half the per-rank share of the host's DRAM bandwidth".to_string(),
            ),
        ])
        .collect();
        Ok(ClusterFile {
            schema: CLUSTER_SCHEMA.to_string(),
            name: name.to_string(),
            description,
            ranks_per_node,
            nodes: None,
            memory_bytes_per_rank: c.memory_bytes,
            hardware: c.hardware,
            sources,
        })
    }

    /// Every figure positive and finite, the efficiency curve increasing in
    /// FLOPs with efficiencies in (0, 1].
    fn check(&self) -> Result<(), PlanError> {
        let bad = |reason: String| Err(PlanError::BadCluster { reason });
        if self.ranks_per_node == 0 || self.memory_bytes_per_rank == 0 {
            return bad("ranks_per_node and memory_bytes_per_rank must be at least 1".into());
        }
        let h = &self.hardware;
        for (name, x) in [
            ("peak_flops_f32", h.peak_flops_f32),
            ("peak_flops_bf16", h.peak_flops_bf16),
            ("mem_bw", h.mem_bw),
            ("intra_bw", h.intra_bw),
            ("inter_bw", h.inter_bw),
            ("host_bw", h.host_bw),
            ("host_mem_bw", h.host_mem_bw),
        ] {
            if !(x.is_finite() && x > 0.0) {
                return bad(format!(
                    "hardware.{name} must be a positive number, it is {x}"
                ));
            }
        }
        for (name, x) in [
            ("intra_latency_s", h.intra_latency_s),
            ("inter_latency_s", h.inter_latency_s),
        ] {
            if !(x.is_finite() && x >= 0.0) {
                return bad(format!("hardware.{name} must be a number >= 0, it is {x}"));
            }
        }
        if !(h.cache_bytes.is_finite() && h.cache_bytes >= 0.0) {
            return bad(format!(
                "hardware.cache_bytes must be a number >= 0, it is {}",
                h.cache_bytes
            ));
        }
        if let Some(g) = &h.cpu_gemm {
            if g.simd_lanes == 0 || g.nr == 0 || g.mr == 0 || g.mr % g.simd_lanes != 0 {
                return bad(format!(
                    "hardware.cpu_gemm: simd_lanes, mr and nr must be at least 1 and mr a multiple of simd_lanes, they are {}, {} and {}",
                    g.simd_lanes, g.mr, g.nr
                ));
            }
        }
        if !(h.kernel_overhead_s.is_finite() && h.kernel_overhead_s >= 0.0) {
            return bad(format!(
                "hardware.kernel_overhead_s must be a number >= 0, it is {}",
                h.kernel_overhead_s
            ));
        }
        for (family, x) in &h.kernel_bw {
            if !(x.is_finite() && *x > 0.0) {
                return bad(format!(
                    "hardware.kernel_bw.{family} must be a positive number, it is {x}"
                ));
            }
        }
        for (family, x) in &h.kernel_flops {
            if !(x.is_finite() && *x > 0.0) {
                return bad(format!(
                    "hardware.kernel_flops.{family} must be a positive number, it is {x}"
                ));
            }
        }
        for f in &h.collective_fits {
            if f.ranks < 2 || !(f.bw.is_finite() && f.bw > 0.0) {
                return bad(format!(
                    "hardware.collective_fits: {} over {} ranks must have at least 2 ranks and a positive bw (it has {})",
                    f.op.name(),
                    f.ranks,
                    f.bw
                ));
            }
            if !(f.latency_s.is_finite() && f.latency_s >= 0.0) {
                return bad(format!(
                    "hardware.collective_fits: {} over {} ranks must have a latency_s >= 0 (it has {})",
                    f.op.name(),
                    f.ranks,
                    f.latency_s
                ));
            }
            let mut prev = 0.0;
            for &(wire, t) in &f.points {
                if !(wire.is_finite() && wire > prev && t.is_finite() && t > 0.0) {
                    return bad(format!(
                        "hardware.collective_fits: {} over {} ranks: point ({wire}, {t}) must have wire bytes above the previous point's and a positive time",
                        f.op.name(),
                        f.ranks
                    ));
                }
                prev = wire;
            }
        }
        if let Some(c) = &h.comm_compute_contention {
            for (name, x) in [
                ("comm_slowdown", c.comm_slowdown),
                ("compute_slowdown", c.compute_slowdown),
                // 0: not measured.
                ("two_comm_slowdown", unmeasured_as_1(c.two_comm_slowdown)),
                (
                    "two_compute_slowdown",
                    unmeasured_as_1(c.two_compute_slowdown),
                ),
                ("comm_pair_slowdown", unmeasured_as_1(c.comm_pair_slowdown)),
            ] {
                if !(x.is_finite() && x >= 1.0) {
                    return bad(format!(
                        "hardware.comm_compute_contention.{name} must be a number >= 1, it is {x}"
                    ));
                }
            }
        }
        let named: Vec<(String, &Vec<(f64, f64)>)> = [
            ("matmul_efficiency".to_string(), &h.matmul_efficiency),
            (
                "skinny_matmul_efficiency".to_string(),
                &h.skinny_matmul_efficiency,
            ),
        ]
        .into_iter()
        .chain(
            h.matmul_curves
                .iter()
                .map(|(k, c)| (format!("matmul_curves.{k}"), c)),
        )
        .collect();
        for (name, curve) in named {
            let mut prev = 0.0;
            for &(flops, e) in curve {
                if !(flops.is_finite() && flops > prev && e > 0.0 && e <= 1.0) {
                    return bad(format!(
                        "hardware.{name}: point ({flops}, {e}) must have FLOPs above the previous point's and an efficiency in (0, 1]"
                    ));
                }
                prev = flops;
            }
        }
        let mut prev = 0.0;
        for &(bytes, r) in &h.bandwidth_by_size {
            if !(bytes.is_finite() && bytes > prev && r > 0.0 && r <= 1.0) {
                return bad(format!(
                    "hardware.bandwidth_by_size: point ({bytes}, {r}) must have bytes above the previous point's and a ratio in (0, 1]"
                ));
            }
            prev = bytes;
        }
        Ok(())
    }

    /// The cluster at `world` ranks (`None`: `nodes` x `ranks_per_node`),
    /// `ranks_per_node` overriding the file's when given.
    pub fn cluster(
        &self,
        world: Option<u32>,
        ranks_per_node: Option<u32>,
    ) -> Result<Cluster, PlanError> {
        let rpn = ranks_per_node.unwrap_or(self.ranks_per_node);
        let world = match (world, self.nodes) {
            (Some(w), _) => w,
            (None, Some(n)) => n.saturating_mul(rpn),
            (None, None) => {
                return Err(PlanError::BadCluster {
                    reason: format!(
                        "cluster `{}` gives no `nodes`: say how many ranks (--world)",
                        self.name
                    ),
                })
            }
        };
        check_shape(world, rpn)?;
        Ok(Cluster {
            preset: self.name.clone(),
            world,
            ranks_per_node: rpn,
            nodes: world / rpn,
            memory_bytes: self.memory_bytes_per_rank,
            hardware: self.hardware.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::{CollectiveFit, CollectiveKind, Contention};

    fn calibrated() -> ClusterFile {
        let mut f = ClusterFile::preset("cpu-local", 2).unwrap();
        let h = &mut f.hardware;
        h.kernel_overhead_s = 2e-6;
        h.kernel_bw.insert("softmax".into(), 3e9);
        h.kernel_bw.insert("softmax:bf16".into(), 1e9);
        h.kernel_flops.insert("attention".into(), 5e10);
        h.matmul_efficiency = vec![(1e6, 0.5), (1e9, 0.9)];
        h.skinny_matmul_efficiency = vec![(1e6, 0.1), (1e9, 0.2)];
        h.collective_fits.push(CollectiveFit {
            op: CollectiveKind::ReduceScatter,
            ranks: 2,
            latency_s: 1e-5,
            bw: 4e9,
            points: Vec::new(),
        });
        h.comm_compute_contention = Some(Contention {
            comm_slowdown: 1.5,
            compute_slowdown: 1.2,
            ..Contention::default()
        });
        f
    }

    #[test]
    fn new_fields_round_trip() {
        let f = calibrated();
        let text = serde_json::to_string_pretty(&f).unwrap();
        assert!(text.contains("\"comm_compute_contention\""), "{text}");
        let back = ClusterFile::from_json(&text).unwrap();
        assert_eq!(back, f);
        let h = &back.hardware;
        assert_eq!(h.kernel_bandwidth("softmax:bf16"), 1e9);
        // A half family not measured falls back to its f32 figure, an
        // unknown family to mem_bw.
        let mut h2 = h.clone();
        h2.kernel_bw.remove("softmax:bf16");
        assert_eq!(h2.kernel_bandwidth("softmax:bf16"), 3e9);
        assert_eq!(h.kernel_bandwidth("binary"), h.mem_bw);
        // Beyond the cache a kernel runs at no more than mem_bw.
        let mut h3 = h.clone();
        h3.cache_bytes = 1e6;
        h3.mem_bw = 2e9;
        assert_eq!(h3.kernel_bandwidth_for("softmax", 1e6), 3e9);
        assert_eq!(h3.kernel_bandwidth_for("softmax", 2e6), 2e9);
        // A measured curve replaces the cap: the family's rate up to its
        // first point, scaled beyond it (log-interpolated).
        let mut h5 = h3.clone();
        h5.bandwidth_by_size = vec![(1e6, 1.0), (1e8, 0.5)];
        assert_eq!(h5.kernel_bandwidth_for("softmax", 5e5), 3e9);
        assert!((h5.kernel_bandwidth_for("softmax", 1e7) - 2.25e9).abs() < 1.0);
        assert_eq!(h5.kernel_bandwidth_for("softmax", 1e9), 1.5e9);
        assert_eq!(
            h.collective_fit(CollectiveKind::ReduceScatter, 2)
                .map(|f| f.bw),
            Some(4e9)
        );
        assert!(h.collective_fit(CollectiveKind::AllGather, 2).is_none());
        assert_eq!(h.kernel_rate("attention:bf16"), Some(5e10));
        assert_eq!(h.kernel_rate("attention_grad"), None);
        // Skinny products use their own curve, others the main one.
        assert_eq!(h.matmul_efficiency_for(1e9, 16), 0.2);
        assert_eq!(h.matmul_efficiency_for(1e9, 65), 0.9);
        let mut h4 = h.clone();
        h4.skinny_matmul_efficiency.clear();
        assert_eq!(h4.matmul_efficiency_for(1e9, 16), 0.9);
    }

    #[test]
    fn older_files_load_without_them() {
        // A file written before these fields: none of them in the JSON.
        let mut v = serde_json::to_value(ClusterFile::preset("a100-80g-roce", 8).unwrap()).unwrap();
        for k in [
            "kernel_overhead_s",
            "kernel_bw",
            "kernel_flops",
            "skinny_matmul_efficiency",
            "cache_bytes",
            "bandwidth_by_size",
            "collective_fits",
            "comm_compute_contention",
        ] {
            assert!(v["hardware"].get(k).is_none(), "{k} written for a preset");
        }
        v["hardware"]
            .as_object_mut()
            .unwrap()
            .remove("matmul_efficiency");
        let f = ClusterFile::from_json(&v.to_string()).unwrap();
        assert_eq!(f.hardware.kernel_overhead_s, 0.0);
        assert!(f.hardware.kernel_bw.is_empty());
        assert!(f.hardware.collective_fits.is_empty());
        assert!(f.hardware.comm_compute_contention.is_none());
    }

    #[test]
    fn bad_calibrated_figures_are_refused() {
        let mut f = calibrated();
        f.hardware.comm_compute_contention = Some(Contention {
            comm_slowdown: 0.5,
            compute_slowdown: 1.0,
            ..Contention::default()
        });
        let text = serde_json::to_string(&f).unwrap();
        let err = ClusterFile::from_json(&text).unwrap_err().to_string();
        assert!(err.contains("comm_slowdown"), "{err}");
        let mut f = calibrated();
        f.hardware.collective_fits[0].ranks = 1;
        let err = ClusterFile::from_json(&serde_json::to_string(&f).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("collective_fits"), "{err}");
        let mut f = calibrated();
        f.hardware.kernel_bw.insert("unary".into(), -1.0);
        let err = ClusterFile::from_json(&serde_json::to_string(&f).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("kernel_bw.unary"), "{err}");
        let mut f = calibrated();
        f.hardware.bandwidth_by_size = vec![(1e6, 1.0), (1e6, 0.5)];
        let err = ClusterFile::from_json(&serde_json::to_string(&f).unwrap())
            .unwrap_err()
            .to_string();
        assert!(err.contains("bandwidth_by_size"), "{err}");
    }
}
