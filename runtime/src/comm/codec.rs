//! The codecs of the low-precision wire formats (`fsdpc_plan::wire`
//! states their semantics): fp8 e4m3 (OCP E4M3FN, saturating, round to
//! nearest even) with a per-unit scale, and int8 with an f32 scale per
//! block: the element codecs, and the quantized all-gather and
//! reduce-scatter built from them around any communicator's byte
//! collectives (the executor, `exec::wire`, calls these with its arena's
//! buffers).

use super::{Buf, BufMut, Communicator};
use crate::error::CommError;
use fsdpc_ir::DType;
use fsdpc_plan::wire::{Wire, AMAX_EPS, E4M3_MAX};
use half::{bf16, f16};

/// The e4m3fn NaN code (with the sign bit clear).
pub const E4M3_NAN: u8 = 0x7f;

/// Smallest normal e4m3 magnitude, 2^-6.
const E4M3_MIN_NORMAL: f32 = 0.015625;

/// `v` as an e4m3fn code: round to nearest, ties to even; magnitudes above
/// 448 saturate to 448; NaN and infinities become the NaN code (keeping
/// the sign bit).
pub fn e4m3_encode(v: f32) -> u8 {
    let sign = if v.is_sign_negative() { 0x80 } else { 0 };
    let a = v.abs();
    if !a.is_finite() {
        return sign | E4M3_NAN;
    }
    if a > E4M3_MAX {
        return sign | 0x7e;
    }
    if a < E4M3_MIN_NORMAL {
        // Subnormals are multiples of 2^-9; `a * 512` is exact. 8 rounds
        // up to the smallest normal, whose code is 0x08.
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // Keep 3 of f32's 23 mantissa bits, rounding the 20 dropped ones to
    // nearest, ties to even (a carry into the exponent is the right value).
    let bits = a.to_bits();
    let r = (bits + 0x7ffff + ((bits >> 20) & 1)) & !0xfffff;
    let exp = (r >> 23) as i32 - 127 + 7;
    let man = (r >> 20) & 7;
    // a <= 448 rounds to at most 448 (exp 15, mantissa 6).
    sign | ((exp as u8) << 3) | man as u8
}

/// The value of e4m3fn code `c` (NaN for the two NaN codes).
pub fn e4m3_decode(c: u8) -> f32 {
    let sign = if c & 0x80 != 0 { -1.0 } else { 1.0 };
    let (exp, man) = ((c >> 3) & 0xf, c & 7);
    if c & 0x7f == E4M3_NAN {
        return f32::NAN;
    }
    let mag = if exp == 0 {
        f32::from(man) / 512.0
    } else {
        (1.0 + f32::from(man) / 8.0) * 2f32.powi(i32::from(exp) - 7)
    };
    sign * mag
}

/// The fp8 scale of a unit whose amax (largest finite magnitude) is `amax`.
pub fn fp8_scale(amax: f32) -> f32 {
    E4M3_MAX / amax.max(AMAX_EPS)
}

/// Element `i` of `bytes` (elements of float dtype `dt`) as f32.
pub fn load(dt: DType, bytes: &[u8], i: usize) -> f32 {
    match dt {
        DType::Bf16 => bf16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
        DType::F16 => f16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]).to_f32(),
        _ => f32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ]),
    }
}

/// Stores `v` at element `i` of `bytes` in float dtype `dt`, rounded to
/// nearest.
pub fn store(dt: DType, bytes: &mut [u8], i: usize, v: f32) {
    match dt {
        DType::Bf16 => bytes[2 * i..2 * i + 2].copy_from_slice(&bf16::from_f32(v).to_le_bytes()),
        DType::F16 => bytes[2 * i..2 * i + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes()),
        _ => bytes[4 * i..4 * i + 4].copy_from_slice(&v.to_le_bytes()),
    }
}

/// The largest magnitude among the finite elements of `xs` (`n` elements
/// of `dt`); 0 when none is finite.
pub fn finite_amax(dt: DType, xs: &[u8], n: usize) -> f32 {
    (0..n)
        .map(|i| load(dt, xs, i).abs())
        .filter(|a| a.is_finite())
        .fold(0.0, f32::max)
}

