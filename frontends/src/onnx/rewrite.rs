//! Layout-chain simplification with an e-graph: PyTorch exports chains of
//! `Transpose` and `Reshape` (view/permute/flatten/unsqueeze) that cancel or
//! collapse. Each maximal chain whose intermediate values have no other
//! reader becomes a small e-graph over `x` (the chain's input), the named
//! rules below saturate it, and the smallest equivalent chain (by `AstSize`:
//! every layout op costs its node plus its attribute leaf) replaces it when
//! it has fewer ops:
//!
//! - `transpose-of-transpose`: `transpose(transpose(x, p), q)` is
//!   `transpose(x, r)` with `r[i] = p[q[i]]`;
//! - `identity-transpose`: `transpose(x, [0, 1, ..])` is `x`;
//! - `reshape-of-reshape`: `reshape(reshape(x, a), b)` is `reshape(x, b)`;
//! - `reshape-to-own-shape`: `reshape(x, s)` is `x` when `x` has shape `s`.
//!
//! Every run is bounded (iterations, e-nodes, time); a run that does not
//! saturate, or a replacement whose type differs from the chain's output,
//! leaves the chain as it was. The replaced chain is left dead for
//! `remove_dead`.
//!
//! Last, a transpose of the last two axes read only by a `MatMul` becomes
//! that matmul's `trans_a`/`trans_b` flag (`fold_into_matmul`).

use egg::{
    define_language, merge_option, rewrite, Analysis, Applier, AstSize, DidMerge, EGraph,
    Extractor, Id, Language, PatternAst, RecExpr, Rewrite, Runner, StopReason, Subst, Symbol, Var,
};
use fsdpc_ir::{Graph, NodeId, Op, ValueId};
use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// An attribute leaf: a permutation or a target shape, written `[0,2,1]`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
struct Dims(Vec<usize>);

impl fmt::Display for Dims {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(usize::to_string).collect();
        write!(f, "[{}]", parts.join(","))
    }
}

impl FromStr for Dims {
    type Err = ();
    fn from_str(s: &str) -> Result<Dims, ()> {
        let inner = s
            .strip_prefix('[')
            .and_then(|s| s.strip_suffix(']'))
            .ok_or(())?;
        let dims = inner.split(',').filter(|d| !d.is_empty());
        Ok(Dims(
            dims.map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| ())?,
        ))
    }
}

define_language! {
    /// Layout ops over one input `x`: `(transpose perm x)`, `(reshape shape x)`.
    enum Layout {
        "transpose" = Transpose([Id; 2]),
        "reshape" = Reshape([Id; 2]),
        Dims(Dims),
        Base(Symbol),
    }
}

/// Per e-class: the dims of an attribute leaf, or the shape of a value.
struct Shapes {
    /// The shape of `x`, the chain's input.
    base: Vec<usize>,
}

impl Analysis<Layout> for Shapes {
    type Data = Option<Vec<usize>>;

    fn make(egraph: &mut EGraph<Layout, Self>, enode: &Layout, _id: Id) -> Self::Data {
        match enode {
            Layout::Base(_) => Some(egraph.analysis.base.clone()),
            Layout::Dims(d) => Some(d.0.clone()),
            Layout::Reshape([s, _]) => egraph[*s].data.clone(),
            Layout::Transpose([p, x]) => {
                let (p, x) = (egraph[*p].data.as_ref()?, egraph[*x].data.as_ref()?);
                p.iter().map(|&i| x.get(i).copied()).collect()
            }
        }
    }

    fn merge(&mut self, a: &mut Self::Data, b: Self::Data) -> DidMerge {
        // Equal classes have equal shapes; keep whichever is known.
        merge_option(a, b, |_, _| DidMerge(false, false))
    }
}

type LayoutGraph = EGraph<Layout, Shapes>;

/// `transpose(transpose(x, p), q)` → `transpose(x, r)`, `r[i] = p[q[i]]`.
struct ComposePerms {
    p: Var,
    q: Var,
    x: Var,
}

impl Applier<Layout, Shapes> for ComposePerms {
    fn apply_one(
        &self,
        egraph: &mut LayoutGraph,
        eclass: Id,
        subst: &Subst,
        _ast: Option<&PatternAst<Layout>>,
        _rule: Symbol,
    ) -> Vec<Id> {
        let (Some(p), Some(q)) = (&egraph[subst[self.p]].data, &egraph[subst[self.q]].data) else {
            return vec![];
        };
        let Some(r) = q.iter().map(|&i| p.get(i).copied()).collect() else {
            return vec![];
        };
        let r = egraph.add(Layout::Dims(Dims(r)));
        let t = egraph.add(Layout::Transpose([r, subst[self.x]]));
        if egraph.union(eclass, t) {
            vec![t]
        } else {
            vec![]
        }
    }
}

