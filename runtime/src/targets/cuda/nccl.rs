//! NCCL communicators over cudarc's result layer. A communicator issues its
//! collectives on the CUDA stream of the call, so the executor keeps one
//! per (plan stream, group): all-gathers on the unshard stream and
//! reduce-scatters on the reduce stream then run beside compute. Every
//! stream's world communicator comes from its own unique id (rank 0 makes
//! them, the TCP rendezvous of `launch` hands them out); the shard,
//! replicate and reshard groups are `ncclCommSplit`s of it, keyed by rank so
//! a member's position is its place in `Group::members`.

use super::error::CudaError;
use cudarc::driver::CudaStream;
use cudarc::nccl::{result, sys};
use fsdpc_ir::DType;
use std::ffi::c_void;

/// Bytes of an NCCL unique id.
pub const ID_BYTES: usize = 128;

/// A new unique id (rank 0 makes one per communicator it hands out).
pub fn unique_id() -> Result<[u8; ID_BYTES], CudaError> {
    let id = result::get_uniqueid().map_err(|e| CudaError::nccl("ncclGetUniqueId", e))?;
    Ok(id.internal.map(|c| c as u8))
}

/// NCCL's version (e.g. 22703 for 2.27.3).
pub fn version() -> Result<i32, CudaError> {
    result::get_nccl_version().map_err(|e| CudaError::nccl("ncclGetVersion", e))
}

/// The NCCL type of `dt`.
pub fn nccl_type(dt: DType) -> Result<sys::ncclDataType_t, CudaError> {
    Ok(match dt {
        DType::F32 => sys::ncclDataType_t::ncclFloat32,
        DType::Bf16 => sys::ncclDataType_t::ncclBfloat16,
        DType::F16 => sys::ncclDataType_t::ncclFloat16,
        DType::I64 => sys::ncclDataType_t::ncclInt64,
        DType::I32 => sys::ncclDataType_t::ncclInt32,
        DType::Bool => sys::ncclDataType_t::ncclUint8,
    })
}

/// One communicator.
#[derive(Debug)]
pub struct NcclComm {
    comm: sys::ncclComm_t,
    /// Members.
    pub size: usize,
    /// This member's position.
    pub position: usize,
}

// SAFETY: a communicator is used by the one host thread that issues the
// rank's work.
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Joins the communicator of `id` as `rank` of `size` (blocks until
    /// every member has joined).
    pub fn init(id: &[u8; ID_BYTES], size: usize, rank: usize) -> Result<NcclComm, CudaError> {
        let uid = sys::ncclUniqueId {
            internal: id.map(|b| b as std::ffi::c_char),
        };
        let mut comm = std::ptr::null_mut();
        // SAFETY: an out-pointer to a live handle; the id is by value.
        unsafe { result::comm_init_rank(&mut comm, size as i32, uid, rank as i32) }
            .map_err(|e| CudaError::nccl("ncclCommInitRank", e))?;
        Ok(NcclComm {
            comm,
            size,
            position: rank,
        })
    }

    /// The sub-communicator of the members with the same `color`, ordered
    /// by `key` (every member of `self` calls it).
    pub fn split(
        &self,
        color: usize,
        key: usize,
        size: usize,
        position: usize,
    ) -> Result<NcclComm, CudaError> {
        let mut comm = std::ptr::null_mut();
        // SAFETY: live communicator, out-pointer to a live handle, no config.
        unsafe {
            sys::ncclCommSplit(
                self.comm,
                color as i32,
                key as i32,
                &mut comm,
                std::ptr::null_mut(),
            )
            .result()
        }
        .map_err(|e| CudaError::nccl("ncclCommSplit", e))?;
        Ok(NcclComm {
            comm,
            size,
            position,
        })
    }

    /// `recv` = every member's `count` elements of `send`, in position order.
    pub fn all_gather(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dt: DType,
        s: &CudaStream,
    ) -> Result<(), CudaError> {
        // SAFETY: arena regions `exec` checked against the buffers' sizes.
        unsafe {
            result::all_gather(
                send as *const c_void,
                recv as *mut c_void,
                count,
                nccl_type(dt)?,
                self.comm,
                s.cu_stream() as _,
            )
        }
        .map(|_| ())
        .map_err(|e| CudaError::nccl("ncclAllGather", e))
    }

    /// `recv` (`count` elements) = this member's slice of the sum of every
    /// member's `send` (`size * count` elements).
    pub fn reduce_scatter(
        &self,
        send: u64,
        recv: u64,
        count: usize,
        dt: DType,
        s: &CudaStream,
    ) -> Result<(), CudaError> {
        // SAFETY: as for `all_gather`; `recv` may be this member's slice of
        // `send` (NCCL's in-place form).
        unsafe {
            result::reduce_scatter(
                send as *const c_void,
                recv as *mut c_void,
                count,
                nccl_type(dt)?,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                s.cu_stream() as _,
            )
        }
        .map(|_| ())
        .map_err(|e| CudaError::nccl("ncclReduceScatter", e))
    }

    /// Sums `count` elements at `buf` over the members, in place.
    pub fn all_reduce(
        &self,
        buf: u64,
        count: usize,
        dt: DType,
        s: &CudaStream,
    ) -> Result<(), CudaError> {
        // SAFETY: as for `all_gather`.
        unsafe {
            result::all_reduce(
                buf as *const c_void,
                buf as *mut c_void,
                count,
                nccl_type(dt)?,
                sys::ncclRedOp_t::ncclSum,
                self.comm,
                s.cu_stream() as _,
            )
        }
        .map(|_| ())
        .map_err(|e| CudaError::nccl("ncclAllReduce", e))
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: created once, destroyed once; errors at teardown are not
        // worth a panic.
        let _ = unsafe { result::comm_destroy(self.comm) };
    }
}
