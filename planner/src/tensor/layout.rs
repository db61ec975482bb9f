//! How a value lies over the tensor group, and each op's rule: given how
//! its inputs lie, how its output lies, which parameters it splits, or why
//! it cannot run split. The rules read the whole (unsplit) graph.

use fsdpc_ir::{BinaryFn, Graph, NodeId, Op, ParamId, ValueId};

/// How a value lies over the T members of the tensor group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Every member holds all of it.
    Rep,
    /// Axis `axis` is the concatenation of `segments` (their whole
    /// lengths), each cut into T chunks; member t holds chunk t of each
    /// (`fsdpc_ir::TpSlice`).
    Split { axis: usize, segments: Vec<usize> },
}

/// Why a node cannot run on split inputs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A dimension the split needs T to divide (heads, key/value heads,
    /// widths): an error in what was asked.
    Indivisible(String),
    /// The op or the way it reads its inputs is not one the split handles:
    /// the layer stays replicated.
    Unsupported(String),
}

/// What a rule decided for one node: its output's layout, the parameters
/// it splits (`param`, axis, segments), whether its output is a partial
/// sum the tensor group must add, and which whole inputs each member reads
/// only its part of (`select`: slot, axis, segments).
#[derive(Debug, Default)]
pub struct Decision {
    pub out: Option<Layout>,
    pub split_params: Vec<(ParamId, usize, Vec<usize>)>,
    pub partial: bool,
    pub select: Vec<(usize, usize, Vec<usize>)>,
    /// Values between an adapter's up-projection and this node, split
    /// with it (`Rules::adapter`).
    pub also: Vec<(ValueId, Layout)>,
    /// Column-parallel products this node makes, each entered from its
    /// whole input like a region's first products.
    pub enter: Vec<NodeId>,
}

/// What the rules read: the graph, T, and whether a whole operand may
/// meet a split one in attention or a batched product, each member then
/// taking its part of the whole (`select`: key/value projections computed
/// whole when T exceeds their heads).
pub struct Rules<'g> {
    pub g: &'g Graph,
    pub t: usize,
    pub select: bool,
}

fn unsupported(g: &Graph, n: NodeId, why: impl std::fmt::Display) -> Refusal {
    let node = g.node(n);
    Refusal::Unsupported(format!("`{}` ({}): {why}", node.name, node.op.name()))
}

fn indivisible(g: &Graph, n: NodeId, why: impl std::fmt::Display) -> Refusal {
    let node = g.node(n);
    Refusal::Indivisible(format!("`{}` ({}): {why}", node.name, node.op.name()))
}