fn var(s: &str) -> Var {
    s.parse().expect("a pattern variable")
}

/// `?p` is the identity permutation.
fn is_identity(p: Var) -> impl Fn(&mut LayoutGraph, Id, &Subst) -> bool {
    move |eg, _, s| {
        eg[s[p]]
            .data
            .as_ref()
            .is_some_and(|p| p.iter().enumerate().all(|(i, &j)| i == j))
    }
}

/// `?x` already has shape `?s`.
fn has_shape(s: Var, x: Var) -> impl Fn(&mut LayoutGraph, Id, &Subst) -> bool {
    move |eg, _, sub| eg[sub[s]].data.is_some() && eg[sub[s]].data == eg[sub[x]].data
}

fn rules() -> Vec<Rewrite<Layout, Shapes>> {
    let (p, q, x) = (var("?p"), var("?q"), var("?x"));
    vec![
        rewrite!("transpose-of-transpose"; "(transpose ?q (transpose ?p ?x))"
            => { ComposePerms { p, q, x } }),
        rewrite!("identity-transpose"; "(transpose ?p ?x)" => "?x" if is_identity(p)),
        rewrite!("reshape-of-reshape"; "(reshape ?b (reshape ?a ?x))" => "(reshape ?b ?x)"),
        rewrite!("reshape-to-own-shape"; "(reshape ?s ?x)" => "?x" if has_shape(var("?s"), x)),
    ]
}

fn val(node: NodeId) -> ValueId {
    ValueId { node, slot: 0 }
}

fn is_layout(op: &Op) -> bool {
    matches!(op, Op::Transpose { .. } | Op::Reshape { .. })
}

/// The layout node feeding `n`, when `n` is its only reader and its value is
/// not a graph output (so the chain through it may be rewritten).
fn below(g: &Graph, n: NodeId) -> Option<NodeId> {
    let x = *g.inputs(n).first()?;
    let private = x.slot == 0 && g.users(x) == [(n, 0)] && !g.outputs.contains(&x);
    (private && is_layout(&g.node(x.node).op)).then_some(x.node)
}

/// Simplifies every layout chain in `g` and folds transposes into matmuls;
/// returns how many rewrites were made. Every ONNX import runs it; public
/// for graphs built elsewhere. Replaced nodes are left dead.
pub fn simplify_layout(g: &mut Graph) -> usize {
    let layout: Vec<NodeId> = g.node_ids().filter(|&n| is_layout(&g.node(n).op)).collect();
    let inner: HashSet<NodeId> = layout.iter().filter_map(|&n| below(g, n)).collect();
    let mut rewritten = 0;
    for &outer in layout.iter().filter(|n| !inner.contains(n)) {
        let mut chain = vec![outer];
        while let Some(n) = below(g, *chain.last().expect("non-empty")) {
            chain.push(n);
        }
        rewritten += usize::from(rewrite_chain(g, &chain).is_some());
    }
    rewritten + fold_into_matmul(g)
}

/// `matmul(transpose(a, swap), b)` → `matmul(a, b)` with `trans_a` flipped
/// (likewise for `b`), where `swap` exchanges the last two axes only and the
/// matmul is the transpose's only reader. A peephole outside the e-graph,
/// whose language holds layout ops only. Returns how many folded.
fn fold_into_matmul(g: &mut Graph) -> usize {
    let swaps = |op: &Op| match op {
        Op::Transpose { perm } if perm.len() >= 2 => {
            let n = perm.len();
            perm[..n - 2].iter().enumerate().all(|(i, &j)| i == j)
                && perm[n - 2..] == [n - 1, n - 2]
        }
        _ => false,
    };
    let ts: Vec<NodeId> = g.node_ids().filter(|&n| swaps(&g.node(n).op)).collect();
    let mut folded = 0;
    for t in ts {
        let (users, ins) = (g.users(val(t)), g.inputs(t));
        let ([(mm, slot)], [a]) = (users.as_slice(), ins.as_slice()) else {
            continue;
        };
        let (mm, slot, a) = (*mm, *slot, *a);
        let Op::MatMul { trans_a, trans_b } = g.node(mm).op else {
            continue;
        };
        let op = match slot {
            0 => Op::MatMul {
                trans_a: !trans_a,
                trans_b,
            },
            1 => Op::MatMul {
                trans_a,
                trans_b: !trans_b,
            },
            _ => continue,
        };
        let mut mm_ins = g.inputs(mm);
        mm_ins[slot as usize] = a;
        let tys: Vec<_> = mm_ins.iter().map(|v| g.value_type(*v)).collect();
        let same = fsdpc_ir::ops::infer(&op, &tys).is_ok_and(|o| o == g.node(mm).outputs);
        if g.outputs.contains(&val(t)) || !same {
            continue;
        }
        g.node_mut(mm).op = op;
        g.set_input(mm, slot, a);
        folded += 1;
    }
    folded
}

