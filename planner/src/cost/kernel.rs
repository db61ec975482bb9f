//! What a kernel costs: the cluster's fixed per-kernel overhead plus its
//! roofline. Matrix products take the slower of compute (peak FLOP/s times
//! the achievable efficiency for the call's size, shape and layout, from
//! the skinny curves when its smallest dimension is small) and memory
//! traffic, plus the promotion of half operands on a backend that
//! multiplies in f32; attention the same, or at its measured FLOP rate
//! (`Hardware::kernel_flops`) where the cluster has one; every other kernel
//! (element-wise, normalisation, softmax, data movement) the slower of
//! compute at peak and its bytes at the bandwidth its family achieves,
//! capped at the memory bandwidth once the bytes exceed the cache
//! (`Hardware::kernel_bandwidth_for`).

use fsdpc_ir::ops::matmul::Geometry;
use fsdpc_ir::Graph;
use fsdpc_plan::cluster::Cluster;

/// Floating-point operations of one kernel (forward or backward), by the
/// IR's per-op FLOP rules.
pub fn node_flops(graph: &Graph, node: fsdpc_ir::NodeId) -> f64 {
    let n = graph.node(node);
    let ins: Vec<_> = graph
        .inputs(node)
        .iter()
        .map(|v| graph.value_type(*v))
        .collect();
    fsdpc_ir::ops::flops(&n.op, &ins, &n.outputs)
}

/// Bytes a kernel moves to and from memory (inputs read once, outputs
/// written once).
pub fn node_bytes(graph: &Graph, node: fsdpc_ir::NodeId) -> f64 {
    let n = graph.node(node);
    let out: u64 = n.outputs.iter().map(|t| t.bytes()).sum();
    let ins: u64 = graph
        .inputs(node)
        .iter()
        .map(|v| graph.value_type(*v).bytes())
        .sum();
    (out + ins) as f64
}

/// Roofline time of a matrix-product-like kernel: the slower of compute
/// (at the peak times the cluster's achievable efficiency for a kernel of
/// this size) and memory traffic (no per-kernel overhead).
pub fn kernel_time(flops: f64, bytes: f64, cluster: &Cluster, dtype: fsdpc_ir::DType) -> f64 {
    let hw = &cluster.hardware;
    let rate = hw.peak_flops(dtype) * hw.efficiency(flops);
    let compute = if rate > 0.0 { flops / rate } else { 0.0 };
    let memory = if hw.mem_bw > 0.0 {
        bytes / hw.mem_bw
    } else {
        0.0
    };
    compute.max(memory)
}

/// The family a kernel is calibrated under (`Hardware::kernel_bw`,
/// `Hardware::kernel_flops`), `None` for matrix products (the efficiency
/// curve: `kernel_time`). Half-precision operands add `:bf16` (the CPU
/// kernels widen them to f32 copies first).
pub fn kernel_family(op: &fsdpc_ir::Op, half: bool) -> Option<String> {
    use fsdpc_ir::Op;
    let base = match op {
        Op::MatMul { .. }
        | Op::Conv { .. }
        | Op::ConvGradInput { .. }
        | Op::ConvGradWeight { .. } => return None,
        Op::Attention { .. } => "attention",
        Op::AttentionGrad { .. } => "attention_grad",
        Op::Binary { .. } | Op::Compare { .. } | Op::Logical { .. } | Op::Where => "binary",
        Op::Unary { .. } | Op::Not | Op::Dropout { .. } => "unary",
        Op::Cast { .. } => "cast",
        Op::UnaryGrad { .. } => "unary_grad",
        Op::LayerNorm { .. } | Op::RmsNorm { .. } => "layer_norm",
        Op::LayerNormGrad { .. } | Op::RmsNormGrad { .. } => "layer_norm_grad",
        Op::Softmax { .. } | Op::LogSoftmax { .. } => "softmax",
        Op::SoftmaxGrad { .. } | Op::LogSoftmaxGrad { .. } => "softmax_grad",
        Op::CrossEntropy { .. } | Op::TpLogitStats { .. } => "cross_entropy",
        Op::CrossEntropyGrad { .. } | Op::TpLogitStatsGrad { .. } => "cross_entropy_grad",
        Op::Transpose { .. } => "transpose",
        Op::Slice { .. } | Op::Concat { .. } | Op::Pad { .. } => "slice",
        Op::SliceGrad { .. } => "slice_grad",
        Op::SumTo { .. } | Op::Reduce { .. } | Op::ReduceMaxGrad { .. } => "sum_to",
        Op::Gather { .. } | Op::TpLookup { .. } => "gather",
        Op::MaxPool { .. } | Op::AvgPool { .. } => "pool",
        Op::MaxPoolGrad { .. } | Op::AvgPoolGrad { .. } => "pool_grad",
        Op::GatherGrad { .. } | Op::TpLookupGrad { .. } => "gather_grad",
        _ => "reshape",
    };
    Some(if half {
        format!("{base}:bf16")
    } else {
        base.to_string()
    })
}

