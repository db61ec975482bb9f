//! Buffers: every piece of memory a rank holds during a step, where it
//! lives (device or host arena), its lifetime on the instruction list and
//! its offset in its arena.

use crate::ids::{BufferId, UnitId};
use crate::instr::Stream;
use fsdpc_ir::{DType, ModuleBufferId, ValueId};
use serde::{Deserialize, Serialize};

/// What a buffer holds; also the memory breakdown's categories.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum BufferKind {
    /// A rank's fp32 shard of a unit's flat parameter (persistent).
    ShardParams,
    /// A unit's full flat parameter after the all-gather.
    GatheredParams,
    /// A rank's 1/n slice of a unit's flat parameter kept from forward to
    /// backward (`ReshardAfterForward::To(n)`), in the gather dtype.
    ReshardedParams,
    /// A unit's full (unsharded) flat gradient, before reduction.
    FlatGrads,
    /// `cpu_offload`: a unit's parameter shard copied from the host for its
    /// all-gather (the gather's source), freed after the gather.
    StagedParams,
    /// `cpu_offload`: a unit's reduced gradient shard on the device (the
    /// reduction's destination), freed after its copy to the host.
    StagedGrads,
    /// `--offload-what optimizer`: one optimizer-state slot of a unit on
    /// the device, copied in from the host before its optimizer step and
    /// back out after it (offload stream), then freed.
    StagedState,
    /// A rank's shard of a unit's reduced gradient (persistent).
    ShardGrads,
    /// Gradient accumulation: one micro-batch's reduced gradient shard,
    /// added into `ShardGrads`.
    PartialGrads,
    /// Optimizer state for a unit's shard (persistent): one buffer per slot.
    OptimizerState,
    /// A module buffer (a running statistic, `fsdpc_ir::ModuleBufferSpec`):
    /// the whole tensor on every rank (persistent), read by the kernels
    /// of its readers and replaced by its `WriteBuffer`.
    ModuleBuffer,
    /// Forward activations and backward intermediate values.
    Activation,
    /// Data inputs loaded each step.
    Input,
    /// The scalar loss (persistent, read after each step).
    Loss,
    /// The f32 sum of squares of every gradient shard (persistent, one
    /// scalar), all-reduced into the squared global norm for clipping.
    GradNorm,
    /// The fp16 loss scaler's state (persistent, two f32: the scale and the
    /// count of good steps since it last changed).
    LossScale,
    /// The fp16 loss scaler's inf/NaN flag (persistent, one f32 scalar:
    /// nonzero when a gradient of this step was not finite on some rank).
    FoundInf,
    /// A stream's kernel scratch (persistent): each kernel of the stream
    /// uses its first `workspace_bytes` (attention tiles, normalisation
    /// rows, f32 copies of half-precision operands).
    Workspace,
    /// A quantized collective's payloads (`wire`: codes and scales, sent
    /// and received; raw bytes, dtype `bool`), written by the collective
    /// and freed right after it on its stream.
    Wire,
    /// Rewritten collectives' intermediate values (`CollectiveAlgorithm`:
    /// the cross-node gather of a hierarchical all-gather, the per-node
    /// sums of a hierarchical reduce-scatter, the reduced slice of an
    /// all-reduce done as reduce-scatter then all-gather): one persistent
    /// buffer per stream that runs them (raw bytes, dtype `bool`), each
    /// collective using its first bytes. Persistent, so it never shares
    /// bytes with another stream's buffers (no fences: a transient one made
    /// gathers wait for compute).
    Staging,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffer {
    pub id: BufferId,
    pub kind: BufferKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<UnitId>,
    /// The graph value an activation buffer holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<ValueId>,
    pub dtype: DType,
    pub bytes: u64,
    /// Byte offset in the rank's arena.
    pub offset: u64,
    /// Instruction index of the first write (0 for persistent buffers).
    pub start: u32,
    /// Instruction index of its `Free`; `None` for persistent buffers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u32>,
    /// The module buffer a `ModuleBuffer` buffer holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_buffer: Option<ModuleBufferId>,
    /// The stream whose kernels use a `Workspace` buffer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<Stream>,
    /// Which memory holds it (absent: the device). `offset` is in that
    /// location's arena.
    #[serde(default, skip_serializing_if = "Location::is_device")]
    pub location: Location,
}

/// Where a buffer lives: each location is one arena of its own.
#[derive(
    Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Location {
    /// Accelerator memory: what kernels and collectives read and write.
    #[default]
    Device,
    /// Host memory (`cpu_offload`): reached by kernels and collectives only
    /// through a `Copy`; the optimizer runs on it.
    Host,
}

impl Location {
    /// True for `Device` (the serde default).
    pub fn is_device(&self) -> bool {
        *self == Location::Device
    }
}

impl Buffer {
    /// Appends a new buffer to `buffers` with the next id and returns it:
    /// `bytes` of `dtype` holding `kind`, on the device, of no unit, value
    /// or stream, at offset 0 with no `end` (memory planning sets its
    /// offset and lifetime). The one way a pass makes a buffer; the
    /// setters below give it the rest.
    pub fn add(
        buffers: &mut Vec<Buffer>,
        kind: BufferKind,
        dtype: DType,
        bytes: u64,
    ) -> &mut Buffer {
        let id = BufferId(buffers.len() as u32);
        buffers.push(Buffer {
            id,
            kind,
            unit: None,
            value: None,
            dtype,
            bytes,
            offset: 0,
            start: 0,
            end: None,
            module_buffer: None,
            stream: None,
            location: Location::Device,
        });
        let last = buffers.len() - 1;
        &mut buffers[last]
    }

    /// Sets the unit the buffer belongs to.
    pub fn of_unit(&mut self, unit: Option<UnitId>) -> &mut Buffer {
        self.unit = unit;
        self
    }

    /// Sets the graph value the buffer holds.
    pub fn holding(&mut self, value: Option<ValueId>) -> &mut Buffer {
        self.value = value;
        self
    }

    /// Sets the stream the buffer is scratch of.
    pub fn on_stream(&mut self, stream: Stream) -> &mut Buffer {
        self.stream = Some(stream);
        self
    }

    pub fn persistent(&self) -> bool {
        self.end.is_none()
    }
}

/// A tensor inside a buffer: a parameter inside a gathered flat parameter, a
/// parameter gradient inside a flat gradient, or a whole activation buffer.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Slot {
    pub buffer: BufferId,
    /// Byte offset inside the buffer.
    pub offset: u64,
}

impl BufferKind {
    /// Buffers that live for the whole run (`end: None`, `start: 0`).
    pub fn is_persistent(self) -> bool {
        matches!(
            self,
            BufferKind::ShardParams
                | BufferKind::ShardGrads
                | BufferKind::OptimizerState
                | BufferKind::ModuleBuffer
                | BufferKind::Loss
                | BufferKind::GradNorm
                | BufferKind::LossScale
                | BufferKind::FoundInf
                | BufferKind::Workspace
                | BufferKind::Staging
        )
    }
}
