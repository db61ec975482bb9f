//! Reading a checkpoint: the latest complete one of a directory, or a
//! step directory named directly, is opened and every file
//! checked against the manifest (present, size, blake3) before any value is
//! used; a rank's buffers are then filled directly (same plan) or re-sharded
//! (same model, other world, shard factor or strategy) by slicing the saved
//! shards at the layout's offsets. A unit with frozen parameters is two
//! segments (see `fsdpc_plan::unit::Unit::segments`): a rank file holds its part of the
//! trainable segment then of the frozen one, and optimizer state for the
//! trainable part only; state read for a parameter that was frozen when
//! saved is zero (a fresh state, as when PyTorch unfreezes a parameter).
//! Reading never writes or removes a file.

use super::manifest::{self, Manifest, LATEST, MANIFEST};
use super::CheckpointError;
use fsdpc_plan::Plan;
use memmap2::Mmap;
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

/// A verified checkpoint, its rank files mapped.
pub struct Checkpoint {
    /// Its manifest.
    pub manifest: Manifest,
    /// Its step directory.
    pub dir: PathBuf,
    /// The rank files by file index (`manifest::file_index`).
    files: Vec<Mmap>,
    /// Each file's tensors: name -> byte range in the map.
    tensors: Vec<HashMap<String, Range<usize>>>,
    /// Parameter name -> (unit index, index in the unit) in the saved
    /// layout.
    index: HashMap<String, (usize, usize)>,
}

/// Which tensor of a unit: its parameters or an optimizer state slot.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Part {
    /// `unit{u}.params`.
    Params,
    /// `unit{u}.state{k}`.
    State(usize),
}

impl Checkpoint {
    /// Opens the checkpoint `path` names and verifies every file it lists:
    /// the latest complete one when `path` is a checkpoint directory (the
    /// step directory `latest` names), or `path` itself when it is a step
    /// directory (`DIR/step-000000005`: an older one, to roll back to).
    pub fn open(path: &Path) -> Result<Checkpoint, CheckpointError> {
        Checkpoint::open_step(&step_dir(path)?)
    }

    /// The step the checkpoint `path` names (as `open` finds it) completed,
    /// from its manifest alone, no rank file read.
    pub fn step_of(path: &Path) -> Result<u64, CheckpointError> {
        Ok(Manifest::read(&step_dir(path)?.join(MANIFEST))?.step)
    }

    /// Opens the checkpoint in the step directory `sdir` and verifies it.
    pub fn open_step(sdir: &Path) -> Result<Checkpoint, CheckpointError> {
        let mpath = sdir.join(MANIFEST);
        let m = Manifest::read(&mpath)?;
        check_shape(&m, &mpath)?;
        let mut files = Vec::with_capacity(m.files.len());
        let mut tensors = Vec::with_capacity(m.files.len());
        for (i, f) in m.files.iter().enumerate() {
            let path = sdir.join(&f.name);
            let at = manifest::file_index(f.position, f.tensor, m.tensor_parallel);
            if at != i || f.tensor >= m.tensor_parallel || f.name != manifest::rank_file(i) {
                return Err(CheckpointError::Format {
                    path: mpath.display().to_string(),
                    reason: format!(
                        "file entry {i} is `{}` (shard position {}, tensor position {})",
                        f.name, f.position, f.tensor
                    ),
                });
            }
            let map = verify_file(&path, f)?;
            tensors.push(tensor_ranges(&map, &path)?);
            files.push(map);
        }
        let mut index = HashMap::new();
        for (u, unit) in m.units.iter().enumerate() {
            for (k, p) in unit.params.iter().enumerate() {
                index.insert(p.name.clone(), (u, k));
            }
        }
        Ok(Checkpoint {
            manifest: m,
            dir: sdir.to_path_buf(),
            files,
            tensors,
            index,
        })
    }

    /// Refuses a checkpoint `plan` cannot continue from: another model or
    /// optimizer, or another global batch (the data would differ).
    pub fn check_compatible(&self, plan: &Plan) -> Result<(), CheckpointError> {
        let m = &self.manifest;
        let bad = |reason: String| CheckpointError::Incompatible {
            path: self.dir.join(MANIFEST).display().to_string(),
            reason,
        };
        if m.model_hash != manifest::model_hash(plan) {
            return Err(bad(format!(
                "it was written for another model or optimizer (`{}`; model hash {} is not this plan's {})",
                m.model,
                m.model_hash,
                manifest::model_hash(plan)
            )));
        }
        let tokens = manifest::tokens_per_step(plan);
        if m.data.tokens_per_step != tokens {
            return Err(bad(format!(
                "it was trained on {} tokens per step, this plan takes {tokens}; resume with the same global batch (batch x data ranks, the ranks over the tensor-parallel degree)",
                m.data.tokens_per_step
            )));
        }
        Ok(())
    }

