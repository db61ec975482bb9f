//! Cluster files (`--cluster FILE`, `fsdpc.cluster/v1`): a cluster as
//! JSON without its size (or with a number of nodes), with where each
//! figure came from; read, checked figure by figure, and turned into a
//! `Cluster` at a world size. `fsdpc cluster PRESET` and `fsdpc calibrate`
//! write them.

use super::hardware::unmeasured_as_1;
use super::{check_shape, Cluster, ClusterError, Hardware, Kernels};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The schema of cluster files.
pub const CLUSTER_SCHEMA: &str = "fsdpc.cluster/v1";

/// The file's layout: a `Cluster` less its world, with `schema` and an
/// optional number of nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct ClusterFile {
    /// Always `CLUSTER_SCHEMA`.
    schema: String,
    /// What plans record as the cluster's name.
    name: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    description: String,
    ranks_per_node: u32,
    /// Nodes: with `ranks_per_node`, the world when a command gives none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nodes: Option<u32>,
    memory_bytes_per_rank: u64,
    hardware: Hardware,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    sources: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Kernels::is_fsdpc")]
    kernels: Kernels,
}

impl Cluster {
    /// Reads a cluster file at `world` ranks (`None`: the file's `nodes` x
    /// `ranks_per_node`), `ranks_per_node` overriding the file's when
    /// given; a world smaller than the file's node lies on part of one
    /// node. Every figure is checked (`check`).
    pub fn from_file(
        text: &str,
        world: Option<u32>,
        ranks_per_node: Option<u32>,
    ) -> Result<Cluster, ClusterError> {
        let f: ClusterFile = serde_json::from_str(text)
            .map_err(|e| ClusterError::new(format!("not a cluster file: {e}")))?;
        if f.schema != CLUSTER_SCHEMA {
            return Err(ClusterError::new(format!(
                "schema `{}` is not `{CLUSTER_SCHEMA}`",
                f.schema
            )));
        }
        if f.ranks_per_node == 0 || f.memory_bytes_per_rank == 0 {
            return Err(ClusterError::new(
                "ranks_per_node and memory_bytes_per_rank must be at least 1",
            ));
        }
        let world = match (world, f.nodes) {
            (Some(w), _) => w,
            (None, Some(n)) => n.saturating_mul(ranks_per_node.unwrap_or(f.ranks_per_node)),
            (None, None) => {
                return Err(ClusterError::new(format!(
                    "cluster `{}` gives no `nodes`: say how many ranks (--world)",
                    f.name
                )))
            }
        };
        // A world smaller than one node uses part of a node, as a preset's
        // does (`presets::default_ranks_per_node`); a given count is kept.
        let rpn = ranks_per_node.unwrap_or_else(|| f.ranks_per_node.min(world.max(1)));
        let cluster = Cluster {
            name: f.name,
            world,
            ranks_per_node: rpn,
            memory_bytes: f.memory_bytes_per_rank,
            hardware: f.hardware,
            description: f.description,
            sources: f.sources,
            kernels: f.kernels,
        };
        cluster.check()?;
        check_shape(world, rpn)?;
        Ok(cluster)
    }

    /// The cluster as a file (without its world; `nodes` when `with_nodes`).
    pub fn to_file(&self, with_nodes: bool) -> String {
        let f = ClusterFile {
            schema: CLUSTER_SCHEMA.to_string(),
            name: self.name.clone(),
            description: self.description.clone(),
            ranks_per_node: self.ranks_per_node,
            nodes: with_nodes.then(|| self.nodes()),
            memory_bytes_per_rank: self.memory_bytes,
            hardware: self.hardware.clone(),
            sources: self.sources.clone(),
            kernels: self.kernels,
        };
        // A map of plain numbers and strings always serialises.
        let text = serde_json::to_string_pretty(&f).unwrap_or_default();
        format!("{text}\n")
    }

    /// Every figure positive and finite, the efficiency curve increasing in
    /// FLOPs with efficiencies in (0, 1].
    pub fn check(&self) -> Result<(), ClusterError> {
        let bad = |reason: String| Err(ClusterError::new(reason));
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
}
