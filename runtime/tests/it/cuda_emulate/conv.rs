//! Convolution and pooling lowered for the GPU against the CPU kernels:
//! kernels/conv.cu and kernels/pool.cu (and the `cast` of a half-precision
//! weight gradient) transcribed thread by thread, cuBLAS's products by the
//! parent's `gemm`, in f32 and bf16 with the workspace the planner's rule
//! gives. Pooling sums in the CPU's order, so its results are compared
//! exactly; the products within f32 (bf16) rounding.

use super::{both, int, ptr, Mem};
use fsdpc_ir::{DType, Op, TensorType, Window2d};
use fsdpc_runtime::targets::cuda::device::{Arg, Launch};
use fsdpc_runtime::targets::cuda::geometry::Win;
use fsdpc_runtime::targets::cuda::ops::{lower, Operand};
use fsdpc_runtime::HostTensor;

fn dt(a: &Arg) -> DType {
    match int(a) {
        0 => DType::F32,
        1 => DType::Bf16,
        2 => DType::F16,
        other => panic!("dtype code {other} is not emulated"),
    }
}

fn win(a: &Arg) -> Win {
    match a {
        Arg::Win(w) => *w,
        other => panic!("not a Win: {other:?}"),
    }
}

/// Input position of tap `a` of output `i` along one axis of `g`.
fn pos(g: &Win, axis: usize, i: i64, a: i64) -> i64 {
    i * g.stride[axis] as i64 + a * g.dilation[axis] as i64 - g.pads[axis] as i64
}

/// `pool_tap`: the in-plane index of tap `(a, b)` of output `(i, j)`.
fn tap(g: &Win, i: i64, j: i64, a: i64, b: i64) -> Option<i64> {
    let (r, c) = (pos(g, 0, i, a), pos(g, 1, j, b));
    let [h, w] = g.hw.map(i64::from);
    ((0..h).contains(&r) && (0..w).contains(&c)).then_some(r * w + c)
}

/// `pool_arg_max`.
fn arg_max(m: &mut Mem, g: &Win, x: u64, xdt: DType, base: i64, i: i64, j: i64) -> Option<i64> {
    let mut best: Option<(i64, f32)> = None;
    for a in 0..g.kernel[0] as i64 {
        for b in 0..g.kernel[1] as i64 {
            let Some(k) = tap(g, i, j, a, b) else {
                continue;
            };
            let v = m.ld(x, xdt, base + k);
            match best {
                Some((_, bv)) if !(v > bv || v.is_nan()) => {}
                _ => best = Some((k, v)),
            }
        }
    }
    best.map(|b| b.0)
}

/// `pool_divisor`.
fn divisor(g: &Win, i: i64, j: i64, include_pad: bool) -> f32 {
    let count = |axis: usize, o: i64| {
        let (p0, p1, len) = (
            g.pads[axis] as i64,
            g.pads[axis + 2] as i64,
            g.hw[axis] as i64,
        );
        let (lo, hi) = if include_pad {
            (-p0, len + p1)
        } else {
            (0, len)
        };
        (0..g.kernel[axis] as i64)
            .filter(|&a| (lo..hi).contains(&pos(g, axis, o, a)))
            .count()
    };
    (count(0, i) * count(1, j)) as f32
}

/// `pool_reach`: the outputs along `axis` whose windows may read input
/// position `r`.
fn reach(g: &Win, axis: usize, r: i64) -> std::ops::Range<i64> {
    let (s, d, k, p) = (
        g.stride[axis] as i64,
        g.dilation[axis] as i64,
        g.kernel[axis] as i64,
        g.pads[axis] as i64,
    );
    let (top, out) = (r + p, g.out[axis] as i64);
    let first = top - (k - 1) * d;
    let lo = if first <= 0 { 0 } else { (first + s - 1) / s };
    lo..(top / s + 1).min(out)
}

