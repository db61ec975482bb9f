//! The instruction list: what every rank executes, in order, each
//! instruction on its stream. `reads` and `writes` say which buffers an
//! instruction touches; the verifier and the memory plan rest on them.

use crate::buffer::{Buffer, BufferKind, Slot};
use crate::group::{CollectiveAlgorithm, Group};
use crate::ids::{BufferId, EventId, UnitId};
use crate::serde_default::{is_false, is_zero, is_zero_u32};
use crate::wire::Wire;
use fsdpc_ir::{DType, NodeId};
use serde::{Deserialize, Serialize};

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// Kernels, optimizer steps, frees of activations.
    Compute,
    /// All-gathers of parameters.
    Unshard,
    /// Reduce-scatters and all-reduces of gradients.
    Reduce,
    /// Copies from host to device memory (`cpu_offload`): parameter shards
    /// in before their all-gather. (Gradient shards go out on `Reduce`,
    /// after their reduction.)
    Offload,
}

impl Stream {
    pub const ALL: [Stream; 4] = [
        Stream::Compute,
        Stream::Unshard,
        Stream::Reduce,
        Stream::Offload,
    ];
    pub fn index(self) -> usize {
        self as usize
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Instr {
    pub stream: Stream,
    #[serde(flatten)]
    pub op: InstrOp,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum InstrOp {
    /// Gather the members' `src` (their shards over `group`: the shard
    /// group, or `Reshard` from a resharded slice) into the unit's full flat
    /// parameter `dst`, cast to `dtype` first; with a quantized `wire`,
    /// quantized instead and dequantized into `dst` through the
    /// `wire_buffer` scratch (exact semantics in `wire`).
    AllGather {
        #[serde(flatten)]
        c: Collective,
        /// Bucketed (the `rewrite` pass's `bucket-all-gathers`): this
        /// gather joins the call of the next all-gather of its stream, the
        /// bucket's last member (not bucketed), and moves nothing at its own
        /// place. Only `Wait`s come between them on the stream, so no
        /// record announces `dst` before the call. A native ring gather of
        /// a persistent shard over the shard group; the values are those of
        /// the unbucketed gathers.
        #[serde(default, skip_serializing_if = "is_false")]
        bucketed: bool,
    },
    /// Sum the unit's full flat gradient `src` over `group` (the shard
    /// group), divide by the world size times `PlanConfig::grad_accum`, and
    /// keep this rank's shard in `dst`. Regions of `src` not written by a
    /// gradient kernel (padding, frozen parameters) count as zero. With a
    /// quantized `wire` the members' slices travel quantized through the
    /// `wire_buffer` scratch and are summed dequantized, in position order
    /// in f32 (see `wire`).
    ReduceScatter {
        #[serde(flatten)]
        c: Collective,
    },
    /// Keep this rank's slice of the gathered flat parameter `src` in `dst`:
    /// with n members of `group` (`Reshard`) and this rank at position p,
    /// the elements `p * len .. (p + 1) * len`, `len` being `dst`'s.
    /// Issued after a unit's forward under `ReshardAfterForward::To(n)`.
    Reshard {
        unit: UnitId,
        src: BufferId,
        dst: BufferId,
        group: Group,
    },
    /// Sum `buffer` over `group` in place and divide by `divide_by`.
    AllReduce {
        unit: UnitId,
        buffer: BufferId,
        group: Group,
        divide_by: u32,
        dtype: DType,
        /// How it runs (absent: one ring all-reduce; or a reduce-scatter
        /// into `staging` and an all-gather from it).
        #[serde(default, skip_serializing_if = "CollectiveAlgorithm::is_ring")]
        algorithm: CollectiveAlgorithm,
        /// The `Staging` buffer of `ReduceScatterAllGather`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        staging: Option<BufferId>,
    },
    /// Tensor parallelism (graph node `node`, a `TpReduce` forward or the
    /// `TpReduce` a `TpCopy`'s gradient is): sum `src` over `group` (the
    /// tensor group) into `dst`, element by element in position order,
    /// in f32, rounded once to `dst`'s dtype. Runs on the compute stream:
    /// what follows reads its result.
    TensorAllReduce {
        node: NodeId,
        src: Slot,
        dst: Slot,
        group: Group,
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        micro_batch: u32,
    },
    /// Sequence parallelism (graph node `node`, a `TpGather`,
    /// `TpReduceScatter` or `TpSplit`): move between this member's row
    /// chunk of a tensor and the whole over `group` (the tensor group), as
    /// `kind` says. Runs on the compute stream: what follows reads it.
    TensorChunks {
        kind: ChunkKind,
        node: NodeId,
        src: Slot,
        dst: Slot,
        group: Group,
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        micro_batch: u32,
    },
    /// Copy the data input of this name into `dst`: this rank's samples of
    /// micro-batch `micro_batch` (samples `(micro_batch * world + rank) *
    /// b ..` of the step's global batch, `b` samples per rank).
    LoadInput {
        node: NodeId,
        name: String,
        dst: Slot,
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        micro_batch: u32,
    },
    /// Run the kernel of graph node `node`, with the first `workspace_bytes`
    /// of its stream's `Workspace` buffer as scratch.
    Kernel {
        node: NodeId,
        kernel: String,
        inputs: Vec<Slot>,
        outputs: Vec<Slot>,
        #[serde(default, skip_serializing_if = "is_zero")]
        workspace_bytes: u64,
        /// The micro-batch the kernel computes on (its samples are those of
        /// `LoadInput` with the same index: random masks follow them).
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        micro_batch: u32,
    },
    /// Replace the module buffer `dst` (a `ModuleBuffer` buffer) with `src`,
    /// the value graph node `node` (a `WriteBuffer`) writes: a copy, same
    /// dtype and size. Runs on the compute stream after every reader of
    /// the buffer in micro-batch `micro_batch`; an evaluation skips it.
    WriteBuffer {
        node: NodeId,
        src: Slot,
        dst: BufferId,
        #[serde(default, skip_serializing_if = "is_zero_u32")]
        micro_batch: u32,
    },
    /// Gradient accumulation: add `src` into `dst` element by element (same
    /// size and dtype; summed in f32, rounded once to the dtype).
    Accumulate {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        unit: Option<UnitId>,
        src: BufferId,
        dst: BufferId,
    },
    /// Update `params` (fp32 shard) from `grads` (reduced shard) with the
    /// program's optimizer, using the state buffers; with `skip_if` (a
    /// `FoundInf` flag), not on a step where that flag is nonzero. `grads`
    /// and the state cover the shard's trainable part, its first elements
    /// (`Unit::trainable_shard_numel`); the frozen part is not touched.
    OptimizerStep {
        unit: UnitId,
        params: BufferId,
        grads: BufferId,
        state: Vec<BufferId>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        skip_if: Option<BufferId>,
    },
    /// Loss scaling, step 0 (instead of the kernel of the constant that
    /// seeds backward, `d loss = 1`): write the current scale, element 0 of
    /// the `LossScale` buffer `scale`, into `dst` in the seed's dtype.
    ScaleSeed {
        node: NodeId,
        scale: BufferId,
        dst: Slot,
    },
    /// Loss scaling, step 1: multiply every element of `grads` by
    /// `1 / scale` (f32 arithmetic, in list order) and set the `FoundInf`
    /// scalar `found_inf` to 1 if any element was inf or NaN, else 0.
    UnscaleGrads {
        grads: Vec<BufferId>,
        scale: BufferId,
        found_inf: BufferId,
    },
    /// Loss scaling, step 2: sum the `FoundInf` scalar over `group` in rank
    /// order, so every rank skips the step when any found an inf or NaN.
    FoundInfAllReduce { buffer: BufferId, group: Group },
    /// Loss scaling, step 3 (after the optimizer steps): when `found_inf`
    /// is nonzero multiply the scale by `backoff_factor` and reset the good
    /// steps; else count a good step, and after `growth_interval` of them
    /// multiply the scale by `growth_factor` and reset the count
    /// (PyTorch's `_amp_update_scale_`).
    UpdateScale {
        scale: BufferId,
        found_inf: BufferId,
        growth_factor: f64,
        backoff_factor: f64,
        growth_interval: u32,
    },
    /// Gradient clipping, step 1: write into `dst` (a `GradNorm` scalar)
    /// the sum of squares of every element of the buffers `grads`, in list
    /// order, accumulated in f64. `split_only_off_first`: under tensor
    /// parallelism, a rank off tensor position 0 counts only the elements
    /// of parameters split over the tensor group (the others, replicated,
    /// count once: at position 0), so that the sum over the tensor group
    /// counts every element of the whole model once.
    GradNormSq {
        grads: Vec<BufferId>,
        dst: BufferId,
        #[serde(default, skip_serializing_if = "is_false")]
        split_only_off_first: bool,
    },
    /// Gradient clipping, step 2: sum the scalar `buffer` over `group` in
    /// rank order (no division): the squared global norm.
    NormAllReduce { buffer: BufferId, group: Group },
    /// Gradient clipping, step 3: scale `grads` by
    /// `min(1, max_norm / (sqrt(norm) + 1e-6))`, where `norm` holds the
    /// squared global norm.
    ClipGrads {
        unit: UnitId,
        norm: BufferId,
        grads: BufferId,
        max_norm: f64,
    },
    /// The buffer's memory may be reused after this point.
    Free { buffer: BufferId },
    /// `cpu_offload`: copy all of `src` into `dst` (same size, one in host
    /// memory and the other on the device): a unit's parameter shard in
    /// before its all-gather (offload stream), its reduced gradient shard
    /// out before its optimizer step (reduce stream).
    Copy {
        unit: UnitId,
        src: BufferId,
        dst: BufferId,
    },
    /// Mark the completion of everything issued so far on this stream.
    Record { event: EventId },
    /// Block this stream until the event has been recorded.
    Wait { event: EventId },
}

/// What an all-gather and a reduce-scatter both say: the unit, its source
/// and destination buffers, the dtype it moves, the group it runs over,
/// its wire format and how it runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Collective {
    pub unit: UnitId,
    pub src: BufferId,
    pub dst: BufferId,
    pub dtype: DType,
    #[serde(default = "Group::shard")]
    pub group: Group,
    /// How the payload travels (absent: native, in `dtype`).
    #[serde(default, skip_serializing_if = "Wire::is_native")]
    pub wire: Wire,
    /// The `Wire` scratch of a quantized `wire` (absent for native).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wire_buffer: Option<BufferId>,
    /// How it runs (absent: one ring over `group`).
    #[serde(default, skip_serializing_if = "CollectiveAlgorithm::is_ring")]
    pub algorithm: CollectiveAlgorithm,
    /// The `Staging` buffer of a hierarchical algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staging: Option<BufferId>,
}

impl InstrOp {
    /// The buffers this instruction reads (a read-write buffer appears in
    /// both `reads` and `writes`).
    pub fn reads(&self) -> Vec<BufferId> {
        match self {
            // A quantized collective's scratch and a rewritten one's staging
            // are written before they are read, by the collective itself:
            // they are in `writes` only.
            InstrOp::AllGather { c, .. } | InstrOp::ReduceScatter { c } => vec![c.src],
            InstrOp::Reshard { src, .. } | InstrOp::Copy { src, .. } => vec![*src],
            InstrOp::AllReduce { buffer, .. }
            | InstrOp::NormAllReduce { buffer, .. }
            | InstrOp::FoundInfAllReduce { buffer, .. } => vec![*buffer],
            InstrOp::GradNormSq { grads, .. } => grads.clone(),
            InstrOp::Accumulate { src, dst, .. } => vec![*src, *dst],
            InstrOp::ScaleSeed { scale, .. } => vec![*scale],
            InstrOp::UnscaleGrads { grads, scale, .. } => {
                grads.iter().copied().chain([*scale]).collect()
            }
            InstrOp::UpdateScale {
                scale, found_inf, ..
            } => vec![*scale, *found_inf],
            InstrOp::ClipGrads { norm, grads, .. } => vec![*norm, *grads],
            InstrOp::Kernel { inputs, .. } => inputs.iter().map(|s| s.buffer).collect(),
            InstrOp::TensorAllReduce { src, .. }
            | InstrOp::TensorChunks { src, .. }
            | InstrOp::WriteBuffer { src, .. } => {
                vec![src.buffer]
            }
            InstrOp::OptimizerStep {
                params,
                grads,
                state,
                skip_if,
                ..
            } => [*params, *grads]
                .into_iter()
                .chain(state.iter().copied())
                .chain(*skip_if)
                .collect(),
            InstrOp::LoadInput { .. }
            | InstrOp::Free { .. }
            | InstrOp::Record { .. }
            | InstrOp::Wait { .. } => Vec::new(),
        }
    }

    /// The buffers this instruction writes.
    pub fn writes(&self) -> Vec<BufferId> {
        match self {
            InstrOp::AllGather { c, .. } | InstrOp::ReduceScatter { c } => std::iter::once(c.dst)
                .chain(c.wire_buffer)
                .chain(c.staging)
                .collect(),
            InstrOp::Reshard { dst, .. } | InstrOp::Copy { dst, .. } => vec![*dst],
            InstrOp::AllReduce {
                buffer, staging, ..
            } => std::iter::once(*buffer).chain(*staging).collect(),
            InstrOp::NormAllReduce { buffer, .. } | InstrOp::FoundInfAllReduce { buffer, .. } => {
                vec![*buffer]
            }
            InstrOp::GradNormSq { dst, .. }
            | InstrOp::Accumulate { dst, .. }
            | InstrOp::WriteBuffer { dst, .. } => vec![*dst],
            InstrOp::ScaleSeed { dst, .. } => vec![dst.buffer],
            InstrOp::UnscaleGrads {
                grads, found_inf, ..
            } => grads.iter().copied().chain([*found_inf]).collect(),
            InstrOp::UpdateScale { scale, .. } => vec![*scale],
            InstrOp::ClipGrads { grads, .. } => vec![*grads],
            InstrOp::LoadInput { dst, .. }
            | InstrOp::TensorAllReduce { dst, .. }
            | InstrOp::TensorChunks { dst, .. } => {
                vec![dst.buffer]
            }
            InstrOp::Kernel { outputs, .. } => outputs.iter().map(|s| s.buffer).collect(),
            InstrOp::OptimizerStep { params, state, .. } => std::iter::once(*params)
                .chain(state.iter().copied())
                .collect(),
            InstrOp::Free { .. } | InstrOp::Record { .. } | InstrOp::Wait { .. } => Vec::new(),
        }
    }

    /// The collective part of an all-gather or a reduce-scatter.
    pub fn collective(&self) -> Option<&Collective> {
        match self {
            InstrOp::AllGather { c, .. } | InstrOp::ReduceScatter { c } => Some(c),
            _ => None,
        }
    }

    /// The collective part of an all-gather or a reduce-scatter, to edit.
    pub fn collective_mut(&mut self) -> Option<&mut Collective> {
        match self {
            InstrOp::AllGather { c, .. } | InstrOp::ReduceScatter { c } => Some(c),
            _ => None,
        }
    }

    /// True for all-gathers, reduce-scatters and all-reduces.
    pub fn is_collective(&self) -> bool {
        self.group().is_some()
    }

    /// The group a collective runs over (`None`: not a collective).
    pub fn group(&self) -> Option<Group> {
        match self {
            InstrOp::AllGather { c, .. } | InstrOp::ReduceScatter { c } => Some(c.group),
            InstrOp::AllReduce { group, .. }
            | InstrOp::NormAllReduce { group, .. }
            | InstrOp::FoundInfAllReduce { group, .. }
            | InstrOp::TensorAllReduce { group, .. }
            | InstrOp::TensorChunks {
                kind: ChunkKind::Gather | ChunkKind::ReduceScatter,
                group,
                ..
            } => Some(*group),
            _ => None,
        }
    }
}

/// What a `TensorChunks` instruction does: `src` and `dst` are a member's
/// row chunk (one of T equal contiguous parts) and the whole tensor.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkKind {
    /// The members' chunks concatenated in position order (an all-gather).
    Gather,
    /// The members' wholes summed in position order, in f32, and this
    /// member's chunk kept (a reduce-scatter).
    ReduceScatter,
    /// This member's chunk of a whole it holds (a copy, no communication).
    Split,
}

/// What a gather that can be in a bucket (`InstrOp::AllGather::bucketed`,
/// as a member or as the last one, whose call runs it) moves: its wire
/// dtype and shard elements; `None` for any other instruction. A native
/// ring gather over the shard group from a persistent shard.
pub fn bucketable_gather(op: &InstrOp, buffers: &[Buffer]) -> Option<(DType, u64)> {
    match op {
        InstrOp::AllGather { c, .. }
            if c.group == Group::Shard
                && c.algorithm == CollectiveAlgorithm::Ring
                && c.wire.is_native() =>
        {
            let b = buffers.get(c.src.index())?;
            (b.kind == BufferKind::ShardParams)
                .then(|| (c.dtype, b.bytes / b.dtype.size().max(1) as u64))
        }
        _ => None,
    }
}
