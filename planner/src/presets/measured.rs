//! The GPU presets' measured tables, each with where it comes from. The
//! rates are achieved TFLOP/s or bytes/s as measured; `gpu_tables` turns
//! them into efficiencies over the preset's datasheet peak, so the cost
//! model's rate (peak times efficiency) is the measured one.
//!
//! Hopper (H100 and H200 SXM: one GH100 die, 132 SMs, the same clocks and
//! 700 W): products, attention, copies, the per-kernel overhead and the
//! memory beside the arena measured on an H200 on 2026-12-04
//! (`scripts/gpu-check.sh`, driver 580.159.04, CUDA 13.0);
//! A100: published measurements only (see each constant).

use fsdpc_plan::cluster::Hardware;
use std::collections::BTreeMap;

/// Which of these tables a preset carries.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(super) enum Tables {
    /// The H100 and H200 SXM presets (one GH100 die).
    Hopper,
    /// The A100 SXM presets.
    A100,
}

/// FLOPs of the square products measured (m x k x n: 256^3, 512^3,
/// 1024^3, 2048^3, 4096 x 2048 x 4096, 4096^3, 8192 x 4096 x 4096,
/// 8192 x 4096 x 14336, 16384 x 8192 x 8192).
const SQUARE_FLOPS: [f64; 9] = [
    3.3554e7, 2.6844e8, 2.1475e9, 1.7180e10, 6.8719e10, 1.3744e11, 2.7488e11, 9.6207e11, 2.1990e12,
];

/// Hopper bf16 products through cuBLAS 13.0 (f32 accumulation), TFLOP/s
/// at `SQUARE_FLOPS` by operand layout: `fsdpc calibrate --target cuda`
/// on an H200 SXM, the median of 7 timed calls between CUDA events on
/// pseudo-random operands, less the time of a tiny kernel
/// (`KERNEL_OVERHEAD_S`, which the cost model adds to every kernel), and
/// at least half the measured time: the device's own time. The smallest
/// are bound by the host's issue time, not the GPU.
const HOPPER_SQUARE: [(&str, [f64; 9]); 4] = [
    (
        "square:nn",
        [7.5, 61.2, 534.7, 787.2, 792.7, 813.1, 809.1, 803.5, 785.6],
    ),
    (
        "square:nt",
        [8.3, 66.1, 534.7, 782.6, 789.2, 812.4, 808.5, 803.2, 795.8],
    ),
    (
        "square:tn",
        [8.5, 59.9, 524.3, 787.2, 786.3, 811.4, 804.3, 804.8, 787.8],
    ),
    (
        "square:tt",
        [8.4, 64.3, 543.4, 782.6, 788.4, 813.4, 807.8, 803.9, 795.9],
    ),
];

/// The time of a 256-element kernel issued and run by the cuda target on
/// the H200 (its host's issue time; `fsdpc calibrate --target cuda`),
/// seconds: what the cost model adds to every kernel on the GPU presets.
pub(super) const KERNEL_OVERHEAD_S: f64 = 4.224e-6;

/// FLOPs of the skinny products measured: 16 x s x s (and its
/// orientations) for s = 1024, 2048, 4096, 8192.
const SKINNY_FLOPS: [f64; 4] = [3.3554e7, 1.3422e8, 5.3687e8, 2.1475e9];

/// The same 64 wide.
const WIDE_FLOPS: [f64; 4] = [1.3422e8, 5.3687e8, 2.1475e9, 8.5899e9];

/// Hopper skinny bf16 products (nn), TFLOP/s, as `HOPPER_SQUARE`: 16 wide
/// at `SKINNY_FLOPS`, 64 wide (`@64`) at `WIDE_FLOPS`.
const HOPPER_SKINNY: [(&str, [f64; 4]); 6] = [
    ("rows:nn", [7.5, 32.1, 69.3, 67.3]),
    ("inner:nn", [7.3, 32.8, 46.2, 50.3]),
    ("cols:nn", [8.6, 29.7, 49.6, 59.1]),
    ("rows:nn@64", [30.0, 114.9, 293.1, 256.4]),
    ("inner:nn@64", [32.0, 75.2, 206.5, 207.3]),
    ("cols:nn@64", [27.2, 130.6, 240.5, 248.6]),
];

