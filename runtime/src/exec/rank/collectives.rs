//! A rank's collectives: sending and receiving whole buffers, all-gathers
//! of a unit's segments (and the bucketed gathers with them), the two
//! levels of hierarchical all-gathers and reduce-scatters, reshards,
//! reduce-scatters and all-reduces, and the rounding and zeroing around
//! reductions.

use super::*;

impl<'a> RankEnv<'a> {
    /// The whole of `src` to send and the whole of `dst` to receive into, for
    /// a collective.
    ///
    /// # Safety
    /// As for `Memory::view_mut`; `resolve` rejects collectives whose `src`
    /// and `dst` are the same buffer.
    pub(in crate::exec) unsafe fn send_recv<'m>(
        &self,
        mem: &'m Memory,
        src: BufferId,
        dst: BufferId,
    ) -> Result<(Buf<'m>, BufMut<'m>), RuntimeError> {
        let send = Buf {
            dtype: self.dtype(src),
            bytes: mem.view(mem.whole(src))?,
        };
        let recv = BufMut {
            dtype: self.dtype(dst),
            bytes: mem.view_mut(mem.whole(dst))?,
        };
        Ok((send, recv))
    }

    /// Gathers each segment of a unit's flat parameter into its place (see
    /// `Step::AllGather`), and those of the bucketed gathers `with` before
    /// it: one grouped call (`Communicator::all_gather_group`) of a gather
    /// per segment, in bucket and segment order on every rank.
    ///
    /// # Safety
    /// As for `Memory::view_mut`; `resolve` checked the parts' bounds, and
    /// the members' buffers are distinct live buffers.
    pub(in crate::exec) unsafe fn all_gather(
        &self,
        mem: &Memory,
        stream: Stream,
        with: &[crate::exec::resolve::Bucketed],
        own: (BufferId, BufferId, &[(usize, usize, usize)]),
        group: Group,
    ) -> Result<(), RuntimeError> {
        let comm = self.comm(stream, group)?;
        let f = comm.size();
        let members = with
            .iter()
            .map(|(s, d, p)| (*s, *d, p.as_slice()))
            .chain(std::iter::once(own));
        let mut calls = crate::comm::GatherCalls::new();
        for (src, dst, parts) in members {
            let (send, recv) = self.send_recv(mem, src, dst)?;
            let (se, re) = (send.dtype.size(), recv.dtype.size());
            let mut rest = recv.bytes;
            let mut taken = 0;
            for &(shard_at, flat_at, n) in parts {
                let part = Buf {
                    dtype: send.dtype,
                    bytes: &send.bytes[shard_at * se..(shard_at + n) * se],
                };
                // Parts are in flat order and disjoint: split them off.
                let tail = std::mem::take(&mut rest);
                let (_, from) = tail.split_at_mut(flat_at * re - taken);
                let (into, after) = from.split_at_mut(n * f * re);
                taken = (flat_at + n * f) * re;
                rest = after;
                calls.push((
                    part,
                    BufMut {
                        dtype: recv.dtype,
                        bytes: into,
                    },
                ));
            }
        }
        comm.all_gather_group(calls)
            .map_err(|e| comm_err(self.rank, e))
    }

    /// The cross-node and node-local communicators of `stream` (the two
    /// levels of a hierarchical collective).
    pub(in crate::exec) fn levels(
        &self,
        stream: Stream,
    ) -> Result<(&dyn Communicator, &dyn Communicator), RuntimeError> {
        Ok((
            self.comm(stream, Group::CrossNode)?,
            self.comm(stream, Group::NodeLocal)?,
        ))
    }

    /// A hierarchical all-gather (`CollectiveAlgorithm::Hierarchical`), per
    /// part of n elements: across nodes first, the m shards at this rank's
    /// place on each node into `staging` (m n elements, the gathered
    /// dtype), then inside the node once per node b, block b of every
    /// member into the gathered flat elements `flat + b k n ..`: shard
    /// positions b k .. b k + k, in order.
    ///
    /// # Safety
    /// As for `all_gather`; `resolve` sized `staging`.
    pub(in crate::exec) unsafe fn hier_all_gather(
        &self,
        mem: &Memory,
        stream: Stream,
        src: BufferId,
        dst: BufferId,
        parts: &[(usize, usize, usize)],
        staging: BufferId,
    ) -> Result<(), RuntimeError> {
        let ce = |e: CommError| comm_err(self.rank, e);
        let (send, recv) = self.send_recv(mem, src, dst)?;
        let st = mem.view_mut(mem.whole(staging))?;
        let (inter, intra) = self.levels(stream)?;
        let (m, k) = (inter.size(), intra.size());
        let (se, re) = (send.dtype.size(), recv.dtype.size());
        for &(shard_at, flat_at, n) in parts {
            let part = Buf {
                dtype: send.dtype,
                bytes: &send.bytes[shard_at * se..(shard_at + n) * se],
            };
            let gathered = BufMut {
                dtype: recv.dtype,
                bytes: &mut st[..m * n * re],
            };
            inter.all_gather(part, gathered).map_err(ce)?;
            for b in 0..m {
                let piece = Buf {
                    dtype: recv.dtype,
                    bytes: &st[b * n * re..(b + 1) * n * re],
                };
                let at = flat_at + b * k * n;
                let into = BufMut {
                    dtype: recv.dtype,
                    bytes: &mut recv.bytes[at * re..(at + k * n) * re],
                };
                intra.all_gather(piece, into).map_err(ce)?;
            }
        }
        Ok(())
    }

    /// A hierarchical reduce-scatter: inside the node first, once per node
    /// b, block b of the flat gradient (k chunks) summed over the node
    /// into chunk b of `staging` (f32, not divided), then across nodes,
    /// `staging`'s m chunks summed and divided into this rank's shard
    /// (chunk b k + j for this rank at place j of node b).
    ///
    /// # Safety
    /// As for `all_gather`; `resolve` sized `staging`.
    pub(in crate::exec) unsafe fn hier_reduce_scatter(
        &self,
        mem: &Memory,
        i: usize,
        stream: Stream,
        src: BufferId,
        dst: BufferId,
        staging: BufferId,
    ) -> Result<(), RuntimeError> {
        let ce = |e: CommError| comm_err(self.rank, e);
        let (send, recv) = self.send_recv(mem, src, dst)?;
        let st = mem.view_mut(mem.whole(staging))?;
        let (inter, intra) = self.levels(stream)?;
        let (m, k) = (inter.size(), intra.size());
        let c = recv.len();
        let (se, fe) = (send.dtype.size(), DType::F32.size());
        if send.len() != c * m * k || st.len() < c * m * fe {
            return Err(RuntimeError::plan_at(
                i,
                format!(
                    "hierarchical reduce-scatter of {} elements into {m} x {k} shards of {c}",
                    send.len()
                ),
            ));
        }
        for b in 0..m {
            let block = Buf {
                dtype: send.dtype,
                bytes: &send.bytes[b * k * c * se..(b + 1) * k * c * se],
            };
            let into = BufMut {
                dtype: DType::F32,
                bytes: &mut st[b * c * fe..(b + 1) * c * fe],
            };
            intra.reduce_scatter(block, into, 1).map_err(ce)?;
        }
        let sums = Buf {
            dtype: DType::F32,
            bytes: &st[..c * m * fe],
        };
        inter
            .reduce_scatter(sums, recv, self.grad_divisor())
            .map_err(ce)
    }

    /// After a reduce-scatter into a wider buffer (f32 gradient shard), rounds
    /// the result to the instruction's reduction dtype: the value a reduction
    /// in that dtype delivers (the sum itself runs in f32, in rank order,
    /// and is rounded once; see `comm`).
    pub(in crate::exec) unsafe fn round_reduced(
        &self,
        mem: &Memory,
        i: usize,
        dst: BufferId,
    ) -> Result<(), RuntimeError> {
        let InstrOp::ReduceScatter {
            c: Collective { dtype, .. },
        } = self.prep.plan.instructions[i].op
        else {
            return Ok(());
        };
        if dtype == self.dtype(dst) {
            return Ok(());
        }
        self.with_f32(mem, dst, |_, xs| widen::round_to(xs, dtype))
    }

    /// Zeroes the regions of a flat gradient no trainable parameter covers.
    pub(in crate::exec) unsafe fn zero_uncovered(
        &self,
        mem: &Memory,
        unit: usize,
        b: BufferId,
    ) -> Result<(), RuntimeError> {
        let es = self.dtype(b).size();
        let bytes = mem.view_mut(mem.whole(b))?;
        for &(s, e) in &self.prep.uncovered[unit] {
            let (s, e) = ((s * es).min(bytes.len()), (e * es).min(bytes.len()));
            bytes[s..e].fill(0);
        }
        Ok(())
    }
    /// Keeps this rank's slice of `src` in `dst`: its position in `group`
    /// (`Step::Reshard`).
    ///
    /// # Safety
    /// As for `Memory::view_mut`.
    pub(in crate::exec) unsafe fn reshard(
        &self,
        mem: &Memory,
        i: usize,
        stream: Stream,
        (src, dst): (BufferId, BufferId),
        group: Group,
    ) -> Result<(), RuntimeError> {
        // This rank's slice: its position in the group.
        let pos = self.comm(stream, group)?.position();
        let (whole, slice) = self.send_recv(mem, src, dst)?;
        let len = slice.bytes.len();
        let from = whole.bytes.get(pos * len..(pos + 1) * len).ok_or_else(|| {
            RuntimeError::plan_at(i, format!("reshard slice {pos} lies outside buffer {src}"))
        })?;
        slice.bytes.copy_from_slice(from);
        Ok(())
    }

    /// Reduce-scatters unit `unit`'s flat gradient `src` into its shard
    /// `dst` over the shard group, as one ring or in two levels through
    /// `hier`'s staging, and rounds it to the instruction's dtype.
    ///
    /// # Safety
    /// As for `Memory::view_mut`.
    pub(in crate::exec) unsafe fn reduce_scatter(
        &self,
        mem: &Memory,
        i: usize,
        stream: Stream,
        (unit, src, dst): (usize, BufferId, BufferId),
        hier: Option<BufferId>,
    ) -> Result<(), RuntimeError> {
        // Every plan reduce-scatters over the shard group (the verifier
        // checks the plan's `group`).
        self.zero_uncovered(mem, unit, src)?;
        match hier {
            None => {
                let (send, recv) = self.send_recv(mem, src, dst)?;
                self.comm(stream, Group::Shard)?
                    .reduce_scatter(send, recv, self.grad_divisor())
                    .map_err(|e| comm_err(self.rank, e))?;
            }
            Some(staging) => self.hier_reduce_scatter(mem, i, stream, src, dst, staging)?,
        }
        self.round_reduced(mem, i, dst)
    }

    /// All-reduces `buffer` (unit `unit`'s) over `group`, dividing by
    /// `divide_by`: as one ring, or as a reduce-scatter into `staging` then
    /// an all-gather from it.
    ///
    /// # Safety
    /// As for `Memory::view_mut`.
    pub(in crate::exec) unsafe fn all_reduce(
        &self,
        mem: &Memory,
        stream: Stream,
        (unit, buffer): (usize, BufferId),
        group: Group,
        divide_by: u32,
        staging: Option<BufferId>,
    ) -> Result<(), RuntimeError> {
        let ce = |e: CommError| comm_err(self.rank, e);
        if kind(self.prep.plan, buffer) == Some(BufferKind::FlatGrads) {
            self.zero_uncovered(mem, unit, buffer)?;
        }
        let dtype = self.dtype(buffer);
        let bytes = mem.view_mut(mem.whole(buffer))?;
        let comm = self.comm(stream, group)?;
        match staging {
            None => comm.all_reduce(BufMut { dtype, bytes }, divide_by),
            // This member's slice reduced into the staging
            // buffer, then gathered back: the all-reduce's
            // values (one rounding, the same order).
            Some(st) => {
                let len = bytes.len() / comm.size().max(1);
                let slice = &mut mem.view_mut(mem.whole(st))?[..len];
                comm.reduce_scatter(
                    Buf {
                        dtype,
                        bytes: &*bytes,
                    },
                    BufMut {
                        dtype,
                        bytes: &mut *slice,
                    },
                    divide_by,
                )
                .and_then(|()| {
                    comm.all_gather(
                        Buf {
                            dtype,
                            bytes: slice,
                        },
                        BufMut { dtype, bytes },
                    )
                })
            }
        }
        .map_err(ce)
    }
}
