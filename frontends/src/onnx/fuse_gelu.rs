//! Fusion of GELU as exporters write it before opset 20, elementwise:
//! `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` becomes `Unary{GeluTanh}` and
//! `0.5·x·(1 + erf(x/√2))` becomes `Unary{GeluErf}`, whatever the order and
//! grouping of the factors, when nothing else reads the intermediates.

use super::pattern::{bin, match_root, mul, replace_node, Pat};
use fsdpc_ir::{BinaryFn, Graph, NodeId, Op, UnaryFn, ValueId};

/// `1 + inner`.
fn one_plus(inner: Pat) -> Pat {
    bin(BinaryFn::Add, Pat::C(1.0), inner)
}

/// `0.5 · x · a` in its three groupings.
fn half_x_times(a: impl Fn() -> Pat) -> Vec<Pat> {
    vec![
        mul(mul(Pat::X, Pat::C(0.5)), a()),
        mul(Pat::X, mul(Pat::C(0.5), a())),
        mul(mul(Pat::X, a()), Pat::C(0.5)),
    ]
}

fn tanh_form() -> Vec<Pat> {
    let a = || {
        let cubic = bin(BinaryFn::Add, Pat::X, mul(Pat::C(0.044715), Pat::Cube));
        one_plus(Pat::Un(
            UnaryFn::Tanh,
            Box::new(mul(Pat::C((2.0 / std::f64::consts::PI).sqrt()), cubic)),
        ))
    };
    half_x_times(a)
}

fn erf_form() -> Vec<Pat> {
    let by_div = || {
        one_plus(Pat::Un(
            UnaryFn::Erf,
            Box::new(bin(BinaryFn::Div, Pat::X, Pat::C(std::f64::consts::SQRT_2))),
        ))
    };
    let by_mul = || {
        one_plus(Pat::Un(
            UnaryFn::Erf,
            Box::new(mul(Pat::X, Pat::C(std::f64::consts::FRAC_1_SQRT_2))),
        ))
    };
    half_x_times(by_div)
        .into_iter()
        .chain(half_x_times(by_mul))
        .collect()
}

/// The GELU rooted at node `root`, if any: its input and form.
fn match_at(g: &Graph, root: NodeId) -> Option<(ValueId, UnaryFn)> {
    let v = ValueId {
        node: root,
        slot: 0,
    };
    for (pats, f) in [
        (tanh_form(), UnaryFn::GeluTanh),
        (erf_form(), UnaryFn::GeluErf),
    ] {
        for p in &pats {
            if let Some(found) = match_root(g, v, p) {
                return (found.is_private(g)).then_some((found.x?, f));
            }
        }
    }
    None
}

/// Replaces every decomposed GELU in `g`; returns how many.
pub(crate) fn fuse_gelu(g: &mut Graph) -> usize {
    let roots: Vec<NodeId> = g
        .node_ids()
        .filter(|&n| g.node(n).op == Op::Binary { f: BinaryFn::Mul })
        .collect();
    let mut fused = 0;
    for root in roots {
        if !g.contains(root) {
            continue;
        }
        let Some((x, f)) = match_at(g, root) else {
            continue;
        };
        let (name, module) = (g.node(root).name.clone(), g.node(root).module);
        let Ok(y) = g.add1(Op::Unary { f }, &[x], format!("{name}/fused_gelu"), module) else {
            continue;
        };
        replace_node(g, root, y);
        fused += 1;
    }
    fused
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::tensor::HostTensor;
    use fsdpc_ir::{DType, ModuleId, TensorType};

    fn c(g: &mut Graph, v: f64) -> ValueId {
        let value = HostTensor::floats(DType::F32, vec![], vec![v]).to_data();
        g.add1(Op::Constant { value }, &[], "c", ModuleId::ROOT)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn op(g: &mut Graph, f: BinaryFn, a: ValueId, b: ValueId) -> ValueId {
        g.add1(Op::Binary { f }, &[a, b], "b", ModuleId::ROOT)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// `(x * 0.5) * (erf(x / sqrt2) + 1)`, with the erf's input also read
    /// elsewhere when `leak`.
    fn erf_gelu(leak: bool) -> Graph {
        let mut g = Graph::new("t");
        let x = g.add_input("x", TensorType::new(DType::F32, [2, 3]));
        let s2 = c(&mut g, std::f64::consts::SQRT_2);
        let d = op(&mut g, BinaryFn::Div, x, s2);
        let e = g.add1(Op::Unary { f: UnaryFn::Erf }, &[d], "erf", ModuleId::ROOT);
        let e = e.unwrap_or_else(|err| panic!("{err}"));
        let one = c(&mut g, 1.0);
        let a = op(&mut g, BinaryFn::Add, e, one);
        let half = c(&mut g, 0.5);
        let xh = op(&mut g, BinaryFn::Mul, x, half);
        let y = op(&mut g, BinaryFn::Mul, xh, a);
        g.outputs = vec![y];
        if leak {
            let extra = g.add1(Op::Unary { f: UnaryFn::Exp }, &[d], "exp", ModuleId::ROOT);
            g.outputs.push(extra.unwrap_or_else(|err| panic!("{err}")));
        }
        g
    }

    #[test]
    fn erf_gelu_is_fused() {
        let mut g = erf_gelu(false);
        assert_eq!(fuse_gelu(&mut g), 1);
        let y = g.node(g.outputs[0].node);
        assert_eq!(
            y.op,
            Op::Unary {
                f: UnaryFn::GeluErf
            }
        );
        assert_eq!(g.inputs(g.outputs[0].node)[0].node, fsdpc_ir::NodeId(0));
    }

    #[test]
    fn shared_intermediates_block_the_fusion() {
        assert_eq!(fuse_gelu(&mut erf_gelu(true)), 0);
    }
}