/// Hopper fused causal attention in bf16 as PyTorch 2.11's
/// `scaled_dot_product_attention` runs it by default, at sequence 4096,
/// head size 128, 32 heads, batch 4 on an H200 (`scripts/gpu-tables.py`):
/// 538.5 TFLOP/s forward and 457.0 backward counting `4 s^2 d / 2` per
/// head forward, 2.5 times that backward; in the IR's count
/// (`(4d + 5) s^2 / 2`) 543.8 and 461.5. Sequence 2048 runs at 0.90 and
/// 0.85 of these, 8192 at 1.05 and 1.07. The run did not record which
/// kernel PyTorch chose; the rate is cuDNN attention's (529 forward and
/// 518 backward at sequence 8192 on an H100 SXM in FlashAttention-3's
/// paper, Figures 5 and 6), not FlashAttention-2's (`HOPPER_FLASH_2`),
/// and PyTorch puts cuDNN first on sm90 once its bundled cuDNN is newer
/// than 9.15 (`check_prefer_cudnn_attention` in ATen's `sdp_utils.cpp`),
/// which 2.11's is.
const HOPPER_ATTENTION: (f64, f64) = (543.8e12, 461.5e12);

/// FlashAttention-2 on an H100 SXM5 in bf16, head size 128, sequence
/// 8192, as FlashAttention-3's paper measured it (Shah et al., 2024,
/// arXiv:2407.08608, Figure 5: 333 TFLOP/s forward with the causal mask;
/// Figure 6: 318 backward, its one backward chart at head size 128),
/// counted as `HOPPER_ATTENTION` is and turned into the IR's count
/// (`(4d + 5) / 4d`). It is the kernel PyTorch's SDPA ran on Hopper up to
/// 2.4 and again once cuDNN attention was made opt-in
/// (pytorch/pytorch#138522, October 2024, in 2.5.1) until the cuDNN
/// preference above: pytorch/pytorch#142132 measured that default at 329.5
/// TFLOP/s on an H100 (nightly 2024-12-04, sequence 4608, head size 128).
const HOPPER_FLASH_2: (f64, f64) = (333.0e12 * 517.0 / 512.0, 318.0e12 * 517.0 / 512.0);

/// Hopper HBM as memory-bound kernels reach it: a 4 GiB device copy
/// through PyTorch on the H200 moved 4.281 TB/s (read + written) of its
/// 4.8 datasheet, 0.892.
pub(super) const HOPPER_HBM_FRACTION: f64 = 4.281 / 4.8;

/// A100 bf16 products: 267.9 TFLOP/s of 312, the best shape of the
/// maximum-achievable-matmul search in Bekman's ml-engineering
/// (compute/accelerator/README.md, "Maximum Achievable Matmul FLOPS
/// comparison table": A100 SXM, CUDA 12.1, 6912 x 16384 x 2048). No
/// by-shape table was found: the A100's curve is the Hopper one's shape
/// (its mean over layouts, as a fraction of its best), scaled to this.
const A100_MAMF: f64 = 267.9e12;

/// A100 HBM as memory-bound kernels reach it: a read kernel on an A100
/// 80GB SXM moved 1.80 TB/s of the 2.04 datasheet, 88% as Nsight Compute
/// confirms, and about 90% is the most any kernel reached in the GTC talk
/// it cites (NVIDIA developer forums, "Trouble to reach peak bandwidth of
/// A100", 2025).
const A100_HBM_FRACTION: f64 = 1.80 / 2.039;

/// A100 fused attention: FlashAttention-2's paper (Dao, 2023, section
/// 4.1) reaches up to 73% of the A100's peak forward and 63% backward.
const A100_ATTENTION_FRACTION: (f64, f64) = (0.73, 0.63);

/// Where the A100's attention rates come from.
const A100_FLASH_2_SOURCE: &str = "published: FlashAttention-2 reaches 73% of the A100's peak forward and 63% backward (Dao, 2023, section 4.1)";

