//! The semantics of every instruction on one rank (`exec`): a dispatch
//! over the resolved steps, with kernels and optimizer steps here and the
//! collectives in `collectives`.

use super::*;

impl<'a> RankEnv<'a> {
    /// Runs one instruction (all but `Free`, which only debug mode acts on).
    pub(in crate::exec) fn exec(
        &self,
        mem: &Memory,
        i: usize,
        pass: Pass,
    ) -> Result<(), RuntimeError> {
        let step = pass.index();
        let stream = self.prep.plan.instructions[i].stream;
        let ce = |e: CommError| comm_err(self.rank, e);
        // SAFETY (all `view`/`view_mut` below): regions come from `resolve`;
        // the plan orders conflicting accesses (see `Memory::view`).
        unsafe {
            match &self.prep.steps[i] {
                Step::AllGather {
                    src,
                    dst,
                    parts,
                    group,
                    hier: None,
                    with,
                } => self.all_gather(mem, stream, with, (*src, *dst, parts), *group),
                Step::Bucketed => Ok(()),
                Step::AllGather {
                    src,
                    dst,
                    parts,
                    hier: Some(staging),
                    ..
                } => self.hier_all_gather(mem, stream, *src, *dst, parts, *staging),
                Step::WireGather {
                    src,
                    dst,
                    scratch,
                    parts,
                    wire,
                } => {
                    let g = crate::exec::quantized::WireGather {
                        src: *src,
                        dst: *dst,
                        scratch: *scratch,
                        parts,
                        wire: *wire,
                    };
                    self.wire_gather(mem, stream, &g)
                }
                Step::WireReduceScatter {
                    unit,
                    src,
                    dst,
                    scratch,
                    block,
                } => {
                    let r = crate::exec::quantized::WireReduce {
                        unit: *unit,
                        src: *src,
                        dst: *dst,
                        scratch: *scratch,
                        block: *block,
                    };
                    self.wire_reduce_scatter(mem, i, stream, &r)
                }
                Step::Reshard { src, dst, group } => {
                    self.reshard(mem, i, stream, (*src, *dst), *group)
                }
                Step::ReduceScatter {
                    unit,
                    src,
                    dst,
                    hier,
                } => self.reduce_scatter(mem, i, stream, (unit.index(), *src, *dst), *hier),
                Step::AllReduce {
                    unit,
                    buffer,
                    group,
                    divide_by,
                    staging,
                } => self.all_reduce(
                    mem,
                    stream,
                    (unit.index(), *buffer),
                    *group,
                    *divide_by,
                    *staging,
                ),
                Step::LoadInput {
                    name,
                    ty,
                    dst,
                    micro,
                } => {
                    let out = TensorMut {
                        ty,
                        bytes: mem.view_mut(*dst)?,
                    };
                    let first_sample = self.first_sample(*micro);
                    let data = match pass {
                        Pass::Step(_) => self.data,
                        Pass::Eval(_) => self.eval_data.ok_or_else(|| {
                            RuntimeError::plan("an evaluation pass without evaluation data")
                        })?,
                    };
                    data.fill(name, Batch { step, first_sample }, out)
                }
                Step::Kernel { .. } => self.kernel(mem, i, pass),
                Step::TensorAllReduce {
                    src,
                    dst,
                    dtype,
                    group,
                } => {
                    let out = mem.view_mut(*dst)?;
                    out.copy_from_slice(mem.view(*src)?);
                    self.comm(stream, *group)?
                        .all_reduce(
                            BufMut {
                                dtype: *dtype,
                                bytes: out,
                            },
                            1,
                        )
                        .map_err(ce)
                }
                Step::TensorChunks {
                    kind,
                    src,
                    dst,
                    dtype,
                    group,
                } => {
                    let comm = self.comm(stream, *group)?;
                    let send = Buf {
                        dtype: *dtype,
                        bytes: mem.view(*src)?,
                    };
                    let recv = BufMut {
                        dtype: *dtype,
                        bytes: mem.view_mut(*dst)?,
                    };
                    match kind {
                        fsdpc_plan::ChunkKind::Gather => comm.all_gather(send, recv).map_err(ce),
                        fsdpc_plan::ChunkKind::ReduceScatter => {
                            comm.reduce_scatter(send, recv, 1).map_err(ce)
                        }
                        fsdpc_plan::ChunkKind::Split => {
                            let n = recv.bytes.len();
                            let at = comm.position() * n;
                            let chunk = send.bytes.get(at..at + n).ok_or_else(|| {
                                RuntimeError::plan_at(i, "a chunk outside the whole tensor")
                            })?;
                            recv.bytes.copy_from_slice(chunk);
                            Ok(())
                        }
                    }
                }
                Step::WriteBuffer { .. } if matches!(pass, Pass::Eval(_)) => Ok(()),
                Step::WriteBuffer { src, dst } => {
                    let from = mem.view(*src)?.to_vec();
                    mem.view_mut(*dst)?.copy_from_slice(&from);
                    Ok(())
                }
                Step::Copy { src, dst } => {
                    let (from, into) = self.send_recv(mem, *src, *dst)?;
                    into.bytes.copy_from_slice(from.bytes);
                    Ok(())
                }
                Step::Accumulate { src, dst } => {
                    let (from, into) = self.send_recv(mem, *src, *dst)?;
                    crate::optim::accumulate(from.dtype, from.bytes, into.bytes)
                        .map_err(|reason| RuntimeError::plan_at(i, reason))
                }
                Step::Optimizer {
                    skip_if: Some(flag),
                    ..
                } if self.f32s(mem, *flag)?[0] != 0.0 => Ok(()),
                Step::Optimizer {
                    unit,
                    params,
                    grads,
                    state,
                    ..
                } => self.optimizer(mem, step, *unit, *params, *grads, state),
                Step::Scaler(s) => self.scaler(mem, stream, s),
                Step::GradNormSq {
                    grads,
                    dst,
                    split_only_off_first,
                } => {
                    let geo = self.geometry();
                    let first = geo.tensor_position(self.rank) == 0;
                    let pos = geo.shard_position(self.rank);
                    let mut sum = 0f64;
                    for g in grads.iter() {
                        if *split_only_off_first && !first {
                            let runs =
                                crate::exec::resolve::split_elements(self.prep.plan, *g, pos);
                            self.with_f32(mem, *g, |_, xs| {
                                for &(a, n) in &runs {
                                    sum += crate::optim::sum_squares(&xs[a..a + n]);
                                }
                            })?;
                        } else {
                            self.with_f32(mem, *g, |_, xs| sum += crate::optim::sum_squares(xs))?;
                        }
                    }
                    self.f32s(mem, *dst)?[0] = sum as f32;
                    Ok(())
                }
                Step::NormAllReduce { buffer, group } => {
                    let buf = BufMut {
                        dtype: DType::F32,
                        bytes: mem.view_mut(mem.whole(*buffer))?,
                    };
                    self.comm(stream, *group)?.all_reduce(buf, 1).map_err(ce)
                }
                Step::ClipGrads {
                    norm,
                    grads,
                    max_norm,
                } => {
                    let sq = self.f32s(mem, *norm)?[0];
                    self.with_f32(mem, *grads, |_, xs| {
                        crate::optim::clip_by_norm(xs, sq, *max_norm)
                    })
                }
                Step::Free(_) => Ok(()),
                Step::Record(e) => {
                    self.events.record(*e);
                    Ok(())
                }
                Step::Wait(e) => self.events.wait(*e, self.rank, self.world),
            }
        }
    }

