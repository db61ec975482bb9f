//! CPU offload: which units `--cpu-offload` moves to host memory
//! (`all|every:K|paths:a,b|kind:CLASS`) and what of them (`--offload-what
//! params|optimizer`), and which buffers that puts in the host arena.
//!
//! `params` is FSDP1's `CPUOffload(offload_params=True)`: the unit's
//! parameter shard, gradient shard and optimizer state live on the host and
//! the optimizer steps there. `optimizer` keeps only the optimizer state on
//! the host (DeepSpeed's `offload_optimizer`), staged to the device for the
//! step.

use crate::buffer::BufferKind;
use crate::error::ConfigError;
use crate::selector::{self, Selector};
use serde::{Deserialize, Serialize};

/// Which units offload (`--cpu-offload WHICH`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OffloadUnits {
    /// Every unit, the root included (the bare flag).
    #[default]
    All,
    /// Every K-th non-root unit in unit order, counting from the first.
    Every(u32),
    /// The units defined by these module paths (the root's is the empty
    /// path, written `root`).
    Paths(Vec<String>),
    /// The non-root units of this module class.
    Kind(String),
}

/// What an offloaded unit keeps in host memory (`--offload-what`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OffloadWhat {
    /// Parameter and gradient shards and optimizer state; the optimizer
    /// steps on the host (FSDP1's `offload_params=True`).
    #[default]
    Params,
    /// The optimizer state only, staged to the device for the step
    /// (DeepSpeed's `offload_optimizer`, stepping on the device).
    Optimizer,
}

impl OffloadWhat {
    /// The values `OffloadWhat::parse` accepts.
    pub const ALLOWED: &'static str = "params, optimizer";

    /// Parses `params` (`param`, `offload_param`) or `optimizer`
    /// (`optimizer_state`, `offload_optimizer`).
    pub fn parse(s: &str) -> Result<OffloadWhat, ConfigError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "params" | "param" | "offload_param" | "offload_params" => Ok(OffloadWhat::Params),
            "optimizer" | "optimizer_state" | "offload_optimizer" => Ok(OffloadWhat::Optimizer),
            _ => Err(ConfigError {
                what: "offload what",
                value: s.to_string(),
                reason: format!("allowed values: {}", OffloadWhat::ALLOWED),
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            OffloadWhat::Params => "params",
            OffloadWhat::Optimizer => "optimizer",
        }
    }

    /// True for `Params` (the serde default).
    pub fn is_params(&self) -> bool {
        *self == OffloadWhat::Params
    }
}

impl OffloadUnits {
    /// The forms `OffloadUnits::parse` accepts.
    pub const ALLOWED: &'static str =
        "all, every:<K>, paths:<path>,<path>,... (root for the root unit), kind:<ModuleClass>";

    /// Parses `all` (or the empty string: the bare flag), `every:K`,
    /// `paths:a,b` or `kind:GPT2Block` (`selector`).
    pub fn parse(s: &str) -> Result<OffloadUnits, ConfigError> {
        let accepts = ["", "all", "every", "paths", "kind"];
        Ok(
            match selector::parse(s, "cpu offload", OffloadUnits::ALLOWED, &accepts)? {
                Selector::Every(k) => OffloadUnits::Every(k),
                Selector::Paths(p) => OffloadUnits::Paths(p),
                Selector::Kind(k) => OffloadUnits::Kind(k),
                Selector::Word(_) | Selector::Size(_) => OffloadUnits::All,
            },
        )
    }

    /// The selection as `parse` accepts it.
    pub fn name(&self) -> String {
        match self {
            OffloadUnits::All => "all".into(),
            OffloadUnits::Every(k) => format!("every:{k}"),
            OffloadUnits::Paths(p) => format!("paths:{}", p.join(",")),
            OffloadUnits::Kind(k) => format!("kind:{k}"),
        }
    }
}

impl OffloadWhat {
    /// Whether an offloaded unit's buffer of `kind` lives on the host.
    pub fn keeps_on_host(self, kind: BufferKind) -> bool {
        match self {
            OffloadWhat::Params => matches!(
                kind,
                BufferKind::ShardParams | BufferKind::ShardGrads | BufferKind::OptimizerState
            ),
            OffloadWhat::Optimizer => kind == BufferKind::OptimizerState,
        }
    }
}
