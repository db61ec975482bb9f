//! The cluster a plan is made for: how many ranks, how they lie on nodes,
//! how much memory each has, and how fast they compute and communicate.
//! One type, `Cluster`, is what a plan records, what the planner's presets
//! give and what a cluster file (`fsdpc.cluster/v1`) holds.
//!
//! `hardware` is what a rank's hardware does (the figures and the lookups
//! the cost model makes); `collectives` the collective kinds and the fits
//! of their measured times; `file` is the cluster file a user edits or
//! `fsdpc calibrate` writes, checked figure by figure.

mod collectives;
mod file;
mod hardware;

pub use collectives::{ring_wire_bytes, CollectiveFit, CollectiveKind};
pub use file::CLUSTER_SCHEMA;
pub use hardware::{
    matmul_shape_key, wide_skinny_key, Contention, GemmBlocking, Hardware, HOST_MEM_BW,
    PCIE4_X16_BW, PROMOTION_FAMILY, SKINNY_BASE_DIM, SKINNY_DIM,
};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use thiserror::Error;

/// A cluster: `world` ranks, `ranks_per_node` on each node, each with
/// `memory_bytes` and the speeds of `hardware`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// The preset or cluster file these figures came from
    /// (`a100-80g-roce`, `cpu-local`, `calibrated`).
    #[serde(rename = "preset", alias = "name")]
    pub name: String,
    /// Total ranks.
    pub world: u32,
    pub ranks_per_node: u32,
    /// Per-rank memory capacity in bytes.
    pub memory_bytes: u64,
    /// The speeds the estimates use (absent in plans written before they
    /// were recorded: zeros).
    #[serde(default)]
    pub hardware: Hardware,
    /// One line on what the cluster is.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// Where each figure came from, by field name (`"mem_bw": "datasheet"`,
    /// `"matmul_efficiency": "fsdpc calibrate on host x"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sources: BTreeMap<String, String>,
    /// Whose kernels the cost model prices the program's operators as
    /// (fsdpc's own by default).
    #[serde(default, skip_serializing_if = "Kernels::is_fsdpc")]
    pub kernels: Kernels,
}

/// Whose kernels run a program's operators, for the cost model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kernels {
    /// fsdpc's runtimes: one kernel per operator, each writing its output
    /// to a buffer of its own (a reshape or a transpose is a copy).
    #[default]
    Fsdpc,
    /// PyTorch eager, to predict a published or a user's PyTorch run of
    /// the same program: shape operators are views where PyTorch makes
    /// them views, and the operators PyTorch runs as a composite of
    /// several kernels (RMSNorm before its fused kernel, cross-entropy as
    /// log-softmax and NLL) are priced as those kernels
    /// (the planner's `cost/eager.rs`).
    PytorchEager,
}

impl Kernels {
    /// Every choice, in the order messages list them.
    pub const ALL: [Kernels; 2] = [Kernels::Fsdpc, Kernels::PytorchEager];

    pub fn is_fsdpc(&self) -> bool {
        *self == Kernels::Fsdpc
    }

    /// The name cluster files and `--kernels` use.
    pub fn name(self) -> &'static str {
        match self {
            Kernels::Fsdpc => "fsdpc",
            Kernels::PytorchEager => "pytorch-eager",
        }
    }
}

/// A cluster file's `kernels`: its name.
impl Serialize for Kernels {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// A cluster file's `kernels`: one of the names, any other value refused
/// naming the field and the choices.
impl<'de> Deserialize<'de> for Kernels {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Kernels, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = Kernels;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                let names: Vec<String> = Kernels::ALL
                    .iter()
                    .map(|k| format!("\"{}\"", k.name()))
                    .collect();
                write!(f, "`kernels` as {}", names.join(" or "))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Kernels, E> {
                Kernels::ALL
                    .into_iter()
                    .find(|k| k.name() == v)
                    .ok_or_else(|| E::invalid_value(serde::de::Unexpected::Str(v), &self))
            }
        }
        d.deserialize_str(Name)
    }
}

/// A cluster that cannot exist or a cluster file that does not check.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("invalid cluster: {reason}")]
pub struct ClusterError {
    pub reason: String,
}

impl ClusterError {
    pub(crate) fn new(reason: impl Into<String>) -> ClusterError {
        ClusterError {
            reason: reason.into(),
        }
    }
}

impl Cluster {
    /// Nodes: `world / ranks_per_node`.
    pub fn nodes(&self) -> u32 {
        self.world / self.ranks_per_node.max(1)
    }

    /// The same hardware at another world size (same ranks per node).
    pub fn with_world(&self, world: u32) -> Result<Cluster, ClusterError> {
        check_shape(world, self.ranks_per_node)?;
        Ok(Cluster {
            world,
            ..self.clone()
        })
    }

    /// The same hardware at `world` ranks, `ranks_per_node` to a node.
    pub fn reshaped(&self, world: u32, ranks_per_node: u32) -> Result<Cluster, ClusterError> {
        check_shape(world, ranks_per_node)?;
        Ok(Cluster {
            world,
            ranks_per_node,
            ..self.clone()
        })
    }
}

/// Checks that `world` ranks can lie on nodes of `ranks_per_node`.
pub fn check_shape(world: u32, ranks_per_node: u32) -> Result<(), ClusterError> {
    if world == 0 {
        return Err(ClusterError::new("world size must be at least 1"));
    }
    if ranks_per_node == 0 {
        return Err(ClusterError::new("ranks per node must be at least 1"));
    }
    if !world.is_multiple_of(ranks_per_node) {
        return Err(ClusterError::new(format!(
            "world size {world} is not a multiple of ranks per node {ranks_per_node}"
        )));
    }
    Ok(())
}
