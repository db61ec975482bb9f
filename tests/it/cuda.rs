//! The CUDA backend against the CPU backend, on a GPU (feature `cuda`).
//! Each test skips with the reason printed when there is no driver or GPU
//! (`Device::open` fails), so `cargo test --features cuda` passes on
//! machines without one; `scripts/gpu-check.sh` runs them where there is.
//!
//! Kernels: every op family on the same inputs through `CpuBackend::run`
//! and `cuda::single::run_node` (convolution and pooling in `cuda/conv.rs`).
//! Tolerances, per output element, `|gpu -
//! cpu| <= atol + rtol * |cpu|`: f32 outputs rtol 1e-4, atol 1e-5 (the CPU
//! uses fast `exp`/`tanh` approximations and other summation orders,
//! cuBLAS another blocking); bf16 outputs rtol 1.6e-2 (two bf16 ulps),
//! atol 1e-2; f16 rtol 2e-3, atol 1e-3; integers and moved data exactly.
//! Training: a full step at world 1, CPU thread rank against GPU rank, f32
//! losses within 1e-4 relative and parameters within 1e-3; bf16 mixed
//! precision losses within 2e-2.
#![cfg(feature = "cuda")]
#![allow(clippy::cloned_ref_to_slice_refs)]

use crate::support;

use fsdpc_ir::{
    BinaryFn, CompareFn, DType, LogicalFn, ModuleId, Node, Op, Optimizer, Phase, ReduceFn,
    TensorType, UnaryFn,
};
use fsdpc_runtime::targets::cuda::device::Device;
use fsdpc_runtime::targets::cuda::single::run_node;
use fsdpc_runtime::targets::cuda::{train_cuda, CudaConfig, CudaError, NcclMode};
use fsdpc_runtime::{Backend, CpuBackend, HostTensor, KernelCtx, TrainOptions, Workspace};

mod conv;

/// Whether a missing GPU fails the tests instead of skipping them
/// (`FSDPC_REQUIRE_GPU`, set by `scripts/gpu-check.sh` on a GPU machine).
fn required() -> bool {
    std::env::var_os("FSDPC_REQUIRE_GPU").is_some()
}

/// The GPU, or `None` with the reason printed.
fn gpu() -> Option<Device> {
    match Device::open(0) {
        Ok(d) => Some(d),
        Err(e) if required() => panic!("FSDPC_REQUIRE_GPU is set but there is no usable GPU: {e}"),
        Err(e) => {
            eprintln!("skipping: no usable GPU: {e}");
            None
        }
    }
}

/// Deterministic values in [lo, hi).
fn values(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            lo + (hi - lo) * ((s >> 40) as f32 / (1u64 << 24) as f32)
        })
        .collect()
}

fn ty(dt: DType, shape: &[usize]) -> TensorType {
    TensorType::new(dt, shape.to_vec())
}

/// A float tensor of `dt` with values in [lo, hi).
fn rand(dt: DType, shape: &[usize], seed: u64, lo: f32, hi: f32) -> HostTensor {
    let n = shape.iter().product();
    let f = HostTensor::from_f32(shape, &values(n, seed, lo, hi)).unwrap();
    cast(&f, dt)
}

fn cast(x: &HostTensor, dt: DType) -> HostTensor {
    if x.ty.dtype == dt {
        return x.clone();
    }
    let node = node(Op::Cast { to: dt }, &[ty(dt, &x.ty.shape.0)]);
    cpu(&node, &[x.clone()], &KernelCtx::default())
        .unwrap()
        .remove(0)
}

fn ints(shape: &[usize], v: &[i64]) -> HostTensor {
    HostTensor::from_i64(shape, v).unwrap()
}

fn node(op: Op, outs: &[TensorType]) -> Node {
    Node {
        op,
        name: "t".into(),
        module: ModuleId::ROOT,
        phase: Phase::Forward,
        outputs: outs.to_vec(),
    }
}

fn ws_bytes(node: &Node, ins: &[HostTensor]) -> u64 {
    let in_types: Vec<&TensorType> = ins.iter().map(|t| &t.ty).collect();
    fsdpc_plan::workspace::kernel_workspace(&node.op, &in_types, &node.outputs)
}

fn cpu(node: &Node, ins: &[HostTensor], ctx: &KernelCtx) -> Result<Vec<HostTensor>, String> {
    let mut out: Vec<HostTensor> = node
        .outputs
        .iter()
        .map(|t| HostTensor::zeros(t.clone()))
        .collect();
    let views: Vec<_> = ins.iter().map(|t| t.view()).collect();
    let mut ov: Vec<_> = out.iter_mut().map(|t| t.view_mut()).collect();
    let mut scratch = vec![0u64; (ws_bytes(node, ins) as usize).div_ceil(8)];
    CpuBackend::default()
        .run(
            node,
            &views,
            &mut ov,
            ctx,
            &mut Workspace::new(bytemuck::cast_slice_mut(&mut scratch)),
        )
        .map_err(|e| e.0)?;
    Ok(out)
}

/// (rtol, atol) of a comparison in `dt`.
fn tolerance(dt: DType) -> (f64, f64) {
    match dt {
        DType::F32 => (1e-4, 1e-5),
        DType::Bf16 => (1.6e-2, 1e-2),
        DType::F16 => (2e-3, 1e-3),
        _ => (0.0, 0.0),
    }
}

