//! Every op's gradient (through the IR's autodiff and the CPU kernels)
//! against central finite differences; see `support::grad` for the method
//! and tolerances. Property tests draw small shapes for the main ops.

use crate::support::grad::Case;
use fsdpc_ir::{BinaryFn, Op, ReduceFn, UnaryFn};
use proptest::prelude::*;

fn cfg() -> ProptestConfig {
    ProptestConfig {
        cases: 24,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

#[test]
fn unary_functions() {
    use UnaryFn::*;
    for f in [
        Neg, Exp, Log, Sqrt, Rsqrt, Reciprocal, Tanh, Relu, Sigmoid, Erf, Abs, GeluTanh, GeluErf,
        Silu, Square,
    ] {
        let mut c = Case::new(1);
        let vals: Vec<f32> = match f {
            Log | Sqrt | Rsqrt | Reciprocal => c.rng.vec(6).iter().map(|v| v.abs() + 0.5).collect(),
            _ => c.rng.away(6),
        };
        let x = c.param(&[2, 3], vals);
        let y = c.op(Op::Unary { f }, &[x]);
        c.check(y).unwrap_or_else(|e| panic!("{f:?}: {e}"));
    }
}

#[test]
fn where_dropout_and_cast() {
    let mut c = Case::new(2);
    let a = c.rand_param(&[2, 3]);
    let b = c.rand_param(&[3]);
    let zero = c.constant(&fsdpc_runtime::HostTensor::from_f32(&[], &[0.0]).unwrap());
    let cond = c.op(
        Op::Compare {
            f: fsdpc_ir::CompareFn::Greater,
        },
        &[a, zero],
    );
    let y = c.op(Op::Where, &[cond, a, b]);
    c.check(y).unwrap();
    let mut c = Case::new(3);
    let x = c.rand_param(&[4, 5]);
    let y = c.op(
        Op::Dropout {
            p: 0.3,
            seed: 9,
            whole_sample: None,
        },
        &[x],
    );
    c.check(y).unwrap();
    let mut c = Case::new(4);
    let x = c.rand_param(&[3]);
    let y = c.op(
        Op::Cast {
            to: fsdpc_ir::DType::F32,
        },
        &[x],
    );
    c.check(y).unwrap();
}

#[test]
fn rms_norm_and_log_softmax() {
    let mut c = Case::new(5);
    let x = c.rand_param(&[3, 4]);
    let g = c.rand_param(&[4]);
    let y = c.op(Op::RmsNorm { eps: 1e-5 }, &[x, g]);
    c.check(y).unwrap();
    let mut c = Case::new(6);
    let x = c.rand_param(&[3, 4]);
    let y = c.op(Op::LogSoftmax { axis: 1 }, &[x]);
    c.check(y).unwrap();
}

/// Two shapes that broadcast: `b` keeps a suffix of `a`'s axes, some set to 1.
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (
        prop::collection::vec(1usize..4, 1..4),
        any::<u32>(),
        0usize..3,
    )
        .prop_map(|(a, mask, drop)| {
            let drop = drop.min(a.len() - 1);
            let b: Vec<usize> = a[drop..]
                .iter()
                .enumerate()
                .map(|(i, &d)| if mask >> i & 1 == 1 { 1 } else { d })
                .collect();
            if mask >> 8 & 1 == 1 {
                (b, a)
            } else {
                (a, b)
            }
        })
}

proptest! {
    #![proptest_config(cfg())]

    #[test]
    fn binary_broadcast((sa, sb) in broadcast_pair(), f in prop::sample::select(vec![BinaryFn::Add, BinaryFn::Sub, BinaryFn::Mul, BinaryFn::Div, BinaryFn::Pow, BinaryFn::Max, BinaryFn::Min]), seed in 0u64..1000) {
        let mut c = Case::new(seed);
        let va: Vec<f32> = c.rng.away(sa.iter().product());
        let vb: Vec<f32> = c.rng.away(sb.iter().product());
        let (va, vb) = match f {
            BinaryFn::Pow => (va.iter().map(|v| v.abs() + 0.5).collect(), vb),
            // On grids offset by 0.05, so a finite-difference step never flips a comparison.
            BinaryFn::Max | BinaryFn::Min => (
                va.iter().map(|v| (v * 10.0).round() / 10.0 + 0.05).collect(),
                vb.iter().map(|v| (v * 10.0).round() / 10.0).collect(),
            ),
            _ => (va, vb),
        };
        let a = c.param(&sa, va);
        let b = c.param(&sb, vb);
        let y = c.op(Op::Binary { f }, &[a, b]);
        prop_assert!(c.check(y).is_ok(), "{:?}", f);
    }

    #[test]
    fn matmul_trans_and_batch(m in 1usize..4, k in 1usize..4, n in 1usize..4, batch in 1usize..3, ta: bool, tb: bool, b_batched: bool, seed in 0u64..1000) {
        let mut c = Case::new(seed);
        let sa = if ta { vec![batch, k, m] } else { vec![batch, m, k] };
        let sb_mat = if tb { vec![n, k] } else { vec![k, n] };
        let sb = if b_batched { [vec![batch], sb_mat].concat() } else { sb_mat };
        let a = c.rand_param(&sa);
        let b = c.rand_param(&sb);
        let y = c.op(Op::MatMul { trans_a: ta, trans_b: tb }, &[a, b]);
        let r = c.check(y);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn layer_norm(rows in 1usize..4, d in 2usize..6, beta: bool, seed in 0u64..1000) {
        let mut c = Case::new(seed);
        // Rows spread out (std >= ~0.3): a near-constant row has a huge,
        // sharply curved gradient that central differences cannot resolve.
        let mut vals = Vec::new();
        for _ in 0..rows {
            let mut row: Vec<f32> = (0..d).map(|i| i as f32 * 0.6 - 1.0).collect();
            for i in (1..d).rev() {
                row.swap(i, c.rng.below(i as u64 + 1) as usize);
            }
            vals.extend(row.iter().map(|v| v + 0.05 * c.rng.sym()));
        }
        let x = c.param(&[rows, d], vals);
        let g = c.rand_param(&[d]);
        let mut ins = vec![x, g];
        if beta {
            ins.push(c.rand_param(&[d]));
        }
        let y = c.op(Op::LayerNorm { eps: 1e-5 }, &ins);
        let r = c.check(y);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn softmax_any_axis(dims in prop::collection::vec(1usize..4, 1..4), axis_pick in 0usize..3, seed in 0u64..1000) {
        let axis = axis_pick % dims.len();
        let mut c = Case::new(seed);
        let x = c.rand_param(&dims);
        let y = c.op(Op::Softmax { axis }, &[x]);
        let r = c.check(y);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn attention(heads in 1usize..3, s in 1usize..5, d in 1usize..4, causal: bool, seed in 0u64..1000) {
        let mut c = Case::new(seed);
        let q = c.rand_param(&[1, heads, s, d]);
        let k = c.rand_param(&[1, heads, s, d]);
        let v = c.rand_param(&[1, heads, s, d]);
        let y = c.op(Op::Attention { causal, scale: 1.0 / (d as f64).sqrt() }, &[q, k, v]);
        let r = c.check(y);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn gather(rows in 1usize..5, cols in 1usize..4, n in 1usize..5, axis in 0usize..2, seed in 0u64..1000) {
        let mut c = Case::new(seed);
        let data = c.rand_param(&[rows, cols]);
        let range = if axis == 0 { rows } else { cols } as u64;
        let idx: Vec<i64> = (0..n).map(|_| c.rng.below(range)).collect();
        let i = c.ints("idx", &[n], idx);
        let y = c.op(Op::Gather { axis }, &[data, i]);
        let r = c.check(y);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn cross_entropy(n in 1usize..5, classes in 2usize..5, ignore_some: bool, seed in 0u64..1000) {
        let mut c = Case::new(seed);
        let logits = c.rand_param(&[n, classes]);
        let mut labels: Vec<i64> = (0..n).map(|_| c.rng.below(classes as u64)).collect();
        if ignore_some && n > 1 {
            labels[0] = -100;
        }
        let l = c.ints("labels", &[n], labels);
        let y = c.op(Op::CrossEntropy { ignore_index: Some(-100) }, &[logits, l]);
        let r = c.check(y);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn tp_lookup(rows in 1usize..4, cols in 1usize..4, n in 1usize..5, member in 0i64..2, padded: bool, seed in 0u64..1000) {
        let mut c = Case::new(seed);
        let table = c.rand_param(&[rows, cols]);
        // Padded: member 1's last row is padding, never looked up.
        let vocab = padded.then_some(2 * rows - 1);
        let whole = vocab.unwrap_or(2 * rows) as u64;
        let idx: Vec<i64> = (0..n).map(|_| c.rng.below(whole)).collect();
        let i = c.ints("idx", &[n], idx);
        let off = c.ints("offset", &[1, 1], vec![member * rows as i64]);
        let y = c.op(Op::TpLookup { parts: 2, vocab }, &[table, i, off]);
        let r = c.check(y);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn tp_logit_stats(n in 1usize..5, classes in 2usize..5, member in 0i64..2, ignore_some: bool, padded: bool, seed in 0u64..1000) {
        let mut c = Case::new(seed);
        // Distinct values 0.05 apart, so no finite-difference step moves a
        // row's maximum (the statistics' first column).
        let count = n * classes;
        let mut vals: Vec<f32> = (0..count).map(|i| i as f32 * 0.05 - 0.5).collect();
        for i in (1..count).rev() {
            vals.swap(i, c.rng.below(i as u64 + 1) as usize);
        }
        let logits = c.param(&[n, classes], vals);
        // Padded: member 1's last column is padding, in no statistic and
        // with a zero gradient (the finite differences see it so too).
        let vocab = padded.then_some(2 * classes - 1);
        let whole = vocab.unwrap_or(2 * classes) as u64;
        let mut labels: Vec<i64> = (0..n).map(|_| c.rng.below(whole)).collect();
        if ignore_some && n > 1 {
            labels[0] = -100;
        }
        let l = c.ints("labels", &[n], labels);
        let off = c.ints("offset", &[1, 1], vec![member * classes as i64]);
        let y = c.op(Op::TpLogitStats { ignore_index: Some(-100), parts: 2, vocab }, &[logits, l, off]);
        let r = c.check(y);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn reduce(dims in prop::collection::vec(1usize..4, 1..4), axis_mask in 1u32..8, keepdims: bool, f in prop::sample::select(vec![ReduceFn::Sum, ReduceFn::Mean, ReduceFn::Max]), seed in 0u64..1000) {
        let axes: Vec<usize> = (0..dims.len()).filter(|i| axis_mask >> i & 1 == 1).collect();
        prop_assume!(!axes.is_empty());
        let mut c = Case::new(seed);
        // Distinct values 0.05 apart, so no finite-difference step reorders the maximum.
        let n: usize = dims.iter().product();
        let mut vals: Vec<f32> = (0..n).map(|i| i as f32 * 0.05 - 0.5).collect();
        for i in (1..n).rev() {
            vals.swap(i, c.rng.below(i as u64 + 1) as usize);
        }
        let x = c.param(&dims, vals);
        let y = c.op(Op::Reduce { f, axes, keepdims }, &[x]);
        let r = c.check(y);
        prop_assert!(r.is_ok(), "{:?}", r);
    }

    #[test]
    fn shape_ops(a in 1usize..4, b in 1usize..4, c3 in 1usize..4, start in 0usize..3, step in 1usize..3, seed in 0u64..1000) {
        let mut c = Case::new(seed);
        let x = c.rand_param(&[a, b, c3]);
        let t = c.op(Op::Transpose { perm: vec![2, 0, 1] }, &[x]);
        let r = c.op(Op::Reshape { shape: vec![c3 * a, b] }, &[t]);
        let start = start.min(c3 * a - 1);
        let s = c.op(Op::Slice { axis: 0, start, end: c3 * a, step }, &[r]);
        let rows = (c3 * a - start).div_ceil(step);
        let other = c.rand_param(&[rows, 2]);
        let cat = c.op(Op::Concat { axis: 1 }, &[s, other]);
        let p = c.op(Op::Pad { pads: vec![(1, 0), (0, 2)], value: 0.5 }, &[cat]);
        let e = c.op(Op::Expand { shape: vec![2, rows + 1, b + 4] }, &[p]);
        let res = c.check(e);
        prop_assert!(res.is_ok(), "{:?}", res);
    }
}

/// The members' logit statistics, combined, are the whole logits'
/// cross-entropy, on a vocabulary the members divide and on one they do
/// not (padded: the padding columns hold large values that would change
/// every statistic if they counted), and a label outside the whole
/// vocabulary is an error.
#[test]
fn split_logit_statistics_combine_into_the_cross_entropy() {
    use crate::support::run_cpu;
    use fsdpc_ir::{DType, TensorType};
    use fsdpc_runtime::HostTensor;
    let (n, parts) = (5usize, 3usize);
    for c in [6usize, 7] {
        let x: Vec<f32> = (0..n * c)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.7)
            .collect();
        let labels = vec![0i64, 5, -100, 3, c as i64 - 1];
        let lab = HostTensor::from_i64(&[n], &labels).unwrap();
        let whole = HostTensor::from_f32(&[n, c], &x).unwrap();
        let ce = Op::CrossEntropy {
            ignore_index: Some(-100),
        };
        let want = run_cpu(
            ce,
            &[whole, lab.clone()],
            &[TensorType::new(DType::F32, vec![])],
        )
        .unwrap()[0]
            .to_f32()[0];
        let local = c.div_ceil(parts);
        let vocab = (!c.is_multiple_of(parts)).then_some(c);
        let stats: Vec<Vec<f32>> = (0..parts)
            .map(|k| {
                let x = &x;
                let part: Vec<f32> = (0..n)
                    .flat_map(|r| {
                        (k * local..(k + 1) * local)
                            .map(move |j| if j < c { x[r * c + j] } else { 50.0 })
                    })
                    .collect();
                let ins = [
                    HostTensor::from_f32(&[n, local], &part).unwrap(),
                    lab.clone(),
                    HostTensor::from_i64(&[1, 1], &[(k * local) as i64]).unwrap(),
                ];
                let op = Op::TpLogitStats {
                    ignore_index: Some(-100),
                    parts: parts as u32,
                    vocab,
                };
                run_cpu(op, &ins, &[TensorType::new(DType::F32, vec![1, n, 3])]).unwrap()[0]
                    .to_f32()
            })
            .collect();
        let (mut sum, mut count) = (0f64, 0);
        for (r, &l) in labels.iter().enumerate() {
            if l == -100 {
                continue;
            }
            let m = stats
                .iter()
                .map(|s| s[3 * r])
                .fold(f32::NEG_INFINITY, f32::max);
            let total: f32 = stats
                .iter()
                .map(|s| s[3 * r + 1] * (s[3 * r] - m).exp())
                .sum();
            let target: f32 = stats.iter().map(|s| s[3 * r + 2]).sum();
            sum += f64::from(total.ln() + m - target);
            count += 1;
        }
        let got = (sum / f64::from(count)) as f32;
        assert!(
            (got - want).abs() <= 1e-6 * want.abs(),
            "{c} classes: {got} vs {want}"
        );
    }
    // A label of 18 is outside 3 members' 6 columns; one of 7 outside a
    // vocabulary of 7 padded to 3 parts of 3.
    let bad = HostTensor::from_i64(&[1], &[18]).unwrap();
    let e = run_cpu(
        Op::TpLogitStats {
            ignore_index: None,
            parts: 3,
            vocab: None,
        },
        &[
            HostTensor::from_f32(&[1, 2], &[0.0, 1.0]).unwrap(),
            bad,
            HostTensor::from_i64(&[1, 1], &[0]).unwrap(),
        ],
        &[TensorType::new(DType::F32, vec![1, 1, 3])],
    )
    .unwrap_err();
    assert!(e.contains("label 18 out of range for 6 classes"), "{e}");
    let bad = HostTensor::from_i64(&[1], &[7]).unwrap();
    let e = run_cpu(
        Op::TpLogitStats {
            ignore_index: None,
            parts: 3,
            vocab: Some(7),
        },
        &[
            HostTensor::from_f32(&[1, 3], &[0.0, 1.0, 2.0]).unwrap(),
            bad,
            HostTensor::from_i64(&[1, 1], &[6]).unwrap(),
        ],
        &[TensorType::new(DType::F32, vec![1, 1, 3])],
    )
    .unwrap_err();
    assert!(e.contains("label 7 out of range for 7 classes"), "{e}");
}
