//! Unary elementwise functions and their derivatives (`Unary`, `UnaryGrad`).
//! f32 is the compute type; integer tensors support the functions that are
//! exact on integers (neg, abs, square, relu) and `is_nan` (always false).

use super::fastmath;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};
use fsdpc_ir::{DType, UnaryFn};

const SQRT_2_OVER_PI: f32 = 0.797_884_6;
const GELU_C: f32 = 0.044_715;
const FRAC_2_SQRT_PI: f32 = std::f32::consts::FRAC_2_SQRT_PI;
const FRAC_1_SQRT_2PI: f32 = 0.398_942_3;

#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    super::fastmath::sigmoid(x)
}

/// `f(x)` in f32.
#[inline(always)]
pub fn apply(f: UnaryFn, x: f32) -> f32 {
    match f {
        UnaryFn::Neg => -x,
        UnaryFn::Exp => x.exp(),
        UnaryFn::Log => x.ln(),
        UnaryFn::Sqrt => x.sqrt(),
        UnaryFn::Rsqrt => 1.0 / x.sqrt(),
        UnaryFn::Reciprocal => 1.0 / x,
        UnaryFn::Tanh => x.tanh(),
        UnaryFn::Relu => {
            if x > 0.0 {
                x
            } else {
                0.0
            }
        }
        UnaryFn::Sigmoid => sigmoid(x),
        UnaryFn::Erf => libm::erff(x),
        UnaryFn::Abs => x.abs(),
        UnaryFn::GeluTanh => {
            0.5 * x * (1.0 + fastmath::tanh(SQRT_2_OVER_PI * (x + GELU_C * x * x * x)))
        }
        UnaryFn::GeluErf => 0.5 * x * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2)),
        UnaryFn::Silu => x * sigmoid(x),
        UnaryFn::Square => x * x,
        UnaryFn::IsNan => f32::from(u8::from(x.is_nan())),
    }
}

/// `f'(x)` in f32.
#[inline(always)]
pub fn derivative(f: UnaryFn, x: f32) -> f32 {
    match f {
        UnaryFn::Neg => -1.0,
        UnaryFn::Exp => x.exp(),
        UnaryFn::Log => 1.0 / x,
        UnaryFn::Sqrt => 0.5 / x.sqrt(),
        UnaryFn::Rsqrt => -0.5 / (x * x.sqrt()),
        UnaryFn::Reciprocal => -1.0 / (x * x),
        UnaryFn::Tanh => {
            let t = x.tanh();
            1.0 - t * t
        }
        UnaryFn::Relu => f32::from(u8::from(x > 0.0)),
        UnaryFn::Sigmoid => {
            let s = sigmoid(x);
            s * (1.0 - s)
        }
        UnaryFn::Erf => FRAC_2_SQRT_PI * (-x * x).exp(),
        UnaryFn::Abs => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        UnaryFn::GeluTanh => gelu_tanh_derivative(x),
        UnaryFn::GeluErf => {
            0.5 * (1.0 + libm::erff(x * std::f32::consts::FRAC_1_SQRT_2))
                + x * FRAC_1_SQRT_2PI * (-0.5 * x * x).exp()
        }
        UnaryFn::Silu => {
            let s = sigmoid(x);
            s + x * s * (1.0 - s)
        }
        UnaryFn::Square => 2.0 * x,
        UnaryFn::IsNan => 0.0,
    }
}

#[inline(always)]
fn gelu_tanh_derivative(x: f32) -> f32 {
    let u = SQRT_2_OVER_PI * (x + GELU_C * x * x * x);
    let t = fastmath::tanh(u);
    0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * SQRT_2_OVER_PI * (1.0 + 3.0 * GELU_C * x * x)
}

/// `Unary { f }`.
pub fn unary(f: UnaryFn, x: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    if f == UnaryFn::IsNan {
        return is_nan(x, y);
    }
    match x.dtype() {
        DType::F32 => {
            let (xs, ys) = (x.f32()?, y.f32_mut()?);
            map_f32(f, xs, ys);
            Ok(())
        }
        DType::I64 | DType::I32 => unary_int(f, x, y),
        dt => crate::kbail!("unary.{f:?} is not defined on {dt}"),
    }
}

crate::multiversion! {
    /// Monomorphised loops so each function vectorises on its own.
    fn map_f32(f: UnaryFn, xs: &[f32], ys: &mut [f32]) {
        #[inline(always)]
        fn run(xs: &[f32], ys: &mut [f32], g: impl Fn(f32) -> f32) {
            for (y, &x) in ys.iter_mut().zip(xs) {
                *y = g(x);
            }
        }
        match f {
            UnaryFn::Neg => run(xs, ys, |x| -x),
            UnaryFn::Relu => run(xs, ys, |x| if x > 0.0 { x } else { 0.0 }),
            UnaryFn::Square => run(xs, ys, |x| x * x),
            UnaryFn::Abs => run(xs, ys, f32::abs),
            UnaryFn::GeluTanh => run(xs, ys, |x| apply(UnaryFn::GeluTanh, x)),
            _ => run(xs, ys, |x| apply(f, x)),
        }
    }
}

fn is_nan(x: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    if y.dtype() != DType::Bool {
        crate::kbail!("unary.is_nan writes bool, the output is {}", y.ty);
    }
    for i in 0..x.numel() {
        y.bytes[i] = u8::from(x.get_f64(i).is_nan());
    }
    Ok(())
}

fn unary_int(f: UnaryFn, x: &TensorRef, y: &mut TensorMut) -> KResult<()> {
    let g: fn(i64) -> i64 = match f {
        UnaryFn::Neg => |v| v.wrapping_neg(),
        UnaryFn::Abs => |v| v.wrapping_abs(),
        UnaryFn::Square => |v| v.wrapping_mul(v),
        UnaryFn::Relu => |v| v.max(0),
        _ => crate::kbail!("unary.{f:?} is not defined on integers"),
    };
    for i in 0..x.numel() {
        y.set_i64(i, g(x.get_i64(i)));
    }
    Ok(())
}

/// `UnaryGrad { f }`: `(x, dy) -> dy * f'(x)`.
pub fn unary_grad(f: UnaryFn, x: &TensorRef, dy: &TensorRef, dx: &mut TensorMut) -> KResult<()> {
    let (xs, dys) = (x.f32()?, dy.f32()?);
    let dxs = dx.f32_mut()?;
    if xs.len() != dys.len() || xs.len() != dxs.len() {
        crate::kbail!("x, dy and dx must have the same shape");
    }
    grad_f32(f, xs, dys, dxs);
    Ok(())
}

crate::multiversion! {
    /// `dx = dy * f'(x)`, one monomorphised loop per function.
    fn grad_f32(f: UnaryFn, xs: &[f32], dys: &[f32], dxs: &mut [f32]) {
        #[inline(always)]
        fn run(xs: &[f32], dys: &[f32], dxs: &mut [f32], g: impl Fn(f32) -> f32) {
            for ((d, &x), &dy) in dxs.iter_mut().zip(xs).zip(dys) {
                *d = dy * g(x);
            }
        }
        match f {
            UnaryFn::Relu => run(xs, dys, dxs, |x| if x > 0.0 { 1.0 } else { 0.0 }),
            UnaryFn::GeluTanh => run(xs, dys, dxs, gelu_tanh_derivative),
            _ => run(xs, dys, dxs, |x| derivative(f, x)),
        }
    }
}
