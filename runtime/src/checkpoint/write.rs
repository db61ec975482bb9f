//! Writing a checkpoint. Each file goes to a temporary name, is synced,
//! renamed into place and its directory synced (`fsdpc_ir::fs`). A step
//! directory is complete once its manifest exists; the manifest is written
//! after every rank file and the `latest` pointer after the manifest, so a
//! run killed at any point leaves the previous checkpoint as `latest`,
//! whole. Older checkpoints are pruned only after the new one is `latest`;
//! two are kept.

use super::manifest::{self, FileEntry, Manifest, LATEST, MANIFEST};
use super::{Checkpoint, CheckpointError};
use fsdpc_ir::fs::{write_atomic_with, AtomicWriteError};
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::{Path, PathBuf};

/// Complete checkpoints kept in a directory.
pub const KEEP: usize = 2;

/// One unit's persistent state on a rank, as bytes of f32 values.
#[derive(Clone, Copy, Debug)]
pub struct UnitBytes<'a> {
    /// The rank's shard of the flat parameter.
    pub params: &'a [u8],
    /// The optimizer state slots, in slot order.
    pub state: &'a [&'a [u8]],
}

/// Writes the file of shard position `pos` and tensor position `tensor`
/// (of `t`) for the checkpoint after `step` completed steps into `dir`,
/// and returns its manifest entry. `buffers` (name, f32 bytes): the module
/// buffers, given by the rank writing file 0 only.
pub fn save_rank(
    dir: &Path,
    step: u64,
    (pos, tensor, t): (u32, u32, u32),
    units: &[UnitBytes<'_>],
    buffers: &[(&str, &[u8])],
) -> Result<FileEntry, CheckpointError> {
    let sdir = manifest::step_dir(dir, step);
    std::fs::create_dir_all(&sdir).map_err(|e| CheckpointError::io(&sdir, e))?;
    let file = manifest::file_index(pos, tensor, t);
    let path = sdir.join(manifest::rank_file(file));
    let fmt = |reason: String| CheckpointError::Format {
        path: path.display().to_string(),
        reason,
    };
    let mut views = Vec::new();
    for (u, ub) in units.iter().enumerate() {
        let named = std::iter::once((manifest::params_tensor(u), ub.params)).chain(
            ub.state
                .iter()
                .enumerate()
                .map(|(k, s)| (manifest::state_tensor(u, k), *s)),
        );
        for (name, bytes) in named {
            let view = TensorView::new(Dtype::F32, vec![bytes.len() / 4], bytes)
                .map_err(|e| fmt(format!("tensor {name}: {e}")))?;
            views.push((name, view));
        }
    }
    for (name, bytes) in buffers {
        let name = manifest::buffer_tensor(name);
        let view = TensorView::new(Dtype::F32, vec![bytes.len() / 4], bytes)
            .map_err(|e| fmt(format!("tensor {name}: {e}")))?;
        views.push((name, view));
    }
    // Streamed from the rank's buffers to a temporary file (the crate
    // writes through a 1 MiB buffer): no copy of the state in memory.
    let (bytes, blake3) = write_atomic_with(&path, |tmp| {
        safetensors::serialize_to_file(views, None, tmp).map_err(|e| fmt(e.to_string()))?;
        size_and_hash(tmp)
    })
    .map_err(|e| match e {
        AtomicWriteError::Write(e) => e,
        AtomicWriteError::Sync { temp, source } => CheckpointError::io(&temp, source),
        AtomicWriteError::Rename(source) => CheckpointError::io(&path, source),
        AtomicWriteError::SyncDir { dir, source } => CheckpointError::io(&dir, source),
    })?;
    Ok(FileEntry {
        name: manifest::rank_file(file),
        position: pos,
        tensor,
        bytes,
        blake3,
    })
}

/// The size of the file at `path` and its blake3 (hex), read through a map
/// (no heap copy).
fn size_and_hash(path: &Path) -> Result<(u64, String), CheckpointError> {
    let io = |e: std::io::Error| CheckpointError::io(path, e);
    let f = std::fs::File::open(path).map_err(io)?;
    let len = f.metadata().map_err(io)?.len();
    // SAFETY: the file is this rank's own temporary file, not yet renamed
    // into place: nothing else writes it while the map lives.
    let map = unsafe { memmap2::Mmap::map(&f) }.map_err(io)?;
    Ok((len, blake3::hash(&map).to_hex().to_string()))
}

/// Completes the checkpoint `m` describes in `dir`: its manifest, then the
/// `latest` pointer, then pruning to the `KEEP` newest step directories.
pub fn commit(dir: &Path, m: &Manifest) -> Result<(), CheckpointError> {
    let sdir = manifest::step_dir(dir, m.step);
    let json = serde_json::to_vec_pretty(m).map_err(|e| CheckpointError::Format {
        path: sdir.join(MANIFEST).display().to_string(),
        reason: e.to_string(),
    })?;
    write_atomic(&sdir.join(MANIFEST), &json)?;
    let name = sdir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    write_atomic(&dir.join(LATEST), name.as_bytes())?;
    prune(dir, m.step)
}

/// Removes step directories older than the `KEEP` newest complete ones up
/// to `newest`; never one newer than `newest` (another run's, in progress).
fn prune(dir: &Path, newest: u64) -> Result<(), CheckpointError> {
    let mut steps: Vec<u64> = step_dirs(dir)?
        .into_iter()
        .map(|(s, _)| s)
        .filter(|&s| s <= newest)
        .collect();
    steps.sort_unstable_by(|a, b| b.cmp(a));
    for old in steps.into_iter().skip(KEEP) {
        let p = manifest::step_dir(dir, old);
        std::fs::remove_dir_all(&p).map_err(|e| CheckpointError::io(&p, e))?;
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically (`fsdpc_ir::fs::write_atomic`): a
/// crash leaves either the old file or the new one, never part of one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    fsdpc_ir::fs::write_atomic(path, bytes).map_err(|e| match e {
        AtomicWriteError::SyncDir { dir, source } => CheckpointError::io(&dir, source),
        AtomicWriteError::Write(source)
        | AtomicWriteError::Sync { source, .. }
        | AtomicWriteError::Rename(source) => CheckpointError::io(path, source),
    })
}

