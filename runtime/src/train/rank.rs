//! One rank's run, whichever launcher started it: its memory (arena or
//! debug allocations), its shards (initialised or loaded from a
//! checkpoint), every step with its report, and its checkpoint files.

use super::*;

/// What a rank thread sends the collector (`threads::collect`).
pub(crate) enum Msg {
    Step {
        rank: usize,
        step: u64,
        out: RankStep,
    },
    Done {
        rank: usize,
        out: Result<RankOut, RuntimeError>,
    },
    /// A rank wrote its checkpoint file for the checkpoint after `step`
    /// completed steps.
    Saved {
        step: u64,
        file: Result<FileEntry, CheckpointError>,
    },
}

/// What a rank hands back at the end: its fp32 shard of every unit and its
/// peaks.
pub(crate) struct RankOut {
    pub(crate) shards: Vec<Vec<f32>>,
    /// Rank 0's module buffers by name (empty on other ranks, or unless
    /// the parameters are kept).
    pub(crate) buffers: Vec<(String, Vec<f32>)>,
    pub(crate) measured: Option<u64>,
    pub(crate) debug_peak: Option<u64>,
    pub(crate) timeline: Option<RankTimeline>,
}

/// What a rank reports after a step: its loss, pre-clip gradient norm,
/// measured peak and step time, and its evaluation if one followed.
pub(crate) struct RankStep {
    pub(crate) loss: f32,
    pub(crate) scalars: StepScalars,
    pub(crate) measured: Option<u64>,
    pub(crate) time: Duration,
    pub(crate) eval: Option<RankEval>,
}

/// Reports one rank's step (`RankStep`).
type Report<'r> = dyn FnMut(u64, RankStep) -> Result<(), RuntimeError> + 'r;

/// Everything one rank uses, whichever launcher started it.
pub(crate) struct RankCtx<'a> {
    pub(crate) rank: usize,
    /// The rank's accounting tag, when the counting allocator is installed.
    pub(crate) tag: Option<usize>,
    pub(crate) world: &'a dyn World,
    pub(crate) prep: &'a Resolved<'a>,
    pub(crate) backend: &'a CpuBackend,
    pub(crate) data: &'a dyn DataSource,
    /// The held-out data and the batches of each evaluation
    /// (`TrainOptions::eval`).
    pub(crate) eval: Option<(&'a dyn DataSource, u64)>,
    pub(crate) opts: &'a TrainOptions,
    pub(crate) resume: Option<&'a Checkpoint>,
    pub(crate) saver: Saver<'a>,
    /// The time origin of measured timelines (shared by thread ranks).
    pub(crate) epoch: Instant,
}