/// Emulates `l` when it is one of this file's kernels; false otherwise.
pub(super) fn launch(m: &mut Mem, l: &Launch) -> bool {
    let a = &l.args;
    match l.kernel {
        "cast" => {
            let (x, xdt, y, ydt) = (ptr(&a[0]), dt(&a[1]), ptr(&a[2]), dt(&a[3]));
            for i in 0..int(&a[4]) {
                let v = m.ld(x, xdt, i);
                m.st(y, ydt, i, v);
            }
        }
        "conv_bias" => {
            let (b, bdt, y, ydt) = (ptr(&a[0]), dt(&a[1]), ptr(&a[2]), dt(&a[3]));
            let (n, o, pix) = (int(&a[4]), int(&a[5]), int(&a[6]));
            for i in 0..n {
                let v = m.ld(b, bdt, (i / pix) % o);
                m.st(y, ydt, i, v);
            }
        }
        "conv_im2col" => {
            let (x, xdt, cols, cdt) = (ptr(&a[0]), dt(&a[1]), ptr(&a[2]), dt(&a[3]));
            let (cg, g) = (int(&a[4]), win(&a[5]));
            let ([h, w], [oh, ow]) = (g.hw.map(i64::from), g.out.map(i64::from));
            let [kh, kw] = g.kernel.map(i64::from);
            let pix = oh * ow;
            for idx in 0..cg * kh * kw * pix {
                let (t, p) = (idx / pix, idx % pix);
                let (ch, ta, tb) = (t / (kh * kw), (t % (kh * kw)) / kw, t % kw);
                let (r, c) = (pos(&g, 0, p / ow, ta), pos(&g, 1, p % ow, tb));
                let v = if (0..h).contains(&r) && (0..w).contains(&c) {
                    m.ld(x, xdt, (ch * h + r) * w + c)
                } else {
                    0.0
                };
                m.st(cols, cdt, idx, v);
            }
        }
        "conv_col2im" => {
            let (cols, dx, dxdt) = (ptr(&a[0]), ptr(&a[1]), dt(&a[2]));
            let (cg, g) = (int(&a[3]), win(&a[4]));
            let ([h, w], [oh, ow]) = (g.hw.map(i64::from), g.out.map(i64::from));
            let ([kh, kw], [sh, sw]) = (g.kernel.map(i64::from), g.stride.map(i64::from));
            let ([dh, dw], [pt, pl]) = (g.dilation.map(i64::from), [g.pads[0], g.pads[1]]);
            for idx in 0..cg * h * w {
                let (ch, r, c) = (idx / (h * w), (idx % (h * w)) / w, idx % w);
                let mut s = 0f32;
                for ta in 0..kh {
                    let ro = r + pt as i64 - ta * dh;
                    if ro < 0 {
                        break;
                    }
                    if ro % sh != 0 || ro / sh >= oh {
                        continue;
                    }
                    for tb in 0..kw {
                        let co = c + pl as i64 - tb * dw;
                        if co < 0 {
                            break;
                        }
                        if co % sw != 0 || co / sw >= ow {
                            continue;
                        }
                        let t = (ch * kh + ta) * kw + tb;
                        s += m.f32(cols, t * oh * ow + (ro / sh) * ow + co / sw);
                    }
                }
                m.st(dx, dxdt, idx, s);
            }
        }
        "maxpool_fwd" | "avgpool_fwd" => {
            let (x, xdt, y, ydt) = (ptr(&a[0]), dt(&a[1]), ptr(&a[2]), dt(&a[3]));
            let (planes, g) = (int(&a[4]), win(&a[5]));
            let ([h, w], [oh, ow]) = (g.hw.map(i64::from), g.out.map(i64::from));
            for idx in 0..planes * oh * ow {
                let (base, i, j) = ((idx / (oh * ow)) * h * w, (idx % (oh * ow)) / ow, idx % ow);
                let v = if l.kernel == "maxpool_fwd" {
                    arg_max(m, &g, x, xdt, base, i, j)
                        .map_or(f32::NEG_INFINITY, |k| m.ld(x, xdt, base + k))
                } else {
                    let mut s = 0f32;
                    for ta in 0..g.kernel[0] as i64 {
                        for tb in 0..g.kernel[1] as i64 {
                            if let Some(k) = tap(&g, i, j, ta, tb) {
                                s += m.ld(x, xdt, base + k);
                            }
                        }
                    }
                    s / divisor(&g, i, j, int(&a[6]) != 0)
                };
                m.st(y, ydt, idx, v);
            }
        }
        "maxpool_bwd" | "avgpool_bwd" => {
            let max = l.kernel == "maxpool_bwd";
            let k = if max { 2 } else { 0 };
            let (x, xdt) = (ptr(&a[0]), dt(&a[1]));
            let (dy, dydt, dx, dxdt) = (ptr(&a[k]), dt(&a[k + 1]), ptr(&a[k + 2]), dt(&a[k + 3]));
            let (planes, g) = (int(&a[k + 4]), win(&a[k + 5]));
            let ([h, w], [oh, ow]) = (g.hw.map(i64::from), g.out.map(i64::from));
            for idx in 0..planes * h * w {
                let (q, e) = (idx / (h * w), idx % (h * w));
                let (r, c) = (e / w, e % w);
                let [dh, dw] = g.dilation.map(i64::from);
                let mut s = 0f32;
                for i in reach(&g, 0, r) {
                    let ra = r + g.pads[0] as i64 - i * g.stride[0] as i64;
                    for j in reach(&g, 1, c) {
                        let ca = c + g.pads[1] as i64 - j * g.stride[1] as i64;
                        let at = q * oh * ow + i * ow + j;
                        if max {
                            if arg_max(m, &g, x, xdt, q * h * w, i, j) == Some(e) {
                                s += m.ld(dy, dydt, at);
                            }
                        } else if ra % dh == 0 && ca % dw == 0 {
                            s += m.ld(dy, dydt, at) / divisor(&g, i, j, int(&a[k + 6]) != 0);
                        }
                    }
                }
                m.st(dx, dxdt, idx, s);
            }
        }
        _ => return false,
    }
    true
}