/// Readies `dir` for a run's checkpoints. A directory holding a checkpoint
/// is written only by a run that resumes from one of its step directories:
/// the step directories newer than the resumed step (leftovers of an
/// interrupted write, or the steps a run rolled back from, `--resume
/// DIR/step-N`) are removed once `latest` names the resumed step, so no
/// file of theirs mixes with the new ones and a crash leaves `latest`
/// whole. Any other run is refused rather than overwrite the checkpoint
/// there.
pub fn prepare_dir(dir: &Path, from: Option<&Checkpoint>) -> Result<(), CheckpointError> {
    let latest = dir.join(LATEST);
    if !latest.exists() {
        return Ok(());
    }
    let same = |c: &Checkpoint| {
        let parent = c.dir.parent().unwrap_or(Path::new("."));
        matches!((parent.canonicalize(), dir.canonicalize()), (Ok(a), Ok(b)) if a == b)
    };
    let Some(c) = from.filter(|c| same(c)) else {
        return Err(CheckpointError::Incompatible {
            path: latest.display().to_string(),
            reason: "this directory already holds checkpoints; continue them with --resume on the same directory, or write to another one".into(),
        });
    };
    let newer: Vec<PathBuf> = step_dirs(dir)?
        .into_iter()
        .filter(|(step, _)| *step > c.manifest.step)
        .map(|(_, path)| path)
        .collect();
    if !newer.is_empty() {
        let name = c
            .dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        write_atomic(&latest, name.as_bytes())?;
    }
    for path in newer {
        std::fs::remove_dir_all(&path).map_err(|e| CheckpointError::io(&path, e))?;
    }
    Ok(())
}

/// The step directories in `dir` with their steps.
fn step_dirs(dir: &Path) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
    Ok(std::fs::read_dir(dir)
        .map_err(|e| CheckpointError::io(dir, e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let step = name.strip_prefix("step-")?.parse::<u64>().ok()?;
            Some((step, e.path()))
        })
        .collect())
}