/// Runs `op` on both backends and compares every output; `scale` widens
/// the tolerance (a sum of many terms).
fn check_with(
    dev: &Device,
    op: Op,
    ins: &[HostTensor],
    outs: &[TensorType],
    ctx: &KernelCtx,
    scale: f64,
) {
    let n = node(op.clone(), outs);
    let want = cpu(&n, ins, ctx).unwrap_or_else(|e| panic!("cpu {}: {e}", op.name()));
    let got = run_node(dev, &n, ins, ctx, ws_bytes(&n, ins))
        .unwrap_or_else(|e| panic!("cuda {}: {e}", op.name()));
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        let (rtol, atol) = tolerance(w.ty.dtype);
        let (rtol, atol) = (rtol * scale, atol * scale);
        let (gv, wv) = if w.ty.dtype.is_float() {
            (
                g.to_f32().iter().map(|&x| x as f64).collect::<Vec<_>>(),
                w.to_f32().iter().map(|&x| x as f64).collect::<Vec<_>>(),
            )
        } else {
            (
                g.to_i64().iter().map(|&x| x as f64).collect(),
                w.to_i64().iter().map(|&x| x as f64).collect(),
            )
        };
        assert_eq!(gv.len(), wv.len());
        let mut worst = 0.0f64;
        for (i, (a, b)) in gv.iter().zip(&wv).enumerate() {
            let ok = (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= atol + rtol * b.abs();
            if !ok {
                panic!(
                    "{} output {k} element {i}: gpu {a} cpu {b} (rtol {rtol}, atol {atol}); ins {:?}",
                    op.name(),
                    ins.iter().map(|t| t.ty.to_string()).collect::<Vec<_>>()
                );
            }
            if (a - b).abs() > worst {
                worst = (a - b).abs();
            }
        }
        eprintln!("{} out {k} ({}): max |diff| {:.3e}", op.name(), w.ty, worst);
    }
}

fn check(dev: &Device, op: Op, ins: &[HostTensor], outs: &[TensorType]) {
    check_with(dev, op, ins, outs, &KernelCtx::default(), 1.0)
}

const UNARY: [UnaryFn; 16] = [
    UnaryFn::Neg,
    UnaryFn::Exp,
    UnaryFn::Log,
    UnaryFn::Sqrt,
    UnaryFn::Rsqrt,
    UnaryFn::Reciprocal,
    UnaryFn::Tanh,
    UnaryFn::Relu,
    UnaryFn::Sigmoid,
    UnaryFn::Erf,
    UnaryFn::Abs,
    UnaryFn::GeluTanh,
    UnaryFn::GeluErf,
    UnaryFn::Silu,
    UnaryFn::Square,
    UnaryFn::IsNan,
];

fn positive_only(f: UnaryFn) -> bool {
    matches!(
        f,
        UnaryFn::Log | UnaryFn::Sqrt | UnaryFn::Rsqrt | UnaryFn::Reciprocal
    )
}

#[test]
fn unary_functions_and_gradients_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    for dt in [DType::F32, DType::Bf16, DType::F16] {
        for f in UNARY {
            let (lo, hi) = if positive_only(f) {
                (0.1, 3.0)
            } else {
                (-3.0, 3.0)
            };
            let x = rand(dt, &[3, 77], 1, lo, hi);
            let out = if f == UnaryFn::IsNan { DType::Bool } else { dt };
            check(&dev, Op::Unary { f }, &[x.clone()], &[ty(out, &[3, 77])]);
            if f != UnaryFn::IsNan {
                let dy = rand(dt, &[3, 77], 2, -1.0, 1.0);
                check(&dev, Op::UnaryGrad { f }, &[x, dy], &[ty(dt, &[3, 77])]);
            }
        }
    }
    let x = ints(&[5], &[-3, 0, 7, i64::MIN + 1, 12]);
    for f in [UnaryFn::Neg, UnaryFn::Abs, UnaryFn::Square, UnaryFn::Relu] {
        check(&dev, Op::Unary { f }, &[x.clone()], &[ty(DType::I64, &[5])]);
    }
}

