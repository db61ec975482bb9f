//! Vocabulary parallelism (Megatron's vocab-parallel embedding and
//! cross-entropy): the token embedding's rows and the head's output
//! columns split over the tensor group, and the loss computed without
//! gathering the logits.
//!
//! - The *head* is the matrix product `x @ W` whose output reaches the
//!   graph's one `CrossEntropy` as its logits, through reshapes that keep
//!   the class axis, slices of other axes and casts. `W` is split over its
//!   vocabulary (column-parallel; `x` enters through a `TpCopy`), and the
//!   loss becomes: each member's `TpLogitStats` (per row: maximum, sum of
//!   exponentials, the label's logit if held here), gathered over the
//!   group (`3 × rows` numbers per member, not the logits), combined into
//!   the mean of `log-sum-exp - target logit` over the rows not ignored.
//! - An *embedding* is a `Gather` along axis 0 of a matrix parameter by
//!   indices that depend on the data (not a position table read by
//!   constant indices). Its rows are split; each member looks up the rows
//!   it holds (`TpLookup`, zeros for the others) and a `TpReduce` sums the
//!   members' parts, so with sequence parallelism the residual stream is
//!   scattered from the first layer on.
//!
//! A vocabulary T does not divide (GPT-2's 50,257) is *padded*, as
//! Megatron's `--make-vocab-size-divisible-by` does, but as a layout: each
//! member holds `ceil(V / T)` rows (`fsdpc_ir::TpSlice`), the last member's
//! last ones zeros that belong to no element of the whole parameter. The
//! lookups never read them, the statistics leave their logit columns out
//! and give them a zero gradient (the ops' `vocab`), so they stay zero.
//! fsdpc pads to the smallest multiple of T (Megatron pads to one of 128·T,
//! for its kernels).
//!
//! A member's offset into the whole vocabulary is a constant of all the
//! offsets split over the group (`TpSplit`), so every member runs the same
//! program. A table read by anything else, a vocabulary so small that a
//! member would hold none of it, or logits read by anything but the loss
//! leave the layer replicated, with the reason in the record.

use super::sequence::is_static;
use fsdpc_ir::{
    BinaryFn, CompareFn, DType, Graph, IrError, NodeId, Op, ParamId, ReduceFn, TensorData, TpSlice,
    UnaryFn, ValueId,
};
use std::collections::{BTreeMap, HashMap};

/// What `find` decided.
#[derive(Debug, Default)]
pub(super) struct Vocab {
    /// Split tables: the axis of their vocabulary and its whole length.
    params: BTreeMap<ParamId, (usize, usize)>,
    /// Lookups of split tables (axis-0 `Gather`s).
    lookups: Vec<NodeId>,
    head: Option<Head>,
    /// Module paths of the split embedding and head.
    pub split: Vec<String>,
    /// Embeddings and heads left whole, with why.
    pub replicated: Vec<Whole>,
    /// The vocabulary (a head's classes or a table's rows) when it is left
    /// whole for not splitting over T (a member would hold none of it).
    pub indivisible: Option<usize>,
    /// The vocabulary, when a split one is padded to a multiple of T.
    pub padded: Option<usize>,
}

/// Why a vocabulary of `v` does not split over `t` members, even padded:
/// the last member would hold none of it (`t - 1` chunks of `ceil(v / t)`
/// already cover it).
fn unsplittable(v: usize, t: usize) -> Option<String> {
    let chunk = v.div_ceil(t);
    (v == 0 || (t - 1) * chunk >= v).then(|| {
        format!(
            "its vocabulary of {v} does not split over T = {t}: padded to {t} parts of \
             {chunk}, the last would hold none of it"
        )
    })
}

#[derive(Debug)]
struct Head {
    product: NodeId,
    /// The ops between the product and the loss (reshapes, slices, casts).
    path: Vec<NodeId>,
    loss: NodeId,
    /// The weight, the axis of its vocabulary, the vocabulary's length.
    weight: ParamId,
    axis: usize,
    width: usize,
}

