//! Kernels as PyTorch eager runs the program (`Kernels::PytorchEager`):
//! what a published or a user's PyTorch run of the same model costs on the
//! same hardware, where it differs from fsdpc's kernels.
//!
//! - Shape operators are views where PyTorch makes them views: a
//!   transpose, a broadcast and a slice never copy, and a reshape copies
//!   only an input that is not contiguous (`torch.reshape`: "a view when
//!   possible"); fsdpc's runtimes write every operator's output to a
//!   buffer of its own.
//! - RMSNorm runs as ATen's composite (`rms_norm`: the input widened to
//!   f32, `pow`, `mean`, `add`, `rsqrt`, two `mul`s, narrowed back; its
//!   backward is autograd's chain through them), which CUDA ran until
//!   PyTorch's fused RMSNorm kernel (pytorch/pytorch#153666, 2025); fsdpc's
//!   is one kernel each way.
//! - Cross-entropy runs as `log_softmax` and `nll_loss`, the
//!   log-probabilities written out and read back in backward.
//!
//! The tables are what `scripts/eager-kernels.py` lists from PyTorch's
//! own dispatch: each kernel that touches the whole tensor as the bytes it
//! reads and writes per element (the input's element size `e`, f32 `4`),
//! the others as launches only. Every kernel pays the cluster's
//! per-kernel overhead.

use fsdpc_ir::{Graph, NodeId, Op, ValueId};
use fsdpc_plan::cluster::Cluster;

/// One kernel of a composite: bytes read and written per element of the
/// whole tensor, as `(times the input's element size, plus f32 bytes)`;
/// `(0, 0)` for a kernel over one value per row (a launch).
type Kernel = (u32, u32);

/// `rms_norm` forward on an input of element size `e`: `to(f32)` (e + 4),
/// `pow` (8), `mean` (4), `add` and `rsqrt` over the rows, `mul` by the
/// reciprocal (8), `mul` by the weight (8), `to(e)` (4 + e).
const RMS_NORM: [Kernel; 8] = [
    (1, 4),
    (0, 8),
    (0, 4),
    (0, 0),
    (0, 0),
    (0, 8),
    (0, 8),
    (1, 4),
];

/// Its backward: the gradient widened (e + 4); the weight's gradient as
/// `mul` (12) and `sum` (4) with a row-sized cast; the normalised
/// gradient `mul` by the weight (8); the reciprocal's gradient `mul` (12)
/// and `sum` (4) with three row-sized kernels; the direct term `mul` (8);
/// the mean's gradient `div` (4), `pow`'s `pow` (8), `mul` (8) and `mul`
/// (12); the two terms added (12) and narrowed (4 + e).
const RMS_NORM_GRAD: [Kernel; 17] = [
    (1, 4),
    (0, 12),
    (0, 8),
    (0, 4),
    (0, 0),
    (0, 12),
    (0, 8),
    (0, 4),
    (0, 0),
    (0, 0),
    (0, 0),
    (0, 4),
    (0, 8),
    (0, 8),
    (0, 12),
    (0, 12),
    (1, 4),
];

/// `cross_entropy` on logits of element size `e`: `log_softmax` (2e) and
/// `nll_loss` (one element per row: a launch).
const CROSS_ENTROPY: [Kernel; 2] = [(2, 0), (0, 0)];

/// Its backward: `nll_loss_backward` writes the whole gradient (e),
/// `_log_softmax_backward_data` reads it and the log-probabilities and
/// writes the logits' gradient (3e).
const CROSS_ENTROPY_GRAD: [Kernel; 2] = [(1, 0), (3, 0)];

/// Seconds node `node` takes as PyTorch eager runs it, where that differs
/// from fsdpc's kernel (`None`: the same kernel).
pub fn eager_kernel_time(graph: &Graph, node: NodeId, cluster: &Cluster) -> Option<f64> {
    let n = graph.node(node);
    let ins = graph.inputs(node);
    let first = ins.first().map(|v| graph.value_type(*v))?;
    let (table, family): (&[Kernel], &str) = match &n.op {
        Op::Transpose { .. } | Op::Expand { .. } | Op::Slice { .. } => return Some(0.0),
        Op::Reshape { .. } if contiguous(graph, ins[0]) => return Some(0.0),
        Op::RmsNorm { .. } => (&RMS_NORM, "unary"),
        Op::RmsNormGrad { .. } => (&RMS_NORM_GRAD, "unary"),
        Op::CrossEntropy { .. } => (&CROSS_ENTROPY, "softmax"),
        Op::CrossEntropyGrad { .. } => (&CROSS_ENTROPY_GRAD, "softmax_grad"),
        _ => return None,
    };
    Some(composite_time(
        table,
        first.numel() as f64,
        first.dtype.size() as f64,
        family,
        cluster,
    ))
}

/// The kernels of `table` over `elements` elements of size `e`, each at
/// the bandwidth `family`'s kernels reach for its bytes.
fn composite_time(table: &[Kernel], elements: f64, e: f64, family: &str, cluster: &Cluster) -> f64 {
    let hw = &cluster.hardware;
    let half = e < 4.0;
    let family = if half {
        format!("{family}:bf16")
    } else {
        family.to_string()
    };
    table
        .iter()
        .map(|&(times_e, f32_bytes)| {
            let bytes = elements * (f64::from(times_e) * e + f64::from(f32_bytes));
            let bw = hw.kernel_bandwidth_for(&family, bytes);
            hw.kernel_overhead_s + if bw > 0.0 { bytes / bw } else { 0.0 }
        })
        .sum()
}

/// Whether PyTorch holds `v` contiguous: what a kernel writes is; a
/// transpose that moves an axis longer than 1, a broadcast that widens
/// one, and a slice that is not of the outermost axis longer than 1 are
/// strided views; a reshape is contiguous (a view of a contiguous input,
/// or a copy of a strided one).
pub fn contiguous(graph: &Graph, v: ValueId) -> bool {
    let n = graph.node(v.node);
    let ins = graph.inputs(v.node);
    let in_dims = || {
        ins.first()
            .map(|i| graph.value_type(*i).shape.dims().to_vec())
    };
    match &n.op {
        Op::Transpose { perm } => {
            let Some(dims) = in_dims() else { return true };
            // The axes longer than 1 keep their order.
            let moved: Vec<usize> = perm.iter().copied().filter(|&a| dims[a] > 1).collect();
            moved.windows(2).all(|w| w[0] < w[1]) && contiguous(graph, ins[0])
        }
        Op::Expand { shape } => {
            in_dims()
                .is_some_and(|d| d.iter().product::<usize>() == shape.iter().product::<usize>())
                && contiguous(graph, ins[0])
        }
        Op::Slice { axis, step, .. } => {
            let Some(dims) = in_dims() else { return true };
            dims[..*axis].iter().all(|&d| d == 1) && *step == 1 && contiguous(graph, ins[0])
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tables_hold_the_traced_bytes() {
        // scripts/eager-kernels.py: 40 B per element forward and 104
        // backward for a bf16 RMSNorm; 8 and 17 launches.
        let total = |t: &[Kernel]| t.iter().map(|&(m, f)| m * 2 + f).sum::<u32>();
        assert_eq!((total(&RMS_NORM), RMS_NORM.len()), (40, 8));
        assert_eq!((total(&RMS_NORM_GRAD), RMS_NORM_GRAD.len()), (104, 17));
    }
}
