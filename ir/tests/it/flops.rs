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