#[test]
fn binary_compare_logical_and_where_broadcast_as_the_cpu() {
    let Some(dev) = gpu() else { return };
    let out = [4, 3, 5];
    for dt in [DType::F32, DType::Bf16] {
        let a = rand(dt, &out, 3, 0.5, 2.0);
        let b = rand(dt, &[3, 1], 4, 0.5, 2.0);
        for f in [
            BinaryFn::Add,
            BinaryFn::Sub,
            BinaryFn::Mul,
            BinaryFn::Div,
            BinaryFn::Pow,
            BinaryFn::Max,
            BinaryFn::Min,
        ] {
            check(
                &dev,
                Op::Binary { f },
                &[a.clone(), b.clone()],
                &[ty(dt, &out)],
            );
            check(
                &dev,
                Op::Binary { f },
                &[b.clone(), a.clone()],
                &[ty(dt, &out)],
            );
        }
        for f in [
            CompareFn::Equal,
            CompareFn::Less,
            CompareFn::LessOrEqual,
            CompareFn::Greater,
            CompareFn::GreaterOrEqual,
        ] {
            check(
                &dev,
                Op::Compare { f },
                &[a.clone(), b.clone()],
                &[ty(DType::Bool, &out)],
            );
        }
    }
    let ia = ints(&[2, 3], &[1, -2, 3, 40, 5, -6]);
    let ib = ints(&[3], &[2, 3, -4]);
    for f in [
        BinaryFn::Add,
        BinaryFn::Sub,
        BinaryFn::Mul,
        BinaryFn::Div,
        BinaryFn::Pow,
        BinaryFn::Max,
        BinaryFn::Min,
    ] {
        check(
            &dev,
            Op::Binary { f },
            &[ia.clone(), ib.clone()],
            &[ty(DType::I64, &[2, 3])],
        );
    }
    check(
        &dev,
        Op::Compare {
            f: CompareFn::Equal,
        },
        &[ia.clone(), ib.clone()],
        &[ty(DType::Bool, &[2, 3])],
    );
    let c = cast(&rand(DType::F32, &out, 5, -1.0, 1.0), DType::Bool);
    let d = cast(&rand(DType::F32, &[5], 6, -1.0, 1.0), DType::Bool);
    for f in [LogicalFn::And, LogicalFn::Or, LogicalFn::Xor] {
        check(
            &dev,
            Op::Logical { f },
            &[c.clone(), d.clone()],
            &[ty(DType::Bool, &out)],
        );
    }
    check(&dev, Op::Not, &[c.clone()], &[ty(DType::Bool, &out)]);
    let a = rand(DType::F32, &out, 7, -1.0, 1.0);
    let b = rand(DType::F32, &[1, 5], 8, -1.0, 1.0);
    check(&dev, Op::Where, &[c.clone(), a, b], &[ty(DType::F32, &out)]);
    let i = ints(&[5], &[1, 2, 3, 4, 5]);
    let j = ints(&[1], &[-9]);
    check(&dev, Op::Where, &[c, i, j], &[ty(DType::I64, &out)]);
}

#[test]
fn integer_division_by_zero_is_an_error_not_a_panic() {
    let Some(dev) = gpu() else { return };
    let n = node(Op::Binary { f: BinaryFn::Div }, &[ty(DType::I64, &[2])]);
    let e = run_node(
        &dev,
        &n,
        &[ints(&[2], &[1, 2]), ints(&[2], &[1, 0])],
        &KernelCtx::default(),
        0,
    )
    .unwrap_err();
    assert!(matches!(e, CudaError::DeviceFault { .. }), "{e}");
}

#[test]
fn casts_between_every_dtype_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    let x = rand(DType::F32, &[1000], 9, -300.0, 300.0);
    let all = [
        DType::F32,
        DType::Bf16,
        DType::F16,
        DType::I64,
        DType::I32,
        DType::Bool,
    ];
    for from in all {
        let src = cast(&x, from);
        for to in all {
            check(&dev, Op::Cast { to }, &[src.clone()], &[ty(to, &[1000])]);
        }
    }
}

#[test]
fn dropout_draws_the_cpus_mask_exactly() {
    let Some(dev) = gpu() else { return };
    let x = rand(DType::F32, &[4, 33], 10, -1.0, 1.0);
    let ctx = KernelCtx {
        step: 3,
        sample_offset: 8,
        seed: 11,
        eval: false,
    };
    let op = Op::Dropout {
        p: 0.3,
        seed: 5,
        whole_sample: None,
    };
    let n = node(op, &[ty(DType::F32, &[4, 33])]);
    let want = cpu(&n, &[x.clone()], &ctx).unwrap();
    let got = run_node(&dev, &n, &[x.clone()], &ctx, 0).unwrap();
    assert_eq!(got[0].to_f32(), want[0].to_f32());
    // A sequence-parallel chunk: the second of two, 132 elements into a
    // whole of 264 elements a sample, its offset read on the device.
    let op = Op::Dropout {
        p: 0.3,
        seed: 5,
        whole_sample: Some(264),
    };
    let n = node(op, &[ty(DType::F32, &[4, 33])]);
    let ins = [x, ints(&[1], &[132])];
    let want = cpu(&n, &ins, &ctx).unwrap();
    let got = run_node(&dev, &n, &ins, &ctx, 0).unwrap();
    assert_eq!(got[0].to_f32(), want[0].to_f32());
}

/// `(a, b, trans_a, trans_b, out)` shapes of a product.
type Product = (
    &'static [usize],
    &'static [usize],
    bool,
    bool,
    &'static [usize],
);

