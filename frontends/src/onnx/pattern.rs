//! A small matcher of elementwise expression patterns on the IR graph, for
//! the fusions of decomposed ops (GELU, LayerNorm). `Add` and `Mul` match in
//! either operand order; the variable and captured values bind at first
//! sight and must agree afterwards.

use super::tensor::HostTensor;
use fsdpc_ir::{BinaryFn, Graph, NodeId, Op, ReduceFn, UnaryFn, ValueId};
use std::collections::HashSet;

/// An expression pattern.
pub(crate) enum Pat {
    /// The variable.
    X,
    /// Any value, captured in slot `k` (the same value at every use).
    Any(usize),
    /// A scalar constant, compared with a relative tolerance.
    C(f64),
    /// A small positive scalar constant (an epsilon), captured.
    Eps,
    Bin(BinaryFn, Box<Pat>, Box<Pat>),
    Un(UnaryFn, Box<Pat>),
    /// A mean over the last axis, keeping it.
    MeanLast(Box<Pat>),
    /// `x^3` as `Pow(x, 3)` or `x·x·x`.
    Cube,
}

/// `f(a, b)`.
pub(crate) fn bin(f: BinaryFn, a: Pat, b: Pat) -> Pat {
    Pat::Bin(f, Box::new(a), Box::new(b))
}

/// `a · b`.
pub(crate) fn mul(a: Pat, b: Pat) -> Pat {
    bin(BinaryFn::Mul, a, b)
}

/// What a match found.
#[derive(Clone, Default)]
pub(crate) struct Found {
    pub x: Option<ValueId>,
    pub any: Vec<Option<ValueId>>,
    pub eps: Option<f64>,
    /// Every node the pattern covered (the root first).
    pub nodes: Vec<NodeId>,
}

impl Found {
    /// True if nothing outside the match reads a covered node other than the root.
    pub fn is_private(&self, g: &Graph) -> bool {
        let set: HashSet<NodeId> = self.nodes.iter().copied().collect();
        self.nodes.iter().skip(1).all(|&n| {
            g.users(ValueId { node: n, slot: 0 })
                .iter()
                .all(|(u, _)| set.contains(u))
        })
    }
}

fn scalar(g: &Graph, v: ValueId) -> Option<f64> {
    match &g.try_node(v.node)?.op {
        Op::Constant { value } => {
            let t = HostTensor::from_data(value).ok()?;
            (t.numel() == 1).then(|| t.as_f64()[0])
        }
        _ => None,
    }
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-4 * b.abs().max(1e-6)
}

/// Matches `p` at `v` from scratch.
pub(crate) fn match_root(g: &Graph, v: ValueId, p: &Pat) -> Option<Found> {
    let mut found = Found::default();
    matches(g, v, p, &mut found).then_some(found)
}

fn bind(slot: &mut Option<ValueId>, v: ValueId) -> bool {
    match slot {
        Some(x) => *x == v,
        None => {
            *slot = Some(v);
            true
        }
    }
}

fn matches(g: &Graph, v: ValueId, p: &Pat, found: &mut Found) -> bool {
    match p {
        Pat::X => bind(&mut found.x, v),
        Pat::Any(k) => {
            if found.any.len() <= *k {
                found.any.resize(k + 1, None);
            }
            bind(&mut found.any[*k], v)
        }
        Pat::C(c) => scalar(g, v).is_some_and(|s| close(s, *c)),
        Pat::Eps => match scalar(g, v) {
            Some(e) if e > 0.0 && e <= 0.1 && found.eps.is_none_or(|f| f == e) => {
                found.eps = Some(e);
                true
            }
            _ => false,
        },
        Pat::Cube => {
            let pow = bin(BinaryFn::Pow, Pat::X, Pat::C(3.0));
            let prod = mul(Pat::X, mul(Pat::X, Pat::X));
            let prod2 = mul(mul(Pat::X, Pat::X), Pat::X);
            [pow, prod, prod2]
                .iter()
                .any(|q| attempt(g, &[(v, q)], found))
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
        Pat::MeanLast(a) => match g.try_node(v.node).map(|n| &n.op) {
            Some(Op::Reduce {
                f: ReduceFn::Mean,
                axes,
                keepdims: true,
            }) if axes.len() == 1 && axes[0] + 1 == g.value_type(v).shape.rank() => {
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
                attempt(g, &[(*l, a), (*r, b)], found)
                    || (commutes && attempt(g, &[(*r, a), (*l, b)], found))
            }
            _ => false,
        },
    }
}

/// Matches every `(value, pattern)` pair on a copy of `found`, kept only if
/// all succeed.
fn attempt(g: &Graph, pairs: &[(ValueId, &Pat)], found: &mut Found) -> bool {
    let mut trial = found.clone();
    let ok = pairs.iter().all(|(v, p)| matches(g, *v, p, &mut trial));
    if ok {
        *found = trial;
    }
    ok
}

/// Points every reader of node `old`'s output (and the graph outputs) at
/// `new`, then removes `old`.
pub(crate) fn replace_node(g: &mut Graph, old: NodeId, new: ValueId) {
    g.replace_uses(ValueId { node: old, slot: 0 }, new);
    g.remove_node(old);
}
