//! The operation set. Each op's shape rule, gradient rule and FLOP count live
//! in `ops/` (one file per family, dispatched from `ops/mod.rs`); kernels live in
//! the runtime's backends. Attributes are plain data so that an op can be
//! written to JSON and read back.
//!
//! Conventions: axes are non-negative (frontends normalise negative axes);
//! elementwise binary ops broadcast as numpy does; `MatMul` multiplies the last
//! two dimensions and broadcasts the leading (batch) dimensions.

use crate::buffer::ModuleBufferId;
use crate::param::ParamId;
use crate::types::{DType, TensorData};
use serde::{Deserialize, Serialize};

mod name;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    // ---- sources (no inputs, one output) ----
    /// A data input fed by the runtime each step (token ids, labels, features).
    Input {
        name: String,
    },
    /// A trainable or frozen parameter; its value lives in a flat parameter.
    Param {
        param: ParamId,
    },
    /// A literal tensor.
    Constant {
        value: TensorData,
    },
    /// A module buffer's value at this point of the step (a running
    /// statistic); its type is its `ModuleBufferSpec`'s. Each rank holds
    /// the whole buffer, kept from step to step.
    ModuleBuffer {
        buffer: ModuleBufferId,
    },

    // ---- state ----
    /// Replace module buffer `buffer` with the one input (the buffer's
    /// type); no outputs. Every other reader of the buffer is an ancestor
    /// of the input (the validator checks), so each read sees the value
    /// before the write; a buffer has at most one writer.
    WriteBuffer {
        buffer: ModuleBufferId,
    },

    // ---- elementwise ----
    Unary {
        f: UnaryFn,
    },
    /// Two inputs, numpy broadcasting, output dtype = input dtype.
    Binary {
        f: BinaryFn,
    },
    /// Two inputs, numpy broadcasting, output dtype bool.
    Compare {
        f: CompareFn,
    },
    /// Two bool inputs (broadcasting), bool output.
    Logical {
        f: LogicalFn,
    },
    /// One bool input.
    Not,
    /// `(cond: bool, a, b)`, broadcasting all three.
    Where,
    Cast {
        to: DType,
    },

    // ---- linear algebra ----
    /// `a[..., m, k] x b[..., k, n]` (after the optional transposes of the last
    /// two axes); leading dimensions broadcast.
    MatMul {
        trans_a: bool,
        trans_b: bool,
    },

    // ---- normalisation, activations with structure ----
    /// Over the last axis. Inputs `(x, gamma)` or `(x, gamma, beta)`.
    LayerNorm {
        eps: f64,
    },
    /// Over the last axis. Inputs `(x, gamma)`.
    RmsNorm {
        eps: f64,
    },
    Softmax {
        axis: usize,
    },
    LogSoftmax {
        axis: usize,
    },
    /// Scaled dot-product attention over `q, k, v: [batch, heads, seq, head_dim]`,
    /// optionally causal. Output has the shape of `q`. `k` and `v` have the
    /// same shape and may have another sequence length than `q` unless causal.
    Attention {
        causal: bool,
        scale: f64,
    },
    /// 2-D convolution (cross-correlation, as ONNX `Conv` and PyTorch's
    /// `Conv2d`): `(x[n, c, h, w], w[o, c / groups, kh, kw][, b[o]])` ->
    /// `[n, o, oh, ow]` (`Window2d::out_hw`). `o` and `c` are multiples of
    /// `groups` (`groups == c == o` is a depthwise convolution); `kernel`
    /// is `[kh, kw]`.
    Conv {
        window: Window2d,
        groups: usize,
    },
    /// Max pooling over `x[n, c, h, w]` -> `[n, c, oh, ow]`; padding never
    /// wins (it is minus infinity).
    MaxPool {
        window: Window2d,
    },
    /// Average pooling over `x[n, c, h, w]` -> `[n, c, oh, ow]`: each window's
    /// sum over its elements inside the input, divided by its element count
    /// inside the padded input (`count_include_pad`, PyTorch's rule: a
    /// `ceil_mode` window's part past the padding never counts) or inside
    /// the input alone.
    AvgPool {
        window: Window2d,
        count_include_pad: bool,
    },
    /// `(data, indices)`: numpy `take` along `axis` (an embedding is axis 0).
    Gather {
        axis: usize,
    },
    /// Inverted dropout with a counter-based mask keyed by (seed, step, element):
    /// element `e` is kept iff `crate::init::dropout_keep(seed, step, e, p)`,
    /// and kept elements are scaled by `1 / (1 - p)`. `0 <= p < 1`.
    Dropout {
        p: f64,
        seed: u64,
        /// The input is a contiguous chunk of a whole tensor (a tensor
        /// group member's rows under sequence parallelism) whose samples
        /// (axis 0) hold this many elements each; a second input `offset`
        /// (one integer) is where the chunk starts in the whole, so element
        /// `i` draws the mask of the whole's element `offset + i`. Absent:
        /// the input is whole.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        whole_sample: Option<u64>,
    },

    // ---- shape ----
    Reshape {
        shape: Vec<usize>,
    },
    Transpose {
        perm: Vec<usize>,
    },
    /// One axis; `end` exclusive (clamped to the axis length, as numpy
    /// does), `start <= length`, `step >= 1`.
    Slice {
        axis: usize,
        start: usize,
        end: usize,
        step: usize,
    },
    Concat {
        axis: usize,
    },
    /// Broadcast to `shape` (numpy `broadcast_to`: the input must broadcast
    /// to exactly `shape`).
    Expand {
        shape: Vec<usize>,
    },
    /// Constant padding: `pads[i] = (before, after)` for axis i.
    Pad {
        pads: Vec<(usize, usize)>,
        value: f64,
    },
    /// Reduce over `axes` (distinct; empty means every axis, as ONNX), keeping
    /// them as 1s if `keepdims`. `Mean` needs floating point.
    Reduce {
        f: ReduceFn,
        axes: Vec<usize>,
        keepdims: bool,
    },

    // ---- losses ----
    /// `(logits[n, c], labels[n] int)` -> scalar mean over the non-ignored rows.
    /// The loss is f32 whatever the logits' dtype.
    CrossEntropy {
        ignore_index: Option<i64>,
    },

    // ---- tensor parallelism (inserted by the planner) ----
    /// Enters a tensor-parallel region: identity forward; in backward the
    /// members' partial gradients are summed over the tensor group
    /// (Megatron's `f`).
    TpCopy,
    /// Leaves a tensor-parallel region: the members' partial results summed
    /// over the tensor group; the gradient passes through (Megatron's `g`).
    TpReduce,
    /// Sequence parallelism: the members' row chunks concatenated. Each
    /// member holds chunk k of `parts` of the whole tensor seen as rows of
    /// its last axis, shaped as the whole with axis `axis` (the first
    /// axis not of size 1) divided by `parts`. The gradient is the chunk of
    /// the members' partial gradients summed (`TpReduceScatter`) when
    /// `partial_grad` (what follows is split over the group, Megatron-SP's
    /// `g` before a column-parallel product), or this member's chunk of the
    /// gradient (`TpSplit`) when what follows is replicated.
    TpGather {
        axis: usize,
        parts: u32,
        partial_grad: bool,
    },
    /// Sequence parallelism: the members' partial results summed and this
    /// member's row chunk kept (Megatron-SP's `g-bar` after a row-parallel
    /// product); the gradient is the members' chunks gathered.
    TpReduceScatter {
        axis: usize,
        parts: u32,
    },
    /// Sequence parallelism: this member's row chunk of a replicated
    /// tensor (no communication); the gradient is the chunks gathered.
    TpSplit {
        axis: usize,
        parts: u32,
    },

    /// Vocabulary parallelism: an embedding table's rows split over
    /// `parts` members. `(table[rows, ..], indices, offset[1])`: for each
    /// index, row `index - offset` of this member's rows when it holds it,
    /// zeros otherwise, so the members' outputs summed (`TpReduce`) are
    /// `Gather { axis: 0 }` of the whole table. Indices count in the whole
    /// table (`vocab`, else `rows * parts`; negative ones from its end);
    /// one outside it is an error, so padding rows are never read.
    TpLookup {
        parts: u32,
        /// The whole vocabulary when the members' parts are padded
        /// (`fsdpc_ir::TpSlice`): the rows past it are padding (absent:
        /// `parts` times this member's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vocab: Option<usize>,
    },
    /// Vocabulary parallelism: per-row statistics of this member's columns
    /// of split logits. `(logits[n, c], labels[n], offset[1])` ->
    /// `[1, n, 3]` f32: the row's maximum `m`, `sum(exp(x - m))`, and the
    /// label's logit when this member holds its column (`0 <= label -
    /// offset < c`), else 0. The members' statistics gathered give the
    /// cross-entropy without gathering the logits. A label outside the
    /// whole vocabulary (`vocab`, else `c * parts`) that is not
    /// `ignore_index` is an error; the columns past it (padding) count in
    /// neither the maximum nor the sum.
    TpLogitStats {
        ignore_index: Option<i64>,
        parts: u32,
        /// The whole vocabulary when the members' parts are padded
        /// (`fsdpc_ir::TpSlice`): the classes past it are padding (absent:
        /// `parts` times this member's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vocab: Option<usize>,
    },

    // ---- gradient kernels (produced by autodiff) ----
    /// Sum a broadcast gradient back to `shape` (inverse of numpy broadcasting).
    SumTo {
        shape: Vec<usize>,
    },
    /// `(x, dy) -> dy * f'(x)`.
    UnaryGrad {
        f: UnaryFn,
    },
    /// `(x, gamma, dy) -> (dx, dgamma, dbeta)`; `dbeta` is produced only if
    /// `has_beta`.
    LayerNormGrad {
        eps: f64,
        has_beta: bool,
    },
    /// `(x, gamma, dy) -> (dx, dgamma)`.
    RmsNormGrad {
        eps: f64,
    },
    /// `(y, dy) -> dx` where `y` is the softmax output.
    SoftmaxGrad {
        axis: usize,
    },
    /// `(y, dy) -> dx` where `y` is the log-softmax output.
    LogSoftmaxGrad {
        axis: usize,
    },
    /// `(q, k, v, dy) -> (dq, dk, dv)`.
    AttentionGrad {
        causal: bool,
        scale: f64,
    },
    /// `(indices, dy) -> d data`: scatter-add into zeros of `data_shape`.
    GatherGrad {
        axis: usize,
        data_shape: Vec<usize>,
    },
    /// `(logits, labels, dloss) -> dlogits`.
    CrossEntropyGrad {
        ignore_index: Option<i64>,
    },
    /// `(indices, offset, dy) -> d table` of `TpLookup`: `dy`'s rows added
    /// into zeros of `table_shape` at the rows this member holds.
    TpLookupGrad {
        parts: u32,
        table_shape: Vec<usize>,
        /// The whole vocabulary when the members' parts are padded
        /// (`fsdpc_ir::TpSlice`): the rows past it are padding (absent:
        /// `parts` times this member's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vocab: Option<usize>,
    },
    /// `(logits, labels, offset, stats, dstats) -> dlogits` of
    /// `TpLogitStats`; zero at the padding columns.
    TpLogitStatsGrad {
        ignore_index: Option<i64>,
        parts: u32,
        /// The whole vocabulary when the members' parts are padded
        /// (`fsdpc_ir::TpSlice`): the classes past it are padding (absent:
        /// `parts` times this member's).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vocab: Option<usize>,
    },
    /// `dy -> dx` of a `Slice`: scatter into zeros of `input_shape`.
    SliceGrad {
        axis: usize,
        start: usize,
        end: usize,
        step: usize,
        input_shape: Vec<usize>,
    },
    /// `(w, dy) -> dx` of a `Conv`, `dx` of shape `[n, c, input_hw]`.
    ConvGradInput {
        window: Window2d,
        groups: usize,
        input_hw: [usize; 2],
    },
    /// `(x, dy) -> dw` of a `Conv` (`[o, c / groups, kh, kw]`, `o` from
    /// `dy`). The bias's gradient is `dy` summed over axes 0, 2 and 3.
    ConvGradWeight {
        window: Window2d,
        groups: usize,
    },
    /// `(x, dy) -> dx` of a `MaxPool`: each window's `dy` routed to its
    /// first maximum (row-major within the window, as PyTorch's kernels).
    MaxPoolGrad {
        window: Window2d,
    },
    /// `dy -> dx` of an `AvgPool`, `dx` of shape `[n, c, input_hw]`.
    AvgPoolGrad {
        window: Window2d,
        count_include_pad: bool,
        input_hw: [usize; 2],
    },
    /// `(x, y, dy) -> dx` of a `Reduce{Max}`: `dy` routed to the arg-max positions.
    ReduceMaxGrad {
        axes: Vec<usize>,
        keepdims: bool,
    },
}