/// A layer left whole: its module path and why.
type Whole = (String, String);

fn param_of(g: &Graph, v: ValueId) -> Option<ParamId> {
    match g.node(v.node).op {
        Op::Param { param } => Some(param),
        _ => None,
    }
}

/// Whether `n` looks up rows of a table by data-dependent indices.
fn is_lookup(g: &Graph, n: NodeId, memo: &mut HashMap<NodeId, bool>) -> bool {
    let ins = g.inputs(n);
    matches!(g.node(n).op, Op::Gather { axis: 0 })
        && param_of(g, ins[0]).is_some()
        && g.value_type(ins[0]).shape.rank() == 2
        && !is_static(g, ins[1], memo)
}

/// The head reading the loss's logits (whatever T), or why it is not one
/// the split can take.
fn head(g: &Graph) -> Result<Option<Head>, Whole> {
    let losses: Vec<NodeId> = g
        .node_ids()
        .filter(|&n| matches!(g.node(n).op, Op::CrossEntropy { .. }))
        .collect();
    let [loss] = losses.as_slice() else {
        return Ok(None);
    };
    let loss = *loss;
    let name = |n: NodeId| g.module_info(g.node(n).module).path.clone();
    let refuse = |n: NodeId, why: String| Err((name(n), why));
    let logits = g.inputs(loss)[0];
    let width = *g.value_type(logits).shape.0.last().unwrap_or(&0);
    let mut path = Vec::new();
    let mut v = logits;
    let product = loop {
        if g.users(v).len() != 1 {
            return refuse(v.node, "the logits are read by more than the loss".into());
        }
        let node = g.node(v.node);
        let dims = &g.value_type(v).shape.0;
        let last = dims.len().saturating_sub(1);
        let keeps_classes = match &node.op {
            Op::Reshape { .. } | Op::Cast { .. } => {
                let from = &g.value_type(g.inputs(v.node)[0]).shape.0;
                from.last() == Some(&width)
            }
            Op::Slice { axis, .. } => *axis != last,
            Op::MatMul { trans_a: false, .. } => break v.node,
            _ => false,
        };
        if !keeps_classes {
            return refuse(
                v.node,
                format!(
                    "the logits come from `{}` ({}), not a product with a weight",
                    node.name,
                    node.op.name()
                ),
            );
        }
        path.push(v.node);
        v = g.inputs(v.node)[0];
    };
    let ins = g.inputs(product);
    let Op::MatMul { trans_b, .. } = g.node(product).op else {
        unreachable!("the loop breaks at a product")
    };
    let (Some(w), None) = (param_of(g, ins[1]), param_of(g, ins[0])) else {
        return refuse(product, "the head's weight is not a parameter".into());
    };
    let axis = usize::from(!trans_b);
    let wshape = &g.param(w).ty.shape.0;
    if wshape.len() != 2 || wshape[axis] != width {
        return refuse(
            product,
            "the head's weight is not a [hidden, vocabulary] matrix".into(),
        );
    }
    path.reverse();
    Ok(Some(Head {
        product,
        path,
        loss,
        weight: w,
        axis,
        width,
    }))
}

impl Vocab {
    /// Whether anything is split.
    pub(super) fn splits(&self) -> bool {
        !self.params.is_empty()
    }
}

/// The product that computes the loss's logits, split or not (the
/// regions leave it to this pass).
pub(super) fn head_product(g: &Graph) -> Option<NodeId> {
    head(g).ok().flatten().map(|h| h.product)
}

