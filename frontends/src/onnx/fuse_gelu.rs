//! Fusion of GELU as exporters write it before opset 20, elementwise:
//! `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))` becomes `Unary{GeluTanh}` and
//! `0.5·x·(1 + erf(x/√2))` becomes `Unary{GeluErf}`, whatever the order and
//! grouping of the factors. Only nodes read by nothing else are replaced.

use fsdpc_ir::{BinaryFn, Graph, NodeId, Op, UnaryFn, ValueId};

/// An elementwise expression pattern over one variable.
enum Pat {
    /// The variable (bound at first sight, equal afterwards).
    X,
    /// A scalar constant, compared with a relative tolerance.
    C(f64),
    Bin(BinaryFn, Box<Pat>, Box<Pat>),
    Un(UnaryFn, Box<Pat>),
    /// `x^3` as `Pow(x, 3)` or `x·x·x`.
    Cube,
}

fn bin(f: BinaryFn, a: Pat, b: Pat) -> Pat {
    Pat::Bin(f, Box::new(a), Box::new(b))
}

fn mul(a: Pat, b: Pat) -> Pat {
    bin(BinaryFn::Mul, a, b)
}

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

/// What a match found: the variable and the nodes it covered.
#[derive(Clone, Default)]
struct Found {
    x: Option<ValueId>,
    nodes: Vec<NodeId>,
}

fn scalar(g: &Graph, v: ValueId) -> Option<f64> {
    match &g.try_node(v.node)?.op {
        Op::Constant { value } => {
            let t = super::tensor::HostTensor::from_data(value).ok()?;
            (t.numel() == 1).then(|| t.as_f64()[0])
        }
        _ => None,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-4 * b.abs().max(1e-6)
}

/// Matches `p` at `v`, extending `found`; commutative ops try both orders.
fn matches(g: &Graph, v: ValueId, p: &Pat, found: &mut Found) -> bool {
    match p {
        Pat::X => match found.x {
            Some(x) => x == v,
            None => {
                found.x = Some(v);
                true
            }
        },
        Pat::C(c) => scalar(g, v).is_some_and(|s| close(s, *c)),
        Pat::Cube => {
            let pow = bin(BinaryFn::Pow, Pat::X, Pat::C(3.0));
            let prod = mul(Pat::X, mul(Pat::X, Pat::X));
            let prod2 = mul(mul(Pat::X, Pat::X), Pat::X);
            [pow, prod, prod2].iter().any(|q| attempt(g, v, q, found))
        }
        Pat::Un(f, a) => match g.try_node(v.node).map(|n| &n.op) {
            Some(Op::Unary { f: h }) if h == f => {
                found.nodes.push(v.node);
                g.inputs(v.node)
                    .first()
                    .is_some_and(|&i| matches(g, i, a, found))
            }
            _ => false,
        },
        Pat::Bin(f, a, b) => match g.try_node(v.node).map(|n| &n.op) {
            Some(Op::Binary { f: h }) if h == f => {
                let ins = g.inputs(v.node);
                let [l, r] = ins.as_slice() else { return false };
                found.nodes.push(v.node);
                let commutes = matches!(f, BinaryFn::Add | BinaryFn::Mul);
                both(g, *l, a, *r, b, found) || (commutes && both(g, *r, a, *l, b, found))
            }
            _ => false,
        },
    }
}

/// `matches` on a copy of `found`, kept only on success.
fn attempt(g: &Graph, v: ValueId, p: &Pat, found: &mut Found) -> bool {
    let mut trial = found.clone();
    let ok = matches(g, v, p, &mut trial);
    if ok {
        *found = trial;
    }
    ok
}

fn both(g: &Graph, l: ValueId, a: &Pat, r: ValueId, b: &Pat, found: &mut Found) -> bool {
    let mut trial = found.clone();
    let ok = matches(g, l, a, &mut trial) && matches(g, r, b, &mut trial);
    if ok {
        *found = trial;
    }
    ok
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
            let mut found = Found::default();
            if matches(g, v, p, &mut found) {
                let x = found.x?;
                let inner_private = found
                    .nodes
                    .iter()
                    .filter(|&&n| n != root)
                    .all(|&n| g.users(ValueId { node: n, slot: 0 }).len() == 1);
                return inner_private.then_some((x, f));
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
        let old = ValueId {
            node: root,
            slot: 0,
        };
        for (user, slot) in g.users(old) {
            g.set_input(user, slot, y);
        }
        for o in g.outputs.iter_mut().filter(|o| **o == old) {
            *o = y;
        }
        g.remove_node(root);
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