/// Rewrites `chain` (outermost node first); `None` leaves it unchanged.
fn rewrite_chain(g: &mut Graph, chain: &[NodeId]) -> Option<()> {
    let x = *g.inputs(*chain.last()?).first()?;
    let mut expr = RecExpr::default();
    let mut top = expr.add(Layout::Base(Symbol::from("x")));
    for &n in chain.iter().rev() {
        top = match &g.node(n).op {
            Op::Transpose { perm } => {
                let p = expr.add(Layout::Dims(Dims(perm.clone())));
                expr.add(Layout::Transpose([p, top]))
            }
            Op::Reshape { shape } => {
                let s = expr.add(Layout::Dims(Dims(shape.clone())));
                expr.add(Layout::Reshape([s, top]))
            }
            _ => return None,
        };
    }
    let runner = Runner::<Layout, Shapes>::new(Shapes {
        base: g.value_type(x).shape.dims().to_vec(),
    })
    .with_iter_limit(16)
    .with_node_limit(512)
    .with_time_limit(Duration::from_millis(50))
    .with_expr(&expr)
    .run(&rules());
    if !matches!(runner.stop_reason, Some(StopReason::Saturated)) {
        return None;
    }
    let (_, best) = Extractor::new(&runner.egraph, AstSize).find_best(runner.roots[0]);
    let ops = |e: &RecExpr<Layout>| e.as_ref().iter().filter(|l| !l.is_leaf()).count();
    if ops(&best) >= chain.len() {
        return None;
    }
    build(g, chain[0], x, &best)
}

/// Adds `best` over `x` in place of node `outer` and moves `outer`'s readers
/// to it; `None` (nothing changed) if its type differs from `outer`'s.
fn build(g: &mut Graph, outer: NodeId, x: ValueId, best: &RecExpr<Layout>) -> Option<()> {
    let mut added = Vec::new();
    let new = add_expr(g, outer, x, best, &mut added)
        .filter(|&v| g.value_type(v) == g.value_type(val(outer)));
    let Some(new) = new else {
        for n in added {
            g.remove_node(n);
        }
        return None;
    };
    g.replace_uses(val(outer), new);
    Some(())
}

/// Adds the ops of `best` over `x` (named after and in the module of
/// `outer`), recording them in `added`; returns its value.
fn add_expr(
    g: &mut Graph,
    outer: NodeId,
    x: ValueId,
    best: &RecExpr<Layout>,
    added: &mut Vec<NodeId>,
) -> Option<ValueId> {
    let (name, module) = (g.node(outer).name.clone(), g.node(outer).module);
    let mut vals: Vec<Option<ValueId>> = Vec::new();
    for l in best.as_ref() {
        let (op, input) = match l {
            Layout::Base(_) => (None, Some(x)),
            Layout::Dims(_) => (None, None),
            Layout::Transpose([p, c]) => (
                Some(Op::Transpose {
                    perm: dims(best, *p),
                }),
                vals[usize::from(*c)],
            ),
            Layout::Reshape([s, c]) => (
                Some(Op::Reshape {
                    shape: dims(best, *s),
                }),
                vals[usize::from(*c)],
            ),
        };
        let v = match op {
            None => input,
            Some(op) => {
                let name = format!("{name}/layout{}", added.len());
                let v = g.add1(op, &[input?], name, module).ok()?;
                added.push(v.node);
                Some(v)
            }
        };
        vals.push(v);
    }
    vals.last().copied().flatten()
}

