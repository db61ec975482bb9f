//! Clean-up passes on the imported graph: attention written out by the
//! exporter (`softmax(mask(q @ kᵀ / c)) @ v`, what nanoGPT-style code and
//! `scaled_dot_product_attention` export to) becomes the IR's fused
//! `Attention` op, so the planner costs it and the runtime runs it without a
//! `[batch, heads, seq, seq]` score tensor; then dead nodes are removed and
//! node ids renumbered in topological order.
//!
//! The rewrite keeps the semantics: it fires only when the mask is absent or exactly
//! causal (masking `j > i` with -inf or a value <= -1e4, through `Where` or
//! an additive bias) and every
//! intermediate value has no other reader.

use super::tensor::HostTensor;
use fsdpc_ir::{BinaryFn, Graph, NodeId, Op, ValueId};
use std::collections::HashSet;

/// A matched attention: its operands, scale, causality and final node.
struct Attn {
    q: ValueId,
    k: ValueId,
    v: ValueId,
    scale: f64,
    causal: bool,
    out: NodeId,
}

fn val(node: NodeId) -> ValueId {
    ValueId { node, slot: 0 }
}

/// The single reader of node `n`'s output, if there is exactly one.
fn only_user(g: &Graph, n: NodeId) -> Option<(NodeId, u32)> {
    match g.users(val(n)).as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

/// The value of a `Constant` node.
fn constant(g: &Graph, v: ValueId) -> Option<HostTensor> {
    match &g.try_node(v.node)?.op {
        Op::Constant { value } => HostTensor::from_data(value).ok(),
        _ => None,
    }
}

/// The single element of a constant scalar (or one-element tensor).
fn scalar(g: &Graph, v: ValueId) -> Option<f64> {
    let t = constant(g, v)?;
    (t.numel() == 1).then(|| t.as_f64()[0])
}

/// Replaces every matched attention in `g`; returns how many.
pub(crate) fn fuse_attention(g: &mut Graph) -> usize {
    let softmaxes: Vec<NodeId> = g
        .node_ids()
        .filter(|&n| matches!(g.node(n).op, Op::Softmax { .. }))
        .collect();
    let mut fused = 0;
    for s in softmaxes {
        if let Some(a) = match_at(g, s) {
            fused += usize::from(replace(g, s, &a));
        }
    }
    fused
}

fn match_at(g: &Graph, softmax: NodeId) -> Option<Attn> {
    let node = g.node(softmax);
    let ty = node.outputs.first()?;
    if ty.shape.rank() != 4 || node.op != (Op::Softmax { axis: 3 }) {
        return None;
    }
    let (out, slot) = only_user(g, softmax)?;
    let trans = Op::MatMul {
        trans_a: false,
        trans_b: false,
    };
    if slot != 0 || g.node(out).op != trans {
        return None;
    }
    let v = *g.inputs(out).get(1)?;
    let (scores, causal) = unmask(g, *g.inputs(softmax).first()?)?;
    let (raw, scale) = unscale(g, scores)?;
    let (q, k, factor) = operands(g, raw)?;
    let scale = scale * factor;
    let shapes = [q, k, v].map(|x| g.value_type(x).clone());
    (shapes[0] == shapes[1] && shapes[1] == shapes[2]).then_some(Attn {
        q,
        k,
        v,
        scale,
        causal,
        out,
    })
}

/// Strips a causal mask: `Where(mask, -inf, s)`, `Where(keep, s, -inf)` or
/// `s + bias` with a constant bias of 0 and -inf. Returns the unmasked
/// scores and whether a (causal) mask was there.
fn unmask(g: &Graph, x: ValueId) -> Option<(ValueId, bool)> {
    match g.node(x.node).op {
        Op::Where => unmask_where(g, x),
        Op::Binary { f: BinaryFn::Add } => unmask_add(g, x),
        _ => Some((x, false)),
    }
}

fn very_negative(f: f64) -> bool {
    f <= -1e4
}

fn unmask_where(g: &Graph, x: ValueId) -> Option<(ValueId, bool)> {
    only_user(g, x.node)?;
    let ins = g.inputs(x.node);
    let (c, a, b) = (*ins.first()?, *ins.get(1)?, *ins.get(2)?);
    let neg = |v: ValueId| scalar(g, v).is_some_and(very_negative);
    let (scores, masked_when) = if neg(a) {
        (b, true)
    } else if neg(b) {
        (a, false)
    } else {
        return None;
    };
    let mask = constant(g, c)?;
    let masked: Vec<bool> = mask
        .as_i64()
        .iter()
        .map(|&m| (m != 0) == masked_when)
        .collect();
    is_causal(&mask.shape, &masked).then_some((scores, true))
}

fn unmask_add(g: &Graph, x: ValueId) -> Option<(ValueId, bool)> {
    only_user(g, x.node)?;
    let ins = g.inputs(x.node);
    let (a, b) = (*ins.first()?, *ins.get(1)?);
    let (scores, bias) = match (constant(g, a), constant(g, b)) {
        (None, Some(t)) => (a, t),
        (Some(t), None) => (b, t),
        _ => return None,
    };
    let values = bias.as_f64();
    if !values.iter().all(|&v| v == 0.0 || very_negative(v)) {
        return None;
    }
    let masked: Vec<bool> = values.iter().map(|&v| very_negative(v)).collect();
    is_causal(&bias.shape, &masked).then_some((scores, true))
}

/// True if `masked` (of a `[s, s]` tensor, possibly with leading 1s) is
/// exactly the positions `j > i`.
fn is_causal(dims: &[usize], masked: &[bool]) -> bool {
    let n = dims.len();
    if n < 2 || dims[..n - 2].iter().any(|&d| d != 1) || dims[n - 1] != dims[n - 2] {
        return false;
    }
    let s = dims[n - 1];
    masked.len() == s * s && (0..s * s).all(|k| masked[k] == (k % s > k / s))
}

/// Strips a scalar scale: `s / c` or `s * c`. Returns the raw scores and the
/// multiplier.
fn unscale(g: &Graph, x: ValueId) -> Option<(ValueId, f64)> {
    let (f, ins) = match &g.node(x.node).op {
        Op::Binary {
            f: f @ (BinaryFn::Div | BinaryFn::Mul),
        } => (*f, g.inputs(x.node)),
        _ => return Some((x, 1.0)),
    };
    only_user(g, x.node)?;
    let c = scalar(g, *ins.get(1)?)?;
    let scale = if f == BinaryFn::Div { 1.0 / c } else { c };
    scale.is_finite().then_some((*ins.first()?, scale))
}

/// `q @ kᵀ` as a MatMul with `trans_b`, or of a `Transpose` swapping the last
/// two axes of k; either operand may carry a scalar factor (`q·√s @ kᵀ·√s`,
/// how `scaled_dot_product_attention` exports). Returns `(q, k, factor)`.
fn operands(g: &Graph, x: ValueId) -> Option<(ValueId, ValueId, f64)> {
    only_user(g, x.node)?;
    let Op::MatMul {
        trans_a: false,
        trans_b,
    } = g.node(x.node).op
    else {
        return None;
    };
    let ins = g.inputs(x.node);
    let (q, fq) = scaled(g, *ins.first()?)?;
    let (kx, fk) = scaled(g, *ins.get(1)?)?;
    if trans_b {
        return Some((q, kx, fq * fk));
    }
    only_user(g, kx.node)?;
    match &g.node(kx.node).op {
        Op::Transpose { perm } if perm == &[0, 1, 3, 2] => {
            Some((q, *g.inputs(kx.node).first()?, fq * fk))
        }
        _ => None,
    }
}

/// `v` without a scalar factor `v * c` (read by nothing else), and `c`.
fn scaled(g: &Graph, v: ValueId) -> Option<(ValueId, f64)> {
    if g.node(v.node).op != (Op::Binary { f: BinaryFn::Mul }) {
        return Some((v, 1.0));
    }
    let ins = g.inputs(v.node);
    let (a, b) = (*ins.first()?, *ins.get(1)?);
    let (x, c) = match (scalar(g, a), scalar(g, b)) {
        (None, Some(c)) => (a, c),
        (Some(c), None) => (b, c),
        _ => return Some((v, 1.0)),
    };
    only_user(g, v.node)?;
    Some((x, c))
}

/// Adds the fused node and points the readers of `a.out` at it.
fn replace(g: &mut Graph, softmax: NodeId, a: &Attn) -> bool {
    let module = g.node(softmax).module;
    let name = g.node(a.out).name.clone();
    let op = Op::Attention {
        causal: a.causal,
        scale: a.scale,
    };
    let Ok(y) = g.add1(
        op,
        &[a.q, a.k, a.v],
        format!("{name}/fused_attention"),
        module,
    ) else {
        return false;
    };
    g.replace_uses(val(a.out), y);
    true
}

/// Removes nodes that neither an output nor a module buffer's write depends
/// on, except parameters, inputs and buffers.
pub(crate) fn remove_dead(g: &mut Graph) {
    let mut live: HashSet<NodeId> = HashSet::new();
    let mut stack: Vec<NodeId> = g.outputs.iter().map(|v| v.node).collect();
    stack.extend(g.buffer_writes().into_values());
    while let Some(n) = stack.pop() {
        if live.insert(n) {
            stack.extend(g.inputs(n).iter().map(|v| v.node));
        }
    }
    let dead: Vec<NodeId> = g
        .node_ids()
        .filter(|n| {
            !live.contains(n)
                && !matches!(
                    g.node(*n).op,
                    Op::Param { .. } | Op::Input { .. } | Op::ModuleBuffer { .. }
                )
        })
        .collect();
    for n in dead {
        g.remove_node(n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fsdpc_ir::{DType, ModuleId, TensorType};

    /// `softmax(where(mask, -inf, q @ kᵀ / 2)) @ v` over `[1, 2, 3, 4]`; the
    /// scores are also read by an extra node when `leak`.
    fn graph(mask: Vec<i64>, leak: bool) -> Graph {
        let mut g = Graph::new("t");
        let ty = TensorType::new(DType::F32, [1, 2, 3, 4]);
        let (q, k, v) = (
            g.add_input("q", ty.clone()),
            g.add_input("k", ty.clone()),
            g.add_input("v", ty),
        );
        let r = ModuleId::ROOT;
        let add = |g: &mut Graph, op: Op, ins: &[ValueId]| {
            g.add1(op, ins, "n", r).unwrap_or_else(|e| panic!("{e}"))
        };
        let c = |t: HostTensor| Op::Constant { value: t.to_data() };
        let kt = add(
            &mut g,
            Op::Transpose {
                perm: vec![0, 1, 3, 2],
            },
            &[k],
        );
        let s = add(
            &mut g,
            Op::MatMul {
                trans_a: false,
                trans_b: false,
            },
            &[q, kt],
        );
        let two = add(
            &mut g,
            c(HostTensor::floats(DType::F32, vec![], vec![2.0])),
            &[],
        );
        let s = add(&mut g, Op::Binary { f: BinaryFn::Div }, &[s, two]);
        let m = add(
            &mut g,
            c(HostTensor::ints(DType::Bool, vec![3, 3], mask)),
            &[],
        );
        let ninf = add(
            &mut g,
            c(HostTensor::floats(
                DType::F32,
                vec![],
                vec![f64::NEG_INFINITY],
            )),
            &[],
        );
        let s2 = add(&mut g, Op::Where, &[m, ninf, s]);
        let p = add(&mut g, Op::Softmax { axis: 3 }, &[s2]);
        let y = add(
            &mut g,
            Op::MatMul {
                trans_a: false,
                trans_b: false,
            },
            &[p, v],
        );
        g.outputs = vec![y];
        if leak {
            let extra = add(
                &mut g,
                Op::Unary {
                    f: fsdpc_ir::UnaryFn::Exp,
                },
                &[s],
            );
            g.outputs.push(extra);
        }
        g
    }

    const CAUSAL: [i64; 9] = [0, 1, 1, 0, 0, 1, 0, 0, 0];

    #[test]
    fn causal_attention_is_fused_and_the_rest_removed() {
        let mut g = graph(CAUSAL.to_vec(), false);
        assert_eq!(fuse_attention(&mut g), 1);
        remove_dead(&mut g);
        let ops: Vec<String> = g.node_ids().map(|n| g.node(n).op.name()).collect();
        assert_eq!(ops, ["input", "input", "input", "attention"]);
        let y = g.outputs[0].node;
        assert_eq!(
            g.node(y).op,
            Op::Attention {
                causal: true,
                scale: 0.5
            }
        );
    }

    #[test]
    fn additive_causal_mask_is_fused() {
        let mut g = Graph::new("t");
        let ty = TensorType::new(DType::F32, [1, 2, 3, 4]);
        let (q, k, v) = (
            g.add_input("q", ty.clone()),
            g.add_input("k", ty.clone()),
            g.add_input("v", ty),
        );
        let r = ModuleId::ROOT;
        let add = |g: &mut Graph, op: Op, ins: &[ValueId]| {
            g.add1(op, ins, "n", r).unwrap_or_else(|e| panic!("{e}"))
        };
        let s = add(
            &mut g,
            Op::MatMul {
                trans_a: false,
                trans_b: true,
            },
            &[q, k],
        );
        let bias: Vec<f64> = CAUSAL
            .iter()
            .map(|&m| if m == 1 { -3.4e38 } else { 0.0 })
            .collect();
        let bias = Op::Constant {
            value: HostTensor::floats(DType::F32, vec![1, 1, 3, 3], bias).to_data(),
        };
        let b = add(&mut g, bias, &[]);
        let s = add(&mut g, Op::Binary { f: BinaryFn::Add }, &[s, b]);
        let p = add(&mut g, Op::Softmax { axis: 3 }, &[s]);
        let y = add(
            &mut g,
            Op::MatMul {
                trans_a: false,
                trans_b: false,
            },
            &[p, v],
        );
        g.outputs = vec![y];
        assert_eq!(fuse_attention(&mut g), 1);
        assert_eq!(
            g.node(g.outputs[0].node).op,
            Op::Attention {
                causal: true,
                scale: 1.0
            }
        );
    }

    #[test]
    fn sdpa_export_with_scaled_operands_is_fused() {
        let mut g = Graph::new("t");
        let ty = TensorType::new(DType::F32, [1, 2, 3, 4]);
        let (q, k, v) = (
            g.add_input("q", ty.clone()),
            g.add_input("k", ty.clone()),
            g.add_input("v", ty),
        );
        let r = ModuleId::ROOT;
        let add = |g: &mut Graph, op: Op, ins: &[ValueId]| {
            g.add1(op, ins, "n", r).unwrap_or_else(|e| panic!("{e}"))
        };
        let root = |g: &mut Graph| {
            let value = HostTensor::floats(DType::F32, vec![], vec![0.5f64.sqrt()]).to_data();
            g.add1(Op::Constant { value }, &[], "c", r)
                .unwrap_or_else(|e| panic!("{e}"))
        };
        let (c1, c2) = (root(&mut g), root(&mut g));
        let qs = add(&mut g, Op::Binary { f: BinaryFn::Mul }, &[q, c1]);
        let kt = add(
            &mut g,
            Op::Transpose {
                perm: vec![0, 1, 3, 2],
            },
            &[k],
        );
        let ks = add(&mut g, Op::Binary { f: BinaryFn::Mul }, &[kt, c2]);
        let s = add(
            &mut g,
            Op::MatMul {
                trans_a: false,
                trans_b: false,
            },
            &[qs, ks],
        );
        let p = add(&mut g, Op::Softmax { axis: 3 }, &[s]);
        let y = add(
            &mut g,
            Op::MatMul {
                trans_a: false,
                trans_b: false,
            },
            &[p, v],
        );
        g.outputs = vec![y];
        assert_eq!(fuse_attention(&mut g), 1);
        let Op::Attention {
            causal: false,
            scale,
        } = g.node(g.outputs[0].node).op
        else {
            panic!("not fused")
        };
        assert!((scale - 0.5).abs() < 1e-6, "{scale}");
    }

    #[test]
    fn other_masks_and_shared_scores_are_left_alone() {
        let mut upper = CAUSAL.to_vec();
        upper[1] = 0;
        assert_eq!(fuse_attention(&mut graph(upper, false)), 0);
        assert_eq!(fuse_attention(&mut graph(CAUSAL.to_vec(), true)), 0);
    }
}