/// Deterministic values of `dt` in [-1, 1) (f32 first, then rounded).
fn t(dt: DType, shape: &[usize], seed: u32) -> HostTensor {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| {
            let h = (i as u32 ^ seed.wrapping_mul(0x9E37_79B9)).wrapping_mul(2654435761);
            (h >> 16) as f32 / 32768.0 - 1.0
        })
        .collect();
    let f = HostTensor::from_f32(shape, &v).unwrap();
    match dt {
        DType::F32 => f,
        DType::Bf16 => {
            let b: Vec<half::bf16> = v.iter().map(|&x| half::bf16::from_f32(x)).collect();
            HostTensor::from_bytes(
                TensorType::new(dt, shape.to_vec()),
                bytemuck::cast_slice(&b),
            )
            .unwrap()
        }
        _ => unreachable!("f32 and bf16 only"),
    }
}

/// The output types of `op` on `ins`.
fn outs(op: &Op, ins: &[HostTensor]) -> Vec<TensorType> {
    let tys: Vec<&TensorType> = ins.iter().map(|t| &t.ty).collect();
    fsdpc_ir::ops::infer(op, &tys).unwrap_or_else(|e| panic!("{}: {e}", op.name()))
}

/// The emulated lowering against the CPU: within `tol` relative to the
/// output's largest magnitude (0: bit for bit, NaN matching NaN).
fn check(op: Op, ins: &[HostTensor], tol: f32) {
    let name = format!("{op:?}");
    let types = outs(&op, ins);
    let (got, want) = both(op, ins, &types);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let top = w.iter().fold(1f32, |m, v| m.max(v.abs()));
        for (i, (x, y)) in g.iter().zip(w).enumerate() {
            let ok = (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * top;
            assert!(ok, "{name} output {k} [{i}]: lowered {x}, cpu {y}");
        }
    }
}

fn window(
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    pads: [usize; 4],
) -> Window2d {
    Window2d {
        kernel,
        stride,
        dilation,
        pads,
        ceil_mode: false,
    }
}

/// `(x, w, groups, window, bias)`: strided, dilated and unevenly padded
/// grouped convolutions, a depthwise one, pointwise ones (grouped, with
/// and without bias: the strided-batched products) and a 1x1 one with a
/// stride (unfolded).
type Case = ([usize; 4], [usize; 4], usize, Window2d, bool);