/// Encodes the `n` elements of `xs` (dtype `dt`) as e4m3 codes of `x *
/// scale` into `codes`.
pub fn fp8_encode(dt: DType, xs: &[u8], n: usize, scale: f32, codes: &mut [u8]) {
    for (i, c) in codes.iter_mut().enumerate().take(n) {
        *c = e4m3_encode(load(dt, xs, i) * scale);
    }
}

/// The dequantized value of code `c` under `scale`.
pub fn fp8_value(c: u8, scale: f32) -> f32 {
    e4m3_decode(c) / scale
}

/// The int8 scale of a block: `absmax / 127`, NaN when an element is not
/// finite.
pub fn int8_scale(block: impl Iterator<Item = f32>) -> f32 {
    let mut absmax = 0f32;
    for x in block {
        if !x.is_finite() {
            return f32::NAN;
        }
        absmax = absmax.max(x.abs());
    }
    absmax / 127.0
}

/// The int8 code of `x` under block scale `s` (0 where `s` is 0 or NaN).
pub fn int8_code(x: f32, s: f32) -> i8 {
    if s == 0.0 || s.is_nan() {
        return 0;
    }
    (x / s).round_ties_even().clamp(-127.0, 127.0) as i8
}

/// Encodes elements `from .. from + n` of `xs` (dtype `dt`) as one int8
/// payload into `out` (`P(n)` bytes: the blocks' f32 scales, then the
/// codes), blocks of `block` elements starting at `from`.
pub fn int8_encode(dt: DType, xs: &[u8], from: usize, n: usize, block: usize, out: &mut [u8]) {
    let nb = n.div_ceil(block.max(1));
    let (scales, codes) = out.split_at_mut(4 * nb);
    for b in 0..nb {
        let (lo, hi) = (b * block, ((b + 1) * block).min(n));
        let s = int8_scale((lo..hi).map(|i| load(dt, xs, from + i)));
        scales[4 * b..4 * b + 4].copy_from_slice(&s.to_le_bytes());
        for (i, c) in codes.iter_mut().enumerate().take(hi).skip(lo) {
            *c = int8_code(load(dt, xs, from + i), s) as u8;
        }
    }
}

/// Element `i` of an int8 payload of `n` elements in blocks of `block`,
/// dequantized: `code * scale`.
pub fn int8_value(payload: &[u8], n: usize, block: usize, i: usize) -> f32 {
    let nb = n.div_ceil(block.max(1));
    let b = i / block.max(1);
    let s = f32::from_le_bytes([
        payload[4 * b],
        payload[4 * b + 1],
        payload[4 * b + 2],
        payload[4 * b + 3],
    ]);
    f32::from(payload[4 * nb + i] as i8) * s
}

/// Raw bytes for the communicator (one-byte elements, copied as they are).
fn raw(bytes: &[u8]) -> Buf<'_> {
    Buf {
        dtype: DType::Bool,
        bytes,
    }
}

fn raw_mut(bytes: &mut [u8]) -> BufMut<'_> {
    BufMut {
        dtype: DType::Bool,
        bytes,
    }
}

fn f32_at(b: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])
}

fn layout_error(op: &str, reason: String) -> CommError {
    CommError::Mismatch {
        op: op.to_string(),
        reason,
    }
}

