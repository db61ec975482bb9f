//! `Cast { to }` between every pair of dtypes: floats round to nearest
//! (bf16/f16 through the `half` crate), float to integer truncates toward zero
//! (NaN gives 0), integers convert exactly (i64 to i32 wraps), and nonzero is
//! true for bool.

use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};
use fsdpc_ir::DType;
use half::{bf16, f16};

/// Converts `x` into `y` (same element count, `y`'s dtype).
pub fn cast(x: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    if x.numel() != y.numel() {
        crate::kbail!("cast from {} to {}: element counts differ", x.ty, y.ty);
    }
    match (x.dtype(), y.dtype()) {
        (a, b) if a == b => y.bytes.copy_from_slice(x.bytes),
        (a, b) if convert_floats(x.bytes, a, y.bytes, b) => {}
        (a, b) if !a.is_float() && !b.is_float() => {
            for i in 0..x.numel() {
                y.set_i64(i, x.get_i64(i));
            }
        }
        (a, b) if a.is_float() && b.is_int() => {
            for i in 0..x.numel() {
                let v = x.get_f64(i);
                y.set_i64(i, if v.is_nan() { 0 } else { v as i64 });
            }
        }
        _ => {
            for i in 0..x.numel() {
                y.set_f64(i, x.get_f64(i));
            }
        }
    }
    Ok(())
}

/// Converts the float elements of `src` (dtype `sdt`) into `dst` (dtype
/// `ddt`, as many elements) where one side is f32 and the other bf16 or
/// f16, as `cast` does (round to nearest); returns false, touching
/// nothing, for any other pair. What collectives that change dtype on the
/// way use instead of one dtype dispatch per element.
pub fn convert_floats(src: &[u8], sdt: DType, dst: &mut [u8], ddt: DType) -> bool {
    match (sdt, ddt) {
        (DType::F32, DType::Bf16) => f32_to(src, dst, |v| bf16::from_f32(v).to_le_bytes()),
        (DType::F32, DType::F16) => f32_to(src, dst, |v| f16::from_f32(v).to_le_bytes()),
        (DType::Bf16, DType::F32) => to_f32(src, dst, |b| bf16::from_le_bytes(b).to_f32()),
        (DType::F16, DType::F32) => to_f32(src, dst, |b| f16::from_le_bytes(b).to_f32()),
        _ => return false,
    }
    true
}

fn f32_to(src: &[u8], dst: &mut [u8], f: impl Fn(f32) -> [u8; 2]) {
    for (d, s) in dst.chunks_exact_mut(2).zip(src.chunks_exact(4)) {
        d.copy_from_slice(&f(f32::from_le_bytes([s[0], s[1], s[2], s[3]])));
    }
}

fn to_f32(src: &[u8], dst: &mut [u8], f: impl Fn([u8; 2]) -> f32) {
    for (d, s) in dst.chunks_exact_mut(4).zip(src.chunks_exact(2)) {
        d.copy_from_slice(&f([s[0], s[1]]).to_le_bytes());
    }
}

/// Converts f32 values into `dst` of dtype `dt` (used for half-precision
/// outputs computed in f32).
pub fn store_f32s(dt: DType, src: &[f32], dst: &mut [u8]) {
    let wide: &[u8] = bytemuck::cast_slice(src);
    if dt == DType::F32 {
        dst.copy_from_slice(wide);
    } else if !convert_floats(wide, DType::F32, dst, dt) {
        for (i, &v) in src.iter().enumerate() {
            crate::tensor::store_f64(dt, dst, i, v as f64);
        }
    }
}