#[test]
fn matrix_products_match_the_cpu_in_f32_and_bf16() {
    let Some(dev) = gpu() else { return };
    let cases: [Product; 8] = [
        (&[7, 5], &[5, 3], false, false, &[7, 3]),
        (&[5, 7], &[5, 3], true, false, &[7, 3]),
        (&[7, 5], &[3, 5], false, true, &[7, 3]),
        (&[5, 7], &[3, 5], true, true, &[7, 3]),
        (&[2, 7, 5], &[5, 3], false, false, &[2, 7, 3]),
        (&[2, 7, 5], &[2, 5, 3], false, false, &[2, 7, 3]),
        (&[2, 1, 7, 5], &[1, 3, 5, 4], false, false, &[2, 3, 7, 4]),
        (&[5], &[5, 3], false, false, &[3]),
    ];
    for dt in [DType::F32, DType::Bf16] {
        for (k, (a, b, ta, tb, out)) in cases.iter().enumerate() {
            let x = rand(dt, a, 20 + k as u64, -1.0, 1.0);
            let y = rand(dt, b, 40 + k as u64, -1.0, 1.0);
            check_with(
                &dev,
                Op::MatMul {
                    trans_a: *ta,
                    trans_b: *tb,
                },
                &[x, y],
                &[ty(dt, out)],
                &KernelCtx::default(),
                2.0,
            );
        }
    }
    // A product large enough for cuBLAS's tiled kernels.
    let x = rand(DType::F32, &[256, 384], 60, -1.0, 1.0);
    let y = rand(DType::F32, &[384, 320], 61, -1.0, 1.0);
    check_with(
        &dev,
        Op::MatMul {
            trans_a: false,
            trans_b: false,
        },
        &[x, y],
        &[ty(DType::F32, &[256, 320])],
        &KernelCtx::default(),
        10.0,
    );
}

#[test]
fn layer_norm_and_rms_norm_forward_and_backward_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    for dt in [DType::F32, DType::Bf16] {
        for d in [7usize, 64, 300] {
            let x = rand(dt, &[5, 3, d], 70, -2.0, 2.0);
            let g = rand(dt, &[d], 71, 0.5, 1.5);
            let b = rand(dt, &[d], 72, -0.5, 0.5);
            let dy = rand(dt, &[5, 3, d], 73, -1.0, 1.0);
            let t = ty(dt, &[5, 3, d]);
            let p = ty(dt, &[d]);
            check(
                &dev,
                Op::LayerNorm { eps: 1e-5 },
                &[x.clone(), g.clone(), b.clone()],
                &[t.clone()],
            );
            check(
                &dev,
                Op::LayerNorm { eps: 1e-5 },
                &[x.clone(), g.clone()],
                &[t.clone()],
            );
            check(
                &dev,
                Op::RmsNorm { eps: 1e-6 },
                &[x.clone(), g.clone()],
                &[t.clone()],
            );
            let sums = 15.0; // dgamma and dbeta add 15 rows
            check_with(
                &dev,
                Op::LayerNormGrad {
                    eps: 1e-5,
                    has_beta: true,
                },
                &[x.clone(), g.clone(), dy.clone()],
                &[t.clone(), p.clone(), p.clone()],
                &KernelCtx::default(),
                sums,
            );
            check_with(
                &dev,
                Op::LayerNormGrad {
                    eps: 1e-5,
                    has_beta: false,
                },
                &[x.clone(), g.clone(), dy.clone()],
                &[t.clone(), p.clone()],
                &KernelCtx::default(),
                sums,
            );
            check_with(
                &dev,
                Op::RmsNormGrad { eps: 1e-6 },
                &[x, g, dy],
                &[t, p],
                &KernelCtx::default(),
                sums,
            );
        }
    }
}

#[test]
fn softmax_and_log_softmax_on_any_axis_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    for dt in [DType::F32, DType::Bf16] {
        let shape = [3, 50, 4];
        let x = rand(dt, &shape, 80, -4.0, 4.0);
        let dy = rand(dt, &shape, 81, -1.0, 1.0);
        let t = ty(dt, &shape);
        for axis in [1usize, 2] {
            for (fwd, bwd) in [
                (Op::Softmax { axis }, Op::SoftmaxGrad { axis }),
                (Op::LogSoftmax { axis }, Op::LogSoftmaxGrad { axis }),
            ] {
                check(&dev, fwd.clone(), &[x.clone()], &[t.clone()]);
                let n = node(fwd, &[t.clone()]);
                let y = cpu(&n, &[x.clone()], &KernelCtx::default())
                    .unwrap()
                    .remove(0);
                check_with(
                    &dev,
                    bwd,
                    &[y, dy.clone()],
                    &[t.clone()],
                    &KernelCtx::default(),
                    4.0,
                );
            }
        }
    }
}

#[test]
fn fused_attention_forward_and_backward_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    // (batch, heads, sq, sk, d, dv, causal)
    let cases = [
        (2, 3, 17, 17, 16, 16, true),
        (1, 2, 70, 70, 64, 64, true),
        (2, 1, 9, 33, 40, 24, false),
        (1, 1, 40, 40, 100, 100, false),
    ];
    for dt in [DType::F32, DType::Bf16] {
        for (k, &(b, h, sq, sk, d, dv, causal)) in cases.iter().enumerate() {
            let s = 10 * k as u64;
            let q = rand(dt, &[b, h, sq, d], 90 + s, -1.0, 1.0);
            let kk = rand(dt, &[b, h, sk, d], 91 + s, -1.0, 1.0);
            let v = rand(dt, &[b, h, sk, dv], 92 + s, -1.0, 1.0);
            let dy = rand(dt, &[b, h, sq, dv], 93 + s, -1.0, 1.0);
            let scale = 1.0 / (d as f64).sqrt();
            let o = ty(dt, &[b, h, sq, dv]);
            check_with(
                &dev,
                Op::Attention { causal, scale },
                &[q.clone(), kk.clone(), v.clone()],
                &[o],
                &KernelCtx::default(),
                2.0,
            );
            let outs = [
                ty(dt, &[b, h, sq, d]),
                ty(dt, &[b, h, sk, d]),
                ty(dt, &[b, h, sk, dv]),
            ];
            check_with(
                &dev,
                Op::AttentionGrad { causal, scale },
                &[q, kk, v, dy],
                &outs,
                &KernelCtx::default(),
                8.0,
            );
        }
    }
}

