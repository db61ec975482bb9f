//! Shape and dtype rules: hand-written cases for every op family, property
//! tests over random shapes, and errors that name the node.

use fsdpc_ir::ops::{broadcast_shapes, infer};
use fsdpc_ir::{
    BinaryFn, DType, Graph, IrError, ModuleId, Op, ReduceFn, TensorData, TensorType, UnaryFn,
};
use proptest::prelude::*;

fn f32t(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

fn i64t(shape: &[usize]) -> TensorType {
    TensorType::new(DType::I64, shape.to_vec())
}

/// The single output type of `op` on `inputs`, or the error reason.
fn check(op: Op, inputs: &[TensorType]) -> Result<TensorType, String> {
    let refs: Vec<&TensorType> = inputs.iter().collect();
    let mut out = infer(&op, &refs)?;
    assert_eq!(out.len(), 1, "{op:?} has one output");
    Ok(out.remove(0))
}

fn err_contains(r: Result<TensorType, String>, what: &str) {
    match r {
        Ok(t) => panic!("expected an error containing {what:?}, got {t}"),
        Err(e) => assert!(e.contains(what), "error {e:?} does not contain {what:?}"),
    }
}

#[test]
fn elementwise_rules() {
    let add = Op::Binary { f: BinaryFn::Add };
    assert_eq!(
        check(add.clone(), &[f32t(&[4, 1, 3]), f32t(&[5, 1])]),
        Ok(f32t(&[4, 5, 3]))
    );
    err_contains(
        check(add.clone(), &[f32t(&[4, 3]), f32t(&[5])]),
        "do not broadcast",
    );
    err_contains(check(add.clone(), &[f32t(&[4]), i64t(&[4])]), "same dtype");
    err_contains(check(add, &[f32t(&[4])]), "expects 2 inputs");
    let exp = Op::Unary { f: UnaryFn::Exp };
    err_contains(check(exp, &[i64t(&[2])]), "floating point");
    let isnan = Op::Unary { f: UnaryFn::IsNan };
    assert_eq!(
        check(isnan, &[f32t(&[2])]).map(|t| t.dtype),
        Ok(DType::Bool)
    );
    let cond = TensorType::new(DType::Bool, vec![3, 1]);
    assert_eq!(
        check(Op::Where, &[cond.clone(), f32t(&[1, 4]), f32t(&[])]),
        Ok(f32t(&[3, 4]))
    );
    err_contains(
        check(Op::Where, &[f32t(&[3]), f32t(&[3]), f32t(&[3])]),
        "must be bool",
    );
    assert_eq!(
        check(Op::Cast { to: DType::Bf16 }, &[f32t(&[2])]).map(|t| t.dtype),
        Ok(DType::Bf16)
    );
}

#[test]
fn matmul_rules() {
    let mm = |a, b| Op::MatMul {
        trans_a: a,
        trans_b: b,
    };
    assert_eq!(
        check(mm(false, false), &[f32t(&[8, 3, 4]), f32t(&[4, 5])]),
        Ok(f32t(&[8, 3, 5]))
    );
    assert_eq!(
        check(mm(true, true), &[f32t(&[2, 1, 4, 3]), f32t(&[7, 5, 4])]),
        Ok(f32t(&[2, 7, 3, 5]))
    );
    err_contains(
        check(mm(false, false), &[f32t(&[3, 4]), f32t(&[5, 4])]),
        "inner dimensions",
    );
    err_contains(
        check(mm(false, false), &[f32t(&[4]), f32t(&[4, 5])]),
        "rank >= 2",
    );
    err_contains(
        check(mm(false, false), &[f32t(&[2, 3, 4]), f32t(&[3, 4, 5])]),
        "batch",
    );
}

#[test]
fn structured_op_rules() {
    let ln = Op::LayerNorm { eps: 1e-5 };
    assert_eq!(
        check(ln.clone(), &[f32t(&[2, 8]), f32t(&[8]), f32t(&[8])]),
        Ok(f32t(&[2, 8]))
    );
    err_contains(
        check(ln, &[f32t(&[2, 8]), f32t(&[4])]),
        "gamma must have shape [8]",
    );
    let att = Op::Attention {
        causal: true,
        scale: 0.125,
    };
    let q = f32t(&[2, 4, 16, 8]);
    assert_eq!(
        check(att.clone(), &[q.clone(), q.clone(), q.clone()]),
        Ok(q.clone())
    );
    err_contains(
        check(att, &[q.clone(), f32t(&[2, 4, 8, 8]), f32t(&[2, 4, 8, 8])]),
        "causal",
    );
    assert_eq!(
        check(Op::Gather { axis: 0 }, &[f32t(&[100, 16]), i64t(&[4, 7])]),
        Ok(f32t(&[4, 7, 16]))
    );
    err_contains(
        check(Op::Gather { axis: 0 }, &[f32t(&[100, 16]), f32t(&[4])]),
        "integer",
    );
    let ce = Op::CrossEntropy {
        ignore_index: Some(-100),
    };
    assert_eq!(
        check(ce.clone(), &[f32t(&[6, 10]), i64t(&[6])]),
        Ok(f32t(&[]))
    );
    err_contains(check(ce, &[f32t(&[6, 10]), i64t(&[5])]), "rows");
    err_contains(
        check(Op::Softmax { axis: 2 }, &[f32t(&[3, 4])]),
        "out of range",
    );
    err_contains(
        check(
            Op::Dropout {
                p: 1.0,
                seed: 0,
                whole_sample: None,
            },
            &[f32t(&[3])],
        ),
        "[0, 1)",
    );
    // A chunk of a whole tensor reads its offset: one integer.
    let chunk = Op::Dropout {
        p: 0.1,
        seed: 0,
        whole_sample: Some(12),
    };
    assert_eq!(
        check(chunk.clone(), &[f32t(&[1, 2, 3]), i64t(&[1, 1])]),
        Ok(f32t(&[1, 2, 3]))
    );
    err_contains(check(chunk.clone(), &[f32t(&[1, 2, 3])]), "offset");
    err_contains(
        check(chunk.clone(), &[f32t(&[1, 2, 3]), i64t(&[2])]),
        "one integer",
    );
    err_contains(check(chunk, &[f32t(&[1, 2, 3]), f32t(&[1])]), "integer");
}

#[test]
fn shape_op_rules() {
    assert_eq!(
        check(Op::Reshape { shape: vec![6, 2] }, &[f32t(&[3, 4])]),
        Ok(f32t(&[6, 2]))
    );
    err_contains(
        check(Op::Reshape { shape: vec![5] }, &[f32t(&[3, 4])]),
        "cannot reshape",
    );
    assert_eq!(
        check(
            Op::Transpose {
                perm: vec![2, 0, 1]
            },
            &[f32t(&[2, 3, 4])]
        ),
        Ok(f32t(&[4, 2, 3]))
    );
    err_contains(
        check(Op::Transpose { perm: vec![0, 0] }, &[f32t(&[2, 3])]),
        "permutation",
    );
    let sl = Op::Slice {
        axis: 1,
        start: 1,
        end: usize::MAX,
        step: 2,
    };
    assert_eq!(check(sl, &[f32t(&[2, 6])]), Ok(f32t(&[2, 3])));
    assert_eq!(
        check(Op::Concat { axis: 1 }, &[f32t(&[2, 3]), f32t(&[2, 5])]),
        Ok(f32t(&[2, 8]))
    );
    err_contains(
        check(Op::Concat { axis: 1 }, &[f32t(&[2, 3]), f32t(&[3, 5])]),
        "outside axis 1",
    );
    assert_eq!(
        check(Op::Expand { shape: vec![4, 3] }, &[f32t(&[1, 3])]),
        Ok(f32t(&[4, 3]))
    );
    err_contains(
        check(Op::Expand { shape: vec![4, 3] }, &[f32t(&[2, 3])]),
        "does not broadcast",
    );
    assert_eq!(
        check(
            Op::Pad {
                pads: vec![(1, 2)],
                value: 0.0
            },
            &[f32t(&[3])]
        ),
        Ok(f32t(&[6]))
    );
    assert_eq!(
        check(Op::SumTo { shape: vec![3] }, &[f32t(&[4, 3])]),
        Ok(f32t(&[3]))
    );
    let sum = |axes: Vec<usize>, keepdims| Op::Reduce {
        f: ReduceFn::Sum,
        axes,
        keepdims,
    };
    assert_eq!(
        check(sum(vec![1], false), &[f32t(&[2, 3, 4])]),
        Ok(f32t(&[2, 4]))
    );
    assert_eq!(
        check(sum(vec![], true), &[f32t(&[2, 3])]),
        Ok(f32t(&[1, 1]))
    );
    err_contains(check(sum(vec![1, 1], false), &[f32t(&[2, 3])]), "twice");
}

#[test]
fn constant_checks_its_bytes() {
    let mut value = TensorData::scalar(DType::F32, 1.0);
    assert_eq!(
        check(
            Op::Constant {
                value: value.clone()
            },
            &[]
        ),
        Ok(f32t(&[]))
    );
    value.bytes.pop();
    err_contains(check(Op::Constant { value }, &[]), "expected 4");
}

/// Sizes that overflow are errors in every build profile, never a panic (a
/// debug build's overflow check) or a wrapped value (a release build's).
#[test]
fn sizes_that_overflow_are_errors() {
    let big = 1usize << 32;
    let reshape = Op::Reshape {
        shape: vec![big, big, 2],
    };
    err_contains(check(reshape, &[f32t(&[4])]), "overflows");
    // An input of 2^80 elements is refused by any op reading it.
    let relu = Op::Unary { f: UnaryFn::Relu };
    err_contains(check(relu, &[f32t(&[1 << 40, 1 << 40])]), "overflows");
    let pad = Op::Pad {
        pads: vec![(usize::MAX, 1)],
        value: 0.0,
    };
    err_contains(check(pad, &[f32t(&[2])]), "overflow");
    // Empty tensors may have huge dims; their concatenation may not overflow.
    let half = TensorType::new(DType::Bool, vec![0, 1 << 63]);
    err_contains(
        check(Op::Concat { axis: 1 }, &[half.clone(), half]),
        "overflows",
    );
    // Attention FLOPs multiply dims of two tensors: counted in f64.
    let q = f32t(&[1, 1, 1 << 40, 0]);
    let op = Op::Attention {
        causal: false,
        scale: 1.0,
    };
    let out = check(op.clone(), &[q.clone(), q.clone(), q.clone()]);
    assert_eq!(out, Ok(q.clone()));
    let flops = fsdpc_ir::ops::flops(&op, &[&q, &q, &q], std::slice::from_ref(&q));
    assert_eq!(flops, 2f64.powi(80) * 5.0);
}

#[test]
fn cross_entropy_needs_at_least_one_class() {
    let ce = Op::CrossEntropy {
        ignore_index: Some(-100),
    };
    err_contains(
        check(ce.clone(), &[f32t(&[4, 0]), i64t(&[4])]),
        "no classes",
    );
    let grad = Op::CrossEntropyGrad { ignore_index: None };
    let r = check(grad, &[f32t(&[4, 0]), i64t(&[4]), f32t(&[])]);
    err_contains(r, "no classes");
    assert_eq!(check(ce, &[f32t(&[4, 1]), i64t(&[4])]), Ok(f32t(&[])));
}

#[test]
fn errors_name_the_node() {
    let mut g = Graph::new("t");
    let x = g.add_input("x", f32t(&[2, 3]));
    let w = g.add_input("w", f32t(&[4, 5]));
    let mm = Op::MatMul {
        trans_a: false,
        trans_b: false,
    };
    let err = g.add1(mm, &[x, w], "h.0.mlp.fc", ModuleId::ROOT);
    match err {
        Err(IrError::Shape { node, op, reason }) => {
            assert_eq!(node, "h.0.mlp.fc");
            assert_eq!(op, "mat_mul");
            assert!(reason.contains("inner dimensions"), "{reason}");
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
}

fn shape_strategy(max_rank: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..5, 0..=max_rank)
}

proptest! {
    /// Broadcasting a shape with a copy where some dims are 1 (or dropped)
    /// gives the original shape, from either side.
    #[test]
    fn broadcast_with_ones(shape in shape_strategy(5), mask in prop::collection::vec(any::<bool>(), 5), drop in 0usize..3) {
        let other: Vec<usize> = shape.iter().zip(&mask).map(|(&d, &m)| if m { 1 } else { d }).collect();
        let other = other[drop.min(other.len())..].to_vec();
        let add = Op::Binary { f: BinaryFn::Mul };
        prop_assert_eq!(check(add.clone(), &[f32t(&shape), f32t(&other)]), Ok(f32t(&shape)));
        prop_assert_eq!(check(add, &[f32t(&other), f32t(&shape)]), Ok(f32t(&shape)));
    }

    /// numpy's rule: each output dim is the max of the aligned dims, and a
    /// mismatch of two non-1 dims is an error.
    #[test]
    fn broadcast_matches_numpy(a in shape_strategy(4), b in shape_strategy(4)) {
        let n = a.len().max(b.len());
        let pad = |s: &Vec<usize>| { let mut v = vec![1; n - s.len()]; v.extend(s); v };
        let (pa, pb) = (pad(&a), pad(&b));
        let ok = pa.iter().zip(&pb).all(|(x, y)| x == y || *x == 1 || *y == 1);
        let r = broadcast_shapes(&a, &b);
        prop_assert_eq!(r.is_ok(), ok);
        if let Ok(out) = r {
            let want: Vec<usize> = pa.iter().zip(&pb).map(|(x, y)| *x.max(y)).collect();
            prop_assert_eq!(out, want);
        }
    }

    /// MatMul: `[batch, m, k] x [k, n]` in every transpose combination.
    #[test]
    fn matmul_shapes(batch in shape_strategy(2), m in 1usize..6, k in 1usize..6, n in 1usize..6, ta: bool, tb: bool) {
        let mut a = batch.clone();
        a.extend(if ta { [k, m] } else { [m, k] });
        let b = if tb { vec![n, k] } else { vec![k, n] };
        let mut want = batch.clone();
        want.extend([m, n]);
        prop_assert_eq!(check(Op::MatMul { trans_a: ta, trans_b: tb }, &[f32t(&a), f32t(&b)]), Ok(f32t(&want)));
    }

    /// Reshape accepts exactly the shapes with the same number of elements.
    #[test]
    fn reshape_numel(a in shape_strategy(4), b in shape_strategy(4)) {
        let same = a.iter().product::<usize>() == b.iter().product::<usize>();
        let r = check(Op::Reshape { shape: b.clone() }, &[f32t(&a)]);
        prop_assert_eq!(r.is_ok(), same);
    }

    /// Reduce removes (or keeps as 1) exactly the reduced axes.
    #[test]
    fn reduce_shapes(shape in shape_strategy(5), pick in prop::collection::vec(any::<bool>(), 5), keepdims: bool) {
        let axes: Vec<usize> = (0..shape.len()).filter(|&i| pick[i]).collect();
        let op = Op::Reduce { f: ReduceFn::Mean, axes: axes.clone(), keepdims };
        let out = check(op, &[f32t(&shape)]).map_err(TestCaseError::fail)?;
        let reduced = |i: usize| axes.is_empty() || axes.contains(&i);
        let want: Vec<usize> = (0..shape.len())
            .filter_map(|i| match (reduced(i), keepdims) { (false, _) => Some(shape[i]), (true, true) => Some(1), _ => None })
            .collect();
        prop_assert_eq!(out, f32t(&want));
    }

    /// Transposing by a permutation and then by its inverse restores the shape.
    #[test]
    fn transpose_roundtrip(shape in shape_strategy(5), seed: u64) {
        let mut perm: Vec<usize> = (0..shape.len()).collect();
        let mut s = seed;
        for i in (1..perm.len()).rev() { s = s.wrapping_mul(6364136223846793005).wrapping_add(1); perm.swap(i, (s >> 33) as usize % (i + 1)); }
        let mut inv = vec![0; perm.len()];
        for (i, &p) in perm.iter().enumerate() { inv[p] = i; }
        let t = check(Op::Transpose { perm }, &[f32t(&shape)]).map_err(TestCaseError::fail)?;
        prop_assert_eq!(check(Op::Transpose { perm: inv }, &[t]), Ok(f32t(&shape)));
    }
}

#[test]
fn builder_helpers_infer_types() {
    let mut g = Graph::new("b");
    let m = ModuleId::ROOT;
    let x = g.add_input("x", f32t(&[2, 3]));
    let w = g.add_input("w", f32t(&[3, 4]));
    let y = g.matmul(x, w, "mm", m).unwrap();
    let y = g.unary(UnaryFn::Relu, y, "relu", m).unwrap();
    let two = g.scalar(DType::F32, 2.0, "two", m).unwrap();
    let y = g.binary(BinaryFn::Mul, y, two, "scale", m).unwrap();
    let y = g.transpose(y, &[1, 0], "t", m).unwrap();
    let y = g.reshape(y, &[8], "flat", m).unwrap();
    let y = g.mean(y, &[], false, "mean", m).unwrap();
    assert_eq!(g.value_type(y), &f32t(&[]));
    assert!(g.reshape(x, &[5], "bad", m).is_err());
}

proptest! {
    /// A rejected node's error carries the node's name, the op and a reason.
    #[test]
    fn rejected_nodes_are_named(a in shape_strategy(3), b in shape_strategy(3), name in "[a-z]{1,8}(\\.[a-z0-9]{1,4}){0,3}") {
        prop_assume!(a.iter().product::<usize>() != b.iter().product::<usize>());
        let mut g = Graph::new("p");
        let x = g.add_input("x", f32t(&a));
        match g.add1(Op::Reshape { shape: b }, &[x], name.clone(), ModuleId::ROOT) {
            Err(IrError::Shape { node, op, reason }) => {
                prop_assert_eq!(node, name);
                prop_assert_eq!(op, "reshape");
                prop_assert!(reason.contains("cannot reshape"));
            }
            other => prop_assert!(false, "expected a shape error, got {:?}", other),
        }
    }
}

#[test]
fn convolution_and_pooling_rules() {
    use fsdpc_ir::Window2d;
    let stem = Window2d {
        stride: [2, 2],
        pads: [3; 4],
        ..Window2d::of_kernel([7, 7])
    };
    let conv = |window, groups| Op::Conv { window, groups };
    // ResNet's stem: 224 -> 112.
    assert_eq!(
        check(
            conv(stem, 1),
            &[f32t(&[2, 3, 224, 224]), f32t(&[64, 3, 7, 7]), f32t(&[64])]
        ),
        Ok(f32t(&[2, 64, 112, 112]))
    );
    // Depthwise: 32 groups of one channel.
    let dw = Window2d {
        pads: [1; 4],
        ..Window2d::of_kernel([3, 3])
    };
    assert_eq!(
        check(conv(dw, 32), &[f32t(&[1, 32, 8, 8]), f32t(&[32, 1, 3, 3])]),
        Ok(f32t(&[1, 32, 8, 8]))
    );
    err_contains(
        check(conv(dw, 1), &[f32t(&[1, 4, 8, 8]), f32t(&[8, 3, 3, 3])]),
        "must have 4 input channels per group",
    );
    err_contains(
        check(conv(dw, 3), &[f32t(&[1, 4, 8, 8]), f32t(&[6, 1, 3, 3])]),
        "groups 3 must divide the input channels 4",
    );
    err_contains(
        check(conv(dw, 1), &[f32t(&[1, 4, 8, 8]), f32t(&[8, 4, 5, 5])]),
        "5x5 kernel but the op's is [3, 3]",
    );
    err_contains(
        check(
            conv(dw, 1),
            &[f32t(&[1, 4, 8, 8]), f32t(&[8, 4, 3, 3]), f32t(&[4])],
        ),
        "b must have shape [8]",
    );
    err_contains(
        check(
            conv(dw, 1),
            &[f32t(&[1, 4, 8, 8, 8]), f32t(&[8, 4, 3, 3, 3])],
        ),
        "only 2-D convolutions",
    );
    let big = Window2d::of_kernel([5, 5]);
    err_contains(
        check(conv(big, 1), &[f32t(&[1, 1, 4, 4]), f32t(&[1, 1, 5, 5])]),
        "padded input has 4",
    );
    // Gradients restore the input's shape, even when the stride drops a row.
    let s2 = Window2d {
        stride: [2, 2],
        ..Window2d::of_kernel([3, 3])
    };
    let gi = Op::ConvGradInput {
        window: s2,
        groups: 1,
        input_hw: [8, 8],
    };
    assert_eq!(
        check(gi, &[f32t(&[5, 2, 3, 3]), f32t(&[1, 5, 3, 3])]),
        Ok(f32t(&[1, 2, 8, 8]))
    );
    let gw = Op::ConvGradWeight {
        window: s2,
        groups: 1,
    };
    assert_eq!(
        check(gw.clone(), &[f32t(&[1, 2, 8, 8]), f32t(&[1, 5, 3, 3])]),
        Ok(f32t(&[5, 2, 3, 3]))
    );
    err_contains(
        check(gw, &[f32t(&[1, 2, 8, 8]), f32t(&[1, 5, 4, 4])]),
        "must be [3, 3] spatially",
    );
    // Pooling: ResNet's max pool, a ceil-mode average.
    let pool = Window2d {
        stride: [2, 2],
        pads: [1; 4],
        ..Window2d::of_kernel([3, 3])
    };
    assert_eq!(
        check(Op::MaxPool { window: pool }, &[f32t(&[2, 64, 112, 112])]),
        Ok(f32t(&[2, 64, 56, 56]))
    );
    let ceil = Window2d {
        stride: [2, 2],
        ceil_mode: true,
        ..Window2d::of_kernel([2, 2])
    };
    let avg = Op::AvgPool {
        window: ceil,
        count_include_pad: false,
    };
    assert_eq!(
        check(avg.clone(), &[f32t(&[1, 3, 5, 5])]),
        Ok(f32t(&[1, 3, 3, 3]))
    );
    err_contains(check(avg, &[i64t(&[1, 3, 5, 5])]), "floating point");
    err_contains(
        check(
            Op::MaxPoolGrad { window: ceil },
            &[f32t(&[1, 3, 5, 5]), f32t(&[1, 3, 2, 2])],
        ),
        "the pooled x and dy",
    );
}