/// The smallest of rows, inner size and columns of the matrix product at
/// `node` (its `Geometry`: after its transposes, leading batch dimensions
/// aside; a convolution's per-image call); 0 when the node multiplies no
/// matrices.
pub fn matmul_min_dim(graph: &Graph, node: fsdpc_ir::NodeId) -> usize {
    let ins = graph.inputs(node);
    let dims = |v: &fsdpc_ir::ValueId| graph.value_type(*v).shape.dims();
    if let Some((c, _)) = conv_call(graph, node) {
        return c.m.min(c.k).min(c.n) as usize;
    }
    let fsdpc_ir::Op::MatMul { trans_a, trans_b } = graph.node(node).op else {
        return 0;
    };
    let (Some(a), Some(b)) = (ins.first(), ins.get(1)) else {
        return 0;
    };
    Geometry::of(dims(a), dims(b), trans_a, trans_b).map_or(0, |g| g.m.min(g.k).min(g.n))
}

/// The matrix-library call a convolution kernel at `node` makes, and how
/// many times (`fsdpc_plan::workspace::conv_calls`).
fn conv_call(
    graph: &Graph,
    node: fsdpc_ir::NodeId,
) -> Option<(fsdpc_plan::workspace::GemmCall, u64)> {
    let dims: Vec<&[usize]> = graph
        .inputs(node)
        .iter()
        .map(|v| graph.value_type(*v).shape.dims())
        .collect();
    fsdpc_plan::workspace::conv_calls(&graph.node(node).op, &dims)
}

/// Seconds a convolution kernel spends unfolding its input into im2col
/// matrices (or folding one back) and, where a product covers several
/// images, gathering their outputs: each product's scratch
/// (`Geometry::scratch`) written and read once, at the bandwidth of a
/// strided window copy (the `slice` family: rows of the input copied,
/// stepped by the stride); 0 for other kernels and pointwise convolutions
/// of large images.
fn im2col_time(graph: &Graph, node: fsdpc_ir::NodeId, hw: &fsdpc_plan::cluster::Hardware) -> f64 {
    let dims: Vec<&[usize]> = graph
        .inputs(node)
        .iter()
        .map(|v| graph.value_type(*v).shape.dims())
        .collect();
    let Some(g) = fsdpc_ir::ops::conv::Geometry::of(&graph.node(node).op, &dims) else {
        return 0.0;
    };
    let products = g.n.div_ceil(g.images_per_product()) * g.groups;
    let per_product = (2 * 4 * g.scratch()) as f64;
    let bw = hw.kernel_bandwidth_for("slice", per_product);
    if bw > 0.0 {
        per_product * products as f64 / bw
    } else {
        0.0
    }
}

/// The efficiency of the matrix product at `node` (`flops` in all): the
/// curve of its library calls' shape at one call's FLOPs when the cluster
/// has one (`Hardware::matmul_call_efficiency`), else the curve for its
/// FLOPs and smallest dimension.
fn matmul_efficiency(graph: &Graph, node: fsdpc_ir::NodeId, flops: f64, cluster: &Cluster) -> f64 {
    let hw = &cluster.hardware;
    let fallback = || hw.matmul_efficiency_for(flops, matmul_min_dim(graph, node));
    if hw.matmul_curves.is_empty() {
        return fallback();
    }
    let (call, count) = match (conv_call(graph, node), &graph.node(node).op) {
        (Some(c), _) => c,
        (None, &fsdpc_ir::Op::MatMul { trans_a, trans_b }) => {
            let ins = graph.inputs(node);
            let (Some(a), Some(b)) = (ins.first(), ins.get(1)) else {
                return fallback();
            };
            fsdpc_plan::workspace::matmul_calls(
                graph.value_type(*a).shape.dims(),
                graph.value_type(*b).shape.dims(),
                trans_a,
                trans_b,
            )
        }
        _ => return fallback(),
    };
    let (trans_a, trans_b) = (call.trans_a, call.trans_b);
    let key = fsdpc_plan::cluster::matmul_shape_key(call.m, call.k, call.n, trans_a, trans_b);
    if !hw.matmul_curves.contains_key(&key) {
        return fallback();
    }
    hw.matmul_call_efficiency(
        flops / count as f64,
        (call.m, call.k, call.n),
        trans_a,
        trans_b,
    )
}

