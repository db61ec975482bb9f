//! Branch-free f32 `exp` and `tanh` that compilers vectorise, for the hot
//! fused kernels (softmax rows, attention, cross-entropy, GELU). `exp` is
//! Cephes' `expf` polynomial (max error about 2 ulp on the clamped range);
//! inputs below -87.3 give about 1e-38 rather than 0, NaN stays NaN.

const LOG2E: f32 = std::f32::consts::LOG2_E;
/// 1.5 * 2^23: adding it rounds a float to the nearest integer.
const ROUND: f32 = 12_582_912.0;
const C1: f32 = 0.693_359_4;
const C2: f32 = -2.121_944_4e-4;
const LO: f32 = -87.3;
const HI: f32 = 88.7;

/// `e^x`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = x.clamp(LO, HI);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * C1 - n * C2;
    let p = 1.987_569_1e-4;
    let p = p * r + 1.398_199_9e-3;
    let p = p * r + 8.333_452e-3;
    let p = p * r + 4.166_579_6e-2;
    let p = p * r + 1.666_666_5e-1;
    let p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    let bits = (t.to_bits() as i32)
        .wrapping_sub(0x4B40_0000)
        .wrapping_add(127)
        << 23;
    y * f32::from_bits(bits as u32)
}

/// `tanh(x) = 1 - 2 / (e^{2x} + 1)` (absolute error about 1e-7).
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    1.0 - 2.0 / (exp(2.0 * x) + 1.0)
}

/// `1 / (1 + e^{-x})`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

#[cfg(test)]
mod tests {
    #[test]
    fn exp_matches_std() {
        let mut worst = 0f32;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (a, b) = (super::exp(x), x.exp());
            worst = worst.max(((a - b) / b).abs());
            x += 0.0137;
        }
        assert!(worst < 4e-7, "relative error {worst}");
        assert!(super::exp(f32::NAN).is_nan());
        assert!(super::exp(f32::NEG_INFINITY) < 1e-37);
    }

    #[test]
    fn tanh_matches_std() {
        let mut x = -20.0f32;
        while x < 20.0 {
            assert!((super::tanh(x) - x.tanh()).abs() < 3e-7, "{x}");
            x += 0.013;
        }
    }
}
