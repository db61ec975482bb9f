//! The kernel-workspace contract: the scratch memory each kernel needs
//! besides its operands, one rule per op kind, and the most the
//! matrix-product library allocates on its own. The planner states each
//! kernel's `workspace_bytes` from these rules and each stream that runs
//! kernels gets one persistent `Workspace` buffer as large as its largest
//! kernel's need; the runtime hands a kernel exactly the first
//! `workspace_bytes` of that buffer and a kernel that would need more fails.
//!
//! The rules (f32 elements unless said otherwise):
//! - `Attention`: one `sq x sk` probability tile; `AttentionGrad`: two
//!   (probabilities and their gradient);
//! - `LayerNormGrad`: two rows of the normalised axis; `RmsNormGrad`: one;
//! - `Softmax`/`LogSoftmax` (grad) off the last axis: the strided row of each
//!   input and the output (`(inputs + 1) x len`); along the last axis none;
//! - `ReduceMaxGrad`: one flag per output element;
//! - `Conv`, `ConvGradInput`, `ConvGradWeight`: one product's im2col
//!   matrix, and its output's when it covers several images
//!   (`Geometry::scratch`; none for a pointwise convolution of large
//!   images);
//! - an arithmetic op with bf16/f16 operands runs on f32 copies of those
//!   operands: their f32 bytes, each rounded up to 8, come first, then the
//!   op's own rule on the widened types.
//!
//! The planner never runs a kernel: these are sizes, stated from the types.

use crate::cluster::GemmBlocking;
use fsdpc_ir::ops::conv::Geometry as Geometry2d;
use fsdpc_ir::ops::matmul::Geometry;
use fsdpc_ir::{DType, Op, TensorType};

/// Largest inner dimension of one call into the matrix-product library: the
/// runtime splits longer products into panels (accumulating), so `gemm`
/// packs blocks of at most `K_PANEL` rows of `b`.
pub const K_PANEL: u64 = 512;

/// Upper bounds of `gemm`'s register-block sizes over the CPUs it supports
/// (f32: `MR` is at most 48 with AVX-512, `NR` at most 8): a packed block of
/// `n` columns holds at most `n + NR_MAX - 1`, one of `m` rows at most
/// `m + MR_MAX - 1`.
const MR_MAX: u64 = 64;
const NR_MAX: u64 = 16;

/// The per-thread slab `gemm` keeps for packing `a` (its `L2_SLAB`: the
/// size of the L2 cache it detects), allocated by a stream's first product
/// that does not pre-pack `a`, when the cluster does not give the
/// machine's (`GemmBlocking::slab_bytes`): a bound over the x86-64 CPUs
/// gemm runs on, whose per-core L2 is 1 MiB (AMD Zen 4 and 5) to 2 MiB
/// (Intel Xeon since Sapphire Rapids) and up to the 4 MiB an Intel E-core
/// cluster shares, which CPUID reports to each of its cores.
pub const GEMM_SLAB_BYTES: u64 = 4 << 20;

/// One call into the matrix-product library: `out[m x n] = a[m x k] b[k x
/// n]`, with `a` or `b` stored transposed.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct GemmCall {
    pub m: u64,
    pub k: u64,
    pub n: u64,
    pub trans_a: bool,
    pub trans_b: bool,
}

/// `gemm`'s right-hand-operand packing threshold on x86-64, in micro-kernel
/// rows (`DEFAULT_RHS_PACKING_THRESHOLD`): a contiguous operand is packed
/// only for products wider than this many `MR`.
const RHS_PACKING_THRESHOLD: u64 = 128;