/// The quantized all-gather of `shard` over `comm` in format `wire` (see
/// `fsdpc_plan::wire`): member q's elements `at .. at + n` of each part
/// `(at, flat, n)` land at `flat + q * n ..` of `out`, dequantized; the
/// payloads go through `scratch`, exactly `wire.gather_scratch_bytes`
/// bytes. Every member calls it with the same sizes.
pub fn all_gather(
    comm: &dyn Communicator,
    wire: Wire,
    shard: Buf<'_>,
    parts: &[(usize, usize, usize)],
    out: BufMut<'_>,
    scratch: &mut [u8],
) -> Result<(), CommError> {
    let f = comm.size();
    let (sdt, ddt) = (shard.dtype, out.dtype);
    let s = shard.len();
    let need = wire.gather_scratch_bytes(s as u64, f as u64) as usize;
    let fits = parts
        .iter()
        .all(|&(at, flat, n)| at + n <= s && (flat + f * n) * ddt.size() <= out.bytes.len());
    if scratch.len() != need || !fits || !sdt.is_float() || !ddt.is_float() {
        return Err(layout_error(
            "quantized all_gather",
            format!(
                "{} over {f} ranks of a {sdt} shard of {s} elements into {ddt}: scratch of {} \
                 bytes (the layout needs {need}), or segments that do not fit",
                wire.name(),
                scratch.len()
            ),
        ));
    }
    let out = out.bytes;
    // Writes member q's element k of each part, given its value.
    let mut land = |value: &dyn Fn(usize, usize) -> f32| {
        for q in 0..f {
            for &(at, flat, n) in parts {
                for k in 0..n {
                    store(ddt, out, flat + q * n + k, value(q, at + k));
                }
            }
        }
    };
    match wire {
        Wire::Fp8E4m3 { .. } => {
            let (amaxes, codes) = scratch.split_at_mut(4 * (1 + f));
            let (mine, all) = amaxes.split_at_mut(4);
            mine.copy_from_slice(&finite_amax(sdt, shard.bytes, s).to_le_bytes());
            comm.all_gather(raw(mine), raw_mut(all))?;
            let amax = (0..f).map(|q| f32_at(all, q)).fold(0.0, f32::max);
            let scale = fp8_scale(amax);
            let (mine, all) = codes.split_at_mut(s);
            fp8_encode(sdt, shard.bytes, s, scale, mine);
            comm.all_gather(raw(mine), raw_mut(all))?;
            let all = &*all;
            land(&|q, k| fp8_value(all[q * s + k], scale));
        }
        Wire::Int8Block { block } => {
            let block = (block as usize).max(1);
            let p = wire.int8_payload(s as u64) as usize;
            let (mine, all) = scratch.split_at_mut(p);
            int8_encode(sdt, shard.bytes, 0, s, block, mine);
            comm.all_gather(raw(mine), raw_mut(all))?;
            let all = &*all;
            land(&|q, k| int8_value(&all[q * p..(q + 1) * p], s, block, k));
        }
        Wire::Native => {
            return Err(layout_error(
                "quantized all_gather",
                "the native format has no codec".into(),
            ))
        }
    }
    Ok(())
}

