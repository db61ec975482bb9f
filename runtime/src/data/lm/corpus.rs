//! A corpus file as a token slice. A nanoGPT `.bin` (little-endian u16
//! tokens) is memory-mapped, not read into memory; a text file is read and
//! each byte becomes a token. A mapped file may be larger than memory (the
//! kernel pages in the windows a step reads, as nanoGPT's `np.memmap` does);
//! a text file larger than the memory left is refused before any of it is
//! read.

use crate::error::RuntimeError;
use memmap2::Mmap;
use std::fs::File;
use std::ops::Deref;
use std::path::Path;

/// The tokens of a corpus file.
#[derive(Debug)]
pub enum Corpus {
    /// A `.bin` file mapped into memory; its length is even.
    Mapped(Mmap),
    /// Tokens read into memory (a text file's bytes, or an empty file).
    Owned(Vec<u16>),
}

impl Deref for Corpus {
    type Target = [u16];

    fn deref(&self) -> &[u16] {
        match self {
            // `open_bin` checked the length is even and the map is page
            // aligned, so the cast cannot fail; an empty slice if it did.
            Corpus::Mapped(m) => bytemuck::try_cast_slice(&m[..]).unwrap_or(&[]),
            Corpus::Owned(v) => v,
        }
    }
}

/// Maps a nanoGPT `.bin` file of little-endian u16 tokens.
pub fn open_bin(path: &Path) -> Result<Corpus, RuntimeError> {
    // Nothing is read up front, so no memory check: only the pages of the
    // windows a step samples become resident, and the kernel can evict them.
    let file = File::open(path).map_err(|e| io(path, &e.to_string()))?;
    let len = file.metadata().map_err(|e| io(path, &e.to_string()))?.len();
    if len % 2 != 0 {
        return Err(io(path, "odd length: not a file of u16 tokens"));
    }
    if len == 0 {
        return Ok(Corpus::Owned(Vec::new()));
    }
    // SAFETY: the map is read-only; the file must not be truncated or
    // rewritten while training reads it, as for any memory-mapped input
    // (nanoGPT's np.memmap makes the same assumption).
    let map = unsafe { Mmap::map(&file) }.map_err(|e| io(path, &e.to_string()))?;
    let tokens = Corpus::Mapped(map);
    if tokens.len() as u64 * 2 != len {
        // Only on a big-endian host or a map that is not 2-aligned.
        return Err(io(
            path,
            "cannot view the mapped file as little-endian u16 tokens on this host",
        ));
    }
    Ok(tokens)
}

/// Reads a text file; each byte is a token (vocabulary 256).
pub fn read_text(path: &Path) -> Result<Corpus, RuntimeError> {
    // Held twice while converting: the bytes and the u16 tokens.
    check_fits(path, 3)?;
    let bytes = std::fs::read(path).map_err(|e| io(path, &e.to_string()))?;
    Ok(Corpus::Owned(bytes.into_iter().map(u16::from).collect()))
}

/// Checks that `factor` x the length of `path` fits the memory this machine
/// has available.
fn check_fits(path: &Path, factor: u64) -> Result<(), RuntimeError> {
    let len = std::fs::metadata(path)
        .map_err(|e| io(path, &e.to_string()))?
        .len();
    let need = len.saturating_mul(factor);
    if let Some(free) = available_memory_bytes() {
        if need > free {
            return Err(RuntimeError::Io {
                path: path.display().to_string(),
                reason: format!(
                    "{len} bytes of text need {need} bytes of memory, but only {free} bytes are available; use a smaller file, or tokenise it into a nanoGPT .bin of u16 tokens, which is memory-mapped"
                ),
            });
        }
    }
    Ok(())
}

/// Memory available to new allocations without swapping (`MemAvailable` of
/// /proc/meminfo), if known.
fn available_memory_bytes() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

fn io(path: &Path, reason: &str) -> RuntimeError {
    RuntimeError::Io {
        path: path.display().to_string(),
        reason: reason.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    /// A fresh directory for one test's files.
    fn tmp_dir(test: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("fsdpc-corpus-{}-{test}", std::process::id()));
        std::fs::create_dir_all(&d).expect("tmp dir");
        d
    }

    #[test]
    fn bin_tokens_are_little_endian_u16() {
        let p = tmp_dir("le").join("t.bin");
        let toks: Vec<u16> = vec![1, 2, 300, 65535, 0];
        let bytes: Vec<u8> = toks.iter().flat_map(|t| t.to_le_bytes()).collect();
        std::fs::write(&p, bytes).expect("write");
        let c = open_bin(&p).expect("maps");
        assert!(matches!(c, Corpus::Mapped(_)));
        assert_eq!(&*c, toks.as_slice());
    }

    #[test]
    fn odd_empty_and_huge_files() {
        let dir = tmp_dir("sizes");
        let odd = dir.join("odd.bin");
        std::fs::write(&odd, [1u8, 2, 3]).expect("write");
        let e = open_bin(&odd).expect_err("odd length");
        assert!(e.to_string().contains("odd length"), "{e}");

        let empty = dir.join("empty.bin");
        std::fs::write(&empty, []).expect("write");
        assert_eq!(open_bin(&empty).expect("empty opens").len(), 0);

        // A sparse file bigger than the memory left: a .bin maps (its last
        // token reads as 0 without reading the rest); as text it is refused
        // without reading.
        let Some(free) = available_memory_bytes() else {
            eprintln!("skipped the size refusal: /proc/meminfo has no MemAvailable");
            return;
        };
        let huge = dir.join("huge.bin");
        let f = File::create(&huge).expect("create");
        f.set_len((free + (1 << 30)) & !1).expect("sparse file");
        let mapped = open_bin(&huge).expect("a .bin larger than memory maps");
        assert_eq!(mapped.len() as u64 * 2, (free + (1 << 30)) & !1);
        assert_eq!(mapped.last(), Some(&0));
        drop(mapped);
        let e = read_text(&huge).expect_err("too large");
        assert!(e.to_string().contains("bytes are available"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