fn cases() -> Vec<Case> {
    vec![
        (
            [2, 4, 7, 6],
            [6, 2, 3, 2],
            2,
            window([3, 2], [2, 1], [1, 2], [1, 0, 2, 1]),
            true,
        ),
        (
            [2, 3, 5, 5],
            [3, 1, 3, 3],
            3,
            window([3, 3], [1, 1], [1, 1], [1; 4]),
            false,
        ),
        (
            [2, 4, 3, 3],
            [5, 4, 1, 1],
            1,
            Window2d::of_kernel([1, 1]),
            true,
        ),
        (
            [3, 4, 2, 3],
            [6, 2, 1, 1],
            2,
            Window2d::of_kernel([1, 1]),
            false,
        ),
        (
            [2, 3, 5, 4],
            [2, 3, 1, 1],
            1,
            window([1, 1], [2, 2], [1, 1], [0; 4]),
            true,
        ),
        (
            [1, 2, 6, 6],
            [4, 2, 3, 3],
            1,
            window([3, 3], [2, 2], [2, 2], [2; 4]),
            false,
        ),
    ]
}

/// Each case's forward, input gradient and weight gradient.
fn convolutions(dt: DType, tol: f32) {
    for (k, (xs, ws, groups, w, bias)) in cases().into_iter().enumerate() {
        let s = 10 * k as u32;
        let (x, wt) = (t(dt, &xs, s), t(dt, &ws, s + 1));
        let fwd = Op::Conv { window: w, groups };
        let mut ins = vec![x.clone(), wt.clone()];
        if bias {
            ins.push(t(dt, &[ws[0]], s + 2));
        }
        let ys = outs(&fwd, &ins);
        check(fwd, &ins, tol);
        let dy = t(dt, &ys[0].shape.0, s + 3);
        let gi = Op::ConvGradInput {
            window: w,
            groups,
            input_hw: [xs[2], xs[3]],
        };
        check(gi, &[wt, dy.clone()], tol);
        check(Op::ConvGradWeight { window: w, groups }, &[x, dy], tol);
    }
}

#[test]
fn convolutions_lower_to_the_cpus_products_in_f32() {
    convolutions(DType::F32, 1e-5);
}

/// bf16 operands: the unfolded matrix in bf16, the products accumulated in
/// f32 (the weight gradient over the images in the workspace, then cast).
#[test]
fn convolutions_lower_to_the_cpus_products_in_bf16() {
    convolutions(DType::Bf16, 8e-3);
}

/// Max pooling with padding, a stride, dilation and a ceil-mode window;
/// average pooling with and without the padding counted, in ceil mode
/// with uneven padding: forward and backward, bit for bit.
#[test]
fn pooling_lowers_to_the_cpus_windows_exactly() {
    let ceil = |mut w: Window2d| {
        w.ceil_mode = true;
        w
    };
    let windows = [
        window([3, 3], [2, 2], [1, 1], [1; 4]),
        ceil(window([2, 2], [2, 2], [1, 1], [0; 4])),
        window([2, 3], [1, 2], [2, 1], [1, 0, 0, 1]),
        ceil(window([3, 2], [2, 3], [1, 1], [1, 1, 0, 1])),
    ];
    for dt in [DType::F32, DType::Bf16] {
        for (k, w) in windows.into_iter().enumerate() {
            let x = t(dt, &[2, 3, 7, 8], 40 + k as u32);
            let dy = t(
                dt,
                &outs(&Op::MaxPool { window: w }, &[x.clone()])[0].shape.0,
                50,
            );
            check(Op::MaxPool { window: w }, &[x.clone()], 0.0);
            check(Op::MaxPoolGrad { window: w }, &[x.clone(), dy.clone()], 0.0);
            for count_include_pad in [false, true] {
                let avg = Op::AvgPool {
                    window: w,
                    count_include_pad,
                };
                check(avg, &[x.clone()], 0.0);
                let grad = Op::AvgPoolGrad {
                    window: w,
                    count_include_pad,
                    input_hw: [7, 8],
                };
                check(grad, &[dy.clone()], 0.0);
            }
        }
    }
}