    pub(in crate::exec) unsafe fn kernel(
        &self,
        mem: &Memory,
        i: usize,
        pass: Pass,
    ) -> Result<(), RuntimeError> {
        let Step::Kernel {
            id,
            node,
            ins,
            outs,
            ws,
            micro,
        } = &self.prep.steps[i]
        else {
            return Ok(());
        };
        // Operand views on the stack (heap only past `VIEWS` operands).
        let mut xs: SmallVec<[TensorRef; VIEWS]> = SmallVec::new();
        for (r, ty) in ins {
            xs.push(TensorRef {
                ty,
                bytes: mem.view(*r)?,
            });
        }
        let mut ys: SmallVec<[TensorMut; VIEWS]> = SmallVec::new();
        for (r, ty) in outs {
            ys.push(TensorMut {
                ty,
                bytes: mem.view_mut(*r)?,
            });
        }
        // The stream's workspace buffer is used by this stream's kernels
        // only, one at a time.
        let mut ws = match ws {
            Some(r) => Workspace::new(mem.view_mut(*r)?),
            None => Workspace::empty(),
        };
        let ctx = KernelCtx {
            step: pass.index(),
            sample_offset: self.first_sample(*micro),
            seed: self.seed,
            eval: matches!(pass, Pass::Eval(_)),
        };
        self.backend
            .run(node, &xs, &mut ys, &ctx, &mut ws)
            .map_err(|e| RuntimeError::Kernel {
                node: format!("{id} ({})", node.name),
                op: node.op.name(),
                reason: e.0,
            })
    }