/// Bytes `gemm` allocates during one call with `k <= K_PANEL`. `gemm` works
/// column-major, so for our row-major output it computes the transposed
/// product: its right-hand operand is our `a` (our `m` columns), its
/// left-hand one our `b` (our `n` rows). It packs a `kc x nc` block of the
/// former (`kc = k`, `nc` from its L3 blocking, `gemm_blocks`) when that
/// operand is strided (`trans_a`) and `n > 2 MR`, or contiguous and `n >
/// 128 MR`; it pre-packs `kc x n` of the latter (rounded up to `MR`) when
/// `n <= 2 mc` (`mc` from its L2 blocking, at most `8 MR`) and `b` is
/// strided (`trans_b`) or `n` is not a multiple of the SIMD width; plus two
/// 128-byte alignments and its flag vector.
///
/// With `blocking` (this machine's, from `fsdpc calibrate`) those are the
/// conditions `gemm` 0.19 tests. Without, an upper bound over every CPU it
/// supports: `MR <= MR_MAX`, `NR <= NR_MAX`, both operands packed whenever
/// `n <= 16 MR_MAX`, the right-hand one always.
pub fn gemm_call_bytes(c: GemmCall, blocking: Option<&GemmBlocking>) -> u64 {
    let GemmCall { m, k, n, .. } = c;
    if m == 0 || n == 0 || k == 0 {
        return 0;
    }
    let kc = k.min(K_PANEL);
    let (rhs, lhs) = match blocking {
        Some(g) => {
            let (mr, lanes) = (u64::from(g.mr), u64::from(g.simd_lanes));
            let pack_rhs = if c.trans_a {
                n > 2 * mr
            } else {
                n > RHS_PACKING_THRESHOLD * mr
            };
            let (mc, nc) = gemm_blocks(n, m, kc, g);
            let prepack_lhs = n <= 2 * mc && (c.trans_b || n % lanes != 0);
            (
                if pack_rhs { kc * nc } else { 0 },
                if prepack_lhs {
                    kc * n.next_multiple_of(mr)
                } else {
                    0
                },
            )
        }
        None => {
            let prepack_lhs = n <= 16 * MR_MAX;
            (
                kc * (m + NR_MAX - 1),
                if prepack_lhs {
                    kc * (n + MR_MAX - 1)
                } else {
                    0
                },
            )
        }
    };
    4 * (rhs + lhs) + 2 * 128 + 16
}

/// `gemm` 0.19's `mc` and `nc` (its `kernel_params`, f32, `kc` = `k` as
/// every call has `k <= K_PANEL <= 512`) for its `gm x gn` product (our
/// `n x m`): `mc` the rows of `a`'s panel that fit the L2 ways the packed
/// `b` micro-panel leaves, evened over the rows and capped at `8 MR`;
/// `nc` the columns of `b` that fit all L3 ways but one, evened, rounded
/// to `NR` (`128 NR` without an L3). Small products (both at most 64) take
/// its shortcut (`mc` from the whole L2, `nc` = `gn` rounded). Without the
/// cache figures, `mc` at its cap and `nc` = `gn` rounded.
fn gemm_blocks(gm: u64, gn: u64, kc: u64, g: &GemmBlocking) -> (u64, u64) {
    let (mr, nr) = (u64::from(g.mr).max(1), u64::from(g.nr).max(1));
    let (l2, kc) = (g.slab_bytes, kc.max(1));
    let whole_n = gn.next_multiple_of(nr);
    if g.l2_assoc == 0 || l2 == 0 {
        return (8 * mr, whole_n);
    }
    if gm <= 64 && gn <= 64 {
        return ((l2 / 4 / kc) / mr * mr, whole_n);
    }
    let even = |len: u64, block: u64, unit: u64| {
        let block = block.max(unit);
        len.div_ceil(len.div_ceil(block) * unit) * unit
    };
    let a2 = u64::from(g.l2_assoc).max(2);
    let rhs_ways = (nr * kc * 4).div_ceil((l2 / a2).max(1));
    let lhs_ways = a2.saturating_sub(1 + rhs_ways).max(1);
    let mc = even(gm, (lhs_ways * l2) / (a2 * 4 * kc) / mr * mr, mr).min(8 * mr);
    let nc = if g.l3_bytes == 0 {
        128 * nr
    } else {
        let a3 = u64::from(g.l3_assoc).max(2);
        let max_bytes = (a3 - 1) * g.l3_bytes / a3;
        even(gn, max_bytes / (4 * kc) / nr * nr, nr)
    };
    (mc, nc)
}

/// Bytes `gemm` allocates at once, outside the arena, in one kernel of
/// `op`: the largest of its products' calls (`gemm_call_bytes`); zero for
/// kernels that multiply no matrices.
pub fn gemm_heap(op: &Op, ins: &[&TensorType], blocking: Option<&GemmBlocking>) -> u64 {
    let dims = |i: usize| ins.get(i).map(|t| t.shape.0.as_slice()).unwrap_or(&[]);
    let call = |m, k, n, trans_a, trans_b| GemmCall {
        m,
        k,
        n,
        trans_a,
        trans_b,
    };
    let calls = match op {
        Op::MatMul { trans_a, trans_b } => {
            vec![matmul_call(dims(0), dims(1), *trans_a, *trans_b)]
        }
        Op::Attention { .. } | Op::AttentionGrad { .. } => {
            let at = |d: &[usize], i: usize| d.get(i).copied().unwrap_or(0) as u64;
            let (q, k, v) = (dims(0), dims(1), dims(2));
            let (sq, sk, d, dv) = (at(q, 2), at(k, 2), at(q, 3), at(v, 3));
            // Forward: S = Q K^T, O = P V; backward also dV = P^T dY,
            // dP = dY V^T, dQ = dS K, dK = dS^T Q (the CPU kernels' calls).
            let mut calls = vec![call(sq, d, sk, false, true), call(sq, sk, dv, false, false)];
            if matches!(op, Op::AttentionGrad { .. }) {
                calls.extend([
                    call(sk, sq, dv, true, false),
                    call(sq, dv, sk, false, true),
                    call(sq, sk, d, false, false),
                    call(sk, sq, d, true, false),
                ]);
            }
            calls
        }
        Op::Conv { .. } | Op::ConvGradInput { .. } | Op::ConvGradWeight { .. } => {
            let all: Vec<&[usize]> = (0..ins.len()).map(dims).collect();
            conv_calls(op, &all).map(|(c, _)| c).into_iter().collect()
        }
        _ => Vec::new(),
    };
    calls
        .into_iter()
        .map(|c| gemm_call_bytes(c, blocking))
        .max()
        .unwrap_or(0)
}

