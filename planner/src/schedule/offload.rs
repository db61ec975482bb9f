//! CPU offload (`cpu_offload`, PyTorch's `CPUOffload(offload_params=True)`,
//! for the units `--cpu-offload WHICH` selects and what `--offload-what`
//! says; see `crate::offload`): which buffers live in host memory and the
//! copies that move shards between host and device.
//!
//! Conventions (the runtime and the verifier rely on them):
//! - `params` (the default): every `ShardParams`, `ShardGrads` and
//!   `OptimizerState` buffer of an offloaded unit is in host memory
//!   (`Location::Host`); everything else is on the device. The rules below
//!   apply to the offloaded units; the others run as without offload.
//!   Kernels and collectives never touch a host buffer; the optimizer tail
//!   (`OptimizerStep`, and clipping and loss-scaling passes over the
//!   gradient shards) runs on the host shards.
//! - Before a unit's all-gather from its shard, the unshard stream
//!   `Record`s, the offload stream `Wait`s, `Copy`s the host shard into a
//!   `StagedParams` buffer on the device and `Record`s; the unshard stream
//!   `Wait`s, gathers from the staged copy and `Free`s it. The copy is
//!   issued after the gather's own waits (issue point, rate limiter), so a
//!   staged copy is alive only while its gather may run.
//! - A unit's reduce-scatter (and, hybrid, its all-reduce across replicas)
//!   writes a `StagedGrads` buffer on the device; the reduce stream then
//!   `Copy`s it into the host `ShardGrads` and `Free`s it, before the
//!   `Record` the optimizer step waits on. As in PyTorch, where the
//!   gradient's copy to the host is issued on the post-backward stream:
//!   one copy stream for both directions would hold every later parameter
//!   copy (and so every later all-gather) behind the reduction of the
//!   gradients copied before it.
//! - `optimizer`: only an offloaded unit's `OptimizerState` buffers are in
//!   host memory; the copies around its optimizer step are inserted after
//!   the optimizer tail is final (`crate::offload::stage_state`).

use super::Lowering;
use fsdpc_plan::*;

impl Lowering<'_> {
    /// Whether unit `u` keeps its shards on the host (`params`).
    fn offloads(&self, u: UnitId) -> bool {
        self.input.offload.of(u) == Some(OffloadWhat::Params)
    }

    /// Moves the offloaded units' persistent buffers (shards and optimizer
    /// state, or the state only) to host memory.
    pub(super) fn place_on_host(&mut self) {
        for b in &mut self.buffers {
            let what = b.unit.and_then(|u| self.input.offload.of(u));
            if what.is_some_and(|w| w.keeps_on_host(b.kind)) {
                b.location = Location::Host;
            }
        }
    }

    /// The buffer unit `u`'s all-gather reads in place of its shard
    /// `shard`: under `cpu_offload` a device copy made on the offload
    /// stream (which the caller frees after the gather), else `shard`.
    pub(super) fn staged_shard(&mut self, u: UnitId, shard: BufferId) -> BufferId {
        if !self.offloads(u) {
            return shard;
        }
        let (dtype, bytes) = {
            let b = &self.buffers[shard.index()];
            (b.dtype, b.bytes)
        };
        let staged = self.new_buffer(BufferKind::StagedParams, Some(u), None, dtype, bytes);
        let issued = self.record(Stream::Unshard);
        self.push(Stream::Offload, InstrOp::Wait { event: issued });
        self.push(
            Stream::Offload,
            InstrOp::Copy {
                unit: u,
                src: shard,
                dst: staged,
            },
        );
        let copied = self.record(Stream::Offload);
        self.push(Stream::Unshard, InstrOp::Wait { event: copied });
        staged
    }

    /// The buffer unit `u`'s gradient reduction writes in place of its
    /// gradient shard `shard`: under `cpu_offload` a device buffer (see
    /// `copy_grads_out`), else `shard`.
    pub(super) fn staged_grads(&mut self, u: UnitId, shard: BufferId) -> BufferId {
        if !self.offloads(u) {
            return shard;
        }
        let (dtype, bytes) = {
            let b = &self.buffers[shard.index()];
            (b.dtype, b.bytes)
        };
        self.new_buffer(BufferKind::StagedGrads, Some(u), None, dtype, bytes)
    }

    /// After the reduction into `staged`: copies it to the host shard
    /// `shard` on the reduce stream and frees it (nothing when nothing is
    /// staged, `staged == shard`).
    pub(super) fn copy_grads_out(&mut self, u: UnitId, staged: BufferId, shard: BufferId) {
        if staged == shard {
            return;
        }
        self.push(
            Stream::Reduce,
            InstrOp::Copy {
                unit: u,
                src: staged,
                dst: shard,
            },
        );
        self.push(Stream::Reduce, InstrOp::Free { buffer: staged });
    }
}
