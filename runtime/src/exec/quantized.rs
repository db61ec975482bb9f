//! The quantized collectives of a plan (`fsdpc_plan::wire`): the fp8
//! and int8 all-gathers and the int8 reduce-scatter of `comm::codec`, run on
//! the shard group's communicator with the instruction's buffers from the
//! arena, the payloads in its `Wire` scratch buffer (nothing allocated).

use super::memory::Memory;
use super::rank::{comm_err, RankEnv};
use crate::comm::{codec, Buf, BufMut};
use crate::error::RuntimeError;
use fsdpc_plan::{BufferId, Group, Stream, UnitId, Wire};

/// What a quantized all-gather works on.
pub(super) struct WireGather<'s> {
    pub src: BufferId,
    pub dst: BufferId,
    pub scratch: BufferId,
    /// `(shard element, flat element, elements per member)` per segment.
    pub parts: &'s [(usize, usize, usize)],
    pub wire: Wire,
}

/// What a quantized reduce-scatter works on.
pub(super) struct WireReduce {
    pub unit: UnitId,
    pub src: BufferId,
    pub dst: BufferId,
    pub scratch: BufferId,
    pub block: usize,
}

impl RankEnv<'_> {
    /// Buffer `b` whole, read-only.
    ///
    /// # Safety
    /// As for `Memory::view`.
    unsafe fn whole<'m>(&self, mem: &'m Memory, b: BufferId) -> Result<Buf<'m>, RuntimeError> {
        Ok(Buf {
            dtype: self.prep.plan.buffers[b.index()].dtype,
            bytes: mem.view(mem.whole(b))?,
        })
    }

    /// Buffer `b` whole, writable.
    ///
    /// # Safety
    /// As for `Memory::view_mut`.
    unsafe fn whole_mut<'m>(
        &self,
        mem: &'m Memory,
        b: BufferId,
    ) -> Result<BufMut<'m>, RuntimeError> {
        Ok(BufMut {
            dtype: self.prep.plan.buffers[b.index()].dtype,
            bytes: mem.view_mut(mem.whole(b))?,
        })
    }

    /// A quantized all-gather (see `plan::Wire`).
    ///
    /// # Safety
    /// As for `Memory::view_mut`; `resolve` checked that the scratch is a
    /// buffer of its own.
    pub(super) unsafe fn wire_gather(
        &self,
        mem: &Memory,
        stream: Stream,
        g: &WireGather<'_>,
    ) -> Result<(), RuntimeError> {
        let comm = self.comm(stream, Group::Shard)?;
        let scratch = mem.view_mut(mem.whole(g.scratch))?;
        let (shard, out) = (self.whole(mem, g.src)?, self.whole_mut(mem, g.dst)?);
        codec::all_gather(comm, g.wire, shard, g.parts, out, scratch)
            .map_err(|e| comm_err(self.rank, e))
    }

    /// A quantized reduce-scatter of instruction `i` (see `plan::Wire`),
    /// then rounded to the instruction's dtype as a native one is.
    ///
    /// # Safety
    /// As for `Memory::view_mut`; `resolve` checked that the scratch is a
    /// buffer of its own.
    pub(super) unsafe fn wire_reduce_scatter(
        &self,
        mem: &Memory,
        i: usize,
        stream: Stream,
        r: &WireReduce,
    ) -> Result<(), RuntimeError> {
        self.zero_uncovered(mem, r.unit.index(), r.src)?;
        let comm = self.comm(stream, Group::Shard)?;
        let scratch = mem.view_mut(mem.whole(r.scratch))?;
        let (grads, out) = (self.whole(mem, r.src)?, self.whole_mut(mem, r.dst)?);
        codec::reduce_scatter(comm, r.block, grads, out, scratch, self.grad_divisor())
            .map_err(|e| comm_err(self.rank, e))?;
        self.round_reduced(mem, i, r.dst)
    }
}
