//! f32 arithmetic on buffers of any float dtype, for the instructions that
//! work on whole gradient buffers (norms, clipping, loss unscaling, the
//! optimizer's gradient): an f32 buffer is used in place; a bf16/f16 buffer
//! is widened `CHUNK` elements at a time into a stack array, worked on in
//! f32 and stored back rounded to nearest (what a half-precision kernel
//! with f32 arithmetic does). Widening and storing back an unchanged value
//! is exact, so read-only uses leave the buffer as it was. No allocation.

use fsdpc_ir::DType;
use half::{bf16, f16};

/// Elements widened at a time (16 KiB of f32 on the stack).
pub const CHUNK: usize = 4096;

/// Calls `f(offset, chunk)` on `bytes` (elements of `dtype`) as f32: the
/// whole buffer at once when it is f32, else chunk by chunk with the values
/// stored back. `offset` is the first element of the chunk. Errors on a
/// non-float dtype or a buffer that is not a whole number of elements.
pub fn with_f32(
    bytes: &mut [u8],
    dtype: DType,
    mut f: impl FnMut(usize, &mut [f32]),
) -> Result<(), String> {
    let es = dtype.size();
    if !bytes.len().is_multiple_of(es) {
        return Err(format!(
            "{} bytes are not whole {dtype} elements",
            bytes.len()
        ));
    }
    match dtype {
        DType::F32 => {
            let xs: &mut [f32] = bytemuck::try_cast_slice_mut(bytes)
                .map_err(|_| "an f32 buffer is not 4-byte aligned".to_string())?;
            f(0, xs);
        }
        DType::Bf16 | DType::F16 => {
            let mut wide = [0f32; CHUNK];
            for (k, part) in bytes.chunks_mut(CHUNK * 2).enumerate() {
                let n = part.len() / 2;
                for (w, b) in wide.iter_mut().zip(part.chunks_exact(2)) {
                    *w = widen(dtype, [b[0], b[1]]);
                }
                f(k * CHUNK, &mut wide[..n]);
                for (b, &w) in part.chunks_exact_mut(2).zip(wide.iter()) {
                    b.copy_from_slice(&narrow(dtype, w));
                }
            }
        }
        other => return Err(format!("{other} is not a floating-point dtype")),
    }
    Ok(())
}

/// Rounds every element of the f32 slice `xs` to `to` (bf16/f16; f32 leaves
/// it as it is), keeping it in f32: the value a reduction in `to` delivers.
pub fn round_to(xs: &mut [f32], to: DType) {
    match to {
        DType::Bf16 => xs.iter_mut().for_each(|x| *x = bf16::from_f32(*x).to_f32()),
        DType::F16 => xs.iter_mut().for_each(|x| *x = f16::from_f32(*x).to_f32()),
        _ => {}
    }
}

fn widen(dtype: DType, b: [u8; 2]) -> f32 {
    match dtype {
        DType::F16 => f16::from_le_bytes(b).to_f32(),
        _ => bf16::from_le_bytes(b).to_f32(),
    }
}

fn narrow(dtype: DType, x: f32) -> [u8; 2] {
    match dtype {
        DType::F16 => f16::from_f32(x).to_le_bytes(),
        _ => bf16::from_f32(x).to_le_bytes(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_buffers_round_trip_and_round_on_store() {
        let vals = [1.0f32, -2.5, 3.140625, 1e-3];
        let mut bytes: Vec<u8> = vals
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        let before = bytes.clone();
        let mut seen = Vec::new();
        with_f32(&mut bytes, DType::Bf16, |_, xs| seen.extend_from_slice(xs)).unwrap();
        assert_eq!(
            bytes, before,
            "a read-only pass leaves the buffer unchanged"
        );
        let want: Vec<f32> = vals.iter().map(|v| bf16::from_f32(*v).to_f32()).collect();
        assert_eq!(seen, want);
        with_f32(&mut bytes, DType::Bf16, |_, xs| {
            xs.iter_mut().for_each(|x| *x /= 3.0)
        })
        .unwrap();
        let third = bf16::from_le_bytes([bytes[0], bytes[1]]).to_f32();
        assert_eq!(third, bf16::from_f32(1.0 / 3.0).to_f32());
        assert!(with_f32(&mut [0u8; 3], DType::Bf16, |_, _| {}).is_err());
        assert!(with_f32(&mut [0u8; 8], DType::I64, |_, _| {}).is_err());
    }

    #[test]
    fn chunks_cover_long_buffers_with_their_offsets() {
        let n = CHUNK * 2 + 5;
        let mut bytes = vec![0u8; n * 2];
        let mut offsets = Vec::new();
        with_f32(&mut bytes, DType::F16, |o, xs| {
            offsets.push((o, xs.len()));
            xs.iter_mut().for_each(|x| *x = 1.5);
        })
        .unwrap();
        assert_eq!(offsets, vec![(0, CHUNK), (CHUNK, CHUNK), (2 * CHUNK, 5)]);
        assert!(bytes
            .chunks_exact(2)
            .all(|b| f16::from_le_bytes([b[0], b[1]]).to_f32() == 1.5));
    }

    #[test]
    fn round_to_matches_the_half_types() {
        let mut xs = [1.0f32 + 1e-3, 65504.0 * 2.0];
        round_to(&mut xs, DType::F16);
        assert_eq!(xs[0], f16::from_f32(1.0 + 1e-3).to_f32());
        assert!(xs[1].is_infinite(), "beyond fp16's range is inf");
        let mut ys = [1.0f32 + 1e-3];
        round_to(&mut ys, DType::Bf16);
        assert_eq!(ys[0], 1.0);
    }
}
