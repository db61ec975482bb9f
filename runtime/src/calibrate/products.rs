//! Matrix products through the CPU backend's `gemm_f32` over shapes like
//! those of the kernels (rows x inner x columns): the peak FLOP/s and the
//! achievable-efficiency curve in FLOPs, each repetition on operands from a
//! rotation spanning 64 MiB (not those the last one left in the core's
//! caches: a training step's products read tensors other kernels touched
//! since). Skinny products (one dimension 16, the others 512..4096) give
//! the curve for products whose smallest dimension is small; curves by call
//! shape and operand layout (`matmul_shape_key`), 16 and 64 wide, give the
//! cost model its per-shape figures.

use super::harness::{fail, lockstep, median, rotation_sets};
use super::CalibrateError;
use super::Calibration;
use crate::cpu::kernels::matmul::{gemm_f32, Mat};
use fsdpc_plan::cluster::{matmul_shape_key, wide_skinny_key, SKINNY_BASE_DIM, SKINNY_DIM};
use gemm::Parallelism;
use std::collections::BTreeMap;
use std::fmt::Write;

/// What the products give the cluster file: the peak FLOP/s per rank and
/// every curve as efficiency (rate over that peak) against FLOPs.
pub(super) struct Products {
    pub peak: f64,
    /// The square shapes' curve (`matmul_efficiency`).
    pub curve: Vec<(f64, f64)>,
    /// The 16-wide products, the mean of their three orientations
    /// (`skinny_matmul_efficiency`).
    pub skinny_curve: Vec<(f64, f64)>,
    /// By shape key and layout (`matmul_curves`).
    pub matmul_curves: BTreeMap<String, Vec<(f64, f64)>>,
}

/// A product's rows, inner size and columns.
type Shape = (usize, usize, usize);

/// The shapes of the peak and of `matmul_efficiency` (m, k, n), in
/// increasing FLOPs.
const SHAPES: [Shape; 8] = [
    (16, 32, 32),
    (64, 64, 64),
    (128, 128, 128),
    (256, 128, 384),
    (512, 256, 256),
    (1024, 128, 512),
    (1024, 512, 512),
    (1024, 1024, 1024),
];

/// The sizes of the skinny products calibrated (16 x s x s and its
/// permutations).
const SKINNY_SIZES: [usize; 4] = [512, 1024, 2048, 4096];

/// Operand layouts: `a` and `b` plain or stored transposed.
const LAYOUTS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// The curves by shape: the name of the family, its shapes, and whether
/// they are the 64-wide skinny ones (`KEY@64`). The square shapes are
/// those of `SHAPES` over `SKINNY_DIM` in every dimension; the skinny
/// ones have 16 (or 64) rows, inner size or columns.
fn curve_families() -> Vec<(&'static str, Vec<Shape>, bool)> {
    let skinny = |which: usize, d: usize| -> Vec<Shape> {
        SKINNY_SIZES
            .iter()
            .map(|&s| match which {
                0 => (d, s, s),
                1 => (s, d, s),
                _ => (s, s, d),
            })
            .collect()
    };
    let square = SHAPES
        .iter()
        .copied()
        .filter(|&(m, k, n)| m.min(k).min(n) > SKINNY_DIM)
        .collect();
    let (base, wide) = (SKINNY_BASE_DIM, SKINNY_DIM);
    vec![
        ("square", square, false),
        ("rows", skinny(0, base), false),
        ("inner", skinny(1, base), false),
        ("cols", skinny(2, base), false),
        ("rows", skinny(0, wide), true),
        ("inner", skinny(1, wide), true),
        ("cols", skinny(2, wide), true),
    ]
}

/// Progress steps of `measure`.
pub(super) fn steps() -> usize {
    SHAPES.len() + SKINNY_SIZES.len() + curve_families().len() * LAYOUTS.len()
}