/// The int8 reduce-scatter (ZeRO++ qgZ) of `grads` over `comm` in blocks
/// of `block` elements: slice p of every member's `grads` goes to member p
/// quantized; this member sums the slices it receives dequantized, in
/// position order in f32, divides by `divide_by` and rounds once into
/// `out` (its slice). The payloads go through `scratch`, exactly
/// `Wire::reduce_scratch_bytes` bytes.
pub fn reduce_scatter(
    comm: &dyn Communicator,
    block: usize,
    grads: Buf<'_>,
    out: BufMut<'_>,
    scratch: &mut [u8],
    divide_by: u32,
) -> Result<(), CommError> {
    let f = comm.size().max(1);
    let (sdt, ddt) = (grads.dtype, out.dtype);
    let t = grads.len();
    let s = t / f;
    let block = block.max(1);
    let wire = Wire::Int8Block {
        block: block as u32,
    };
    let p = wire.int8_payload(s as u64) as usize;
    if !t.is_multiple_of(f)
        || out.len() != s
        || scratch.len() != 2 * f * p
        || !sdt.is_float()
        || !ddt.is_float()
    {
        return Err(layout_error(
            "quantized reduce_scatter",
            format!(
                "{t} {sdt} elements over {f} ranks into {} {ddt} elements with a scratch of {} \
                 bytes (the layout needs {})",
                out.len(),
                scratch.len(),
                2 * f * p
            ),
        ));
    }
    let (send, recv) = scratch.split_at_mut(f * p);
    for (q, payload) in send.chunks_exact_mut(p.max(1)).enumerate().take(f) {
        int8_encode(sdt, grads.bytes, q * s, s, block, payload);
    }
    comm.all_to_all(raw(send), raw_mut(recv))?;
    let d = divide_by as f32;
    for k in 0..s {
        let mut acc = int8_value(&recv[..p], s, block, k);
        for q in 1..f {
            acc += int8_value(&recv[q * p..(q + 1) * p], s, block, k);
        }
        store(ddt, out.bytes, k, acc / d);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every finite non-negative e4m3 value, by code.
    fn finite_codes() -> Vec<(u8, f32)> {
        (0u8..0x7f).map(|c| (c, e4m3_decode(c))).collect()
    }

    /// The reference encoder: the nearest finite code by value, ties to
    /// the even code (the even mantissa), saturating.
    fn nearest(v: f32) -> u8 {
        let sign = if v.is_sign_negative() { 0x80 } else { 0 };
        let a = v.abs();
        let mut best = (0u8, f32::INFINITY);
        for (c, x) in finite_codes() {
            let d = (x - a).abs();
            if d < best.1 || (d == best.1 && c % 2 == 0) {
                best = (c, d);
            }
        }
        sign | best.0
    }

    #[test]
    fn decode_known_values() {
        assert_eq!(e4m3_decode(0x7e), 448.0);
        assert_eq!(e4m3_decode(0x08), 2f32.powi(-6));
        assert_eq!(e4m3_decode(0x01), 2f32.powi(-9));
        assert_eq!(e4m3_decode(0x38), 1.0);
        assert_eq!(e4m3_decode(0xb8), -1.0);
        assert!(e4m3_decode(0x7f).is_nan() && e4m3_decode(0xff).is_nan());
    }

    #[test]
    fn encode_is_nearest_even_and_saturates() {
        // Every code's value, the midpoints between neighbours (ties) and
        // points just beside them.
        let vals = finite_codes();
        let mut probes: Vec<f32> = vals.iter().map(|v| v.1).collect();
        for w in vals.windows(2) {
            let mid = (w[0].1 + w[1].1) / 2.0;
            // Positive floats: the neighbours are one ulp away in bits.
            probes.extend([
                mid,
                f32::from_bits(mid.to_bits() + 1),
                f32::from_bits(mid.to_bits() - 1),
            ]);
        }
        probes.extend([449.0, 463.9, 464.0, 500.0, 1e30, 1e-20, 0.0]);
        for v in probes {
            for s in [v, -v] {
                assert_eq!(e4m3_encode(s), nearest(s), "{s}");
            }
        }
        assert_eq!(e4m3_encode(f32::NAN) & 0x7f, E4M3_NAN);
        assert_eq!(e4m3_encode(f32::INFINITY), E4M3_NAN);
        assert_eq!(e4m3_encode(f32::NEG_INFINITY), 0x80 | E4M3_NAN);
    }

    #[test]
    fn int8_blocks() {
        let xs: Vec<u8> = [1.0f32, -2.0, 0.5, 127.0, 0.0, 0.0, f32::NAN]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let mut out = vec![0u8; 4 * 3 + 7];
        int8_encode(DType::F32, &xs, 0, 7, 3, &mut out);
        // Block 0: absmax 2, scale 2/127.
        let s0 = 2.0f32 / 127.0;
        assert_eq!(int8_value(&out, 7, 3, 1), -127.0 * s0);
        assert_eq!(
            int8_value(&out, 7, 3, 0),
            (1.0f32 / s0).round_ties_even() * s0
        );
        // Block 1: 127, 0, 0 -> scale 1; exact.
        assert_eq!(int8_value(&out, 7, 3, 3), 127.0);
        assert_eq!(int8_value(&out, 7, 3, 4), 0.0);
        // Block 2 holds a NaN: it lands as NaN.
        assert!(int8_value(&out, 7, 3, 6).is_nan());
    }
}