/// Where the Hopper FlashAttention-2 rates come from.
const HOPPER_FLASH_2_SOURCE: &str = "published: FlashAttention-2 on an H100 SXM5 at sequence 8192, head size 128: 333 TFLOP/s forward with the causal mask, 318 backward (FlashAttention-3's paper, Shah et al., 2024, Figures 5 and 6), PyTorch's SDPA kernel on Hopper while cuDNN attention was opt-in (pytorch/pytorch#138522, #142132)";

/// FlashAttention-2's forward and backward rates (FLOP/s in the IR's
/// count) on a preset carrying `tables` of datasheet peak `peak`, and
/// where they come from: what `kernel_flops` holds for a PyTorch run whose
/// SDPA runs FlashAttention-2.
pub(super) fn flash_attention_2(tables: Tables, peak: f64) -> ((f64, f64), &'static str) {
    match tables {
        Tables::Hopper => (HOPPER_FLASH_2, HOPPER_FLASH_2_SOURCE),
        Tables::A100 => (
            (
                A100_ATTENTION_FRACTION.0 * peak,
                A100_ATTENTION_FRACTION.1 * peak,
            ),
            A100_FLASH_2_SOURCE,
        ),
    }
}

/// Device memory a process of the cuda target holds once its context
/// exists and its kernels are loaded, on an H200 with driver 580.159.04
/// and CUDA 13.0 (`fsdpc calibrate --target cuda`): 556,597,248 B.
pub(super) const HOPPER_CONTEXT_BYTES: u64 = 556_597_248;

/// Device memory a cuBLAS 13.0 handle takes beyond the workspace it is
/// given, measured the same way: 66 MiB.
pub(super) const CUBLAS_HANDLE_BYTES: u64 = 66 << 20;

fn curve(flops: &[f64], tflops: &[f64], peak: f64) -> Vec<(f64, f64)> {
    flops
        .iter()
        .zip(tflops)
        .map(|(&f, &r)| (f, (r * 1e12 / peak).min(1.0)))
        .collect()
}

/// `h` (a Hopper preset, its datasheet peak set) with the Hopper tables.
pub(super) fn hopper(h: &mut Hardware) {
    let peak = h.peak_flops_bf16;
    let mut curves = BTreeMap::new();
    for (key, rates) in HOPPER_SQUARE {
        curves.insert(key.to_string(), curve(&SQUARE_FLOPS, &rates, peak));
    }
    for (key, rates) in HOPPER_SKINNY {
        let at = if key.ends_with("@64") {
            &WIDE_FLOPS
        } else {
            &SKINNY_FLOPS
        };
        curves.insert(key.to_string(), curve(at, &rates, peak));
    }
    let mean: Vec<f64> = (0..SQUARE_FLOPS.len())
        .map(|i| HOPPER_SQUARE.iter().map(|(_, r)| r[i]).sum::<f64>() / 4.0)
        .collect();
    h.matmul_efficiency = curve(&SQUARE_FLOPS, &mean, peak);
    let skinny: Vec<f64> = (0..SKINNY_FLOPS.len())
        .map(|i| HOPPER_SKINNY[..3].iter().map(|(_, r)| r[i]).sum::<f64>() / 3.0)
        .collect();
    h.skinny_matmul_efficiency = curve(&SKINNY_FLOPS, &skinny, peak);
    h.matmul_curves = curves;
    h.kernel_flops = BTreeMap::from([
        ("attention:bf16".to_string(), HOPPER_ATTENTION.0),
        ("attention_grad:bf16".to_string(), HOPPER_ATTENTION.1),
    ]);
    h.mem_bw *= HOPPER_HBM_FRACTION;
    h.context_bytes = HOPPER_CONTEXT_BYTES;
    h.cublas_handle_bytes = CUBLAS_HANDLE_BYTES;
    h.kernel_overhead_s = KERNEL_OVERHEAD_S;
    h.collective_fits = super::hopper_nccl::fits();
}

