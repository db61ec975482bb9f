//! Kernel unit tests against hand-computed values.

#![allow(clippy::cloned_ref_to_slice_refs)]

use fsdpc_ir::{BinaryFn, DType, ModuleId, Node, Op, Phase, ReduceFn, TensorType, UnaryFn};
use fsdpc_runtime::{Backend, CpuBackend, HostTensor, KernelCtx, Workspace};

fn f32t(shape: &[usize], v: &[f32]) -> HostTensor {
    HostTensor::from_f32(shape, v).unwrap()
}

use crate::support::run_cpu as run;

fn ty(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

fn close(a: &[f32], b: &[f32]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

#[test]
fn binary_broadcasts_rows_and_columns() {
    let a = f32t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let row = f32t(&[3], &[10., 20., 30.]);
    let col = f32t(&[2, 1], &[100., 200.]);
    let r = run(
        Op::Binary { f: BinaryFn::Add },
        &[a.clone(), row],
        &[ty(&[2, 3])],
    )
    .unwrap();
    close(&r[0].to_f32(), &[11., 22., 33., 14., 25., 36.]);
    let r = run(Op::Binary { f: BinaryFn::Mul }, &[col, a], &[ty(&[2, 3])]).unwrap();
    close(&r[0].to_f32(), &[100., 200., 300., 800., 1000., 1200.]);
}

#[test]
fn matmul_with_transposes_and_batch_broadcast() {
    // a: [2, 2, 3] (batch 2), b: [3, 2]
    let a = f32t(
        &[2, 2, 3],
        &[1., 2., 3., 4., 5., 6., 1., 0., 0., 0., 1., 0.],
    );
    let b = f32t(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
    let r = run(
        Op::MatMul {
            trans_a: false,
            trans_b: false,
        },
        &[a.clone(), b],
        &[ty(&[2, 2, 2])],
    )
    .unwrap();
    close(&r[0].to_f32(), &[22., 28., 49., 64., 1., 2., 3., 4.]);
    // b^T given as [2, 3]
    let bt = f32t(&[2, 3], &[1., 3., 5., 2., 4., 6.]);
    let r = run(
        Op::MatMul {
            trans_a: false,
            trans_b: true,
        },
        &[a, bt],
        &[ty(&[2, 2, 2])],
    )
    .unwrap();
    close(&r[0].to_f32(), &[22., 28., 49., 64., 1., 2., 3., 4.]);
    // trans_a: a^T of [3, 2] -> [2, 3] x [3, 1]
    let at = f32t(&[3, 2], &[1., 4., 2., 5., 3., 6.]);
    let c = f32t(&[3, 1], &[1., 1., 1.]);
    let r = run(
        Op::MatMul {
            trans_a: true,
            trans_b: false,
        },
        &[at, c],
        &[ty(&[2, 1])],
    )
    .unwrap();
    close(&r[0].to_f32(), &[6., 15.]);
}

#[test]
fn layer_norm_and_softmax_rows() {
    let x = f32t(&[1, 4], &[1., 2., 3., 4.]);
    let g = f32t(&[4], &[1., 1., 1., 1.]);
    let b = f32t(&[4], &[0., 0., 0., 1.]);
    let r = run(
        Op::LayerNorm { eps: 0.0 },
        &[x.clone(), g, b],
        &[ty(&[1, 4])],
    )
    .unwrap();
    let s = 1.25f32.sqrt();
    close(
        &r[0].to_f32(),
        &[-1.5 / s, -0.5 / s, 0.5 / s, 1.5 / s + 1.0],
    );
    let r = run(Op::Softmax { axis: 1 }, &[x], &[ty(&[1, 4])]).unwrap();
    let e: Vec<f32> = [1f32, 2., 3., 4.].iter().map(|v| v.exp()).collect();
    let z: f32 = e.iter().sum();
    close(&r[0].to_f32(), &e.iter().map(|v| v / z).collect::<Vec<_>>());
}

#[test]
fn cross_entropy_ignores_rows_and_rejects_bad_labels() {
    let logits = f32t(&[2, 2], &[0., 0., 1., 1.]);
    let labels = HostTensor::from_i64(&[2], &[1, -100]).unwrap();
    let op = Op::CrossEntropy {
        ignore_index: Some(-100),
    };
    let r = run(op.clone(), &[logits.clone(), labels], &[ty(&[])]).unwrap();
    close(&r[0].to_f32(), &[std::f32::consts::LN_2]);
    let bad = HostTensor::from_i64(&[2], &[1, 7]).unwrap();
    let e = run(op, &[logits, bad], &[ty(&[])]).unwrap_err();
    assert!(e.contains("out of range"), "{e}");
}

#[test]
fn attention_causal_first_row_sees_only_itself() {
    let q = f32t(&[1, 1, 2, 1], &[1., 1.]);
    let k = f32t(&[1, 1, 2, 1], &[0., 0.]);
    let v = f32t(&[1, 1, 2, 1], &[3., 5.]);
    let r = run(
        Op::Attention {
            causal: true,
            scale: 1.0,
        },
        &[q, k, v],
        &[ty(&[1, 1, 2, 1])],
    )
    .unwrap();
    close(&r[0].to_f32(), &[3., 4.]);
}

#[test]
fn gather_and_gather_grad() {
    let data = f32t(&[3, 2], &[1., 2., 3., 4., 5., 6.]);
    let idx = HostTensor::from_i64(&[3], &[2, 0, 2]).unwrap();
    let r = run(Op::Gather { axis: 0 }, &[data, idx.clone()], &[ty(&[3, 2])]).unwrap();
    close(&r[0].to_f32(), &[5., 6., 1., 2., 5., 6.]);
    let dy = f32t(&[3, 2], &[1., 1., 1., 1., 1., 1.]);
    let op = Op::GatherGrad {
        axis: 0,
        data_shape: vec![3, 2],
    };
    let r = run(op, &[idx, dy], &[ty(&[3, 2])]).unwrap();
    close(&r[0].to_f32(), &[1., 1., 0., 0., 2., 2.]);
}

#[test]
fn shape_ops() {
    let x = f32t(&[2, 3], &[1., 2., 3., 4., 5., 6.]);
    let r = run(
        Op::Transpose { perm: vec![1, 0] },
        &[x.clone()],
        &[ty(&[3, 2])],
    )
    .unwrap();
    close(&r[0].to_f32(), &[1., 4., 2., 5., 3., 6.]);
    let op = Op::Slice {
        axis: 1,
        start: 0,
        end: 3,
        step: 2,
    };
    let r = run(op, &[x.clone()], &[ty(&[2, 2])]).unwrap();
    close(&r[0].to_f32(), &[1., 3., 4., 6.]);
    let r = run(
        Op::Concat { axis: 1 },
        &[x.clone(), x.clone()],
        &[ty(&[2, 6])],
    )
    .unwrap();
    close(
        &r[0].to_f32(),
        &[1., 2., 3., 1., 2., 3., 4., 5., 6., 4., 5., 6.],
    );
    let r = run(
        Op::Pad {
            pads: vec![(0, 1), (1, 0)],
            value: 9.0,
        },
        &[x.clone()],
        &[ty(&[3, 4])],
    )
    .unwrap();
    close(
        &r[0].to_f32(),
        &[9., 1., 2., 3., 9., 4., 5., 6., 9., 9., 9., 9.],
    );
    let r = run(
        Op::Expand {
            shape: vec![2, 2, 3],
        },
        &[x.clone()],
        &[ty(&[2, 2, 3])],
    )
    .unwrap();
    close(&r[0].to_f32()[6..], &[1., 2., 3., 4., 5., 6.]);
    let op = Op::Reduce {
        f: ReduceFn::Mean,
        axes: vec![1],
        keepdims: false,
    };
    let r = run(op, &[x.clone()], &[ty(&[2])]).unwrap();
    close(&r[0].to_f32(), &[2., 5.]);
    let r = run(Op::SumTo { shape: vec![3] }, &[x], &[ty(&[3])]).unwrap();
    close(&r[0].to_f32(), &[5., 7., 9.]);
}

#[test]
fn unary_and_cast() {
    let x = f32t(&[3], &[-1., 0., 2.]);
    let r = run(Op::Unary { f: UnaryFn::Relu }, &[x.clone()], &[ty(&[3])]).unwrap();
    close(&r[0].to_f32(), &[0., 0., 2.]);
    let bt = TensorType::new(DType::Bf16, vec![3]);
    let r = run(Op::Cast { to: DType::Bf16 }, &[x.clone()], &[bt]).unwrap();
    close(&r[0].to_f32(), &[-1., 0., 2.]);
    let it = TensorType::new(DType::I64, vec![3]);
    let r = run(
        Op::Cast { to: DType::I64 },
        &[f32t(&[3], &[-1.7, 0.2, 2.9])],
        &[it],
    )
    .unwrap();
    assert_eq!(r[0].to_i64(), vec![-1, 0, 2]);
}

#[test]
fn wrong_input_count_is_an_error() {
    let x = f32t(&[3], &[1., 2., 3.]);
    let e = run(Op::Binary { f: BinaryFn::Add }, &[x], &[ty(&[3])]).unwrap_err();
    assert!(e.contains("expected 2 inputs"), "{e}");
}

#[test]
fn dropout_mask_is_keyed_by_global_element() {
    let x = f32t(&[4, 3], &[1.0; 12]);
    let node = |n: usize| Node {
        op: Op::Dropout {
            p: 0.5,
            seed: 3,
            whole_sample: None,
        },
        name: "d".into(),
        module: ModuleId::ROOT,
        phase: Phase::Forward,
        outputs: vec![ty(&[n, 3])],
    };
    let run_at = |t: &HostTensor, offset: u64| {
        let n = t.ty.shape.0[0];
        let mut out = HostTensor::zeros(ty(&[n, 3]));
        let ctx = KernelCtx {
            step: 5,
            sample_offset: offset,
            seed: 1,
            eval: false,
        };
        CpuBackend::default()
            .run(
                &node(n),
                &[t.view()],
                &mut [out.view_mut()],
                &ctx,
                &mut Workspace::empty(),
            )
            .unwrap();
        out.to_f32()
    };
    let whole = run_at(&x, 0);
    let half = f32t(&[2, 3], &[1.0; 6]);
    let parts = [run_at(&half, 0), run_at(&half, 2)].concat();
    assert_eq!(whole, parts);
    assert!(whole.iter().all(|&v| v == 0.0 || v == 2.0));
}

/// A chunk of a whole tensor (sequence parallelism) at its offset in the
/// whole draws the whole's mask: one sample of 4 rows cut into two chunks
/// of 2, and 2 samples of 6 elements cut by sample, each at sample offset
/// 3 of the global batch.
#[test]
fn a_dropout_chunk_draws_the_whole_tensors_mask() {
    let run_with = |x: &HostTensor, whole_sample: Option<u64>, offset: Option<i64>| {
        let dims = x.ty.shape.0.clone();
        let node = Node {
            op: Op::Dropout {
                p: 0.5,
                seed: 3,
                whole_sample,
            },
            name: "d".into(),
            module: ModuleId::ROOT,
            phase: Phase::Forward,
            outputs: vec![ty(&dims)],
        };
        let off = offset.map(|o| HostTensor::from_i64(&[1], &[o]).unwrap());
        let mut ins = vec![x.view()];
        ins.extend(off.iter().map(|o| o.view()));
        let mut out = HostTensor::zeros(ty(&dims));
        let ctx = KernelCtx {
            step: 5,
            sample_offset: 3,
            seed: 1,
            eval: false,
        };
        CpuBackend::default()
            .run(
                &node,
                &ins,
                &mut [out.view_mut()],
                &ctx,
                &mut Workspace::empty(),
            )
            .map(|()| out.to_f32())
    };
    for (whole, chunk) in [
        (vec![1, 4, 3], vec![1, 2, 3]),
        (vec![4, 2, 3], vec![2, 2, 3]),
    ] {
        let n: usize = whole.iter().product();
        let x = f32t(&whole, &vec![1.0; n]);
        let want = run_with(&x, None, None).unwrap();
        let per_sample = (n / whole[0]) as u64;
        let c = f32t(&chunk, &vec![1.0; n / 2]);
        let parts = [
            run_with(&c, Some(per_sample), Some(0)).unwrap(),
            run_with(&c, Some(per_sample), Some((n / 2) as i64)).unwrap(),
        ]
        .concat();
        assert_eq!(want, parts, "{whole:?} in chunks of {chunk:?}");
        assert!(want.contains(&0.0) && want.contains(&2.0), "{want:?}");
    }
    // A chunk without its offset, or at a negative one, is an error.
    let c = f32t(&[1, 2, 3], &[1.0; 6]);
    assert!(run_with(&c, Some(12), None).is_err());
    assert!(run_with(&c, Some(12), Some(-1)).is_err());
}

#[test]
fn adamw_and_sgd_match_hand_computed_steps() {
    use fsdpc_ir::Optimizer;
    use fsdpc_runtime::OptimizerArgs;
    let (mut p, g, mut m, mut v) = (vec![1.0f32], vec![0.5f32], vec![0.0f32], vec![0.0f32]);
    let adamw = Optimizer::AdamW {
        lr: 0.1,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.01,
    };
    let args = OptimizerArgs {
        optimizer: &adamw,
        step: 0,
        params: &mut p,
        grads: &g,
        state: vec![&mut m, &mut v],
    };
    CpuBackend::default().optimizer_step(args).unwrap();
    // p = 1 * (1 - 0.1 * 0.01) - (0.1 / 0.1) * 0.05 / (sqrt(0.00025) / sqrt(0.001) + 1e-8)
    close(&p, &[0.899]);
    close(&m, &[0.05]);
    close(&v, &[0.00025]);
    let sgd = Optimizer::Sgd {
        lr: 0.1,
        momentum: 0.9,
        weight_decay: 0.1,
    };
    let (mut p, mut b) = (vec![1.0f32], vec![0.0f32]);
    for _ in 0..2 {
        let args = OptimizerArgs {
            optimizer: &sgd,
            step: 0,
            params: &mut p,
            grads: &g,
            state: vec![&mut b],
        };
        CpuBackend::default().optimizer_step(args).unwrap();
    }
    // step 1: d = 0.6, buf = 0.6, p = 0.94; step 2: d = 0.594, buf = 1.134, p = 0.8266
    close(&p, &[0.8266]);
}

/// PyTorch's `cross_entropy(ignore_index=-100)`: the mean over the counted
/// rows only; ignored rows add no loss and get zero gradient.
#[test]
fn cross_entropy_with_ignored_rows_matches_pytorch_semantics() {
    let ln = |v: f32| v.ln();
    // Row 0: softmax [1/6, 2/6, 3/6], label 2: loss ln 2.
    // Row 1: ignored; huge logits would dominate if it were counted.
    // Row 2: softmax [1/4, 1/4, 1/2], label 0: loss ln 4.
    // Row 3: ignored.
    let logits = f32t(
        &[4, 3],
        &[
            ln(1.),
            ln(2.),
            ln(3.),
            50.,
            -50.,
            0.,
            ln(1.),
            ln(1.),
            ln(2.),
            1.,
            2.,
            3.,
        ],
    );
    let labels = HostTensor::from_i64(&[4], &[2, -100, 0, -100]).unwrap();
    let ignore_index = Some(-100);
    let r = run(
        Op::CrossEntropy { ignore_index },
        &[logits.clone(), labels.clone()],
        &[ty(&[])],
    )
    .unwrap();
    // (ln 2 + ln 4) / 2 counted rows, not / 4 rows.
    close(&r[0].to_f32(), &[1.5 * std::f32::consts::LN_2]);
    // dlogits = (softmax - onehot) * dloss / 2 on counted rows, with dloss = 2.
    let dloss = f32t(&[], &[2.0]);
    let g = run(
        Op::CrossEntropyGrad { ignore_index },
        &[logits, labels, dloss],
        &[ty(&[4, 3])],
    )
    .unwrap();
    #[rustfmt::skip]
    let want = [
        1. / 6., 2. / 6., 3. / 6. - 1.,
        0., 0., 0.,
        1. / 4. - 1., 1. / 4., 1. / 2.,
        0., 0., 0.,
    ];
    close(&g[0].to_f32(), &want);
}
