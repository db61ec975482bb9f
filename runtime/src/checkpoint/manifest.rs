//! The manifest: everything needed to check, resume and re-shard a
//! checkpoint without its plan — the hashes that tie it to a plan and a
//! model, the flat layout of every unit, the step and data position, and
//! each rank file's size and checksum.

use super::CheckpointError;
use fsdpc_ir::TpSlice;
use fsdpc_plan::Plan;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The manifest's `format` value.
pub const FORMAT: &str = "fsdpc.checkpoint/v1";
/// The manifest's file name inside a step directory.
pub const MANIFEST: &str = "manifest.json";
/// The file in the checkpoint directory naming the latest complete step directory.
pub const LATEST: &str = "latest";

/// A checkpoint's manifest (`manifest.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// `fsdpc.checkpoint/v1`.
    pub format: String,
    /// blake3 of the plan's JSON: equal means the files load as they are.
    pub plan_hash: String,
    /// blake3 of the parameters (names, shapes) and the optimizer: equal
    /// means the checkpoint can be re-sharded for this plan.
    pub model_hash: String,
    /// The model's name.
    pub model: String,
    /// Ranks of the run that wrote it.
    pub world: u32,
    /// Its shard factor (ranks per shard group; one file per position).
    pub shard_factor: u32,
    /// Its tensor-parallel degree T (absent: 1). Each shard position has
    /// one file per tensor position, file `position * T + tensor`.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub tensor_parallel: u32,
    /// Its strategy (`full_shard`, `no_shard`, ...).
    pub strategy: String,
    /// Optimizer steps completed: a resumed run starts at this step.
    pub step: u64,
    /// Seed of parameter init, data and dropout (all counter-based).
    pub seed: u64,
    /// Where the data stream stands.
    pub data: DataPosition,
    /// Optimizer state slots per unit.
    pub state_slots: usize,
    /// Every unit's flat layout, in plan order.
    pub units: Vec<UnitLayout>,
    /// One file per shard position.
    pub files: Vec<FileEntry>,
    /// The module buffers (running statistics), rank 0's values, each the
    /// tensor `buffer_tensor(name)` of file 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub buffers: Vec<BufferLayout>,
}

/// A module buffer in a checkpoint: its name and shape (f32).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferLayout {
    /// Its PyTorch name (`layer1.0.bn1.running_mean`).
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
}

/// The data position. Every sample is a pure function of (seed, step,
/// global sample index), so the next step and the tokens per step (the
/// global batch) are all a resumed run needs to see the data the
/// uninterrupted run would.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DataPosition {
    /// The next step to run.
    pub next_step: u64,
    /// Tokens (samples x sequence) per step over all ranks.
    pub tokens_per_step: u64,
    /// Tokens consumed so far (`next_step * tokens_per_step`).
    pub tokens_seen: u64,
}

/// A unit's flat parameter layout.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitLayout {
    /// The unit's index.
    pub id: u32,
    /// Flat length with padding (`shard_numel * shard_factor`).
    pub padded_numel: u64,
    /// Elements per rank.
    pub shard_numel: u64,
    /// Elements of the frozen segment at the end (`Unit::frozen_numel`):
    /// each rank file holds its part of the trainable segment then its part
    /// of the frozen one, and optimizer state for the trainable part only.
    /// Absent (0) in checkpoints of plans without frozen parameters.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub frozen_numel: u64,
    /// Its parameters.
    pub params: Vec<ParamLayout>,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

fn is_zero32(x: &u32) -> bool {
    *x == 0
}

fn one() -> u32 {
    1
}

fn is_one(x: &u32) -> bool {
    *x == 1
}

impl UnitLayout {
    /// Elements of each rank's part of the trainable segment (what an
    /// optimizer-state tensor holds), for shard factor `f`.
    pub fn trainable_shard_numel(&self, f: u64) -> u64 {
        self.padded_numel.saturating_sub(self.frozen_numel) / f.max(1)
    }
}

/// One parameter inside a unit's flat parameter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParamLayout {
    /// The original name.
    pub name: String,
    /// Its shape (a tensor position's part, when split).
    pub shape: Vec<usize>,
    /// First element in the flat parameter.
    pub offset: u64,
    /// Elements.
    pub numel: u64,
    /// Set when the parameter is split over the tensor group: which
    /// elements of the whole each tensor position holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<TpSlice>,
}

impl ParamLayout {
    /// The whole parameter's shape.
    pub fn whole_shape(&self) -> Vec<usize> {
        match &self.tp {
            Some(tp) => tp.full_shape(&self.shape),
            None => self.shape.clone(),
        }
    }

    /// The whole parameter's elements.
    pub fn whole_numel(&self) -> u64 {
        self.whole_shape().iter().map(|&d| d as u64).product()
    }
}

/// One rank file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name inside the step directory.
    pub name: String,
    /// Shard position (rank within the shard group).
    pub position: u32,
    /// Tensor position (absent: 0).
    #[serde(default, skip_serializing_if = "is_zero32")]
    pub tensor: u32,
    /// Size in bytes.
    pub bytes: u64,
    /// blake3 of the whole file (hex).
    pub blake3: String,
}