/// Seconds a backend that multiplies in f32 spends widening a matrix
/// product's half-precision operands to f32 copies and narrowing its
/// half-precision output back (the CPU backend's `promoted`): every half
/// element read in one dtype and written in the other, at the measured
/// rate of the cast kernel (`Hardware::promotion_bandwidth`); 0 on a
/// cluster without that figure (GPUs multiply half precision natively).
pub fn promotion_time(
    graph: &Graph,
    node: fsdpc_ir::NodeId,
    hw: &fsdpc_plan::cluster::Hardware,
) -> f64 {
    let elements: u64 = graph
        .inputs(node)
        .iter()
        .map(|v| graph.value_type(*v))
        .chain(graph.node(node).outputs.iter())
        .filter(|t| is_half(t.dtype))
        .map(|t| t.numel())
        .sum();
    hw.half_conversion_time(elements)
}

pub(super) fn is_half(d: fsdpc_ir::DType) -> bool {
    matches!(d, fsdpc_ir::DType::Bf16 | fsdpc_ir::DType::F16)
}

/// Time of the kernel of graph node `node`: the per-kernel overhead plus
/// its roofline (see the module header), or what PyTorch eager's kernels
/// for it take on a cluster that prices them (`eager`).
pub fn node_kernel_time(
    graph: &Graph,
    node: fsdpc_ir::NodeId,
    cluster: &Cluster,
    dtype: fsdpc_ir::DType,
) -> f64 {
    if cluster.kernels == fsdpc_plan::cluster::Kernels::PytorchEager {
        if let Some(t) = super::eager::eager_kernel_time(graph, node, cluster) {
            return t;
        }
    }
    let hw = &cluster.hardware;
    let flops = node_flops(graph, node);
    let bytes = node_bytes(graph, node);
    let n = graph.node(node);
    let half = n
        .outputs
        .iter()
        .chain(graph.inputs(node).iter().map(|v| graph.value_type(*v)))
        .any(|t| is_half(t.dtype));
    let body = match kernel_family(&n.op, half) {
        None => {
            // A matrix product (or a convolution's products): the
            // efficiency of its calls' shape and size
            // (`Hardware::matmul_curves`), else of its size and smallest
            // dimension; a convolution adds its im2col traffic.
            let rate = hw.peak_flops(dtype) * matmul_efficiency(graph, node, flops, cluster);
            let compute = if rate > 0.0 { flops / rate } else { 0.0 };
            let body = compute.max(if hw.mem_bw > 0.0 {
                bytes / hw.mem_bw
            } else {
                0.0
            });
            body + promotion_time(graph, node, hw) + im2col_time(graph, node, hw)
        }
        // Compute-bound kernels of their own (attention): at their
        // measured FLOP rate when the cluster has one.
        Some(family) if family.starts_with("attention") => match hw.kernel_rate(&family) {
            Some(rate) => (flops / rate).max(if hw.mem_bw > 0.0 {
                bytes / hw.mem_bw
            } else {
                0.0
            }),
            None => kernel_time(flops, bytes, cluster, dtype),
        },
        Some(family) => {
            let peak = hw.peak_flops(dtype);
            let compute = if peak > 0.0 { flops / peak } else { 0.0 };
            let bw = hw.kernel_bandwidth_for(&family, bytes);
            compute.max(if bw > 0.0 { bytes / bw } else { 0.0 })
        }
    };
    hw.kernel_overhead_s + body
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_families() {
        use fsdpc_ir::Op;
        assert_eq!(
            kernel_family(
                &Op::MatMul {
                    trans_a: false,
                    trans_b: false
                },
                false
            ),
            None
        );
        assert_eq!(
            kernel_family(&Op::LayerNorm { eps: 1e-5 }, true).as_deref(),
            Some("layer_norm:bf16")
        );
        assert_eq!(
            kernel_family(&Op::Softmax { axis: 1 }, false).as_deref(),
            Some("softmax")
        );
    }
}