/// Finds the head and embeddings of `g` (the whole forward graph) to split
/// over `t` members; `taken` are the parameters the regions split.
pub(super) fn find(g: &Graph, t: usize, taken: &BTreeMap<ParamId, (usize, Vec<usize>)>) -> Vocab {
    let mut out = Vocab::default();
    let mut memo = HashMap::new();
    let nodes = g.param_nodes();
    let readers = |p: ParamId| -> Vec<NodeId> {
        nodes.get(&p).map_or(Vec::new(), |&n| {
            g.users(ValueId { node: n, slot: 0 })
                .into_iter()
                .map(|(u, _)| u)
                .collect()
        })
    };
    let module = |n: NodeId| g.module_info(g.node(n).module).path.clone();
    let head = match head(g) {
        Ok(Some(h)) => match unsplittable(h.width, t) {
            Some(why) => {
                out.replicated.push((module(h.product), why));
                out.indivisible = Some(h.width);
                None
            }
            None => Some(h),
        },
        Ok(None) => None,
        Err(why) => {
            out.replicated.push(why);
            None
        }
    };
    // The head's weight may be the embedding's table (tied): it splits if
    // every reader is the head or a lookup.
    if let Some(h) = head {
        let (w, axis, width) = (h.weight, h.axis, h.width);
        let others: Vec<NodeId> = readers(w)
            .into_iter()
            .filter(|&r| r != h.product)
            .filter(|&r| !(axis == 0 && is_lookup(g, r, &mut memo)))
            .collect();
        if taken.contains_key(&w) || !others.is_empty() {
            let by = others.first().map_or("a split region".to_string(), |&r| {
                format!("`{}`", g.node(r).name)
            });
            out.replicated.push((
                module(h.product),
                format!("its weight `{}` is also read by {by}", g.param(w).name),
            ));
        } else {
            out.split.push(module(h.product));
            out.params.insert(w, (axis, width));
            if !width.is_multiple_of(t) {
                out.padded = Some(width);
            }
            out.head = Some(h);
        }
    }
    let head_product = out.head.as_ref().map(|h| h.product);
    for n in g.node_ids().collect::<Vec<_>>() {
        if !is_lookup(g, n, &mut memo) {
            continue;
        }
        let p = param_of(g, g.inputs(n)[0]).expect("a lookup reads a parameter");
        let rows = g.param(p).ty.shape.0[0];
        if out.params.get(&p).is_some_and(|&(axis, _)| axis == 0) {
            out.lookups.push(n);
            out.split.push(module(n));
            continue;
        }
        let others: Vec<NodeId> = readers(p)
            .into_iter()
            .filter(|&r| Some(r) != head_product && !is_lookup(g, r, &mut memo))
            .collect();
        let why = if taken.contains_key(&p) || out.params.contains_key(&p) {
            Some("its table is split another way".to_string())
        } else if let Some(&r) = others.first() {
            Some(format!(
                "its table `{}` is also read by `{}`",
                g.param(p).name,
                g.node(r).name
            ))
        } else if let Some(why) = unsplittable(rows, t) {
            out.indivisible.get_or_insert(rows);
            Some(why)
        } else {
            None
        };
        match why {
            Some(why) => out.replicated.push((module(n), why)),
            None => {
                if !rows.is_multiple_of(t) {
                    out.padded.get_or_insert(rows);
                }
                out.params.insert(p, (0, rows));
                out.lookups.push(n);
                out.split.push(module(n));
            }
        }
    }
    out.replicated.dedup();
    out
}

