//! FLOP conventions the planner's cost model relies on.

use fsdpc_ir::ops::{flops, infer};
use fsdpc_ir::{BinaryFn, DType, Op, TensorType, UnaryFn};

fn f32t(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

fn count(op: Op, inputs: &[TensorType]) -> f64 {
    let refs: Vec<&TensorType> = inputs.iter().collect();
    let outs = infer(&op, &refs).unwrap();
    flops(&op, &refs, &outs)
}

#[test]
fn matmul_is_two_mnk_per_batch() {
    let mm = |a, b| Op::MatMul {
        trans_a: a,
        trans_b: b,
    };
    assert_eq!(
        count(mm(false, false), &[f32t(&[8, 3, 4]), f32t(&[4, 5])]),
        2.0 * 8.0 * 3.0 * 5.0 * 4.0
    );
    assert_eq!(
        count(mm(true, true), &[f32t(&[4, 3]), f32t(&[5, 4])]),
        2.0 * 3.0 * 5.0 * 4.0
    );
}

#[test]
fn attention_counts_two_products_halved_when_causal() {
    let q = f32t(&[2, 4, 16, 8]);
    let qkv = [q.clone(), q.clone(), q.clone()];
    let full = count(
        Op::Attention {
            causal: false,
            scale: 1.0,
        },
        &qkv,
    );
    let causal = count(
        Op::Attention {
            causal: true,
            scale: 1.0,
        },
        &qkv,
    );
    let scores = 2.0 * 4.0 * 16.0 * 16.0;
    assert_eq!(full, scores * (4.0 * 8.0 + 5.0));
    assert_eq!(causal, full / 2.0);
    let grad = count(
        Op::AttentionGrad {
            causal: true,
            scale: 1.0,
        },
        &[q.clone(), q.clone(), q.clone(), q],
    );
    assert_eq!(grad, 2.5 * causal);
}

#[test]
fn elementwise_and_data_movement() {
    let x = f32t(&[10, 10]);
    assert_eq!(
        count(Op::Binary { f: BinaryFn::Add }, &[x.clone(), x.clone()]),
        100.0
    );
    assert_eq!(
        count(Op::Unary { f: UnaryFn::Exp }, std::slice::from_ref(&x)),
        400.0
    );
    assert_eq!(
        count(Op::Reshape { shape: vec![100] }, std::slice::from_ref(&x)),
        0.0
    );
    assert_eq!(
        count(Op::Transpose { perm: vec![1, 0] }, std::slice::from_ref(&x)),
        0.0
    );
    assert_eq!(
        count(Op::SumTo { shape: vec![10] }, std::slice::from_ref(&x)),
        100.0
    );
    assert_eq!(count(Op::LayerNorm { eps: 1e-5 }, &[x, f32t(&[10])]), 800.0);
}

/// A convolution and each gradient count `2 · n · o · oh · ow · (c / g) ·
/// kh · kw`; pooling one per tap of each output.
#[test]
fn convolution_and_pooling() {
    use fsdpc_ir::Window2d;
    let w3 = Window2d {
        pads: [1; 4],
        ..Window2d::of_kernel([3, 3])
    };
    let x = f32t(&[2, 8, 6, 6]);
    let w = f32t(&[4, 2, 3, 3]);
    let y = f32t(&[2, 4, 6, 6]);
    let fwd = 2.0 * (2 * 4 * 36 * 2 * 9) as f64;
    assert_eq!(
        count(
            Op::Conv {
                window: w3,
                groups: 4
            },
            &[x.clone(), w.clone()]
        ),
        fwd
    );
    let gi = Op::ConvGradInput {
        window: w3,
        groups: 4,
        input_hw: [6, 6],
    };
    assert_eq!(count(gi, &[w, y.clone()]), fwd);
    let gw = Op::ConvGradWeight {
        window: w3,
        groups: 4,
    };
    assert_eq!(count(gw, &[x.clone(), y]), fwd);
    assert_eq!(
        count(Op::MaxPool { window: w3 }, &[x]),
        (2 * 8 * 36 * 9) as f64
    );
}