fn dims(e: &RecExpr<Layout>, id: Id) -> Vec<usize> {
    match &e[id] {
        Layout::Dims(d) => d.0.clone(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::fuse::remove_dead;
    use fsdpc_ir::{BinaryFn, DType, ModuleId, TensorType};

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

    /// `x: [2, 3, 4]` through `chain` (in module `m`), then `out = y + y`;
    /// returns the graph and the type of `y`.
    fn graph(chain: &[Op], m: &str) -> (Graph, fsdpc_ir::TensorType) {
        let mut g = Graph::new("g");
        let mut y = g.add_input("x", TensorType::new(DType::F32, [2, 3, 4]));
        let m = g.module(m, "Block");
        for (i, op) in chain.iter().enumerate() {
            y = g
                .add1(op.clone(), &[y], format!("n{i}"), m)
                .expect("valid op");
        }
        let add = Op::Binary { f: BinaryFn::Add };
        let out = g.add1(add, &[y, y], "out", ModuleId::ROOT).expect("add");
        g.outputs = vec![out];
        let ty = g.value_type(y).clone();
        (g, ty)
    }

    /// The layout ops left after the pass and dead-node removal, and the
    /// type `out` reads.
    fn simplified(mut g: Graph) -> (Vec<Op>, fsdpc_ir::TensorType, Graph) {
        simplify_layout(&mut g);
        remove_dead(&mut g);
        let ops = g
            .node_ids()
            .map(|n| g.node(n).op.clone())
            .filter(is_layout)
            .collect();
        let out = g.outputs[0].node;
        let ty = g.value_type(g.inputs(out)[0]).clone();
        (ops, ty, g)
    }

    #[test]
    fn transpose_pairs_cancel_and_compose() {
        let (g, ty) = graph(&[t(&[0, 2, 1]), t(&[0, 2, 1])], "block");
        let (ops, out, _) = simplified(g);
        assert_eq!((ops, out), (vec![], ty));

        // p = [1, 0, 2], q = [0, 2, 1]: r[i] = p[q[i]] = [1, 2, 0].
        let (g, ty) = graph(&[t(&[1, 0, 2]), t(&[0, 2, 1])], "block");
        assert_eq!(ty.shape.dims(), [3, 4, 2]);
        let (ops, out, _) = simplified(g);
        assert_eq!((ops, out), (vec![t(&[1, 2, 0])], ty));
    }

    #[test]
    fn reshape_chains_collapse() {
        let (g, ty) = graph(&[r(&[6, 4]), r(&[2, 12]), r(&[24])], "block");
        let (ops, out, _) = simplified(g);
        assert_eq!((ops, out), (vec![r(&[24])], ty));

        let (g, ty) = graph(&[r(&[6, 4]), t(&[1, 0]), t(&[1, 0]), r(&[2, 3, 4])], "b");
        let (ops, out, _) = simplified(g);
        assert_eq!((ops, out), (vec![], ty));
    }

    #[test]
    fn mixed_chain_keeps_module_and_type() {
        let chain = [r(&[6, 4]), r(&[2, 12]), t(&[1, 0]), t(&[1, 0]), t(&[1, 0])];
        let (g, ty) = graph(&chain, "encoder.layer.0");
        let (ops, out, g) = simplified(g);
        assert_eq!((ops, out), (vec![r(&[2, 12]), t(&[1, 0])], ty));
        for n in g.node_ids().filter(|&n| is_layout(&g.node(n).op)) {
            assert_eq!(g.module_info(g.node(n).module).path, "encoder.layer.0");
        }
    }

    #[test]
    fn shared_intermediates_are_kept() {
        // The first transpose is also a graph output: nothing may change.
        let (mut g, _) = graph(&[t(&[0, 2, 1]), t(&[0, 2, 1])], "block");
        let first = g.node_ids().find(|&n| g.node(n).name == "n0").expect("n0");
        g.outputs.push(val(first));
        let before = g.node_count();
        assert_eq!(simplify_layout(&mut g), 0);
        remove_dead(&mut g);
        assert_eq!(g.node_count(), before);
    }

    #[test]
    fn last_two_axes_transposes_fold_into_matmul() {
        let mut g = Graph::new("g");
        let x = g.add_input("x", TensorType::new(DType::F32, [2, 3, 4]));
        let w = g.add_input("w", TensorType::new(DType::F32, [5, 4]));
        let root = ModuleId::ROOT;
        let wt = g.add1(t(&[1, 0]), &[w], "wt", root).expect("transpose");
        let mm = Op::MatMul {
            trans_a: false,
            trans_b: false,
        };
        let y = g.add1(mm, &[x, wt], "mm", root).expect("matmul");
        g.outputs = vec![y];
        let ty = g.value_type(y).clone();
        assert_eq!(simplify_layout(&mut g), 1);
        remove_dead(&mut g);
        let folded = Op::MatMul {
            trans_a: false,
            trans_b: true,
        };
        assert_eq!(
            (&g.node(y.node).op, g.inputs(y.node)),
            (&folded, vec![x, w])
        );
        assert_eq!((g.value_type(y), g.node_count()), (&ty, 3));
    }

    #[test]
    fn non_identity_chains_stay() {
        let (g, ty) = graph(&[t(&[1, 0, 2]), r(&[3, 8])], "block");
        let (ops, out, _) = simplified(g);
        assert_eq!((ops, out), (vec![t(&[1, 0, 2]), r(&[3, 8])], ty));
    }
}