/// Ties keep the first maximum in row-major order and a NaN replaces any
/// value (the last NaN of a window wins), so the gradient goes where the
/// CPU's does.
#[test]
fn max_pooling_routes_ties_and_nans_as_the_cpu() {
    let v = [
        1.0,
        1.0,
        0.5,
        1.0,
        f32::NAN,
        2.0,
        f32::NAN,
        2.0,
        3.0,
        3.0,
        -1.0,
        f32::NAN,
        0.0,
        0.0,
        0.0,
        0.0,
    ];
    let x = HostTensor::from_f32(&[1, 1, 4, 4], &v).unwrap();
    for w in [
        window([2, 2], [1, 1], [1, 1], [0; 4]),
        window([3, 3], [1, 1], [1, 1], [1; 4]),
    ] {
        let dy = t(
            DType::F32,
            &outs(&Op::MaxPool { window: w }, &[x.clone()])[0].shape.0,
            7,
        );
        check(Op::MaxPool { window: w }, &[x.clone()], 0.0);
        check(Op::MaxPoolGrad { window: w }, &[x.clone(), dy], 0.0);
    }
}

/// A missing or short workspace and outputs of the wrong type are errors
/// naming what is wrong.
#[test]
fn bad_convolution_and_pooling_operands_are_errors() {
    let (x, w) = (
        t(DType::F32, &[1, 2, 5, 5], 1),
        t(DType::F32, &[3, 2, 3, 3], 2),
    );
    let op = Op::Conv {
        window: Window2d::of_kernel([3, 3]),
        groups: 1,
    };
    let y = TensorType::new(DType::F32, vec![1, 3, 3, 3]);
    let xs = [
        Operand {
            ptr: 1 << 20,
            ty: &x.ty,
        },
        Operand {
            ptr: 1 << 21,
            ty: &w.ty,
        },
    ];
    let ys = [Operand {
        ptr: 1 << 22,
        ty: &y,
    }];
    let e = lower(&op, &xs, &ys, None, 0, 0).unwrap_err();
    assert!(e.contains("needs 648 bytes of workspace"), "{e}");
    let e = lower(&op, &xs, &ys, Some((1 << 23, 100)), 0, 0).unwrap_err();
    assert!(e.contains("the plan gave 100"), "{e}");
    assert!(lower(&op, &xs, &ys, Some((1 << 23, 648)), 0, 0).is_ok());
    let wrong = TensorType::new(DType::F32, vec![1, 3, 4, 3]);
    let ys = [Operand {
        ptr: 1 << 22,
        ty: &wrong,
    }];
    let e = lower(&op, &xs, &ys, Some((1 << 23, 648)), 0, 0).unwrap_err();
    assert!(
        e.contains("f32[1, 3, 4, 3]") && e.contains("f32[1, 3, 3, 3]"),
        "{e}"
    );
    let e = lower(&op, &xs[..1], &ys, None, 0, 0).unwrap_err();
    assert!(e.contains("expects 2 or 3 inputs"), "{e}");
    let pool = Op::MaxPool {
        window: Window2d::of_kernel([2, 2]),
    };
    let e = lower(&pool, &xs[1..], &ys, None, 0, 0).unwrap_err();
    assert!(e.contains("are not the"), "{e}");
}

/// Empty batches and channel-less groups: no products, the outputs
/// written all the same (zero, or the bias).
#[test]
fn convolutions_without_products_write_zeros_or_the_bias() {
    let w3 = window([3, 3], [1, 1], [1, 1], [1; 4]);
    let conv = Op::Conv {
        window: w3,
        groups: 1,
    };
    let (x0, w0, b) = (
        t(DType::F32, &[2, 0, 4, 4], 1),
        t(DType::F32, &[3, 0, 3, 3], 2),
        t(DType::F32, &[3], 3),
    );
    check(conv.clone(), &[x0.clone(), w0.clone()], 0.0);
    check(conv, &[x0, w0, b], 0.0);
    let gw = Op::ConvGradWeight {
        window: w3,
        groups: 1,
    };
    check(
        gw,
        &[
            t(DType::Bf16, &[0, 2, 4, 4], 4),
            t(DType::Bf16, &[0, 3, 4, 4], 5),
        ],
        0.0,
    );
    let gi = Op::ConvGradInput {
        window: w3,
        groups: 1,
        input_hw: [4, 4],
    };
    check(
        gi,
        &[
            t(DType::F32, &[0, 2, 3, 3], 6),
            t(DType::F32, &[2, 0, 4, 4], 7),
        ],
        0.0,
    );
}