#[test]
fn gather_and_its_gradient_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    let idx = ints(&[2, 3], &[4, 0, -1, 2, 4, 4]);
    for dt in [DType::F32, DType::Bf16] {
        let table = rand(dt, &[5, 6], 100, -1.0, 1.0);
        check(
            &dev,
            Op::Gather { axis: 0 },
            &[table.clone(), idx.clone()],
            &[ty(dt, &[2, 3, 6])],
        );
        check(
            &dev,
            Op::Gather { axis: 1 },
            &[rand(dt, &[3, 5, 2], 101, -1.0, 1.0), ints(&[2], &[1, -2])],
            &[ty(dt, &[3, 2, 2])],
        );
        let dy = rand(dt, &[2, 3, 6], 102, -1.0, 1.0);
        check(
            &dev,
            Op::GatherGrad {
                axis: 0,
                data_shape: vec![5, 6],
            },
            &[idx.clone(), dy],
            &[ty(dt, &[5, 6])],
        );
    }
    let n = node(Op::Gather { axis: 0 }, &[ty(DType::F32, &[1, 6])]);
    let e = run_node(
        &dev,
        &n,
        &[rand(DType::F32, &[5, 6], 1, 0.0, 1.0), ints(&[1], &[5])],
        &KernelCtx::default(),
        0,
    )
    .unwrap_err();
    assert!(matches!(e, CudaError::DeviceFault { .. }), "{e}");
}

#[test]
fn cross_entropy_and_its_gradient_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    let labels = ints(&[6], &[3, 0, 9, -100, 9, 5]);
    for dt in [DType::F32, DType::Bf16] {
        let logits = rand(dt, &[6, 10], 110, -3.0, 3.0);
        for ignore in [None, Some(-100)] {
            let lab = if ignore.is_some() {
                labels.clone()
            } else {
                ints(&[6], &[3, 0, 9, 1, 9, 5])
            };
            check(
                &dev,
                Op::CrossEntropy {
                    ignore_index: ignore,
                },
                &[logits.clone(), lab.clone()],
                &[ty(DType::F32, &[])],
            );
            let dl = HostTensor::from_f32(&[], &[0.7]).unwrap();
            check(
                &dev,
                Op::CrossEntropyGrad {
                    ignore_index: ignore,
                },
                &[logits.clone(), lab, dl],
                &[ty(dt, &[6, 10])],
            );
        }
    }
    let n = node(
        Op::CrossEntropy { ignore_index: None },
        &[ty(DType::F32, &[])],
    );
    let e = run_node(
        &dev,
        &n,
        &[rand(DType::F32, &[2, 4], 1, 0.0, 1.0), ints(&[2], &[1, 4])],
        &KernelCtx::default(),
        0,
    )
    .unwrap_err();
    assert!(matches!(e, CudaError::DeviceFault { .. }), "{e}");
}

/// Vocabulary parallelism's lookup and logit statistics on a member's
/// part (the second of two), with their gradients, on a vocabulary of 10
/// and on one of 9 padded to two parts of 5 (the member's last row and
/// column padding); an index outside the whole vocabulary is a device
/// fault.
#[test]
fn vocabulary_parallel_kernels_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    let offset = ints(&[1, 1], &[5]);
    for (vocab, idx, labels) in [
        (None, [4, 0, -1, 7, 9, 5], [3, 7, 9, -100, 6, 5]),
        (Some(9), [4, 0, -1, 7, 8, 5], [3, 7, 8, -100, 6, 5]),
    ] {
        let (idx, labels) = (ints(&[2, 3], &idx), ints(&[6], &labels));
        for dt in [DType::F32, DType::Bf16] {
            let table = rand(dt, &[5, 6], 130, -1.0, 1.0);
            check(
                &dev,
                Op::TpLookup { parts: 2, vocab },
                &[table, idx.clone(), offset.clone()],
                &[ty(dt, &[2, 3, 6])],
            );
            check(
                &dev,
                Op::TpLookupGrad {
                    parts: 2,
                    table_shape: vec![5, 6],
                    vocab,
                },
                &[
                    idx.clone(),
                    offset.clone(),
                    rand(dt, &[2, 3, 6], 131, -1.0, 1.0),
                ],
                &[ty(dt, &[5, 6])],
            );
            let logits = rand(dt, &[6, 5], 132, -3.0, 3.0);
            let stats = Op::TpLogitStats {
                ignore_index: Some(-100),
                parts: 2,
                vocab,
            };
            let ins = [logits.clone(), labels.clone(), offset.clone()];
            check(&dev, stats.clone(), &ins, &[ty(DType::F32, &[1, 6, 3])]);
            let n = node(stats, &[ty(DType::F32, &[1, 6, 3])]);
            let st = cpu(&n, &ins, &KernelCtx::default()).expect("the CPU kernel runs");
            check(
                &dev,
                Op::TpLogitStatsGrad {
                    ignore_index: Some(-100),
                    parts: 2,
                    vocab,
                },
                &[
                    logits,
                    labels.clone(),
                    offset.clone(),
                    st[0].clone(),
                    rand(DType::F32, &[1, 6, 3], 133, -1.0, 1.0),
                ],
                &[ty(dt, &[6, 5])],
            );
        }
    }
    let n = node(
        Op::TpLookup {
            parts: 2,
            vocab: None,
        },
        &[ty(DType::F32, &[1, 6])],
    );
    let e = run_node(
        &dev,
        &n,
        &[
            rand(DType::F32, &[5, 6], 1, 0.0, 1.0),
            ints(&[1], &[10]),
            offset,
        ],
        &KernelCtx::default(),
        0,
    )
    .unwrap_err();
    assert!(matches!(e, CudaError::DeviceFault { .. }), "{e}");
}