/// Times every product on every rank at once and adds their table.
pub(super) fn measure(cal: &mut Calibration) -> Result<Products, CalibrateError> {
    let _ = writeln!(
        cal.table,
        "matrix products (gemm_f32, one thread per rank):"
    );
    let mut points = Vec::new();
    for (m, k, n) in SHAPES {
        cal.message(format!("matrix product {m}x{k}x{n}"));
        let (flops, rate) = matmul_rate(cal.ranks, m, k, n)?;
        let _ = writeln!(
            cal.table,
            "  {m:>5} x {k:>5} x {n:>5}: {:>8.2} GFLOP/s",
            rate / 1e9
        );
        points.push((flops, rate));
        cal.inc();
    }
    // Skinny products (a small batch through a wide layer): the smallest
    // dimension 16 as rows, inner size or columns, at each size.
    let _ = writeln!(
        cal.table,
        "skinny matrix products (16 rows, inner or columns; mean of the three):"
    );
    let mut skinny = Vec::new();
    for s in SKINNY_SIZES {
        cal.message(format!("skinny matrix products, {s}"));
        let mut rates = Vec::new();
        let mut flops = 0.0;
        for (m, k, n) in [(16, s, s), (s, 16, s), (s, s, 16)] {
            let (f, rate) = matmul_rate(cal.ranks, m, k, n)?;
            flops = f;
            rates.push(rate);
        }
        let rate = rates.iter().sum::<f64>() / rates.len() as f64;
        let _ = writeln!(
            cal.table,
            "  16 x {s:>5} x {s:>5}: {:>8.2} GFLOP/s ({})",
            rate / 1e9,
            rates
                .iter()
                .map(|r| format!("{:.1}", r / 1e9))
                .collect::<Vec<_>>()
                .join(", ")
        );
        skinny.push((flops, rate));
        cal.inc();
    }
    // Curves by call shape and operand layout (`matmul_shape_key`): the
    // square shapes above with a smallest dimension over SKINNY_DIM, and
    // the skinny ones with 16 rows, inner size or columns, each with `a`
    // and `b` plain or stored transposed.
    let _ = writeln!(
        cal.table,
        "matrix products by shape and layout (GFLOP/s; a, b plain n or transposed t):"
    );
    let mut matmul_curves: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    for (family, list, wide) in curve_families() {
        for (trans_a, trans_b) in LAYOUTS {
            cal.message(format!("matrix products, {family}"));
            let (m0, k0, n0) = list[0];
            let mut key = matmul_shape_key(m0 as u64, k0 as u64, n0 as u64, trans_a, trans_b);
            if wide {
                key = wide_skinny_key(&key);
            }
            let mut curve: Vec<(f64, f64)> = Vec::new();
            let mut shown = Vec::new();
            for &shape in &list {
                let (flops, rate) = matmul_rate_of(cal.ranks, shape, trans_a, trans_b)?;
                if curve.last().is_none_or(|l| flops > l.0) {
                    curve.push((flops, rate));
                }
                shown.push(format!("{:.1}", rate / 1e9));
            }
            let _ = writeln!(cal.table, "  {key:<12} {}", shown.join(", "));
            matmul_curves.insert(key, curve);
            cal.inc();
        }
    }
    // One peak over every product measured; every curve relative to it.
    let peak = points
        .iter()
        .chain(&skinny)
        .chain(matmul_curves.values().flatten())
        .map(|p| p.1)
        .fold(0.0, f64::max);
    let skinny_curve: Vec<(f64, f64)> = skinny
        .iter()
        .map(|&(f, r)| (f, (r / peak).clamp(1e-6, 1.0)))
        .collect();
    let mut curve: Vec<(f64, f64)> = Vec::new();
    for &(flops, rate) in &points {
        // Keep the curve increasing in FLOPs (shapes are in that order).
        if curve.last().is_none_or(|l| flops > l.0) {
            curve.push((flops, (rate / peak).clamp(1e-6, 1.0)));
        }
    }
    for curve in matmul_curves.values_mut() {
        for p in curve.iter_mut() {
            p.1 = (p.1 / peak).clamp(1e-6, 1.0);
        }
    }

    Ok(Products {
        peak,
        curve,
        skinny_curve,
        matmul_curves,
    })
}

/// (FLOPs, FLOP/s per rank) of one product `m x k` by `k x n` on every rank.
fn matmul_rate(ranks: usize, m: usize, k: usize, n: usize) -> Result<(f64, f64), CalibrateError> {
    matmul_rate_of(ranks, (m, k, n), false, false)
}

/// `matmul_rate` with `a` and/or `b` stored transposed.
fn matmul_rate_of(
    ranks: usize,
    (m, k, n): Shape,
    trans_a: bool,
    trans_b: bool,
) -> Result<(f64, f64), CalibrateError> {
    let flops = 2.0 * (m * k * n) as f64;
    let reps = ((2e8 / flops) as usize).clamp(3, 200);
    // Operands rotate over sets spanning ROTATION_BYTES: in a training
    // step a product's operands were written or read by other kernels
    // since, not by the same product a moment ago. At most one set per
    // repetition: the curves are measured so, and more repetitions of the
    // mid-sized products (7, not 3) made their operands colder than a
    // small model's are in training (its step predicted 16% slow).
    let sets = rotation_sets(4 * (m * k + k * n + m * n)).min(reps);
    let times = lockstep(ranks, reps, |_| {
        let mut ops: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = (0..sets)
            .map(|_| {
                (
                    vec![0.5f32; m * k],
                    vec![0.25f32; k * n],
                    // Written, not zero-allocated: a first write to a
                    // fresh zero page faults, which a plan's arena
                    // does not.
                    vec![1f32; m * n],
                )
            })
            .collect();
        let mut set = 0;
        Ok(Box::new(move || {
            let (a, b, out) = &mut ops[set];
            set = (set + 1) % sets;
            let ma = Mat {
                data: a,
                rows: m,
                cols: k,
                trans: trans_a,
            };
            let mb = Mat {
                data: b,
                rows: k,
                cols: n,
                trans: trans_b,
            };
            gemm_f32(Parallelism::None, out, ma, mb, 1.0, false).map_err(|e| e.0)
        }))
    })
    .map_err(|e| fail("matrix product", e))?;
    Ok((flops, flops / median(&times).max(1e-12)))
}