/// The largest call a convolution kernel (`Conv`, `ConvGradInput`,
/// `ConvGradWeight`) on operands of these dims makes, once per group of
/// `images_per_product` images and per channel group, and that count: `y =
/// W cols`, `dcols = W^T dy`, `dW += dy cols^T` over one product's im2col
/// matrix (`Geometry`); `None` for other ops.
pub fn conv_calls(op: &Op, dims: &[&[usize]]) -> Option<(GemmCall, u64)> {
    let g = Geometry2d::of(op, dims)?;
    let b = g.images_per_product();
    let (og, taps, pix) = (
        g.group_out() as u64,
        g.taps() as u64,
        (b * g.pixels()) as u64,
    );
    let call = |m, k, n, trans_a, trans_b| GemmCall {
        m,
        k,
        n,
        trans_a,
        trans_b,
    };
    let c = match op {
        Op::Conv { .. } => call(og, taps, pix, false, false),
        Op::ConvGradInput { .. } => call(taps, og, pix, true, false),
        _ => call(og, pix, taps, false, true),
    };
    Some((c, (g.n.div_ceil(b) * g.groups) as u64))
}

/// The call one `MatMul` kernel of these operand shapes makes, and how
/// many times (`Geometry::calls`): once with the batch folded into the
/// rows when `b` has no batch and `a` is not transposed, else once per
/// element of the broadcast batch.
pub fn matmul_calls(a: &[usize], b: &[usize], trans_a: bool, trans_b: bool) -> (GemmCall, u64) {
    let count = Geometry::of(a, b, trans_a, trans_b).map_or(1, |g| g.calls().1);
    (matmul_call(a, b, trans_a, trans_b), count as u64)
}

/// One call of the `MatMul` kernel (`Geometry::calls`; rank-1 operands
/// are a row or a column vector, rank-0 ones make an empty call).
fn matmul_call(a: &[usize], b: &[usize], trans_a: bool, trans_b: bool) -> GemmCall {
    let (m, k, n) = Geometry::of(a, b, trans_a, trans_b)
        .map_or((0, 0, 0), |g| (g.calls().0 as u64, g.k as u64, g.n as u64));
    GemmCall {
        m,
        k,
        n,
        trans_a,
        trans_b,
    }
}

/// Scratch bytes the kernel of `op` needs on operands of these types.
pub fn kernel_workspace(op: &Op, ins: &[&TensorType], outs: &[TensorType]) -> u64 {
    let half = |t: &TensorType| matches!(t.dtype, DType::Bf16 | DType::F16);
    if !op.moves_data() && (ins.iter().any(|t| half(t)) || outs.iter().any(half)) {
        let widen = |t: &TensorType| TensorType {
            dtype: if half(t) { DType::F32 } else { t.dtype },
            shape: t.shape.clone(),
        };
        let copies: u64 = ins
            .iter()
            .copied()
            .chain(outs.iter())
            .filter(|t| half(t))
            .map(|t| round8(t.numel() * 4))
            .sum();
        let wins: Vec<TensorType> = ins.iter().map(|t| widen(t)).collect();
        let win_refs: Vec<&TensorType> = wins.iter().collect();
        return copies + f32_workspace(op, &win_refs);
    }
    f32_workspace(op, ins)
}

fn round8(x: u64) -> u64 {
    x.div_ceil(8) * 8
}

