//! Full parameters out of a checkpoint, under their original names and
//! whole shapes (a tensor-parallel checkpoint's parts put back together),
//! one parameter at a time: the safetensors header is computed from the saved
//! layout, then each parameter is gathered from the rank files (mapped, not
//! read whole) and appended, so exporting never holds more than one
//! parameter beyond the maps the operating system pages in and out.

use super::manifest::ParamLayout;
use super::read::{Checkpoint, Part};
use super::CheckpointError;
use fsdpc_ir::fs::{write_atomic_with, AtomicWriteError};
use std::collections::BTreeMap;
use std::io::{BufWriter, Write};
use std::path::Path;

impl Checkpoint {
    /// Every saved parameter in layout order (unit by unit).
    pub fn params(&self) -> impl Iterator<Item = &ParamLayout> {
        self.manifest.units.iter().flat_map(|u| u.params.iter())
    }

    /// The values of the whole parameter `p` (`ParamLayout::whole_shape`).
    pub fn param_values(&self, p: &ParamLayout) -> Result<Vec<f32>, CheckpointError> {
        let mut bytes = vec![0u8; (p.whole_numel() * 4) as usize];
        self.read_param(&p.name, 0, Part::Params, &mut bytes)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// Writes every parameter and module buffer (f32, original names and
    /// shapes) to the safetensors file `out`, streaming, atomically (`fsdpc_ir::fs`: a
    /// temporary file next to it, synced and renamed over `out` once
    /// complete, the directory synced). Returns the tensor count.
    pub fn export_safetensors(&self, out: &Path) -> Result<usize, CheckpointError> {
        let header = self.header(out)?;
        write_atomic_with(out, |tmp| self.write_body(tmp, &header)).map_err(|e| match e {
            AtomicWriteError::Write(e) => e,
            AtomicWriteError::Sync { temp, source } => CheckpointError::io(&temp, source),
            AtomicWriteError::Rename(source) => CheckpointError::io(out, source),
            AtomicWriteError::SyncDir { dir, source } => CheckpointError::io(&dir, source),
        })
    }

    /// The safetensors header: an 8-byte little-endian length, then JSON
    /// naming each tensor's dtype, shape and byte range, padded with spaces
    /// to a multiple of 8 (the format's alignment).
    fn header(&self, out: &Path) -> Result<Vec<u8>, CheckpointError> {
        let mut entries = BTreeMap::new();
        let mut at = 0u64;
        for p in self.params() {
            let numel: u64 = p.shape.iter().map(|&d| d as u64).product();
            if numel != p.numel {
                return Err(CheckpointError::Format {
                    path: self
                        .dir
                        .join(super::manifest::MANIFEST)
                        .display()
                        .to_string(),
                    reason: format!(
                        "`{}` has shape {:?} but {} elements",
                        p.name, p.shape, p.numel
                    ),
                });
            }
            let end = at + p.whole_numel() * 4;
            entries.insert(
                p.name.clone(),
                serde_json::json!({"dtype": "F32", "shape": p.whole_shape(), "data_offsets": [at, end]}),
            );
            at = end;
        }
        for b in &self.manifest.buffers {
            let end = at + b.shape.iter().product::<usize>() as u64 * 4;
            entries.insert(
                b.name.clone(),
                serde_json::json!({"dtype": "F32", "shape": b.shape, "data_offsets": [at, end]}),
            );
            at = end;
        }
        let mut json = serde_json::to_vec(&entries).map_err(|e| CheckpointError::io(out, e))?;
        while json.len() % 8 != 0 {
            json.push(b' ');
        }
        let mut h = (json.len() as u64).to_le_bytes().to_vec();
        h.extend_from_slice(&json);
        Ok(h)
    }

    /// Writes `header` and then every parameter's bytes to `tmp`.
    fn write_body(&self, tmp: &Path, header: &[u8]) -> Result<usize, CheckpointError> {
        let io = |e: std::io::Error| CheckpointError::io(tmp, e);
        let file = std::fs::File::create(tmp).map_err(io)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        w.write_all(header).map_err(io)?;
        let mut n = 0;
        let mut buf = Vec::new();
        for p in self.params() {
            buf.resize((p.whole_numel() * 4) as usize, 0);
            self.read_param(&p.name, 0, Part::Params, &mut buf)?;
            w.write_all(&buf).map_err(io)?;
            n += 1;
        }
        for b in &self.manifest.buffers {
            for v in self.buffer_values(&b.name)? {
                w.write_all(&v.to_le_bytes()).map_err(io)?;
            }
            n += 1;
        }
        w.into_inner().map_err(|e| io(e.into_error()))?;
        Ok(n)
    }
}
