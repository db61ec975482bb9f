//! Vectorisation helpers for the hot loops.
//!
//! `multiversion!` compiles a hot function for AVX-512 and AVX2+FMA as well
//! as the baseline target the crate builds for, and picks one at run time.
//! Only code compiled inside it gets the wider instructions, so the helpers
//! below are `#[inline(always)]`.
//!
//! The reductions keep `LANES` independent accumulators, which lets the
//! compiler vectorise a floating-point sum (it may not reassociate one
//! accumulator); the order is fixed, so results stay deterministic.

/// Independent accumulators per reduction.
pub const LANES: usize = 16;

/// Vector instruction sets the kernels are compiled for.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Level {
    /// AVX-512 (F, VL, BW, DQ) with FMA.
    V4,
    /// AVX2 with FMA.
    V3,
    /// The build target's baseline.
    Base,
}

/// The best level this CPU supports.
#[inline]
pub fn level() -> Level {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f")
            && has!("avx512vl")
            && has!("avx512bw")
            && has!("avx512dq")
            && has!("fma")
        {
            return Level::V4;
        }
        if has!("avx2") && has!("fma") {
            return Level::V3;
        }
    }
    Level::Base
}

/// Defines a function whose body is compiled three times — for AVX-512,
/// AVX2+FMA and the baseline — and picks one at run time by `level()`.
/// Closures written in the body inherit the target features, and helpers it
/// calls should be `#[inline(always)]`.
#[macro_export]
macro_rules! multiversion {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$m])*
        #[allow(clippy::too_many_arguments)]
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,avx,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v4($($arg: $ty),*) $(-> $ret)? $body
                #[target_feature(enable = "avx2,avx,fma")]
                #[allow(clippy::too_many_arguments)]
                unsafe fn v3($($arg: $ty),*) $(-> $ret)? $body
                match $crate::cpu::kernels::simd::level() {
                    // SAFETY: `level()` checked that the CPU has these features.
                    $crate::cpu::kernels::simd::Level::V4 => return unsafe { v4($($arg),*) },
                    $crate::cpu::kernels::simd::Level::V3 => return unsafe { v3($($arg),*) },
                    $crate::cpu::kernels::simd::Level::Base => {}
                }
            }
            $body
        }
    };
}

/// Reduces `x` with `LANES` accumulators started at `init`.
#[inline(always)]
fn fold_lanes(x: &[f32], init: f32, op: impl Fn(f32, f32) -> f32) -> [f32; LANES] {
    let mut acc = [init; LANES];
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] = op(acc[i], c[i]);
        }
    }
    for (i, &v) in rest.iter().enumerate() {
        acc[i] = op(acc[i], v);
    }
    acc
}

/// Sum of the lanes, pairwise.
#[inline(always)]
fn total(acc: [f32; LANES]) -> f32 {
    let mut a = acc;
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            a[i] += a[i + w];
        }
        w /= 2;
    }
    a[0]
}

/// `sum(x)`.
#[inline(always)]
pub fn sum(x: &[f32]) -> f32 {
    total(fold_lanes(x, 0.0, |a, v| a + v))
}

/// `max(x)` (`-inf` for an empty slice).
#[inline(always)]
pub fn max(x: &[f32]) -> f32 {
    let acc = fold_lanes(x, f32::NEG_INFINITY, |a, v| if v > a { v } else { a });
    acc.iter()
        .copied()
        .fold(f32::NEG_INFINITY, |a, v| if v > a { v } else { a })
}

/// `sum(a * b)`.
#[inline(always)]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0f32; LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    for i in 0..ra.len() {
        acc[i] += ra[i] * rb[i];
    }
    total(acc)
}

/// `sum((x - m)^2)`.
#[inline(always)]
pub fn sum_sq_dev(x: &[f32], m: f32) -> f32 {
    total(fold_lanes(x, 0.0, |a, v| a + (v - m) * (v - m)))
}

/// `sum(exp(x - m))`, writing the exponentials into `out` when given.
#[inline(always)]
pub fn exp_sum(x: &[f32], m: f32, out: Option<&mut [f32]>) -> f32 {
    use super::fastmath::exp;
    match out {
        None => total(fold_lanes(x, 0.0, |a, v| a + exp(v - m))),
        Some(out) => {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = exp(v - m);
            }
            sum(out)
        }
    }
}

/// `x *= s`.
#[inline(always)]
pub fn scale(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}