impl Rules<'_> {
    fn shape(&self, v: ValueId) -> &[usize] {
        &self.g.value_type(v).shape.0
    }

    /// The parameter `v` is, if it is a parameter's value.
    pub fn param_of(&self, v: ValueId) -> Option<ParamId> {
        match self.g.node(v.node).op {
            Op::Param { param } => Some(param),
            _ => None,
        }
    }

    /// Segments of a whole axis of length `len` that T must cut evenly.
    fn check_segments(&self, n: NodeId, segments: &[usize], what: &str) -> Result<(), Refusal> {
        match segments.iter().find(|&&s| !s.is_multiple_of(self.t)) {
            Some(s) => Err(indivisible(
                self.g,
                n,
                format!("{what} of {s} does not split over T = {}", self.t),
            )),
            None => Ok(()),
        }
    }

    /// A column-parallel product `x @ W` (or `x @ W^T`) whose weight is
    /// split over its output columns, in `segments`.
    pub fn column(&self, n: NodeId, segments: Vec<usize>) -> Result<Decision, Refusal> {
        let Op::MatMul { trans_b, .. } = self.g.node(n).op else {
            return Err(unsupported(self.g, n, "not a matrix product"));
        };
        let ins = self.g.inputs(n);
        let w = self
            .param_of(ins[1])
            .ok_or_else(|| unsupported(self.g, n, "its weight is not a parameter"))?;
        self.check_segments(n, &segments, "an output width")?;
        let out_rank = self.g.node(n).outputs[0].shape.0.len();
        Ok(Decision {
            out: Some(Layout::Split {
                axis: out_rank - 1,
                segments: segments.clone(),
            }),
            split_params: vec![(w, usize::from(!trans_b), segments)],
            ..Decision::default()
        })
    }

    /// The rule of node `n` whose inputs lie as `ins` (some split).
    pub fn apply(&self, n: NodeId, ins: &[Layout]) -> Result<Decision, Refusal> {
        let g = self.g;
        let node = g.node(n);
        let inputs = g.inputs(n);
        let out_shape = node
            .outputs
            .first()
            .map(|t| t.shape.0.clone())
            .unwrap_or_default();
        let out_rank = out_shape.len();
        let split = |l: &Layout| match l {
            Layout::Split { axis, segments } => Some((*axis, segments.clone())),
            Layout::Rep => None,
        };
        let same = |l: Layout| {
            Ok(Decision {
                out: Some(l),
                ..Decision::default()
            })
        };
        let first = ins.iter().find_map(split);
        let Some((a, segs)) = first else {
            return same(Layout::Rep);
        };
        match &node.op {
            Op::Unary { .. } | Op::Cast { .. } | Op::Not => same(ins[0].clone()),
            Op::Binary { .. } | Op::Compare { .. } | Op::Logical { .. } | Op::Where => {
                self.elementwise(n, &inputs, ins, out_rank)
            }
            Op::MatMul { trans_a, trans_b } => {
                let (ra, rb) = (self.shape(inputs[0]).len(), self.shape(inputs[1]).len());
                let k_a = if *trans_a { ra - 2 } else { ra - 1 };
                let m_a = if *trans_a { ra - 1 } else { ra - 2 };
                match (&ins[0], &ins[1]) {
                    (Layout::Split { axis, segments }, Layout::Rep) if *axis == k_a => {
                        // Row-parallel: the weight split over its input rows.
                        let w = self.param_of(inputs[1]).ok_or_else(|| {
                            unsupported(g, n, "a split reduction axis against an activation")
                        })?;
                        if rb != 2 {
                            return Err(unsupported(g, n, "the weight is not a matrix"));
                        }
                        let k_b = usize::from(*trans_b);
                        Ok(Decision {
                            out: Some(Layout::Rep),
                            split_params: vec![(w, k_b, segments.clone())],
                            partial: true,
                            ..Decision::default()
                        })
                    }
                    (Layout::Split { axis, segments }, Layout::Rep)
                        if *axis == m_a && self.param_of(inputs[1]).is_some() =>
                    {
                        same(Layout::Split {
                            axis: out_rank - 2,
                            segments: segments.clone(),
                        })
                    }
                    (
                        Layout::Split {
                            axis: x,
                            segments: s,
                        },
                        Layout::Split {
                            axis: y,
                            segments: u,
                        },
                    ) if x == y && s == u && ra == rb && *x + 2 < ra => {
                        // A batched product over split heads.
                        same(ins[0].clone())
                    }
                    // A batched product over split heads with a whole
                    // operand (keys or values computed whole): each member
                    // takes its heads of it.
                    (Layout::Split { axis, segments }, Layout::Rep)
                    | (Layout::Rep, Layout::Split { axis, segments })
                        if self.select
                            && ra == rb
                            && *axis + 2 < ra
                            && self.shape(inputs[0])[*axis] == self.shape(inputs[1])[*axis] =>
                    {
                        let whole = usize::from(ins[1] == Layout::Rep);
                        Ok(Decision {
                            out: Some(Layout::Split {
                                axis: *axis,
                                segments: segments.clone(),
                            }),
                            select: vec![(whole, *axis, segments.clone())],
                            ..Decision::default()
                        })
                    }
                    _ => Err(unsupported(g, n, "split operands this product cannot use")),
                }
            }
            Op::Attention { .. } => {
                let all = ins.iter().all(
                    |l| matches!(l, Layout::Split { axis: 1, segments } if segments.len() == 1),
                );
                let q_heads = self.shape(inputs[0]).get(1).copied();
                let whole_kv = ins[1..].iter().all(|l| *l == Layout::Rep)
                    && inputs[1..]
                        .iter()
                        .all(|v| self.shape(*v).get(1).copied() == q_heads);
                if all && ins.iter().all(|l| *l == ins[0]) {
                    same(ins[0].clone())
                } else if let (true, true, Layout::Split { segments, .. }) =
                    (self.select, whole_kv, &ins[0])
                {
                    // Keys and values computed whole: each member takes
                    // its query heads' share.
                    if segments.len() != 1 || !matches!(ins[0], Layout::Split { axis: 1, .. }) {
                        return Err(unsupported(g, n, "query not split by heads"));
                    }
                    Ok(Decision {
                        out: Some(ins[0].clone()),
                        select: vec![(1, 1, segments.clone()), (2, 1, segments.clone())],
                        ..Decision::default()
                    })
                } else {
                    Err(unsupported(
                        g,
                        n,
                        "query, key and value not all split by heads",
                    ))
                }
            }
            Op::Softmax { axis } | Op::LogSoftmax { axis } if *axis != a => same(ins[0].clone()),
            Op::LayerNorm { .. } | Op::RmsNorm { .. }
                if a + 1 != self.shape(inputs[0]).len()
                    && ins[1..].iter().all(|l| *l == Layout::Rep) =>
            {
                same(ins[0].clone())
            }
            Op::Reshape { shape } => self.reshape(n, self.shape(inputs[0]), shape, a, segs),
            Op::Transpose { perm } => {
                let b = perm.iter().position(|&p| p == a).unwrap_or(a);
                same(Layout::Split {
                    axis: b,
                    segments: segs,
                })
            }
            Op::Slice {
                axis,
                start,
                end,
                step,
            } => {
                if *axis != a {
                    return same(ins[0].clone());
                }
                let len = self.shape(inputs[0])[a];
                let end = (*end).min(len);
                let mut bounds = vec![0usize];
                for s in &segs {
                    bounds.push(bounds.last().copied().unwrap_or(0) + s);
                }
                let i = bounds.iter().position(|&b| b == *start);
                let j = bounds.iter().position(|&b| b == end);
                match (i, j) {
                    (Some(i), Some(j)) if *step == 1 && i < j => same(Layout::Split {
                        axis: a,
                        segments: segs[i..j].to_vec(),
                    }),
                    _ => Err(unsupported(
                        g,
                        n,
                        format!("[{start}, {end}) of axis {a} is not whole segments of {segs:?}"),
                    )),
                }
            }
            Op::Concat { axis } if *axis != a && ins.iter().all(|l| *l == ins[0]) => {
                same(ins[0].clone())
            }
            Op::Expand { .. } => {
                let r = self.shape(inputs[0]).len();
                same(Layout::Split {
                    axis: a + (out_rank - r),
                    segments: segs,
                })
            }
            Op::Reduce { axes, keepdims, .. } if !axes.is_empty() && !axes.contains(&a) => {
                let b = if *keepdims {
                    a
                } else {
                    a - axes.iter().filter(|&&x| x < a).count()
                };
                same(Layout::Split {
                    axis: b,
                    segments: segs,
                })
            }
            Op::Pad { pads, .. } if pads.get(a) == Some(&(0, 0)) => same(ins[0].clone()),
            Op::Dropout { .. } => Err(unsupported(
                g,
                n,
                "dropout on a split tensor (its mask follows whole-tensor elements)",
            )),
            _ => Err(unsupported(g, n, "this op does not run on a split input")),
        }
    }

    /// A reshape of a value split on axis `a` in `segs`: the input and
    /// output axes fall into groups of equal size (a reshape only merges
    /// and splits axes within a group). Where the split axis is merged
    /// with others into one output axis, the output is split there, its
    /// segments the input's repeated for each index of the outer axes and
    /// scaled by the inner ones (heads merged with the batch for a batched
    /// product). Where it is cut into several output axes, the output is
    /// split on the first whose chunks are the segments' (heads from a
    /// projection's width, the parts of a fused projection).
    fn reshape(
        &self,
        n: NodeId,
        from: &[usize],
        shape: &[usize],
        a: usize,
        segs: Vec<usize>,
    ) -> Result<Decision, Refusal> {
        let g = self.g;
        let moves = || {
            Err(unsupported(
                g,
                n,
                format!("{from:?} -> {shape:?} moves the split axis {a}"),
            ))
        };
        let Some(((i0, i1), (o0, o1))) = reshape_group(from, shape, a) else {
            return moves();
        };
        let split = |axis: usize, segments: Vec<usize>| {
            Ok(Decision {
                out: Some(Layout::Split { axis, segments }),
                ..Decision::default()
            })
        };
        if o1 - o0 == 1 {
            // Merged (or kept): outer repeats, inner scale.
            let k: usize = from[i0..a].iter().product();
            let m: usize = from[a + 1..i1].iter().product();
            let one: Vec<usize> = segs.iter().map(|s| s * m).collect();
            return split(o0, one.repeat(k));
        }
        if i1 - i0 != 1 {
            return moves();
        }
        // Cut into shape[o0..o1]: the first axis c whose chunks are the
        // segments, each segment one index of the axes before c.
        for c in o0..o1 {
            let k: usize = shape[o0..c].iter().product();
            let m: usize = shape[c + 1..o1].iter().product();
            if shape[c] == 1 || segs.len() != k || segs.iter().any(|&s| s != shape[c] * m) {
                continue;
            }
            if !shape[c].is_multiple_of(self.t) {
                return Err(indivisible(
                    g,
                    n,
                    format!(
                        "the split axis becomes {} (heads) here, which does not split over T = {}",
                        shape[c], self.t
                    ),
                ));
            }
            return split(c, vec![shape[c]]);
        }
        moves()
    }

    /// Numpy-broadcasting ops: every split input split alike (aligned to
    /// the output's axes), every whole input broadcast along the split axis
    /// or a parameter split with it (a bias).
    fn elementwise(
        &self,
        n: NodeId,
        inputs: &[ValueId],
        ins: &[Layout],
        out_rank: usize,
    ) -> Result<Decision, Refusal> {
        let g = self.g;
        let mut at: Option<(usize, Vec<usize>)> = None;
        for (v, l) in inputs.iter().zip(ins) {
            if let Layout::Split { axis, segments } = l {
                let aligned = axis + out_rank - self.shape(*v).len();
                match &at {
                    Some((b, s)) if *b != aligned || s != segments => {
                        return Err(unsupported(g, n, "inputs split differently"))
                    }
                    _ => at = Some((aligned, segments.clone())),
                }
            }
        }
        let Some((b, segs)) = at else {
            return Ok(Decision {
                out: Some(Layout::Rep),
                ..Decision::default()
            });
        };
        let mut d = Decision {
            out: Some(Layout::Split {
                axis: b,
                segments: segs.clone(),
            }),
            ..Decision::default()
        };
        for (v, l) in inputs.iter().zip(ins) {
            if *l != Layout::Rep {
                continue;
            }
            let shape = self.shape(*v);
            let Some(axis) = (b + shape.len()).checked_sub(out_rank) else {
                continue; // broadcast: the axis is not there
            };
            if shape[axis] == 1 {
                continue;
            }
            if let Some(p) = self.param_of(*v) {
                d.split_params.push((p, axis, segs.clone()));
            } else if let Some((product, chain)) = self.adapter(*v, shape.len() - 1, axis) {
                // A low-rank adapter's up-projection added to a split
                // product: it becomes column-parallel too.
                let Op::MatMul { trans_b, .. } = g.node(product).op else {
                    unreachable!("an adapter ends in a product")
                };
                let w = self
                    .param_of(g.inputs(product)[1])
                    .expect("an adapter's weight");
                d.split_params
                    .push((w, usize::from(!trans_b), segs.clone()));
                let split = Layout::Split {
                    axis,
                    segments: segs.clone(),
                };
                d.also.extend(chain.into_iter().map(|c| (c, split.clone())));
                d.enter.push(product);
            } else {
                return Err(unsupported(
                    g,
                    n,
                    "a whole activation meets a split one along the split axis",
                ));
            }
        }
        Ok(d)
    }

    /// Whether `v` is a low-rank adapter's output (LoRA's `h @ B`, scaled
    /// by static values or cast, each read only by the next): the product
    /// and the values from it to `v`, when `v`'s last axis is the split
    /// `axis` and the product's weight is a matrix read only there.
    fn adapter(&self, v: ValueId, last: usize, axis: usize) -> Option<(NodeId, Vec<ValueId>)> {
        let g = self.g;
        if axis != last {
            return None;
        }
        let mut memo = std::collections::HashMap::new();
        let mut chain = vec![v];
        let mut at = v;
        loop {
            if g.users(at).len() != 1 {
                return None;
            }
            let ins = g.inputs(at.node);
            match &g.node(at.node).op {
                Op::MatMul { trans_a: false, .. } => {
                    let w = ins[1];
                    let whole_input = self.param_of(ins[0]).is_none();
                    let weight = self.param_of(w).is_some()
                        && self.shape(w).len() == 2
                        && g.users(w).len() == 1;
                    return (whole_input && weight).then_some((at.node, chain));
                }
                Op::Cast { .. } => at = ins[0],
                Op::Binary {
                    f: BinaryFn::Mul | BinaryFn::Div,
                } if super::sequence::is_static(g, ins[1], &mut memo)
                    && self.shape(ins[1]).iter().product::<usize>() == 1 =>
                {
                    at = ins[0]
                }
                _ => return None,
            }
            chain.push(at);
        }
    }
}