/// The geometry of a 2-D sliding window over the last two axes of an
/// `[n, c, h, w]` tensor: a convolution's kernel or a pooling window.
/// Window `(i, j)` covers rows `i·stride[0] - pads[0] + a·dilation[0]` for
/// `a < kernel[0]` (columns alike); positions outside the input are padding.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Window2d {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// `[top, left, bottom, right]`: ONNX's `pads` order (every axis's
    /// beginning, then every axis's end).
    pub pads: [usize; 4],
    /// Count a last, partial window (pooling's `ceil_mode`): the output
    /// length rounds up, less a window that would start past the input and
    /// its leading padding (PyTorch's rule, which ONNX follows).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub ceil_mode: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UnaryFn {
    Neg,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Reciprocal,
    Tanh,
    Relu,
    Sigmoid,
    Erf,
    Abs,
    /// GELU with the tanh approximation.
    GeluTanh,
    /// GELU with the exact erf form.
    GeluErf,
    /// `x * sigmoid(x)` (SiLU/Swish).
    Silu,
    /// `x * x`.
    Square,
    IsNan,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BinaryFn {
    Add,
    Sub,
    Mul,
    Div,
    Pow,
    Max,
    Min,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompareFn {
    Equal,
    Less,
    LessOrEqual,
    Greater,
    GreaterOrEqual,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LogicalFn {
    And,
    Or,
    Xor,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceFn {
    Sum,
    Mean,
    Max,
}

impl Op {
    /// The short name used in dumps, plans and error messages (`matmul`,
    /// `layer_norm`, `unary.gelu_tanh`, ...).
    pub fn name(&self) -> String {
        // A constant's value is data: its name without serialising it.
        if let Op::Constant { .. } = self {
            return "constant".into();
        }
        let name::Name { op, f } = name::Name::of(self);
        let base = op.unwrap_or_else(|| "?".into());
        match f {
            Some(f) => format!("{base}.{f}"),
            None => base,
        }
    }

    /// True for ops with no inputs whose value is not computed by a kernel.
    pub fn is_source(&self) -> bool {
        matches!(
            self,
            Op::Input { .. } | Op::Param { .. } | Op::Constant { .. } | Op::ModuleBuffer { .. }
        )
    }

    /// True for ops that only copy or compare elements, so they work on
    /// every dtype as is; every other op computes in f32 (a half-precision
    /// operand is widened first, which the planner sizes as workspace).
    pub fn moves_data(&self) -> bool {
        matches!(
            self,
            Op::Input { .. }
                | Op::Param { .. }
                | Op::Constant { .. }
                | Op::ModuleBuffer { .. }
                | Op::WriteBuffer { .. }
                | Op::Compare { .. }
                | Op::Logical { .. }
                | Op::Not
                | Op::Where
                | Op::Cast { .. }
                | Op::Gather { .. }
                | Op::Reshape { .. }
                | Op::Transpose { .. }
                | Op::Slice { .. }
                | Op::Concat { .. }
                | Op::Expand { .. }
                | Op::Pad { .. }
                | Op::SliceGrad { .. }
                | Op::TpCopy
                | Op::TpGather { .. }
                | Op::TpSplit { .. }
                | Op::TpLookup { .. }
        )
    }
}
