//! Collectives over a group of ranks. `Communicator` is the set a backend
//! provides and `World` makes a rank's communicators; `shm` implements both
//! for ranks that are threads of one process, `mpi` for ranks that are
//! processes (cargo feature `mpi`).
//!
//! Reduction order is fixed: element by element, the sum runs in group
//! position order, `((x0 + x1) + x2) + ...`, accumulated in f32, then divided
//! (`x / d as f32`). Reduce-scatter and all-reduce use the same order, so a
//! reduce-scatter over N ranks and an all-reduce over the same N ranks give
//! bit-identical values.
//!
//! Mixed dtypes (mixed precision): each member's elements are read in their
//! own dtype and widened exactly to f32, summed in that order in f32,
//! divided, and the result is rounded once into the receive buffer's dtype
//! (bf16/f16 round to nearest). A reduction whose instruction names a half
//! `reduce_dtype` but lands in an f32 gradient shard is rounded to that
//! dtype afterwards by the executor, so it delivers the same values as one
//! landing in a half buffer.

pub mod codec;
pub mod mpi;
pub mod shm;

use crate::error::CommError;
use fsdpc_ir::DType;
use std::time::Duration;

/// A read-only buffer of `dtype` elements.
#[derive(Copy, Clone, Debug)]
pub struct Buf<'a> {
    /// Element type.
    pub dtype: DType,
    /// Little-endian elements.
    pub bytes: &'a [u8],
}

/// A writable buffer of `dtype` elements.
#[derive(Debug)]
pub struct BufMut<'a> {
    /// Element type.
    pub dtype: DType,
    /// Little-endian elements.
    pub bytes: &'a mut [u8],
}

impl Buf<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size()
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

impl BufMut<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size()
    }

    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// The pairs of a grouped all-gather (`Communicator::all_gather_group`):
/// inline up to 8 (a bucket's members, or a unit's segments), so a
/// collective allocates nothing the memory plan does not know of (a
/// transient heap vector on a stream thread added to the rank's measured
/// peak whenever a gather ran at the peak).
pub type GatherCalls<'a> = smallvec::SmallVec<[(Buf<'a>, BufMut<'a>); 8]>;

/// The collective set on one group of ranks. Every member calls the same
/// collectives in the same order; a call blocks until all members have made
/// it, a member has failed, or the timeout passes.
pub trait Communicator: Send + Sync {
    /// Number of ranks in the group.
    fn size(&self) -> usize;

    /// This rank's position in the group.
    fn position(&self) -> usize;

    /// `recv` = the members' `send` buffers end to end in position order,
    /// converted to `recv.dtype`.
    fn all_gather(&self, send: Buf<'_>, recv: BufMut<'_>) -> Result<(), CommError>;

    /// Several all-gathers as one call (a bucket; NCCL's grouped calls):
    /// each `(send, recv)` pair as by `all_gather`, in order. Every member
    /// passes the same number of pairs of the same lengths. The default
    /// makes one call per pair.
    fn all_gather_group(&self, calls: GatherCalls<'_>) -> Result<(), CommError> {
        for (send, recv) in calls {
            self.all_gather(send, recv)?;
        }
        Ok(())
    }

    /// Sums the members' `send` buffers in position order, divides by
    /// `divide_by`, and keeps this member's `1/size` slice in `recv`.
    fn reduce_scatter(
        &self,
        send: Buf<'_>,
        recv: BufMut<'_>,
        divide_by: u32,
    ) -> Result<(), CommError>;

    /// Sums `buf` over the members in position order and divides by
    /// `divide_by`, in place.
    fn all_reduce(&self, buf: BufMut<'_>, divide_by: u32) -> Result<(), CommError>;

    /// `recv` chunk q = member q's `send` chunk p, for this member at
    /// position p: each member's `send` is `size` equal chunks, chunk q for
    /// member q (an all-to-all; `send` and `recv` of one length and dtype).
    /// The quantized reduce-scatter (`wire`) sends its payloads with it.
    fn all_to_all(&self, send: Buf<'_>, recv: BufMut<'_>) -> Result<(), CommError>;

    /// Copies the buffer of member `root` into every member's `buf`.
    fn broadcast(&self, buf: BufMut<'_>, root: usize) -> Result<(), CommError>;

    /// Returns once every member has called it.
    fn barrier(&self) -> Result<(), CommError>;
}

/// The ranks one launcher runs, seen from one rank: makes its communicators
/// and carries the failure state its streams share.
pub trait World: Send + Sync {
    /// Number of ranks in the world.
    fn size(&self) -> usize;

    /// How long a rank waits for the others (collectives, events).
    fn timeout(&self) -> Duration;

    /// The communicator of `rank` on the group `ranks` (world ranks in
    /// position order), one per `tag` so collectives with different tags can
    /// run concurrently. Every rank makes its communicators in the same order.
    fn communicator(
        &self,
        ranks: &[usize],
        tag: &str,
        rank: usize,
    ) -> Result<Box<dyn Communicator>, CommError>;

    /// Marks `rank` as failed so that every blocked wait of this world stops;
    /// the first failure is the one reported.
    fn poison(&self, rank: usize, reason: &str);

    /// The first failure, if any.
    fn failure(&self) -> Option<(usize, String)>;
}