/// The group of a reshape `from -> to` that holds input axis `a`: the
/// input axes `i0..i1` and output axes `o0..o1` of equal product, the
/// smallest such runs (size-1 axes join the group before them).
fn reshape_group(
    from: &[usize],
    to: &[usize],
    a: usize,
) -> Option<((usize, usize), (usize, usize))> {
    let (mut i, mut o) = (0, 0);
    while i < from.len() && o < to.len() {
        let (i0, o0) = (i, o);
        let (mut pi, mut po) = (from[i], to[o]);
        i += 1;
        o += 1;
        while pi != po {
            if pi < po {
                pi *= *from.get(i)?;
                i += 1;
            } else {
                po *= *to.get(o)?;
                o += 1;
            }
        }
        // Trailing size-1 axes belong to this group.
        while from.get(i) == Some(&1) && to.get(o) != Some(&1) {
            i += 1;
        }
        while to.get(o) == Some(&1) && from.get(i) != Some(&1) {
            o += 1;
        }
        if (i0..i).contains(&a) {
            return Some(((i0, i), (o0, o)));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::reshape_group;

    /// Groups are the smallest runs of equal product, size-1 axes joining
    /// the group before them.
    #[test]
    fn reshape_groups_pair_the_axes_a_reshape_merges_or_cuts() {
        // Heads cut from a width, and merged back.
        assert_eq!(
            reshape_group(&[2, 16, 64], &[2, 16, 4, 16], 2),
            Some(((2, 3), (2, 4)))
        );
        assert_eq!(
            reshape_group(&[2, 16, 4, 16], &[2, 16, 64], 2),
            Some(((2, 4), (2, 3)))
        );
        // Heads merged with the batch for a batched product.
        assert_eq!(
            reshape_group(&[2, 2, 2, 16, 8], &[8, 16, 8], 1),
            Some(((0, 3), (0, 1)))
        );
        // A flattened product's rows.
        assert_eq!(
            reshape_group(&[32, 96], &[2, 16, 96], 1),
            Some(((1, 2), (2, 3)))
        );
        assert_eq!(
            reshape_group(&[2, 1, 16], &[2, 16], 2),
            Some(((2, 3), (1, 2)))
        );
    }
}