    /// The optimizer step of unit `unit`'s shard: the parameters weight
    /// decay does not apply to (`Unit::undecayed`) are stepped without it.
    /// The update is element by element, so stepping the shard in pieces
    /// equals one call.
    pub(in crate::exec) unsafe fn optimizer(
        &self,
        mem: &Memory,
        step: u64,
        unit: usize,
        params: BufferId,
        grads: BufferId,
        state: &[BufferId],
    ) -> Result<(), RuntimeError> {
        let f32s = |b: BufferId| -> Result<&mut [f32], RuntimeError> {
            if self.dtype(b) != DType::F32 {
                return Err(RuntimeError::plan(format!(
                    "optimizer buffer {b} must be f32, it is {}",
                    self.dtype(b)
                )));
            }
            bytemuck::try_cast_slice_mut(mem.view_mut(mem.whole(b))?)
                .map_err(|_| RuntimeError::plan(format!("buffer {b} is not 4-byte aligned")))
        };
        let mut st = Vec::with_capacity(state.len());
        for b in state {
            st.push(f32s(*b)?);
        }
        let pieces = self.decay_pieces(step, unit);
        if self.dtype(grads) != DType::F32 {
            return self.optimizer_half(mem, &pieces, f32s(params)?, grads, st);
        }
        // The gradient covers the trainable part of the shard, its first
        // elements (`Unit::trainable_shard_numel`; sizes checked by `resolve`).
        let g = f32s(grads)?;
        let p = f32s(params)?;
        let n = g.len().min(p.len());
        let mut result = Ok(());
        for_pieces(&pieces, 0, n, |lo, hi, optimizer| {
            if result.is_ok() {
                result = self.backend.optimizer_step(OptimizerArgs {
                    optimizer,
                    step,
                    params: &mut p[lo..hi],
                    grads: &g[lo..hi],
                    state: st.iter_mut().map(|s| &mut s[lo..hi]).collect(),
                });
            }
        });
        result.map_err(|e| RuntimeError::Kernel {
            node: format!("optimizer step of buffer {params}"),
            op: "optimizer".into(),
            reason: e.0,
        })
    }

    /// The optimizer of `step` (its scheduled rate) and the same without
    /// weight decay, with the shard's elements each applies to.
    fn decay_pieces(&self, step: u64, unit: usize) -> DecayPieces {
        let plan = self.prep.plan;
        let optimizer = plan.optimizer_at(step);
        let pos = plan.geometry().shard_position(self.rank) as u64;
        let undecayed = match plan.units.get(unit) {
            Some(u) if optimizer.weight_decay() != 0.0 => u.undecayed(pos),
            _ => Vec::new(),
        };
        DecayPieces {
            step,
            plain: optimizer.without_decay(),
            optimizer,
            undecayed: undecayed
                .into_iter()
                .map(|r| r.start as usize..r.end as usize)
                .collect(),
        }
    }

    /// The optimizer step on a half-precision gradient (no_shard mixed
    /// precision updates its f32 parameters from the all-reduced bf16/f16
    /// flat gradient): the gradient is widened chunk by chunk and each chunk
    /// updates the same elements of the parameters and state. The update is
    /// element by element, so this equals one call on the widened gradient.
    pub(in crate::exec) unsafe fn optimizer_half(
        &self,
        mem: &Memory,
        pieces: &DecayPieces,
        params: &mut [f32],
        grads: BufferId,
        mut state: Vec<&mut [f32]>,
    ) -> Result<(), RuntimeError> {
        let mut result = Ok(());
        let n = params.len();
        self.with_f32(mem, grads, |off, g| {
            let end = (off + g.len()).min(n);
            if off >= end {
                return;
            }
            for_pieces(pieces, off, end, |lo, hi, optimizer| {
                if result.is_ok() {
                    result = self.backend.optimizer_step(OptimizerArgs {
                        optimizer,
                        step: pieces.step,
                        params: &mut params[lo..hi],
                        grads: &g[lo - off..hi - off],
                        state: state.iter_mut().map(|s| &mut s[lo..hi]).collect(),
                    });
                }
            });
        })?;
        result.map_err(|e| RuntimeError::Kernel {
            node: format!("optimizer step of gradient buffer {grads}"),
            op: "optimizer".into(),
            reason: e.0,
        })
    }
}

/// A shard's optimizer step in pieces: `optimizer` everywhere but on the
/// `undecayed` element ranges (sorted, disjoint), where `plain` (no
/// weight decay) applies.
pub(in crate::exec) struct DecayPieces {
    step: u64,
    optimizer: fsdpc_ir::Optimizer,
    plain: fsdpc_ir::Optimizer,
    undecayed: Vec<std::ops::Range<usize>>,
}

/// Calls `f(lo, hi, optimizer)` for the consecutive pieces of `from..to`,
/// each with the optimizer its elements take.
fn for_pieces(
    pieces: &DecayPieces,
    from: usize,
    to: usize,
    mut f: impl FnMut(usize, usize, &fsdpc_ir::Optimizer),
) {
    let mut at = from;
    for r in &pieces.undecayed {
        let (lo, hi) = (r.start.max(at), r.end.min(to));
        if lo >= hi {
            continue;
        }
        if at < lo {
            f(at, lo, &pieces.optimizer);
        }
        f(lo, hi, &pieces.plain);
        at = hi;
    }
    if at < to {
        f(at, to, &pieces.optimizer);
    }
}
