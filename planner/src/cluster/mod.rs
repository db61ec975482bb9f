//! Cluster and hardware descriptions: how many ranks, how much memory each
//! has, and how fast they compute and communicate. The planner only reads
//! these numbers; it never measures anything.
//!
//! `hardware` is what a rank's hardware does (the figures and the lookups
//! the cost model makes), `presets` the built-in clusters, `file` the
//! cluster file a user edits or `fsdpc calibrate` writes.

mod file;
mod hardware;
mod presets;

pub use file::{ClusterFile, CLUSTER_SCHEMA};
pub use hardware::{
    matmul_shape_key, wide_skinny_key, CollectiveFit, CollectiveKind, Contention, GemmBlocking,
    Hardware, PROMOTION_FAMILY, SKINNY_BASE_DIM, SKINNY_DIM,
};
pub use presets::{HOST_MEM_BW, PCIE4_X16_BW, PCIE5_X16_BW, PRESETS};

use crate::error::PlanError;
use serde::{Deserialize, Serialize};

/// A cluster: `nodes` hosts of `ranks_per_node` ranks each.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// The preset these numbers came from.
    pub preset: String,
    /// Total ranks.
    pub world: u32,
    pub ranks_per_node: u32,
    pub nodes: u32,
    /// Per-rank memory capacity in bytes.
    pub memory_bytes: u64,
    pub hardware: Hardware,
}

impl Cluster {
    /// The preset `name` at `world` ranks, `ranks_per_node` per node.
    pub fn preset(name: &str, world: u32, ranks_per_node: u32) -> Result<Cluster, PlanError> {
        check_shape(world, ranks_per_node)?;
        let (memory_bytes, hardware) =
            presets::preset(name, ranks_per_node).ok_or_else(|| PlanError::UnknownPreset {
                name: name.to_string(),
                known: PRESETS.map(|(n, _)| n).join(", "),
            })?;
        Ok(Cluster {
            preset: name.to_string(),
            world,
            ranks_per_node,
            nodes: world / ranks_per_node,
            memory_bytes,
            hardware,
        })
    }

    /// The same hardware at another world size (same ranks per node).
    pub fn with_world(&self, world: u32) -> Result<Cluster, PlanError> {
        check_shape(world, self.ranks_per_node)?;
        Ok(Cluster {
            world,
            nodes: world / self.ranks_per_node,
            ..self.clone()
        })
    }

    /// The plan's record of this cluster.
    pub fn info(&self) -> crate::plan::ClusterInfo {
        crate::plan::ClusterInfo {
            world: self.world,
            ranks_per_node: self.ranks_per_node,
            preset: self.preset.clone(),
            memory_bytes: self.memory_bytes,
            hardware: self.hardware.clone(),
        }
    }

    /// Rebuilds a cluster from a plan's record.
    pub fn from_info(info: &crate::plan::ClusterInfo) -> Cluster {
        Cluster {
            preset: info.preset.clone(),
            world: info.world,
            ranks_per_node: info.ranks_per_node.max(1),
            nodes: info.world / info.ranks_per_node.max(1),
            memory_bytes: info.memory_bytes,
            hardware: info.hardware.clone(),
        }
    }
}

fn check_shape(world: u32, ranks_per_node: u32) -> Result<(), PlanError> {
    let bad = |reason: String| Err(PlanError::BadCluster { reason });
    if world == 0 {
        return bad("world size must be at least 1".into());
    }
    if ranks_per_node == 0 {
        return bad("ranks per node must be at least 1".into());
    }
    if !world.is_multiple_of(ranks_per_node) {
        return bad(format!(
            "world size {world} is not a multiple of ranks per node {ranks_per_node}"
        ));
    }
    Ok(())
}
