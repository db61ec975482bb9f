//! Sharded training checkpoints: every `K` steps each rank of the first shard
//! group writes its parameter shard and optimizer state (one safetensors file
//! per rank, tensors `unit{u}.params` and `unit{u}.state{k}`), then a manifest
//! (JSON) names the files with their sizes and blake3 checksums.
//!
//! - `manifest`: what a checkpoint records (plan hash, model hash, layout,
//!   step, data position, seed, files) and the on-disk names;
//! - `write`: atomic per-rank files and the manifest-last commit (`latest`
//!   pointer, pruning to the two newest checkpoints);
//! - `read`: opening and verifying the latest complete checkpoint, filling a
//!   rank's buffers from it directly or re-sharded for another world, shard
//!   factor or strategy, and reading one parameter at a time;
//! - `export`: full parameters into one safetensors file, streamed.
//!
//! The per-rank calls (`write::save_rank`, `read::Checkpoint::load_rank`)
//! take plain byte slices, so a process-per-rank runtime calls the same code.
//! Replicas (ranks beyond the first shard group) hold identical shards and
//! write nothing.

pub mod export;
pub mod manifest;
pub mod read;
pub mod write;

pub use manifest::{FileEntry, Manifest};
pub use read::Checkpoint;

use thiserror::Error;

/// What can go wrong writing or reading a checkpoint. Each names the file.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CheckpointError {
    /// A file could not be read, written, synced or renamed.
    #[error("checkpoint {path}: {reason}")]
    Io {
        /// The file or directory.
        path: String,
        /// The operating system's message.
        reason: String,
    },
    /// A directory holds no checkpoint: it has no `latest` pointer and is
    /// not a step directory (no manifest).
    #[error("{dir} is not a checkpoint directory: it has no `latest` pointer (`fsdpc train --checkpoint-dir` writes one) and no manifest of a step directory")]
    NotACheckpoint {
        /// The directory.
        dir: String,
    },
    /// A file the checkpoint needs (its manifest, or a file the manifest
    /// lists) is absent.
    #[error("checkpoint {path}: missing")]
    Missing {
        /// The file.
        path: String,
    },
    /// A file's size is not the one the manifest records.
    #[error("checkpoint {path}: {actual} bytes, the manifest records {expected} (truncated or overwritten)")]
    Size {
        /// The file.
        path: String,
        /// Bytes the manifest records.
        expected: u64,
        /// Bytes on disk.
        actual: u64,
    },
    /// A file's checksum is not the one the manifest records.
    #[error("checkpoint {path}: blake3 checksum {actual} does not match the manifest's {expected} (corrupted)")]
    Checksum {
        /// The file.
        path: String,
        /// The manifest's checksum (hex).
        expected: String,
        /// The file's checksum (hex).
        actual: String,
    },
    /// A file or the manifest does not have the expected content.
    #[error("checkpoint {path}: {reason}")]
    Format {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// The checkpoint belongs to another model or cannot continue this run.
    #[error("checkpoint {path}: {reason}")]
    Incompatible {
        /// The manifest.
        path: String,
        /// What differs.
        reason: String,
    },
}

impl CheckpointError {
    /// An I/O error on `path`.
    pub(crate) fn io(path: &std::path::Path, e: impl std::fmt::Display) -> CheckpointError {
        CheckpointError::Io {
            path: path.display().to_string(),
            reason: e.to_string(),
        }
    }
}