/// Rewrites the member's forward graph `g` as `v` decided; returns the
/// loss, which is new when the head was split.
pub(super) fn apply(g: &mut Graph, v: &Vocab, t: usize, loss: ValueId) -> Result<ValueId, IrError> {
    let parts = t as u32;
    // The whole vocabulary, for the ops on a padded one.
    let padded = |whole: usize| (!whole.is_multiple_of(t)).then_some(whole);
    for (&p, &(axis, whole)) in &v.params {
        let spec = &mut g.params[p.0 as usize];
        spec.ty.shape.0[axis] = whole.div_ceil(t);
        spec.tp = Some(TpSlice {
            axis,
            segments: vec![whole],
            parts,
        });
    }
    for (p, n) in g.param_nodes() {
        if v.params.contains_key(&p) {
            g.node_mut(n).outputs = vec![g.param(p).ty.clone()];
        }
    }
    // One offset per local vocabulary size.
    let mut offsets: HashMap<usize, ValueId> = HashMap::new();
    let mut offset = |g: &mut Graph, local: usize, at: NodeId| -> Result<ValueId, IrError> {
        if let Some(&o) = offsets.get(&local) {
            return Ok(o);
        }
        let module = g.node(at).module;
        let o = super::member_offset(g, local as u64, t, "vocab_offset", module)?;
        offsets.insert(local, o);
        Ok(o)
    };
    for &n in &v.lookups {
        let ins = g.inputs(n);
        let local = g.value_type(ins[0]).shape.0[0];
        let off = offset(g, local, n)?;
        let whole = param_of(g, ins[0]).and_then(|p| v.params.get(&p));
        let vocab = whole.and_then(|&(_, w)| padded(w));
        let (name, module) = (g.node(n).name.clone(), g.node(n).module);
        let part = g.add1(
            Op::TpLookup { parts, vocab },
            &[ins[0], ins[1], off],
            name.clone(),
            module,
        )?;
        let sum = g.add1(Op::TpReduce, &[part], format!("{name}.tp_reduce"), module)?;
        g.replace_uses(ValueId { node: n, slot: 0 }, sum);
        g.remove_node(n);
    }
    let mut loss = loss;
    if let Some(h) = &v.head {
        let local = {
            let w = g.inputs(h.product)[1];
            let Op::MatMul { trans_b, .. } = g.node(h.product).op else {
                unreachable!("the head is a product")
            };
            g.value_type(w).shape.0[usize::from(!trans_b)]
        };
        let x = g.inputs(h.product)[0];
        let (pname, pmodule) = (g.node(h.product).name.clone(), g.node(h.product).module);
        let c = g.add1(Op::TpCopy, &[x], format!("{pname}.tp_copy"), pmodule)?;
        g.set_input(h.product, 0, c);
        for &n in &h.path {
            if let Op::Reshape { shape } = &mut g.node_mut(n).op {
                if let Some(last) = shape.last_mut() {
                    *last = local;
                }
            }
        }
        let off = offset(g, local, h.loss)?;
        let new = combine(g, h.loss, off, parts, padded(h.width))?;
        let old = ValueId {
            node: h.loss,
            slot: 0,
        };
        g.replace_uses(old, new);
        if loss == old {
            loss = new;
        }
        g.remove_node(h.loss);
    }
    let order = g
        .topo_order()
        .map_err(|_| IrError::Invalid("the forward graph has a cycle".into()))?;
    for n in order {
        if !g.node(n).op.is_source() {
            crate::precision::infer_outputs(g, n)?;
        }
    }
    Ok(loss)
}

