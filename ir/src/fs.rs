//! Writing a file atomically, the one way every crate writes its outputs
//! (exported parameters, checkpoints, ONNX write-back): the bytes go to a
//! temporary file next to the target (`.NAME.tmp-PID`), which is synced,
//! renamed over the target, and then the directory is synced, so a crash
//! at any point leaves either the old file or the new one, whole, and the
//! new name survives once the write returns. On a failure before the
//! rename the temporary file is removed; a process killed mid-write
//! leaves it behind (readers ignore it: it is never the target's name).

use std::fmt;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The step of an atomic write that failed.
#[derive(Debug)]
pub enum AtomicWriteError<E> {
    /// The writer failed to fill the temporary file.
    Write(E),
    /// Syncing the temporary file `temp` failed.
    Sync { temp: PathBuf, source: io::Error },
    /// Renaming the temporary file over the target failed.
    Rename(io::Error),
    /// Syncing the directory `dir` failed, after the rename: the new file
    /// is in place but its name may not be durable.
    SyncDir { dir: PathBuf, source: io::Error },
}

impl<E: fmt::Display> fmt::Display for AtomicWriteError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AtomicWriteError::Write(e) => e.fmt(f),
            AtomicWriteError::Sync { source, .. }
            | AtomicWriteError::Rename(source)
            | AtomicWriteError::SyncDir { source, .. } => source.fmt(f),
        }
    }
}

impl<E: fmt::Debug + fmt::Display> std::error::Error for AtomicWriteError<E> {}

impl From<AtomicWriteError<io::Error>> for io::Error {
    /// The error of the step that failed.
    fn from(e: AtomicWriteError<io::Error>) -> io::Error {
        match e {
            AtomicWriteError::Write(source)
            | AtomicWriteError::Sync { source, .. }
            | AtomicWriteError::Rename(source)
            | AtomicWriteError::SyncDir { source, .. } => source,
        }
    }
}

/// Writes `bytes` to `path` atomically (see the module header).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), AtomicWriteError<io::Error>> {
    write_atomic_with(path, |temp| File::create(temp)?.write_all(bytes))
}

/// Writes the file at `path` atomically (see the module header): `write`
/// creates and fills the temporary file at the path it is given (a
/// streaming writer, a library that writes to a path); this function then
/// syncs it, renames it over `path` and syncs the directory. Returns what
/// `write` returned.
pub fn write_atomic_with<T, E>(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<T, E>,
) -> Result<T, AtomicWriteError<E>> {
    let temp = temp_path(path);
    let written = write(&temp).map_err(AtomicWriteError::Write).and_then(|v| {
        File::open(&temp)
            .and_then(|f| f.sync_all())
            .map_err(|source| AtomicWriteError::Sync {
                temp: temp.clone(),
                source,
            })?;
        std::fs::rename(&temp, path).map_err(AtomicWriteError::Rename)?;
        Ok(v)
    });
    let v = match written {
        Ok(v) => v,
        Err(e) => {
            // The temporary file is ours; the first error is what matters.
            let _ = std::fs::remove_file(&temp);
            return Err(e);
        }
    };
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = dir.unwrap_or(Path::new("."));
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|source| AtomicWriteError::SyncDir {
            dir: dir.to_path_buf(),
            source,
        })?;
    Ok(v)
}

/// `dir/.name.tmp-PID` next to `path`.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map_or_else(|| "out".into(), |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fsdpc-fs-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
        d
    }

    #[test]
    fn a_write_replaces_the_file_and_leaves_no_temporary() {
        let d = dir("replace");
        let path = d.join("f.bin");
        std::fs::write(&path, b"old").unwrap_or_else(|e| panic!("{e}"));
        write_atomic(&path, b"new").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(std::fs::read(&path).unwrap_or_default(), b"new");
        assert!(!temp_path(&path).exists());
        std::fs::remove_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_failed_writer_keeps_the_old_file_and_removes_the_temporary() {
        let d = dir("fail");
        let path = d.join("f.bin");
        std::fs::write(&path, b"old").unwrap_or_else(|e| panic!("{e}"));
        let r = write_atomic_with(&path, |temp| {
            std::fs::write(temp, b"half")?;
            Err::<(), io::Error>(io::Error::other("the writer gave up"))
        });
        assert!(matches!(r, Err(AtomicWriteError::Write(_))), "{r:?}");
        assert_eq!(
            r.err().map(|e| e.to_string()).as_deref(),
            Some("the writer gave up")
        );
        assert_eq!(std::fs::read(&path).unwrap_or_default(), b"old");
        assert!(!temp_path(&path).exists());
        std::fs::remove_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
    }

    #[test]
    fn a_writer_that_makes_no_file_fails_to_sync() {
        let d = dir("nofile");
        let path = d.join("f.bin");
        let r = write_atomic_with(&path, |_| Ok::<(), io::Error>(()));
        assert!(matches!(r, Err(AtomicWriteError::Sync { .. })), "{r:?}");
        assert!(!path.exists());
        std::fs::remove_dir_all(&d).unwrap_or_else(|e| panic!("{e}"));
    }
}