/// The Hopper products' mean over layouts as fractions of its best.
fn hopper_shape() -> Vec<(f64, f64)> {
    let mean: Vec<f64> = (0..SQUARE_FLOPS.len())
        .map(|i| HOPPER_SQUARE.iter().map(|(_, r)| r[i]).sum::<f64>() / 4.0)
        .collect();
    let best = mean.iter().copied().fold(0.0, f64::max);
    SQUARE_FLOPS
        .iter()
        .zip(mean)
        .map(|(&f, r)| (f, r / best))
        .collect()
}

/// `h` (an A100 preset) with the A100 figures.
pub(super) fn a100(h: &mut Hardware) {
    let peak = h.peak_flops_bf16;
    h.matmul_efficiency = hopper_shape()
        .into_iter()
        .map(|(f, x)| (f, x * A100_MAMF / peak))
        .collect();
    let ((forward, backward), _) = flash_attention_2(Tables::A100, peak);
    h.kernel_flops = BTreeMap::from([
        ("attention:bf16".to_string(), forward),
        ("attention_grad:bf16".to_string(), backward),
    ]);
    h.mem_bw *= A100_HBM_FRACTION;
    h.cublas_handle_bytes = CUBLAS_HANDLE_BYTES;
    h.kernel_overhead_s = KERNEL_OVERHEAD_S;
}

/// Where each figure `tables` set comes from, by field name.
pub(super) fn sources(tables: Tables) -> Vec<(&'static str, &'static str)> {
    match tables {
        Tables::Hopper => vec![
            ("matmul_efficiency", "measured: cuBLAS 13.0 bf16 products on an H200 SXM (same GH100 compute as the H100 SXM), fsdpc calibrate --target cuda, 2026-12-04; the mean over operand layouts (planner/src/presets/measured.rs)"),
            ("matmul_curves", "measured: as matmul_efficiency, by shape and operand layout"),
            ("skinny_matmul_efficiency", "measured: as matmul_efficiency, 16-wide products"),
            ("kernel_flops", "measured: PyTorch 2.11's default scaled_dot_product_attention kernel (by its rate cuDNN attention's) on an H200 SXM at sequence 4096, head size 128, 2026-12-04; `fsdpc cluster NAME --attention flash-attention-2` prices FlashAttention-2 instead"),
            ("mem_bw", "the datasheet HBM bandwidth times 0.892, the fraction a 4 GiB device copy reached on an H200 SXM, 2026-12-04"),
            ("context_bytes", "measured: the cuda target's context and kernels on an H200 SXM, driver 580.159.04, CUDA 13.0, 2026-12-04"),
            ("cublas_handle_bytes", "measured: a cuBLAS 13.0 handle beyond its workspace on an H200 SXM, 2026-12-04"),
            ("kernel_overhead_s", "measured: a 256-element kernel issued and run by the cuda target on an H200 SXM, 2026-12-04"),
            ("collective_fits", super::hopper_nccl::SOURCE),
            ("intra_bw", "vendor datasheet: NVLink4's 450 GB/s each way, for the groups inside a node that collective_fits does not hold (3, 5, 6 or 7 GPUs)"),
        ],
        Tables::A100 => vec![
            ("matmul_efficiency", "published and assumed: 267.9 of 312 TFLOP/s, the A100 SXM's maximum achievable bf16 matmul (Bekman, ml-engineering, compute/accelerator/README.md), at the sizes where the H200's measured curve is at its best, and that curve's shape below"),
            ("kernel_overhead_s", "assumed: the issue time of a tiny kernel measured on the H200's host (4.2 us)"),
            ("kernel_flops", A100_FLASH_2_SOURCE),
            ("mem_bw", "the datasheet HBM bandwidth times 0.883: a read kernel on an A100 80GB SXM reached 1.80 of 2.04 TB/s (NVIDIA developer forums, \"Trouble to reach peak bandwidth of A100\", 2025)"),
            ("cublas_handle_bytes", "assumed: as a cuBLAS 13.0 handle measured on an H200 SXM (66 MiB)"),
        ],
    }
}