/// The cross-entropy of node `ce` from the members' logit statistics: per
/// row `log(sum_k s_k exp(m_k - M)) + M - sum_k target_k` with `M` the
/// largest `m_k`, averaged over the rows whose label is not ignored (0 when
/// none is, as `CrossEntropy`); `vocab` is a padded vocabulary's classes.
fn combine(
    g: &mut Graph,
    ce: NodeId,
    off: ValueId,
    parts: u32,
    vocab: Option<usize>,
) -> Result<ValueId, IrError> {
    let Op::CrossEntropy { ignore_index } = g.node(ce).op else {
        return Err(IrError::Invalid(
            "the head's loss is not a cross-entropy".into(),
        ));
    };
    let ins = g.inputs(ce);
    let (logits, labels) = (ins[0], ins[1]);
    let rows = g.value_type(labels).shape.numel() as usize;
    let (base, module) = (g.node(ce).name.clone(), g.node(ce).module);
    let op = |g: &mut Graph, op: Op, ins: &[ValueId], what: &str| {
        g.add1(op, ins, format!("{base}.{what}"), module)
    };
    let stats = op(
        g,
        Op::TpLogitStats {
            ignore_index,
            parts,
            vocab,
        },
        &[logits, labels, off],
        "stats",
    )?;
    let all = op(
        g,
        Op::TpGather {
            axis: 0,
            parts,
            partial_grad: false,
        },
        &[stats],
        "stats_gather",
    )?;
    let column = |i: usize| Op::Slice {
        axis: 2,
        start: i,
        end: i + 1,
        step: 1,
    };
    let m = op(g, column(0), &[all], "max")?;
    let s = op(g, column(1), &[all], "sum_exp")?;
    let tg = op(g, column(2), &[all], "target")?;
    let big_m = op(
        g,
        Op::Reduce {
            f: ReduceFn::Max,
            axes: vec![0],
            keepdims: true,
        },
        &[m],
        "global_max",
    )?;
    let shift = op(g, Op::Binary { f: BinaryFn::Sub }, &[m, big_m], "shift")?;
    let scale = op(g, Op::Unary { f: UnaryFn::Exp }, &[shift], "rescale")?;
    let scaled = op(g, Op::Binary { f: BinaryFn::Mul }, &[s, scale], "rescaled")?;
    let sum_over = |f| Op::Reduce {
        f,
        axes: vec![0],
        keepdims: false,
    };
    let total = op(g, sum_over(ReduceFn::Sum), &[scaled], "total")?;
    let log_total = op(g, Op::Unary { f: UnaryFn::Log }, &[total], "log_total")?;
    let big_m_rows = op(
        g,
        Op::Reshape {
            shape: vec![rows, 1],
        },
        &[big_m],
        "max_rows",
    )?;
    let lse = op(
        g,
        Op::Binary { f: BinaryFn::Add },
        &[log_total, big_m_rows],
        "lse",
    )?;
    let target = op(g, sum_over(ReduceFn::Sum), &[tg], "target_sum")?;
    let row = op(
        g,
        Op::Binary { f: BinaryFn::Sub },
        &[lse, target],
        "row_loss",
    )?;
    let row = op(g, Op::Reshape { shape: vec![rows] }, &[row], "row_losses")?;
    let all_axes = |f| Op::Reduce {
        f,
        axes: Vec::new(),
        keepdims: false,
    };
    let Some(ignore) = ignore_index else {
        return op(g, all_axes(ReduceFn::Mean), &[row], "loss");
    };
    // Counted rows; no float constant, which the precision pass would
    // narrow to the buffer dtype.
    let value = TensorData::scalar(DType::I64, ignore as f64);
    let ig = op(g, Op::Constant { value }, &[], "ignore_index")?;
    let ignored = op(
        g,
        Op::Compare {
            f: CompareFn::Equal,
        },
        &[labels, ig],
        "ignored",
    )?;
    let counted = op(g, Op::Not, &[ignored], "counted")?;
    let weight = op(g, Op::Cast { to: DType::F32 }, &[counted], "weight")?;
    let kept = op(g, Op::Binary { f: BinaryFn::Mul }, &[row, weight], "kept")?;
    let sum = op(g, all_axes(ReduceFn::Sum), &[kept], "sum")?;
    let count = op(g, all_axes(ReduceFn::Sum), &[weight], "count")?;
    let value = TensorData::scalar(DType::Bool, 1.0);
    let yes = op(g, Op::Constant { value }, &[], "one")?;
    let one = op(g, Op::Cast { to: DType::F32 }, &[yes], "one_f32")?;
    let at_least_one = op(g, Op::Binary { f: BinaryFn::Max }, &[count, one], "divisor")?;
    op(
        g,
        Op::Binary { f: BinaryFn::Div },
        &[sum, at_least_one],
        "loss",
    )
}
