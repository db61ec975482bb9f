//! Convolution and pooling kernels: the forward against a direct
//! evaluation of the definition over random geometries (stride, uneven
//! padding, dilation, groups, bias), every gradient against finite
//! differences, and PyTorch's hand-checked values for pooling's edge rules.

use crate::support::grad::{Case, Rng};
use crate::support::run_cpu;
use fsdpc_ir::{DType, Op, TensorType, Window2d};
use fsdpc_runtime::HostTensor;
use proptest::prelude::*;

fn ty(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

/// A convolution's geometry drawn for a test.
#[derive(Clone, Debug)]
struct Geo {
    n: usize,
    groups: usize,
    c_per: usize,
    o_per: usize,
    hw: [usize; 2],
    window: Window2d,
    bias: bool,
}

fn geo() -> impl Strategy<Value = Geo> {
    (
        (1usize..3, 1usize..4, 1usize..3, 1usize..4),
        (3usize..8, 3usize..8),
        (1usize..4, 1usize..4, 1usize..3, 1usize..3),
        (0usize..3, 0usize..3, 0usize..2, 0usize..2),
        any::<bool>(),
    )
        .prop_filter_map(
            "the window must fit the padded input",
            |((n, groups, c_per, o_per), (h, w), (kh, kw, s, d), (pt, pl, pb, pr), bias)| {
                let window = Window2d {
                    kernel: [kh, kw],
                    stride: [s, 3 - s],
                    dilation: [d, 1],
                    pads: [pt, pl, pb, pr],
                    ceil_mode: false,
                };
                window.out_hw([h, w]).ok()?;
                Some(Geo {
                    n,
                    groups,
                    c_per,
                    o_per,
                    hw: [h, w],
                    window,
                    bias,
                })
            },
        )
}

/// `y[n, o, i, j] = b[o] + Σ x[n, g·cg + ci, i·s + a·d - p, ...] w[o, ci, a, b]`,
/// straight from the definition.
fn direct(g: &Geo, x: &[f32], w: &[f32], b: Option<&[f32]>) -> (Vec<usize>, Vec<f32>) {
    let (c, o) = (g.groups * g.c_per, g.groups * g.o_per);
    let [oh, ow] = g.window.out_hw(g.hw).unwrap();
    let [kh, kw] = g.window.kernel;
    let [h, wd] = g.hw;
    let mut y = vec![0f32; g.n * o * oh * ow];
    for n in 0..g.n {
        for oc in 0..o {
            let grp = oc / g.o_per;
            for i in 0..oh {
                for j in 0..ow {
                    let mut acc = b.map_or(0.0, |b| b[oc]);
                    for ci in 0..g.c_per {
                        let ch = grp * g.c_per + ci;
                        for a in 0..kh {
                            for bb in 0..kw {
                                let r = g.window.position(0, i, a);
                                let col = g.window.position(1, j, bb);
                                if r < 0 || col < 0 || r as usize >= h || col as usize >= wd {
                                    continue;
                                }
                                let xv = x[((n * c + ch) * h + r as usize) * wd + col as usize];
                                acc += xv * w[((oc * g.c_per + ci) * kh + a) * kw + bb];
                            }
                        }
                    }
                    y[((n * o + oc) * oh + i) * ow + j] = acc;
                }
            }
        }
    }
    (vec![g.n, o, oh, ow], y)
}

fn conv_op(g: &Geo) -> Op {
    Op::Conv {
        window: g.window,
        groups: g.groups,
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// The im2col kernel computes the definition.
    #[test]
    fn conv_forward_is_the_definition(g in geo(), seed in 0u64..1000) {
        let mut rng = Rng(seed);
        let (c, o) = (g.groups * g.c_per, g.groups * g.o_per);
        let [kh, kw] = g.window.kernel;
        let xs = [g.n, c, g.hw[0], g.hw[1]];
        let ws = [o, g.c_per, kh, kw];
        let x = rng.vec(xs.iter().product());
        let w = rng.vec(ws.iter().product());
        let b = rng.vec(o);
        let (shape, want) = direct(&g, &x, &w, g.bias.then_some(&b[..]));
        let mut ins = vec![HostTensor::from_f32(&xs, &x).unwrap(), HostTensor::from_f32(&ws, &w).unwrap()];
        if g.bias {
            ins.push(HostTensor::from_f32(&[o], &b).unwrap());
        }
        let got = run_cpu(conv_op(&g), &ins, &[ty(&shape)]).unwrap()[0].to_f32();
        for (k, (a, e)) in got.iter().zip(&want).enumerate() {
            prop_assert!((a - e).abs() <= 1e-5 * (1.0 + e.abs()), "element {k}: {a} vs {e}");
        }
    }

    /// Input, weight and bias gradients against finite differences.
    #[test]
    fn conv_gradients(g in geo(), seed in 0u64..1000) {
        let mut cs = Case::new(seed);
        let (c, o) = (g.groups * g.c_per, g.groups * g.o_per);
        let [kh, kw] = g.window.kernel;
        let x = cs.rand_param(&[g.n, c, g.hw[0], g.hw[1]]);
        let w = cs.rand_param(&[o, g.c_per, kh, kw]);
        let mut ins = vec![x, w];
        if g.bias {
            ins.push(cs.rand_param(&[o]));
        }
        let y = cs.op(conv_op(&g), &ins);
        prop_assert_eq!(cs.check(y), Ok(()));
    }
}

/// A depthwise and a pointwise convolution (the pointwise one multiplies
/// the input in place of an im2col matrix), and a ViT patch embedding.
#[test]
fn depthwise_pointwise_and_patch_convolutions() {
    for (seed, c, o, groups, k, stride, hw) in [
        (1, 3, 6, 3, 3, 1, 5),
        (2, 4, 3, 1, 1, 1, 4),
        (3, 3, 4, 1, 4, 4, 8),
    ] {
        let mut cs = Case::new(seed);
        let x = cs.rand_param(&[2, c, hw, hw]);
        let w = cs.rand_param(&[o, c / groups, k, k]);
        let b = cs.rand_param(&[o]);
        let window = Window2d {
            stride: [stride; 2],
            pads: [usize::from(k == 3); 4],
            ..Window2d::of_kernel([k, k])
        };
        let y = cs.op(Op::Conv { window, groups }, &[x, w, b]);
        cs.check(y)
            .unwrap_or_else(|e| panic!("k {k} groups {groups}: {e}"));
    }
}

/// Products of several images: 5x5 outputs put 3 images in a product
/// (64 columns or more), so 5 images make a product of 3 and one of 2; a
/// grouped 1x1 convolution on 2x2 maps takes all 4 images at once.
#[test]
fn several_images_per_product() {
    let mut cs = Case::new(21);
    let x = cs.rand_param(&[5, 2, 5, 5]);
    let w = cs.rand_param(&[3, 2, 3, 3]);
    let b = cs.rand_param(&[3]);
    let window = Window2d {
        pads: [1; 4],
        ..Window2d::of_kernel([3, 3])
    };
    let y = cs.op(Op::Conv { window, groups: 1 }, &[x, w, b]);
    cs.check(y).unwrap();
    let mut cs = Case::new(22);
    let x = cs.rand_param(&[4, 4, 2, 2]);
    let w = cs.rand_param(&[6, 2, 1, 1]);
    let y = cs.op(
        Op::Conv {
            window: Window2d::of_kernel([1, 1]),
            groups: 2,
        },
        &[x, w],
    );
    cs.check(y).unwrap();
}

/// Distinct values, so no window ties and the max is differentiable.
fn distinct(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n).map(|i| i as f32 * 0.37 - n as f32 * 0.15).collect();
    for i in (1..n).rev() {
        v.swap(i, rng.below(i as u64 + 1) as usize);
    }
    v
}

#[test]
fn pooling_gradients() {
    let cases = [
        Window2d {
            stride: [2, 2],
            pads: [1; 4],
            ..Window2d::of_kernel([3, 3])
        },
        Window2d {
            stride: [2, 2],
            ceil_mode: true,
            ..Window2d::of_kernel([2, 2])
        },
        Window2d {
            stride: [1, 2],
            pads: [0, 1, 1, 0],
            dilation: [2, 1],
            ..Window2d::of_kernel([2, 3])
        },
    ];
    for (k, window) in cases.into_iter().enumerate() {
        let mut cs = Case::new(k as u64);
        let vals = distinct(&mut cs.rng, 2 * 2 * 5 * 6);
        let x = cs.param(&[2, 2, 5, 6], vals);
        let y = cs.op(Op::MaxPool { window }, &[x]);
        cs.check(y)
            .unwrap_or_else(|e| panic!("max {window:?}: {e}"));
        for count_include_pad in [false, true] {
            let mut cs = Case::new(10 + k as u64);
            let x = cs.rand_param(&[2, 2, 5, 6]);
            let y = cs.op(
                Op::AvgPool {
                    window,
                    count_include_pad,
                },
                &[x],
            );
            cs.check(y)
                .unwrap_or_else(|e| panic!("avg {window:?} {count_include_pad}: {e}"));
        }
    }
}

/// `torch.nn.AvgPool2d(3, 2, padding=1, ceil_mode=True)` and its
/// `count_include_pad=False` twin on `arange(25).reshape(1, 1, 5, 5)`, and
/// `MaxPool2d(2, 2, ceil_mode=True)`: PyTorch's outputs.
#[test]
fn pooling_matches_pytorch_at_the_edges() {
    let x = HostTensor::from_f32(
        &[1, 1, 5, 5],
        &(0..25).map(|v| v as f32).collect::<Vec<_>>(),
    )
    .unwrap();
    let window = Window2d {
        stride: [2, 2],
        pads: [1; 4],
        ceil_mode: true,
        ..Window2d::of_kernel([3, 3])
    };
    let avg = |count_include_pad| {
        run_cpu(
            Op::AvgPool {
                window,
                count_include_pad,
            },
            std::slice::from_ref(&x),
            &[ty(&[1, 1, 3, 3])],
        )
        .unwrap()[0]
            .to_f32()
    };
    let with_pad = [
        12.0 / 9.0,
        3.0,
        24.0 / 9.0,
        7.0,
        12.0,
        9.0,
        8.0,
        13.0,
        84.0 / 9.0,
    ];
    let without = [3.0, 4.5, 6.0, 10.5, 12.0, 13.5, 18.0, 19.5, 21.0];
    for (got, want) in [(avg(true), with_pad), (avg(false), without)] {
        for (a, e) in got.iter().zip(want) {
            assert!((a - e).abs() < 1e-5, "{got:?} vs {want:?}");
        }
    }
    let max = Window2d {
        stride: [2, 2],
        ceil_mode: true,
        ..Window2d::of_kernel([2, 2])
    };
    let got = run_cpu(Op::MaxPool { window: max }, &[x], &[ty(&[1, 1, 3, 3])]).unwrap()[0].to_f32();
    assert_eq!(got, [6.0, 8.0, 9.0, 16.0, 18.0, 19.0, 21.0, 23.0, 24.0]);
}

/// A kernel given operands that do not fit its op fails with a message.
#[test]
fn mismatched_operands_are_an_error() {
    let x = HostTensor::from_f32(&[1, 2, 4, 4], &[0.0; 32]).unwrap();
    let w = HostTensor::from_f32(&[1, 2, 3], &[0.0; 6]).unwrap();
    let op = Op::Conv {
        window: Window2d::of_kernel([3, 3]),
        groups: 1,
    };
    let e = run_cpu(op, &[x, w], &[ty(&[1, 1, 2, 2])]).unwrap_err();
    assert!(e.contains("do not fit"), "{e}");
}