#[test]
fn reductions_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    let shape = [3, 4, 5];
    for dt in [DType::F32, DType::Bf16] {
        let x = rand(dt, &shape, 120, -2.0, 2.0);
        for (axes, keep) in [
            (vec![1usize], vec![3, 1, 5]),
            (vec![0, 2], vec![1, 4, 1]),
            (vec![], vec![1, 1, 1]),
            (vec![2], vec![3, 4, 1]),
        ] {
            for f in [ReduceFn::Sum, ReduceFn::Mean, ReduceFn::Max] {
                check(
                    &dev,
                    Op::Reduce {
                        f,
                        axes: axes.clone(),
                        keepdims: true,
                    },
                    &[x.clone()],
                    &[ty(dt, &keep)],
                );
            }
            let n = node(
                Op::Reduce {
                    f: ReduceFn::Max,
                    axes: axes.clone(),
                    keepdims: true,
                },
                &[ty(dt, &keep)],
            );
            let y = cpu(&n, &[x.clone()], &KernelCtx::default())
                .unwrap()
                .remove(0);
            let dy = rand(dt, &keep, 121, -1.0, 1.0);
            check(
                &dev,
                Op::ReduceMaxGrad {
                    axes,
                    keepdims: true,
                },
                &[x.clone(), y, dy],
                &[ty(dt, &shape)],
            );
        }
        check(
            &dev,
            Op::SumTo { shape: vec![4, 1] },
            &[x.clone()],
            &[ty(dt, &[4, 1])],
        );
        check(&dev, Op::SumTo { shape: vec![5] }, &[x], &[ty(dt, &[5])]);
        // Long enough for the chunked kernels (the sum's association
        // differs from the CPU's: tolerance for 5000 terms).
        let long = rand(dt, &[5000, 3], 122, -1.0, 1.0);
        check_with(
            &dev,
            Op::SumTo { shape: vec![3] },
            &[long.clone()],
            &[ty(dt, &[3])],
            &KernelCtx::default(),
            50.0,
        );
        for f in [ReduceFn::Sum, ReduceFn::Mean, ReduceFn::Max] {
            check_with(
                &dev,
                Op::Reduce {
                    f,
                    axes: vec![0],
                    keepdims: false,
                },
                &[long.clone()],
                &[ty(dt, &[3])],
                &KernelCtx::default(),
                50.0,
            );
        }
    }
}

#[test]
fn data_movement_ops_copy_exactly_what_the_cpu_copies() {
    let Some(dev) = gpu() else { return };
    for dt in [DType::F32, DType::Bf16, DType::I64] {
        let x = cast(&rand(DType::F32, &[2, 3, 4], 130, -50.0, 50.0), dt);
        check(
            &dev,
            Op::Reshape { shape: vec![6, 4] },
            &[x.clone()],
            &[ty(dt, &[6, 4])],
        );
        check(
            &dev,
            Op::Transpose {
                perm: vec![2, 0, 1],
            },
            &[x.clone()],
            &[ty(dt, &[4, 2, 3])],
        );
        check(
            &dev,
            Op::Transpose {
                perm: vec![0, 2, 1],
            },
            &[x.clone()],
            &[ty(dt, &[2, 4, 3])],
        );
        check(
            &dev,
            Op::Slice {
                axis: 2,
                start: 1,
                end: 9,
                step: 2,
            },
            &[x.clone()],
            &[ty(dt, &[2, 3, 2])],
        );
        let dy = cast(&rand(DType::F32, &[2, 3, 2], 131, -5.0, 5.0), dt);
        check(
            &dev,
            Op::SliceGrad {
                axis: 2,
                start: 1,
                end: 9,
                step: 2,
                input_shape: vec![2, 3, 4],
            },
            &[dy],
            &[ty(dt, &[2, 3, 4])],
        );
        let z = cast(&rand(DType::F32, &[2, 1, 4], 132, -5.0, 5.0), dt);
        check(
            &dev,
            Op::Concat { axis: 1 },
            &[x.clone(), z.clone()],
            &[ty(dt, &[2, 4, 4])],
        );
        check(
            &dev,
            Op::Expand {
                shape: vec![3, 2, 5, 4],
            },
            &[z.clone()],
            &[ty(dt, &[3, 2, 5, 4])],
        );
        check(
            &dev,
            Op::Pad {
                pads: vec![(0, 1), (2, 0), (1, 1)],
                value: 3.0,
            },
            &[x.clone()],
            &[ty(dt, &[3, 5, 6])],
        );
    }
    let value = fsdpc_ir::TensorData::from_f64s(ty(DType::F32, &[2]), &[1.5, -2.0]).unwrap();
    check(&dev, Op::Constant { value }, &[], &[ty(DType::F32, &[2])]);
}