    /// Fills rank `rank`'s buffers of `plan`: per unit, its parameter shard
    /// and its optimizer state slots, as f32 bytes. The same plan copies the
    /// saved shard; any other re-shards from the saved layout. Call
    /// `check_compatible` first.
    pub fn load_rank(
        &self,
        plan: &Plan,
        rank: usize,
        units: &mut [(&mut [u8], Vec<&mut [u8]>)],
    ) -> Result<(), CheckpointError> {
        let g = plan.geometry();
        let (pos, member) = (g.shard_position(rank), g.tensor_position(rank) as u32);
        let file = manifest::file_index(pos as u32, member, self.t());
        let same = self.manifest.plan_hash == manifest::plan_hash(plan);
        for (u, (params, state)) in units.iter_mut().enumerate() {
            let unit = plan
                .units
                .get(u)
                .ok_or_else(|| self.format("", "more units than the plan"))?;
            let want = (unit.shard_numel * 4) as usize;
            let want_state = (unit.trainable_shard_numel() * 4) as usize;
            // A unit without trainable elements has no state buffers.
            let slots_ok =
                state.len() == self.manifest.state_slots || (state.is_empty() && want_state == 0);
            if params.len() != want || !slots_ok || state.iter().any(|s| s.len() != want_state) {
                return Err(self.format(
                    MANIFEST,
                    &format!(
                        "unit {u}: this rank has {} parameter bytes and {} state slots, the plan needs {want} (state {want_state} each) and the checkpoint has {}",
                        params.len(),
                        state.len(),
                        self.manifest.state_slots
                    ),
                ));
            }
            let trainable_shard = unit.trainable_shard_numel();
            let parts = std::iter::once((Part::Params, &mut **params)).chain(
                state
                    .iter_mut()
                    .enumerate()
                    .map(|(k, s)| (Part::State(k), &mut **s)),
            );
            for (part, dst) in parts {
                if same {
                    dst.copy_from_slice(self.tensor(file, u, part, dst.len())?);
                    continue;
                }
                dst.fill(0);
                // Optimizer state covers the trainable segment only.
                let ranges = unit
                    .shard_ranges(pos as u64)
                    .into_iter()
                    .filter(|&(_, at, _)| part == Part::Params || at < trainable_shard);
                for (lo, at, n) in ranges {
                    for p in &unit.params {
                        let (a, b) = (p.offset.max(lo), (p.offset + p.numel).min(lo + n));
                        if a >= b {
                            continue;
                        }
                        let range = ((a - lo + at) * 4) as usize..((b - lo + at) * 4) as usize;
                        let out = dst.get_mut(range).ok_or_else(|| {
                            self.format(
                                MANIFEST,
                                &format!("unit {u}: `{}` lies outside the shard", p.name),
                            )
                        })?;
                        // This member's elements [a, b) of the parameter,
                        // as runs of the whole one.
                        let (first, last) = (a - p.offset, b - p.offset);
                        let tp = plan
                            .training
                            .graph
                            .params
                            .get(p.param.0 as usize)
                            .and_then(|s| s.tp.as_ref());
                        let runs = match tp {
                            Some(tp) => tp.runs(&p.shape, member),
                            None => vec![(0, 0, p.numel)],
                        };
                        for (local, whole, n) in runs {
                            let (x, y) = (local.max(first), (local + n).min(last));
                            if x >= y {
                                continue;
                            }
                            let o = ((x - first) * 4) as usize..((y - first) * 4) as usize;
                            self.read_param(&p.name, whole + (x - local), part, &mut out[o])?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Elements `[first, first + out.len()/4)` of the whole parameter
    /// `name`'s `part` (row-major), gathered from the saved shards and, for
    /// a parameter saved split over the tensor group, from its members'
    /// parts.
    pub fn read_param(
        &self,
        name: &str,
        first: u64,
        part: Part,
        out: &mut [u8],
    ) -> Result<(), CheckpointError> {
        let &(u, k) = self.index.get(name).ok_or_else(|| {
            self.format("", &format!("parameter `{name}` is not in the checkpoint"))
        })?;
        let p = &self.manifest.units[u].params[k];
        let Some(tp) = &p.tp else {
            return self.read_part(name, u, p.offset + first, 0, part, out);
        };
        // Run by run of the whole: each lies in one member's part.
        let mut done = 0usize;
        while done + 4 <= out.len() {
            let whole = first + (done / 4) as u64;
            let (member, local, run) = tp.locate(&p.shape, whole).ok_or_else(|| {
                self.format(MANIFEST, &format!("`{name}` has no element {whole}"))
            })?;
            let n = ((run * 4) as usize).min(out.len() - done);
            let flat = p.offset + local;
            self.read_part(name, u, flat, member, part, &mut out[done..done + n])?;
            done += n;
        }
        Ok(())
    }

    /// The tensor-parallel degree the checkpoint was written at.
    fn t(&self) -> u32 {
        self.manifest.tensor_parallel.max(1)
    }

    /// Flat elements `[flat, flat + out.len()/4)` of saved unit `u` at
    /// tensor position `member` (inside parameter `name`).
    fn read_part(
        &self,
        name: &str,
        u: usize,
        mut flat: u64,
        member: u32,
        part: Part,
        out: &mut [u8],
    ) -> Result<(), CheckpointError> {
        let len = self.part_bytes(u, part);
        let mut done = 0usize;
        while done + 4 <= out.len() {
            let Some((pos, at, run)) = self.locate(u, flat, part) else {
                if part == Part::Params {
                    return Err(self.format(
                        MANIFEST,
                        &format!("`{name}` lies outside unit {u}'s layout"),
                    ));
                }
                // No state was saved for a frozen element: a fresh state.
                out[done..].fill(0);
                return Ok(());
            };
            let n = ((run * 4) as usize).min(out.len() - done);
            let file = manifest::file_index(pos as u32, member, self.t());
            let src = self.tensor(file, u, part, len)?;
            let s = (at * 4) as usize;
            let bytes = src.get(s..s + n).ok_or_else(|| {
                self.format(MANIFEST, &format!("`{name}` lies outside the saved shard"))
            })?;
            out[done..done + n].copy_from_slice(bytes);
            done += n;
            flat += (n / 4) as u64;
        }
        Ok(())
    }

    /// Bytes of unit `u`'s `part` tensor in each rank file: the shard for
    /// the parameters, its trainable part for a state slot.
    fn part_bytes(&self, u: usize, part: Part) -> usize {
        let unit = &self.manifest.units[u];
        let f = u64::from(self.manifest.shard_factor.max(1));
        let n = match part {
            Part::Params => unit.shard_numel,
            Part::State(_) => unit.trainable_shard_numel(f),
        };
        (n * 4) as usize
    }

    /// Where flat element `x` of saved unit `u` lies for `part`: (file
    /// position, element in that file's tensor, elements of the same run
    /// from there). `None` for a state slot in the frozen segment, which
    /// has no state.
    fn locate(&self, u: usize, x: u64, part: Part) -> Option<(usize, u64, u64)> {
        let unit = &self.manifest.units[u];
        let f = u64::from(self.manifest.shard_factor.max(1));
        let t = unit.padded_numel.saturating_sub(unit.frozen_numel);
        let (seg, seg_len, shard_at) = if x < t {
            (0, t, 0)
        } else if part == Part::Params {
            (t, unit.frozen_numel, t / f)
        } else {
            return None;
        };
        let per_rank = seg_len / f;
        if per_rank == 0 {
            return None;
        }
        let y = x - seg;
        Some((
            (y / per_rank) as usize,
            shard_at + y % per_rank,
            per_rank - y % per_rank,
        ))
    }

    /// Rank 0's values of module buffer `name` (f32), as saved in file 0.
    pub fn buffer_values(&self, name: &str) -> Result<Vec<f32>, CheckpointError> {
        let fname = manifest::rank_file(0);
        let layout = self
            .manifest
            .buffers
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| self.format(MANIFEST, &format!("it holds no module buffer `{name}`")))?;
        let numel: usize = layout.shape.iter().product();
        let tensor = manifest::buffer_tensor(name);
        let (Some(map), Some(tensors)) = (self.files.first(), self.tensors.first()) else {
            return Err(self.format(&fname, "missing"));
        };
        let range = tensors
            .get(&tensor)
            .filter(|r| r.len() == numel * 4)
            .ok_or_else(|| {
                self.format(
                    &fname,
                    &format!("tensor {tensor} is missing or not {numel} f32 values"),
                )
            })?;
        Ok(map[range.clone()]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }

    /// The bytes of unit `u`'s `part` in file `file`
    /// (`manifest::file_index`), which must hold `len` bytes.
    fn tensor(
        &self,
        file: usize,
        u: usize,
        part: Part,
        len: usize,
    ) -> Result<&[u8], CheckpointError> {
        let name = match part {
            Part::Params => manifest::params_tensor(u),
            Part::State(k) => manifest::state_tensor(u, k),
        };
        let fname = manifest::rank_file(file);
        let (Some(map), Some(tensors)) = (self.files.get(file), self.tensors.get(file)) else {
            return Err(self.format(&fname, "position outside the checkpoint"));
        };
        let range = tensors
            .get(&name)
            .ok_or_else(|| self.format(&fname, &format!("tensor {name} is missing")))?;
        if range.len() != len {
            return Err(self.format(
                &fname,
                &format!(
                    "tensor {name} has {} bytes, the layout needs {len}",
                    range.len()
                ),
            ));
        }
        Ok(&map[range.clone()])
    }

    fn format(&self, file: &str, reason: &str) -> CheckpointError {
        CheckpointError::Format {
            path: self.dir.join(file).display().to_string(),
            reason: reason.to_string(),
        }
    }
}

/// The manifest's own consistency: one file per shard position, layouts
/// that divide into shards.
fn check_shape(m: &Manifest, path: &Path) -> Result<(), CheckpointError> {
    let bad = |reason: String| CheckpointError::Format {
        path: path.display().to_string(),
        reason,
    };
    let t = m.tensor_parallel;
    if m.shard_factor == 0 || t == 0 || m.files.len() != m.shard_factor as usize * t as usize {
        return Err(bad(format!(
            "{} files for shard factor {} and tensor parallelism {t}",
            m.files.len(),
            m.shard_factor
        )));
    }
    for u in &m.units {
        let f = u64::from(m.shard_factor);
        if u.frozen_numel > u.padded_numel || !u.frozen_numel.is_multiple_of(f) {
            return Err(bad(format!(
                "unit {}: frozen segment {} does not fit the layout",
                u.id, u.frozen_numel
            )));
        }
        if u.shard_numel * u64::from(m.shard_factor) != u.padded_numel {
            return Err(bad(format!(
                "unit {}: shards do not cover the flat parameter",
                u.id
            )));
        }
        if let Some(p) = u
            .params
            .iter()
            .find(|p| p.offset + p.numel > u.padded_numel)
        {
            return Err(bad(format!("unit {}: `{}` lies outside it", u.id, p.name)));
        }
    }
    Ok(())
}

/// Every tensor of the safetensors file `map` (of `path`): name -> byte
/// range in the map.
fn tensor_ranges(
    map: &Mmap,
    path: &Path,
) -> Result<HashMap<String, Range<usize>>, CheckpointError> {
    let st = SafeTensors::deserialize(map).map_err(|e| CheckpointError::Format {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    Ok(st
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            // The view borrows the map: its data lies inside it.
            let start = view.data().as_ptr() as usize - map.as_ptr() as usize;
            (name, start..start + view.data().len())
        })
        .collect())
}

/// Maps `path` after checking its presence, size and checksum.
fn verify_file(path: &Path, f: &manifest::FileEntry) -> Result<Mmap, CheckpointError> {
    let file = match std::fs::File::open(path) {
        Ok(file) => file,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CheckpointError::Missing {
                path: path.display().to_string(),
            })
        }
        Err(e) => return Err(CheckpointError::io(path, e)),
    };
    let actual = file
        .metadata()
        .map_err(|e| CheckpointError::io(path, e))?
        .len();
    if actual != f.bytes {
        return Err(CheckpointError::Size {
            path: path.display().to_string(),
            expected: f.bytes,
            actual,
        });
    }
    // SAFETY: the map is read-only; a file changed under it after the
    // checksum is the same hazard as a file changed between two reads.
    let map = unsafe { Mmap::map(&file) }.map_err(|e| CheckpointError::io(path, e))?;
    let sum = blake3::hash(&map).to_hex().to_string();
    if sum != f.blake3 {
        return Err(CheckpointError::Checksum {
            path: path.display().to_string(),
            expected: f.blake3.clone(),
            actual: sum,
        });
    }
    Ok(map)
}

/// The step directory `path` names: itself when it holds a manifest and no
/// `latest` pointer, otherwise the one its `latest` pointer names.
fn step_dir(path: &Path) -> Result<PathBuf, CheckpointError> {
    let latest = path.join(LATEST);
    if !latest.exists() && path.join(MANIFEST).exists() {
        return Ok(path.to_path_buf());
    }
    let name = match std::fs::read_to_string(&latest) {
        Ok(n) => n.trim().to_string(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(CheckpointError::NotACheckpoint {
                dir: path.display().to_string(),
            })
        }
        Err(e) => return Err(CheckpointError::io(&latest, e)),
    };
    if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
        return Err(CheckpointError::Format {
            path: latest.display().to_string(),
            reason: format!("`{name}` is not a step directory name"),
        });
    }
    Ok(path.join(name))
}