impl Manifest {
    /// The manifest of `plan` after `step` completed steps, with `files`.
    pub fn new(plan: &Plan, step: u64, seed: u64, files: Vec<FileEntry>) -> Manifest {
        let tokens = tokens_per_step(plan);
        Manifest {
            format: FORMAT.into(),
            plan_hash: plan_hash(plan),
            model_hash: model_hash(plan),
            model: plan.model.name.clone(),
            world: plan.cluster.world,
            shard_factor: plan.config.shard_factor,
            tensor_parallel: plan.geometry().t(),
            strategy: plan.config.strategy.name().into(),
            step,
            seed,
            data: DataPosition {
                next_step: step,
                tokens_per_step: tokens,
                tokens_seen: step * tokens,
            },
            state_slots: plan.training.optimizer.state_slots(),
            units: layout(plan),
            files,
            buffers: plan
                .training
                .graph
                .buffers
                .iter()
                .map(|b| BufferLayout {
                    name: b.name.clone(),
                    shape: b.ty.shape.dims().to_vec(),
                })
                .collect(),
        }
    }

    /// Reads and parses `path`.
    pub fn read(path: &Path) -> Result<Manifest, CheckpointError> {
        let text = match std::fs::read(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(CheckpointError::Missing {
                    path: path.display().to_string(),
                })
            }
            Err(e) => return Err(CheckpointError::io(path, e)),
        };
        let m: Manifest = serde_json::from_slice(&text).map_err(|e| CheckpointError::Format {
            path: path.display().to_string(),
            reason: format!("not a checkpoint manifest: {e}"),
        })?;
        if m.format != FORMAT {
            return Err(CheckpointError::Format {
                path: path.display().to_string(),
                reason: format!("format `{}`, this build reads `{FORMAT}`", m.format),
            });
        }
        Ok(m)
    }
}

/// The directory of the checkpoint after `step` completed steps.
pub fn step_dir(dir: &Path, step: u64) -> PathBuf {
    dir.join(format!("step-{step:09}"))
}

/// The file of file index `i` (shard position x T + tensor position).
pub fn rank_file(i: usize) -> String {
    format!("rank-{i:05}.safetensors")
}

/// The file index of shard position `pos` and tensor position `tensor`
/// with `t` tensor positions.
pub fn file_index(pos: u32, tensor: u32, t: u32) -> usize {
    pos as usize * t.max(1) as usize + tensor as usize
}

/// The tensor holding unit `u`'s parameter shard.
pub fn params_tensor(u: usize) -> String {
    format!("unit{u}.params")
}

/// The tensor of file 0 holding module buffer `name`.
pub fn buffer_tensor(name: &str) -> String {
    format!("buffer.{name}")
}

/// The tensor holding unit `u`'s optimizer state slot `k`.
pub fn state_tensor(u: usize, k: usize) -> String {
    format!("unit{u}.state{k}")
}

/// blake3 of the plan's JSON (its serialisation is deterministic: no maps
/// with unordered keys).
pub fn plan_hash(plan: &Plan) -> String {
    let json = serde_json::to_vec(plan).unwrap_or_default();
    blake3::hash(&json).to_hex().to_string()
}

/// blake3 of what a checkpoint's values mean: every parameter's name and
/// whole shape (the same for every tensor-parallel degree) and the
/// optimizer (its hyper-parameters and state slots).
pub fn model_hash(plan: &Plan) -> String {
    let mut params: Vec<(&str, Vec<usize>)> = plan
        .units
        .iter()
        .flat_map(|u| {
            u.params.iter().map(|p| {
                let whole = match tp_of(plan, p) {
                    Some(tp) => tp.full_shape(&p.shape),
                    None => p.shape.clone(),
                };
                (p.name.as_str(), whole)
            })
        })
        .collect();
    params.sort();
    let json = serde_json::to_vec(&(params, &plan.training.optimizer)).unwrap_or_default();
    blake3::hash(&json).to_hex().to_string()
}

/// Tokens per step over all ranks: equal for two plans exactly when their
/// global batches (of the same sequence length) are. The members of a
/// tensor group read the same samples: each data rank counts once.
pub fn tokens_per_step(plan: &Plan) -> u64 {
    plan.model.tokens_per_rank_step * u64::from(plan.geometry().data_world())
}

/// Which elements of the whole parameter a flat parameter entry holds,
/// when it is split over the tensor group.
fn tp_of<'p>(plan: &'p Plan, p: &fsdpc_plan::FlatParam) -> Option<&'p TpSlice> {
    plan.training
        .graph
        .params
        .get(p.param.0 as usize)
        .and_then(|s| s.tp.as_ref())
}

/// Every unit's layout.
fn layout(plan: &Plan) -> Vec<UnitLayout> {
    plan.units
        .iter()
        .map(|u| UnitLayout {
            id: u.id.0,
            padded_numel: u.padded_numel,
            shard_numel: u.shard_numel,
            frozen_numel: u.frozen_numel,
            params: u
                .params
                .iter()
                .map(|p| ParamLayout {
                    name: p.name.clone(),
                    shape: p.shape.clone(),
                    offset: p.offset,
                    numel: p.numel,
                    tp: tp_of(plan, p).cloned(),
                })
                .collect(),
        })
        .collect()
}