const GPT: &str = "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=96,batch=2";

fn cuda_train(
    plan: &fsdpc_plan::Plan,
    steps: u64,
    nccl: NcclMode,
) -> Option<fsdpc_runtime::TrainReport> {
    let opts = TrainOptions {
        steps,
        seed: 3,
        ..TrainOptions::default()
    };
    cuda_train_with(plan, &opts, nccl)
}

/// A GPU run of `plan` with `opts`; `None` (saying why) without a GPU.
fn cuda_train_with(
    plan: &fsdpc_plan::Plan,
    opts: &TrainOptions,
    nccl: NcclMode,
) -> Option<fsdpc_runtime::TrainReport> {
    let cfg = CudaConfig {
        nccl,
        ..CudaConfig::default()
    };
    match train_cuda(plan, opts, None, &cfg, &mut |_| {}) {
        Ok(r) => Some(r),
        Err(fsdpc_runtime::RuntimeError::Cuda(
            e @ (CudaError::NoDevice { .. } | CudaError::LibraryMissing { .. }),
        )) if !required() => {
            eprintln!("skipping: {e}");
            None
        }
        Err(e) => panic!("{e}"),
    }
}

fn close(a: &[f32], b: &[f32], rtol: f32, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!(
            (x - y).abs() <= rtol * (1.0 + y.abs()),
            "{what} [{i}]: gpu {x} cpu {y}"
        );
    }
}

fn compare_training(
    plan: &fsdpc_plan::Plan,
    steps: u64,
    nccl: NcclMode,
    rtol_loss: f32,
    rtol_params: f32,
) {
    let Some(g) = cuda_train(plan, steps, nccl) else {
        return;
    };
    let opts = TrainOptions {
        steps,
        seed: 3,
        ..TrainOptions::default()
    };
    let c = fsdpc_runtime::train(plan, &opts, &mut |_| {}).unwrap();
    eprintln!("losses: gpu {:?} cpu {:?}", g.losses, c.losses);
    eprintln!("memory: {:?}", g.device.as_ref().map(|d| &d.memory));
    close(&g.losses, &c.losses, rtol_loss, "loss");
    let opts_keep = TrainOptions {
        steps,
        seed: 3,
        keep_params: true,
        ..TrainOptions::default()
    };
    let cfg = CudaConfig {
        nccl,
        ..CudaConfig::default()
    };
    let gk = train_cuda(plan, &opts_keep, None, &cfg, &mut |_| {}).unwrap();
    let ck = fsdpc_runtime::train(plan, &opts_keep, &mut |_| {}).unwrap();
    for ((n, a), (_, b)) in gk.final_params.iter().zip(&ck.final_params) {
        close(a, b, rtol_params, n);
    }
    let m = &g
        .device
        .as_ref()
        .expect("a cuda run reports its device")
        .memory;
    assert!(m.allocated >= plan.memory.arena_bytes);
}

#[test]
fn a_gpt_trains_on_the_gpu_as_on_one_cpu_rank_in_f32() {
    let p = support::plan::plan(
        GPT,
        1,
        fsdpc_plan::Strategy::FullShard,
        Optimizer::adamw(1e-2),
    );
    compare_training(&p, 3, NcclMode::Auto, 1e-4, 1e-3);
}

#[test]
fn a_gpt_trains_on_the_gpu_with_nccl_at_world_one() {
    let p = support::plan::plan(
        GPT,
        1,
        fsdpc_plan::Strategy::FullShard,
        Optimizer::adamw(1e-2),
    );
    compare_training(&p, 3, NcclMode::Always, 1e-4, 1e-3);
}

#[test]
fn a_bf16_gpt_trains_on_the_gpu_as_on_one_cpu_rank() {
    let p = support::plan::plan_with(GPT, 1, |c| {
        c.param_dtype = DType::Bf16;
        c.reduce_dtype = DType::Bf16;
    });
    compare_training(&p, 3, NcclMode::Auto, 2e-2, 3e-2);
}

#[test]
fn plans_the_backend_does_not_run_are_refused_naming_what() {
    let Some(_) = gpu() else { return };
    let p = support::plan::plan_with(GPT, 1, |c| c.cpu_offload = true);
    let opts = TrainOptions {
        steps: 1,
        ..TrainOptions::default()
    };
    let e = train_cuda(&p, &opts, None, &CudaConfig::default(), &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("offload"), "{e}");
}

