//! The e-graph layout simplification of the ONNX import keeps forward
//! values: a graph with a cancelling transpose pair, a reshape chain back to
//! its input's shape, a composable transpose pair and a transpose feeding a
//! matmul evaluates to the same outputs before and after, with fewer nodes.

use fsdpc_frontends::onnx::simplify_layout;
use fsdpc_ir::{DType, Graph, Op, TensorType, ValueId};
use fsdpc_runtime::{eval_graph, HostTensor, KernelCtx};
use std::collections::HashMap;

fn t(perm: &[usize]) -> Op {
    Op::Transpose {
        perm: perm.to_vec(),
    }
}

fn r(shape: &[usize]) -> Op {
    Op::Reshape {
        shape: shape.to_vec(),
    }
}

fn graph() -> Graph {
    let mut g = Graph::new("layout");
    let x = g.add_input("x", TensorType::new(DType::F32, [2, 3, 4]));
    let w = g.add_input("w", TensorType::new(DType::F32, [5, 4]));
    let m = g.module("block", "Block");
    let mut add = |op: Op, ins: &[ValueId]| g.add1(op, ins, "n", m).expect("valid op");
    let a = add(t(&[0, 2, 1]), &[x]);
    let b = add(t(&[0, 2, 1]), &[a]);
    let c = add(r(&[6, 4]), &[b]);
    let d = add(r(&[2, 12]), &[c]);
    let e = add(r(&[2, 3, 4]), &[d]);
    let f = add(t(&[1, 0, 2]), &[e]);
    let h = add(t(&[0, 2, 1]), &[f]);
    let wt = add(t(&[1, 0]), &[w]);
    let mm = Op::MatMul {
        trans_a: false,
        trans_b: false,
    };
    let y = add(mm, &[e, wt]);
    g.outputs = vec![h, y];
    g
}

/// Deterministic values in [-1, 1).
fn random(shape: &[usize], seed: u64) -> HostTensor {
    let n: usize = shape.iter().product();
    let mut s = seed;
    let data: Vec<f32> = (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect();
    HostTensor::from_f32(shape, &data).expect("tensor")
}

fn outputs(g: &Graph, feeds: &HashMap<String, HostTensor>) -> Vec<Vec<f32>> {
    let values = eval_graph(g, feeds, &HashMap::new(), &KernelCtx::default()).expect("eval");
    g.outputs.iter().map(|v| values[v].to_f32()).collect()
}

#[test]
fn layout_simplification_keeps_forward_values() {
    let before = graph();
    let mut after = before.clone();
    assert_eq!(simplify_layout(&mut after), 3);
    // The graph stays acyclic; count the nodes its outputs still reach.
    let (after, _) = after.renumbered().expect("acyclic");
    let live: usize = {
        let mut seen = std::collections::HashSet::new();
        let mut stack: Vec<_> = after.outputs.iter().map(|v| v.node).collect();
        while let Some(n) = stack.pop() {
            if seen.insert(n) {
                stack.extend(after.inputs(n).iter().map(|v| v.node));
            }
        }
        seen.len()
    };
    // x, w, one composed transpose, the matmul.
    assert_eq!(live, 4);
    let feeds: HashMap<String, HostTensor> = [
        ("x".to_string(), random(&[2, 3, 4], 1)),
        ("w".to_string(), random(&[5, 4], 2)),
    ]
    .into();
    let (want, got) = (outputs(&before, &feeds), outputs(&after, &feeds));
    assert_eq!(want.len(), got.len());
    assert_eq!(want[0], got[0], "layout ops move values exactly");
    for (a, b) in want[1].iter().zip(&got[1]) {
        assert!((a - b).abs() <= 1e-5 * (1.0 + a.abs()), "{a} vs {b}");
    }
}