/// The rule of each op on f32 operands.
fn f32_workspace(op: &Op, ins: &[&TensorType]) -> u64 {
    let dims = |i: usize| ins.get(i).map(|t| t.shape.0.as_slice()).unwrap_or(&[]);
    let last = |i: usize| dims(i).last().copied().unwrap_or(0) as u64;
    let elems = match op {
        Op::Attention { .. } | Op::AttentionGrad { .. } => {
            let (q, k) = (dims(0), dims(1));
            let tile =
                q.get(2).copied().unwrap_or(0) as u64 * k.get(2).copied().unwrap_or(0) as u64;
            if matches!(op, Op::Attention { .. }) {
                tile
            } else {
                2 * tile
            }
        }
        Op::LayerNormGrad { .. } => 2 * last(0),
        Op::RmsNormGrad { .. } => last(0),
        Op::Softmax { axis } | Op::LogSoftmax { axis } => strided_rows(dims(0), *axis, 1),
        Op::SoftmaxGrad { axis } | Op::LogSoftmaxGrad { axis } => strided_rows(dims(0), *axis, 2),
        Op::ReduceMaxGrad { .. } => ins.get(1).map_or(0, |t| t.numel()),
        Op::Conv { .. } | Op::ConvGradInput { .. } | Op::ConvGradWeight { .. } => {
            let all: Vec<&[usize]> = (0..ins.len()).map(dims).collect();
            Geometry2d::of(op, &all).map_or(0, |g| g.scratch() as u64)
        }
        _ => 0,
    };
    elems * 4
}

/// `(inputs + 1) x len` elements when `axis` is not the last axis of `dims`.
fn strided_rows(dims: &[usize], axis: usize, inputs: u64) -> u64 {
    let inner: usize = dims.get(axis + 1..).map_or(1, |d| d.iter().product());
    if inner == 1 {
        return 0;
    }
    (inputs + 1) * dims.get(axis).copied().unwrap_or(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A matrix product folds its batch into the rows when it can, else
    /// calls the library once per element of the broadcast batch.
    #[test]
    fn matmul_calls_fold_or_count_the_batch() {
        let (c, n) = matmul_calls(&[4, 128, 64], &[64, 32], false, false);
        assert_eq!((c.m, c.k, c.n, n), (512, 64, 32, 1));
        let (c, n) = matmul_calls(&[2, 8, 128, 64], &[2, 8, 96, 64], false, true);
        assert_eq!((c.m, c.k, c.n, n), (128, 64, 96, 16));
        let (_, n) = matmul_calls(&[2, 1, 128, 64], &[8, 64, 128], false, false);
        assert_eq!(n, 16, "broadcast batch 2 x 8");
        let (c, n) = matmul_calls(&[4, 64, 128], &[64, 32], true, false);
        assert_eq!((c.m, c.k, c.n, n), (128, 64, 32, 4));
    }

    /// A convolution's scratch is one product's im2col matrix (none when
    /// pointwise over large images); small maps put several images in one
    /// product, whose output matrix is scratch too.
    #[test]
    fn convolutions_unfold_one_product_at_a_time() {
        use fsdpc_ir::Window2d;
        let f32t = |d: &[usize]| TensorType::new(DType::F32, d.to_vec());
        let w3 = Window2d {
            pads: [1; 4],
            ..Window2d::of_kernel([3, 3])
        };
        let conv = Op::Conv {
            window: w3,
            groups: 2,
        };
        // 8x8 maps: one image per product; 4 channels per group x 9 taps,
        // by 64 pixels.
        let (x, w) = (f32t(&[2, 8, 8, 8]), f32t(&[4, 4, 3, 3]));
        assert_eq!(kernel_workspace(&conv, &[&x, &w], &[]), 4 * 36 * 64);
        let (c, count) = conv_calls(&conv, &[&[2, 8, 8, 8], &[4, 4, 3, 3]]).unwrap();
        assert_eq!((c.m, c.k, c.n, count), (2, 36, 64, 4));
        let gw = Op::ConvGradWeight {
            window: w3,
            groups: 2,
        };
        let (c, _) = conv_calls(&gw, &[&[2, 8, 8, 8], &[2, 4, 8, 8]]).unwrap();
        assert_eq!((c.m, c.k, c.n, c.trans_b), (2, 64, 36, true));
        // 2x2 maps: all 5 images (20 columns) in one product per group,
        // with its 2 x 20 output matrix.
        let small = f32t(&[5, 8, 2, 2]);
        assert_eq!(
            kernel_workspace(&conv, &[&small, &w], &[]),
            4 * (36 + 2) * 20
        );
        let (c, count) = conv_calls(&conv, &[&[5, 8, 2, 2], &[4, 4, 3, 3]]).unwrap();
        assert_eq!((c.m, c.k, c.n, count), (2, 36, 20, 2));
        let pointwise = Op::Conv {
            window: Window2d::of_kernel([1, 1]),
            groups: 1,
        };
        let w1 = f32t(&[4, 8, 1, 1]);
        assert_eq!(kernel_workspace(&pointwise, &[&x, &w1], &[]), 0);
    }
}