/// `--trace` on a GPU: every kernel, product and collective of the last
/// two steps has a span from CUDA events, on its own stream, inside its
/// step and after the span before it on that stream.
#[test]
fn a_traced_gpu_step_times_every_instruction() {
    let Some(_) = gpu() else { return };
    let p = support::plan::plan_with(GPT, 1, |_| {});
    let opts = TrainOptions {
        steps: 3,
        trace_steps: 2,
        ..TrainOptions::default()
    };
    let r = train_cuda(&p, &opts, None, &CudaConfig::default(), &mut |_| {}).unwrap();
    assert_eq!(r.timelines.len(), 1);
    let t = &r.timelines[0];
    let mut seen = std::collections::BTreeSet::new();
    for s in &t.streams {
        for w in s.spans.windows(2) {
            assert!(
                w[0].end_ns <= w[1].start_ns + 1_000,
                "{:?} then {:?}",
                w[0],
                w[1]
            );
        }
        for x in &s.spans {
            assert!(x.step == 1 || x.step == 2, "{x:?}");
            assert!(x.start_ns <= x.end_ns, "{x:?}");
            assert_eq!(p.instructions[x.instr as usize].stream, s.stream);
            seen.insert((x.step, x.instr));
        }
    }
    // Both steps timed the same instructions, matrix products among them.
    let of = |step| -> Vec<u32> { seen.iter().filter(|x| x.0 == step).map(|x| x.1).collect() };
    assert_eq!(of(1), of(2));
    let products: Vec<u32> = p
        .instructions
        .iter()
        .enumerate()
        .filter(|(_, i)| matches!(&i.op, fsdpc_plan::InstrOp::Kernel { kernel, .. } if kernel == "mat_mul"))
        .map(|(k, _)| k as u32)
        .collect();
    assert!(!products.is_empty());
    assert!(products.iter().all(|k| of(1).contains(k)), "{products:?}");
}

/// Every instruction of a range of plans lowers to device work at address
/// 0 (kernel coverage, shapes, collectives), without a GPU: what the
/// executor does before it allocates. World 1 needs no communicator; world
/// 2 full_shard one per collective stream; hybrid at world 4 the same; a
/// tensor-parallel plan one more, the compute stream's.
#[test]
fn every_instruction_of_these_plans_lowers_without_a_gpu() {
    use fsdpc_plan::Strategy;
    use fsdpc_plan::{CheckpointPolicy, Stream};
    use fsdpc_runtime::targets::cuda::exec::{check_plan, NcclUse};
    type Edit = fn(&mut fsdpc_planner::FsdpConfig);
    let cases: Vec<(&str, u32, Edit, usize)> = vec![
        (GPT, 1, |_| {}, 0),
        (GPT, 1, |c| c.param_dtype = DType::Bf16, 0),
        (GPT, 1, |c| c.clip_grad_norm = Some(1.0), 0),
        (GPT, 1, |c| c.grad_accum = 2, 0),
        (
            GPT,
            1,
            |c| c.activation_checkpointing = CheckpointPolicy::Units,
            0,
        ),
        (GPT, 2, |_| {}, 2),
        (
            GPT,
            2,
            |c| {
                c.param_dtype = DType::Bf16;
                c.reduce_dtype = DType::Bf16;
            },
            2,
        ),
        (GPT, 2, |c| c.strategy = Strategy::NoShard, 1),
        // Tensor parallelism: the tensor group's sums on the compute
        // stream; at T = world nothing is sharded (F = 1).
        (GPT, 2, |c| c.tensor_parallel = 2, 1),
        (GPT, 4, |c| c.tensor_parallel = 2, 3),
        (
            GPT,
            4,
            |c| {
                c.tensor_parallel = 2;
                c.sequence_parallel = false;
            },
            3,
        ),
        // A vocabulary T does not divide, padded (95 over 2: parts of
        // 48), in bf16.
        (
            "gpt:layers=2,hidden=64,heads=4,seq=16,vocab=95,batch=2",
            2,
            |c| {
                c.tensor_parallel = 2;
                c.param_dtype = DType::Bf16;
            },
            1,
        ),
        // Clipping: the norm summed over the shard group, then the tensor
        // group, on the reduce stream; off tensor position 0 only the
        // split parameters' elements are counted.
        (
            GPT,
            4,
            |c| {
                c.tensor_parallel = 2;
                c.clip_grad_norm = Some(1.0);
            },
            3,
        ),
        (
            GPT,
            2,
            |c| {
                c.tensor_parallel = 2;
                c.clip_grad_norm = Some(1.0);
            },
            2,
        ),
        (GPT, 2, |c| c.strategy = Strategy::ShardGradOp, 2),
        (
            GPT,
            4,
            |c| {
                c.strategy = Strategy::HybridShard;
                c.shard_factor = Some(2);
            },
            2,
        ),
        (
            "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=2,dropout=0.1,lora=4",
            1,
            |_| {},
            0,
        ),
        (
            "mlp:layers=2,in=8,hidden=16,classes=4,batch=4",
            2,
            |_| {},
            2,
        ),
        (
            "t5:layers=1,hidden=32,ff=64,heads=2,vocab=64,seq=8,dec_seq=4,batch=2",
            1,
            |_| {},
            0,
        ),
    ];
    for (spec, world, edit, want) in cases {
        let p = support::plan::plan_with(spec, world, edit);
        let streams = check_plan(&p, world as usize, NcclUse::Auto)
            .unwrap_or_else(|e| panic!("{spec} at world {world}: {e}"));
        assert_eq!(streams.len(), want, "{spec} at world {world}: {streams:?}");
        assert!(!streams.contains(&Stream::Offload));
        let always = check_plan(&p, world as usize, NcclUse::Always).unwrap();
        assert!(
            !always.is_empty(),
            "{spec}: NCCL at world 1 has communicators"
        );
    }
}
