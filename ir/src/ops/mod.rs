//! Per-op rules, one file per op family: output types (shape and dtype
//! inference), vector-Jacobian products and FLOP counts. `family` is the one
//! table that routes an op to its family; everything else looks rules up there.
//!
//! FLOP conventions (what `flops` counts, for the planner's roofline):
//! a multiply-add is 2 FLOPs (`MatMul` is `2·m·n·k` per batch); attention counts
//! its two matrix products (`4·b·h·s·t·d`), halved when causal (kernels skip the
//! masked blocks), plus 5 per score for the softmax, and its backward is 2.5× its
//! forward; a convolution and each of its gradients `2·n·o·oh·ow·(c/groups)·kh·kw`,
//! pooling 1 per tap of each output element; elementwise ops count 1 per output element (transcendental unary
//! functions 4, GELU 8); normalisations, softmax and cross-entropy a few per
//! element; data movement (reshape, transpose, slice, gather, ...) counts 0.

mod attention;
mod cast;
mod check;
pub mod conv;
mod dropout;
mod elementwise;
mod gather;
mod grad_kernels;
mod loss;
pub mod matmul;
mod norm;
mod pool;
mod reduce;
mod shape;
mod softmax;
mod source;
mod tensor_parallel;
mod vjp;
mod vocab;
mod window;

pub use check::{broadcast_shapes, broadcasts_to};
pub use vjp::vjp;
pub(crate) use vjp::VjpCtx;

use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

/// The rules of one op family.
pub(crate) trait Family: Sync {
    /// Output types of `op` on inputs of types `inputs`, or why not.
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String>;
    /// Adds the backward nodes of the forward node in `cx` and returns the
    /// gradient of each input (`None` where not needed or not differentiable).
    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String>;
    /// FLOPs of one execution (see the module conventions).
    fn flops(&self, op: &Op, inputs: &[&TensorType], outputs: &[TensorType]) -> f64;
}

/// The family whose file holds the rules of `op`.
fn family(op: &Op) -> &'static dyn Family {
    use Op::*;
    match op {
        Input { .. }
        | Param { .. }
        | Constant { .. }
        | ModuleBuffer { .. }
        | WriteBuffer { .. } => &source::Source,
        Unary { .. } | Binary { .. } | Compare { .. } | Logical { .. } | Not | Where => {
            &elementwise::Elementwise
        }
        Cast { .. } => &cast::Cast,
        MatMul { .. } => &matmul::MatMul,
        LayerNorm { .. } | RmsNorm { .. } => &norm::Norm,
        Softmax { .. } | LogSoftmax { .. } => &softmax::Softmax,
        Attention { .. } => &attention::Attention,
        Conv { .. } | ConvGradInput { .. } | ConvGradWeight { .. } => &conv::Conv,
        MaxPool { .. } | AvgPool { .. } | MaxPoolGrad { .. } | AvgPoolGrad { .. } => &pool::Pool,
        Gather { .. } => &gather::Gather,
        Dropout { .. } => &dropout::Dropout,
        Reshape { .. }
        | Transpose { .. }
        | Slice { .. }
        | Concat { .. }
        | Expand { .. }
        | Pad { .. }
        | SumTo { .. } => &shape::ShapeOps,
        Reduce { .. } => &reduce::Reduce,
        CrossEntropy { .. } => &loss::Loss,
        TpCopy | TpReduce | TpGather { .. } | TpReduceScatter { .. } | TpSplit { .. } => {
            &tensor_parallel::TensorParallel
        }
        TpLookup { .. } | TpLookupGrad { .. } | TpLogitStats { .. } | TpLogitStatsGrad { .. } => {
            &vocab::Vocab
        }
        UnaryGrad { .. }
        | LayerNormGrad { .. }
        | RmsNormGrad { .. }
        | SoftmaxGrad { .. }
        | LogSoftmaxGrad { .. }
        | AttentionGrad { .. }
        | GatherGrad { .. }
        | CrossEntropyGrad { .. }
        | SliceGrad { .. }
        | ReduceMaxGrad { .. } => &grad_kernels::GradKernels,
    }
}

/// Output types of `op` applied to inputs of types `inputs`. The error is a
/// reason; the caller adds the node's name.
///
/// `Input` and `Param` have no rule here: their types are given when they are
/// added (`Graph::add_input`, `Graph::add_param`).
///
/// Every input and output must be at most `2^60` bytes, so that no later
/// product of a tensor's dimensions (element counts, bytes, FLOPs) overflows.
pub fn infer(op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
    for (i, t) in inputs.iter().enumerate() {
        check::size(t, &format!("input {i}"))?;
    }
    let outputs = family(op).infer(op, inputs)?;
    for (i, t) in outputs.iter().enumerate() {
        check::size(t, &format!("output {i}"))?;
    }
    Ok(outputs)
}

/// FLOPs of one execution of `op` on inputs `inputs` producing `outputs` (see
/// the module documentation for the conventions).
pub fn flops(op: &Op, inputs: &[&TensorType], outputs: &[TensorType]) -> f64 {
    family(op).flops(op, inputs, outputs)
}

/// The error a family returns when handed an op of another family (a routing
/// bug in `family`, reported rather than panicking).
fn misrouted(op: &Op, fam: &str) -> String {
    format!("internal: `{}` was routed to the {fam} rules", op.name())
}

/// Numel of the first output, as f64 (0 when there is none).
fn out_numel(outputs: &[TensorType]) -> f64 {
    outputs.first().map_or(0.0, |t| t.numel() as f64)
}

/// Numel of input `i`, as f64 (0 when there is none).
fn in_numel(inputs: &[&TensorType], i: usize) -> f64 {
    inputs.get(i).map_or(0.0, |t| t.numel() as f64)
}