/// Where a rank's checkpoint file entry goes.
pub(crate) enum Saver<'a> {
    /// Thread ranks: to the collector, which writes the manifest.
    Thread(&'a mpsc::SyncSender<Msg>),
    /// Process ranks: gathered to rank 0 over this communicator of every
    /// rank; rank 0 writes the manifest and tells the others it did.
    Process(&'a dyn crate::comm::Communicator),
}

/// Bytes of one rank's file entry in the gather: a status byte (`ENTRY_*`),
/// 7 bytes padding, the file size (u64 little-endian), its blake3 (32 bytes).
const ENTRY_BYTES: usize = 48;
/// The rank wrote its file.
const ENTRY_OK: u8 = 1;
/// The rank failed to write its file.
const ENTRY_FAILED: u8 = 2;
/// The rank writes no file (a replica).
const ENTRY_NONE: u8 = 0;

impl RankCtx<'_> {
    pub(crate) fn run(
        &self,
        arena: Option<&mut Arena>,
        report: &mut Report,
    ) -> Result<RankOut, RuntimeError> {
        let plan = self.prep.plan;
        let mut env = RankEnv::new(
            self.rank,
            self.world,
            self.prep,
            self.backend,
            self.data,
            self.opts.seed,
        )?;
        if let Some((data, _)) = self.eval {
            env = env.with_eval_data(data);
        }
        let mut mem = match arena {
            Some(a) => Memory::arena(plan, a),
            None => {
                let mut m = Memory::debug(plan);
                for b in plan.buffers.iter().filter(|b| b.persistent()) {
                    m.alloc(b.id);
                }
                m
            }
        };
        match self.resume {
            Some(c) => self.load(c, &mem)?,
            None => self.init_shards(&mem)?,
        }
        self.init_module_buffers(&mem)?;
        env.init_loss_scale(&mem)?;
        if self.opts.trace_steps > 0 {
            // Reserved here, on this untagged thread, before the window:
            // the trace buffers are not the rank's memory (`timeline`).
            let from = self
                .opts
                .steps
                .saturating_sub(self.opts.trace_steps)
                .max(first_step(self.resume));
            let n = self.opts.steps.saturating_sub(from);
            env.start_trace(self.epoch, from, n, self.tag);
        }
        // The step window: from here to the last step, every allocation of
        // this thread and its stream threads counts as the rank's, on top
        // of its arena (allocated under the same tag).
        if let Some(t) = self.tag {
            account::reset_peak(t);
        }
        self.steps(&env, &mut mem, report)?;
        let measured = self.tag.map(|t| account::peak(t).max(0) as u64);
        let debug_peak = (self.opts.mode == ExecMode::DebugAlloc).then(|| mem.peak());
        // Only the first shard group's shards are assembled.
        // Process ranks all hand theirs to the gather (`gather_params`).
        let first_group = plan.geometry().data_rank(self.rank) < plan.config.shard_factor as usize;
        let keep =
            self.opts.keep_params && (first_group || matches!(self.saver, Saver::Process(_)));
        Ok(RankOut {
            shards: if keep { self.shards(&mem)? } else { Vec::new() },
            buffers: if self.opts.keep_params && self.rank == 0 {
                self.module_buffers(&mem)?
            } else {
                Vec::new()
            },
            measured,
            debug_peak,
            timeline: env.take_trace(),
        })
    }

    /// Runs every step, reporting each step's loss and the evaluations
    /// that follow the steps they are due after.
    fn steps(
        &self,
        env: &RankEnv,
        mem: &mut Memory,
        sink: &mut Report,
    ) -> Result<(), RuntimeError> {
        // What the step left (read before an evaluation overwrites the loss).
        let read = |mem: &Memory, time: Duration| -> Result<RankStep, RuntimeError> {
            Ok(RankStep {
                loss: env.read_loss(mem)?,
                scalars: StepScalars {
                    grad_norm: env.read_grad_norm(mem)?,
                    loss_scale: env.read_loss_scale(mem)?,
                },
                measured: None,
                time,
                eval: None,
            })
        };
        let mut finish = |step: u64, mut out: RankStep, mem: &Memory| {
            out.measured = self.tag.map(|t| account::peak(t).max(0) as u64);
            sink(step, out)?;
            if let Some(f) = &self.opts.fault {
                f.inject(self.world, self.rank, step)?;
            }
            self.maybe_save(step + 1, mem)
        };
        let steps = first_step(self.resume)..self.opts.steps;
        match self.opts.mode {
            ExecMode::Arena => {
                let mem = &*mem;
                env.run_arena(mem, steps, self.tag, &mut |step, time, run| {
                    let mut out = read(mem, time)?;
                    out.eval = self.evaluate(step, &mut |j| {
                        run(j)?;
                        env.read_loss_scalar(mem)
                    })?;
                    finish(step, out, mem)
                })
            }
            ExecMode::DebugAlloc => {
                let _tag = self.tag.map(RankTag::enter);
                for step in steps {
                    let began = Instant::now();
                    env.pass_debug(mem, Pass::Step(step))?;
                    let mut out = read(mem, began.elapsed())?;
                    out.eval = self.evaluate(step, &mut |j| {
                        env.pass_debug(mem, Pass::Eval(j))?;
                        env.read_loss_scalar(mem)
                    })?;
                    finish(step, out, mem)?;
                }
                Ok(())
            }
        }
    }

    /// After `step`, this rank's evaluation if one is due (`evaluate`).
    fn evaluate(
        &self,
        step: u64,
        batch: &mut dyn FnMut(u64) -> Result<f32, RuntimeError>,
    ) -> Result<Option<RankEval>, RuntimeError> {
        match (&self.opts.eval, self.eval) {
            (Some(opts), Some((_, batches))) => {
                evaluate(opts, step, self.opts.steps, batches, batch)
            }
            _ => Ok(None),
        }
    }

    /// The ShardParams buffer of each unit.
    fn shard_buffers(&self) -> Vec<Option<&fsdpc_plan::Buffer>> {
        let plan = self.prep.plan;
        plan.units
            .iter()
            .map(|u| {
                plan.buffers
                    .iter()
                    .find(|b| b.kind == BufferKind::ShardParams && b.unit == Some(u.id))
            })
            .collect()
    }

    /// Each unit's shard buffer and optimizer state buffers (in slot order,
    /// as its optimizer instruction lists them).
    fn unit_buffers(&self) -> Vec<(Option<BufferId>, Vec<BufferId>)> {
        self.shard_buffers()
            .into_iter()
            .map(|b| {
                let b = b.map(|b| b.id);
                let state = self.prep.steps.iter().find_map(|s| match s {
                    Step::Optimizer { params, state, .. } if Some(*params) == b => {
                        Some(state.to_vec())
                    }
                    _ => None,
                });
                (b, state.unwrap_or_default())
            })
            .collect()
    }

    /// After `done` completed steps: when a checkpoint is due and this rank
    /// holds a shard position of the first group, writes its file; thread
    /// ranks hand the entry to the collector (which writes the manifest),
    /// process ranks complete the checkpoint together (`commit_ranks`).
    fn maybe_save(&self, done: u64, mem: &Memory) -> Result<(), RuntimeError> {
        let Some(cfg) = &self.opts.checkpoint else {
            return Ok(());
        };
        let f = self.prep.plan.config.shard_factor as usize;
        if cfg.every == 0 || !done.is_multiple_of(cfg.every) {
            return Ok(());
        }
        let first_group = self.prep.plan.geometry().data_rank(self.rank) < f;
        let file = first_group.then(|| self.save(&cfg.dir, done, mem));
        match self.saver {
            Saver::Thread(tx) => {
                if let Some(file) = file {
                    let _ = tx.send(Msg::Saved { step: done, file });
                }
                Ok(())
            }
            Saver::Process(comm) => self.commit_ranks(comm, &cfg.dir, done, file),
        }
    }

    /// Process ranks: gathers every rank's file entry (`ENTRY_BYTES` each)
    /// over `comm`; rank 0 writes the manifest and `latest`
    /// (`write::commit`) and broadcasts whether it did, so no rank goes on
    /// (to the next checkpoint, which prunes) before the commit.
    fn commit_ranks(
        &self,
        comm: &dyn crate::comm::Communicator,
        dir: &Path,
        done: u64,
        file: Option<Result<FileEntry, CheckpointError>>,
    ) -> Result<(), RuntimeError> {
        let ce = |e| crate::exec::rank::comm_err(self.rank, e);
        let mut mine = [0u8; ENTRY_BYTES];
        let mut own_error = None;
        match file {
            None => mine[0] = ENTRY_NONE,
            Some(Ok(e)) => match blake3::Hash::from_hex(&e.blake3) {
                Ok(h) => {
                    mine[0] = ENTRY_OK;
                    mine[8..16].copy_from_slice(&e.bytes.to_le_bytes());
                    mine[16..].copy_from_slice(h.as_bytes());
                }
                Err(err) => {
                    mine[0] = ENTRY_FAILED;
                    own_error = Some(RuntimeError::plan(format!("checkpoint hash: {err}")));
                }
            },
            Some(Err(e)) => {
                mine[0] = ENTRY_FAILED;
                own_error = Some(e.into());
            }
        }
        let n = comm.size();
        let mut all = vec![0u8; ENTRY_BYTES * n];
        comm.all_gather(
            crate::comm::Buf {
                dtype: fsdpc_ir::DType::F32,
                bytes: &mine,
            },
            BufMut {
                dtype: fsdpc_ir::DType::F32,
                bytes: &mut all,
            },
        )
        .map_err(ce)?;
        if let Some(e) = own_error {
            return Err(e);
        }
        // The first shard group's ranks, ranks 0 .. F x T: rank r holds
        // shard position r / T at tensor position r % T (file r).
        let t = self.prep.plan.geometry().t();
        let f = self.prep.plan.config.shard_factor as usize * t as usize;
        let mut files = Vec::with_capacity(f);
        for (r, rec) in all.chunks_exact(ENTRY_BYTES).enumerate().take(f) {
            if rec[0] != ENTRY_OK {
                return Err(RuntimeError::RankFailed {
                    rank: r,
                    reason: format!("could not write its file of the checkpoint at step {done}"),
                });
            }
            let mut size = [0u8; 8];
            size.copy_from_slice(&rec[8..16]);
            let mut hash = [0u8; 32];
            hash.copy_from_slice(&rec[16..]);
            files.push(FileEntry {
                name: checkpoint::manifest::rank_file(r),
                position: r as u32 / t,
                tensor: r as u32 % t,
                bytes: u64::from_le_bytes(size),
                blake3: blake3::Hash::from_bytes(hash).to_hex().to_string(),
            });
        }
        let committed = if self.rank == 0 {
            let m = checkpoint::Manifest::new(self.prep.plan, done, self.opts.seed, files);
            Some(checkpoint::write::commit(dir, &m))
        } else {
            None
        };
        let mut ok = [u8::from(committed.as_ref().is_some_and(|r| r.is_ok())); 4];
        comm.broadcast(
            BufMut {
                dtype: fsdpc_ir::DType::F32,
                bytes: &mut ok,
            },
            0,
        )
        .map_err(ce)?;
        match committed {
            Some(r) => Ok(r?),
            None if ok[0] == 1 => Ok(()),
            None => Err(RuntimeError::RankFailed {
                rank: 0,
                reason: format!("could not write the manifest of the checkpoint at step {done}"),
            }),
        }
    }

    /// Writes this rank's checkpoint file.
    fn save(&self, dir: &Path, done: u64, mem: &Memory) -> Result<FileEntry, CheckpointError> {
        let io = |e: RuntimeError| CheckpointError::Io {
            path: dir.display().to_string(),
            reason: e.to_string(),
        };
        let bufs = self.unit_buffers();
        let mut params = Vec::with_capacity(bufs.len());
        let mut states = Vec::with_capacity(bufs.len());
        for (b, state) in &bufs {
            // SAFETY: between steps no stream runs.
            let view = |id: BufferId| unsafe { mem.view(mem.whole(id)) };
            params.push(b.map(view).transpose().map_err(io)?.unwrap_or(&[]));
            states.push(
                state
                    .iter()
                    .map(|&s| view(s))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(io)?,
            );
        }
        let units: Vec<UnitBytes<'_>> = params
            .iter()
            .zip(&states)
            .map(|(p, s)| UnitBytes {
                params: p,
                state: s,
            })
            .collect();
        let g = self.prep.plan.geometry();
        let at = (
            g.shard_position(self.rank) as u32,
            g.tensor_position(self.rank) as u32,
            g.t(),
        );
        // Rank 0's module buffers go into file 0 (PyTorch saves rank 0's).
        let mut buffers = Vec::new();
        if self.rank == 0 {
            for (b, name) in self.module_buffer_list() {
                // SAFETY: between steps no stream runs.
                let bytes = unsafe { mem.view(mem.whole(b)) }.map_err(io)?;
                buffers.push((name, bytes));
            }
        }
        checkpoint::write::save_rank(dir, done, at, &units, &buffers)
    }

    /// Each `ModuleBuffer` buffer of the plan and its module buffer's name.
    fn module_buffer_list(&self) -> Vec<(BufferId, &str)> {
        let plan = self.prep.plan;
        plan.buffers
            .iter()
            .filter(|b| b.kind == BufferKind::ModuleBuffer)
            .filter_map(|b| {
                let spec = plan
                    .training
                    .graph
                    .buffers
                    .get(b.module_buffer?.0 as usize)?;
                Some((b.id, spec.name.as_str()))
            })
            .collect()
    }

    /// Sets every module buffer: from the checkpoint resumed from (rank
    /// 0's saved values, on every rank, as loading PyTorch's full state
    /// dict does), or its initial values.
    fn init_module_buffers(&self, mem: &Memory) -> Result<(), RuntimeError> {
        let plan = self.prep.plan;
        for (b, name) in self.module_buffer_list() {
            let values = match self.resume {
                Some(c) => c.buffer_values(name)?,
                None => {
                    let spec = plan
                        .training
                        .graph
                        .buffers
                        .iter()
                        .find(|s| s.name == name)
                        .ok_or_else(|| RuntimeError::plan(format!("no module buffer `{name}`")))?;
                    spec.initial_values(self.opts.seed)
                        .map_err(|e| RuntimeError::plan(format!("module buffer `{name}`: {e}")))?
                }
            };
            // SAFETY: before the first step no stream runs.
            let bytes = unsafe { mem.view_mut(mem.whole(b))? };
            if bytes.len() != values.len() * 4 {
                return Err(RuntimeError::plan(format!(
                    "module buffer `{name}`: {} bytes planned for {} values",
                    bytes.len(),
                    values.len()
                )));
            }
            for (dst, v) in bytes.chunks_exact_mut(4).zip(values) {
                dst.copy_from_slice(&v.to_le_bytes());
            }
        }
        Ok(())
    }

    /// This rank's module buffers by name (f32 values).
    fn module_buffers(&self, mem: &Memory) -> Result<Vec<(String, Vec<f32>)>, RuntimeError> {
        let mut out = Vec::new();
        for (b, name) in self.module_buffer_list() {
            // SAFETY: after the last step no stream runs.
            let vals = unsafe { mem.view(mem.whole(b))? }
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            out.push((name.to_string(), vals));
        }
        Ok(out)
    }

    /// Fills the shards and optimizer state from a checkpoint.
    fn load(&self, c: &Checkpoint, mem: &Memory) -> Result<(), RuntimeError> {
        let mut units = Vec::new();
        for (b, state) in self.unit_buffers() {
            // SAFETY: before the first step no stream runs; the buffers are
            // distinct persistent buffers.
            let view = |id: BufferId| unsafe { mem.view_mut(mem.whole(id)) };
            let p = b.map(view).transpose()?.unwrap_or(&mut []);
            let s = state.into_iter().map(view).collect::<Result<Vec<_>, _>>()?;
            units.push((p, s));
        }
        c.load_rank(self.prep.plan, self.rank, &mut units)?;
        Ok(())
    }

    fn init_shards(&self, mem: &Memory) -> Result<(), RuntimeError> {
        let plan = self.prep.plan;
        let g = plan.geometry();
        let at = (
            g.shard_position(self.rank) as u64,
            g.tensor_position(self.rank) as u32,
        );
        for (u, b) in self.shard_buffers().into_iter().enumerate() {
            let Some(b) = b else { continue };
            // SAFETY: before the first step no stream runs.
            let bytes = unsafe { mem.view_mut(mem.whole(b.id))? };
            let out: &mut [f32] = bytemuck::try_cast_slice_mut(bytes).map_err(|_| {
                RuntimeError::plan(format!("shard buffer {} is not f32-aligned", b.id))
            })?;
            crate::init::fill_shard(
                &plan.units[u],
                &plan.training.graph.params,
                at,
                self.opts.seed,
                out,
            )?;
        }
        Ok(())
    }

    fn shards(&self, mem: &Memory) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let mut out = Vec::new();
        for b in self.shard_buffers() {
            let vals = match b {
                // SAFETY: after the last step no stream runs.
                Some(b) => unsafe { mem.view(mem.whole(b.id))? }
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                None => Vec::new(),
            };
            out.push(vals);
        }
        Ok(out)
    }
}
