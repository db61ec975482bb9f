//! Sequence parallelism (Megatron-SP) on a member's forward graph: the
//! activations between split regions, replicated on every member under
//! plain tensor parallelism, are held as row chunks instead.
//!
//! A tensor whose leading axes are 1 up to an axis `a` before the last,
//! with `a`'s size divisible by T, is *chunkable*: member k holds the k-th
//! of T equal contiguous parts (rows of the last axis), shaped as the whole
//! with axis `a` divided by T, so gathering and scattering are plain
//! collectives over contiguous buffers. A region's sum of three or more
//! axes with no such axis but whose rows (every axis but the last) T
//! divides is chunked as those rows: reshaped to `[rows, last]` before its
//! reduce-scatter, the chunks' ops computing on rows, and every gather of
//! them reshaped back to the whole's shape (a dropout reads the whole: its
//! mask is drawn per sample).
//!
//! In graph order:
//! - a region's `TpReduce` whose sum is chunkable becomes a
//!   `TpReduceScatter` (each member keeps its chunk of the sum);
//! - an op that works row by row (elementwise ops, casts, norms and
//!   reductions over the last axis, dropout, reshapes to a chunkable
//!   shape) and reads a chunk computes on chunks: another
//!   activation of the same whole shape it reads is split (`TpSplit`, no
//!   communication), and a value computed from parameters and constants
//!   alone (a norm's weight, a bias) is read through a `TpCopy`, so its
//!   gradient, partial on each member, is summed over the group, unless it
//!   spans the chunk axis (a position table against one sample's sequence
//!   chunks): then it is split too, its gradient gathered whole; a
//!   dropout on a chunk reads the chunk's place in the whole (a constant
//!   of every member's offset, split over the group) and draws the whole
//!   tensor's mask for its elements, so the members together drop exactly
//!   what one rank holding the whole drops;
//! - a `TpCopy` that enters a region from a chunk becomes a `TpGather`
//!   whose gradient is reduce-scattered;
//! - any other op that reads a chunk (a product with a replicated weight,
//!   the loss) reads it through a `TpGather` whose gradient is this
//!   member's chunk.

use fsdpc_ir::{Graph, IrError, ModuleId, NodeId, Op, ValueId};
use std::collections::HashMap;

/// What the rewrite did, for the plan's record.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sequence {
    /// Region exits that reduce-scatter instead of all-reducing.
    pub scattered: usize,
    /// Region exits left as all-reduces (their sum is not chunkable).
    pub whole: usize,
    /// Chunks gathered whole for ops that do not run on chunks (a
    /// replicated head's product, the loss).
    pub gathered: usize,
}

/// The first axis not of size 1, when it lies before the last and `t`
/// divides it.
fn chunk_axis(dims: &[usize], t: usize) -> Option<usize> {
    let a = dims.iter().position(|&d| d != 1)?;
    (a + 1 < dims.len() && dims[a].is_multiple_of(t)).then_some(a)
}

/// The rows of a whole of three or more axes, all but its last, when `t`
/// divides them: chunked as `[rows, last]` when no axis of it can be.
fn row_count(dims: &[usize], t: usize) -> Option<usize> {
    let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
    (dims.len() >= 3 && rows.is_multiple_of(t)).then_some(rows)
}

/// The axis of a value of shape `d`, broadcast right-aligned against a
/// `whole` chunked on `axis`, that spans the chunk axis: present there
/// with the whole's extent, with no axis before it but of size 1, and
/// every axis after it the whole's or 1.
fn spans(d: &[usize], whole: &[usize], axis: usize) -> Option<usize> {
    let lead = whole.len().checked_sub(d.len())?;
    let at = axis.checked_sub(lead)?;
    let fits = d[at] == whole[axis]
        && d[..at].iter().all(|&x| x == 1)
        && d[at + 1..]
            .iter()
            .zip(&whole[axis + 1..])
            .all(|(&x, &w)| x == w || x == 1);
    fits.then_some(at)
}

/// Whether value `v` is computed from parameters and constants alone.
pub(super) fn is_static(g: &Graph, v: ValueId, memo: &mut HashMap<NodeId, bool>) -> bool {
    if let Some(&s) = memo.get(&v.node) {
        return s;
    }
    let s = match &g.node(v.node).op {
        Op::Param { .. } | Op::Constant { .. } => true,
        Op::Input { .. } => false,
        _ => g.inputs(v.node).iter().all(|&i| is_static(g, i, memo)),
    };
    memo.insert(v.node, s);
    s
}

/// Whether `op` works on each row of its last axis independently, so that
/// it computes on chunks as it does on the whole.
fn row_wise(op: &Op, rank: usize) -> bool {
    match op {
        Op::Unary { .. }
        | Op::Binary { .. }
        | Op::Compare { .. }
        | Op::Logical { .. }
        | Op::Not
        | Op::Where
        | Op::Cast { .. }
        | Op::LayerNorm { .. }
        | Op::RmsNorm { .. }
        | Op::Reshape { .. } => true,
        Op::Dropout { whole_sample, .. } => whole_sample.is_none(),
        Op::Softmax { axis } | Op::LogSoftmax { axis } => *axis + 1 == rank,
        Op::Reduce { axes, keepdims, .. } => *keepdims && axes.as_slice() == [rank - 1],
        _ => false,
    }
}

/// Rewrites the member's forward graph `g` (plain tensor parallelism over
/// `t` members) to hold the activations between regions as chunks; `loss`
/// is its loss. The nodes are renumbered so that each inserted node comes
/// right before the op it was inserted for (the planner schedules in id
/// order among ready nodes: a `TpCopy` of a norm's weight, ready from the
/// start, would otherwise run first in forward and its gradient's sum last
/// in backward, holding every unit's flat gradient until then). Returns
/// the renumbered graph's loss.
pub fn apply(g: &mut Graph, loss: ValueId, t: usize) -> Result<(Sequence, ValueId), IrError> {
    let order = g
        .topo_order()
        .map_err(|_| IrError::Invalid("the forward graph has a cycle".into()))?;
    let kept: std::collections::HashSet<NodeId> = g.node_ids().collect();
    let parts = t as u32;
    // Values held as chunks, with their chunk axis.
    let mut chunks: HashMap<ValueId, usize> = HashMap::new();
    let mut statics = HashMap::new();
    // One split of a whole activation and one gather of a chunk, however
    // many ops read them.
    let mut splits: HashMap<ValueId, ValueId> = HashMap::new();
    let mut gathers: HashMap<ValueId, ValueId> = HashMap::new();
    // One constant of the members' offsets per chunk size (dropout).
    let mut offsets: HashMap<u64, ValueId> = HashMap::new();
    // Chunks of rows (a whole of no axis to cut, as rows of its last
    // axis), with the whole's own shape.
    let mut flat: HashMap<ValueId, Vec<usize>> = HashMap::new();
    let mut record = Sequence::default();
    for n in order {
        let node = g.node(n);
        if node.phase != fsdpc_ir::Phase::Forward || node.op.is_source() {
            continue;
        }
        let (name, module) = (node.name.clone(), node.module);
        let out = ValueId { node: n, slot: 0 };
        let ins = g.inputs(n);
        let dims = |v: ValueId, g: &Graph| g.value_type(v).shape.0.clone();
        match node.op.clone() {
            Op::TpReduce => {
                let whole = dims(out, g);
                match (chunk_axis(&whole, t), row_count(&whole, t)) {
                    (Some(axis), _) => {
                        g.node_mut(n).op = Op::TpReduceScatter { axis, parts };
                        crate::precision::infer_outputs(g, n)?;
                        chunks.insert(out, axis);
                        record.scattered += 1;
                    }
                    // No axis to cut, but rows to: the sum as rows of its
                    // last axis, chunked on them.
                    (None, Some(rows)) => {
                        let last = whole[whole.len() - 1];
                        let r = g.add1(
                            Op::Reshape {
                                shape: vec![rows, last],
                            },
                            &[ins[0]],
                            format!("{name}.sp_rows"),
                            module,
                        )?;
                        g.set_input(n, 0, r);
                        g.node_mut(n).op = Op::TpReduceScatter { axis: 0, parts };
                        crate::precision::infer_outputs(g, n)?;
                        chunks.insert(out, 0);
                        flat.insert(out, whole);
                        record.scattered += 1;
                    }
                    (None, None) => record.whole += 1,
                }
            }
            Op::TpCopy if chunks.contains_key(&ins[0]) => {
                let axis = chunks[&ins[0]];
                let users = g.users(out);
                g.node_mut(n).op = Op::TpGather {
                    axis,
                    parts,
                    partial_grad: true,
                };
                crate::precision::infer_outputs(g, n)?;
                let back =
                    whole_shaped(g, &flat, ins[0], out, format!("{name}.sp_unrows"), module)?;
                if back != out {
                    for (u, slot) in users {
                        g.set_input(u, slot, back);
                    }
                }
            }
            op => {
                let chunked: Vec<usize> = ins
                    .iter()
                    .enumerate()
                    .filter(|(_, v)| chunks.contains_key(v))
                    .map(|(i, _)| i)
                    .collect();
                let Some(&first) = chunked.first() else {
                    continue;
                };
                let axis = chunks[&ins[first]];
                let whole_in = {
                    let mut d = dims(ins[first], g);
                    d[axis] *= t;
                    d
                };
                let rank = whole_in.len();
                let whole_out = dims(out, g);
                // A chunk of rows: the shape its whole had before.
                let rows_of = flat.get(&ins[first]).cloned();
                // Every other input: a chunk of the same whole, a whole
                // activation of that shape (split here), or a static value
                // that does not vary along the chunk axis or spans it.
                let fits = row_wise(&op, rank)
                    && g.node(n).outputs.len() == 1
                    // A chunk of rows holds parts of samples: a dropout's
                    // mask is drawn per sample, so it reads the whole.
                    && !(rows_of.is_some() && matches!(op, Op::Dropout { .. }))
                    && ins.iter().all(|&v| {
                        if let Some(&a) = chunks.get(&v) {
                            return a == axis && dims(v, g).len() == rank;
                        }
                        let d = dims(v, g);
                        if d == whole_in || rows_of.as_ref() == Some(&d) {
                            return true;
                        }
                        // Right-aligned broadcast: size 1 or absent at the
                        // chunk axis and every axis before it, or spanning
                        // the chunk axis (split here).
                        let lead = rank.saturating_sub(d.len());
                        is_static(g, v, &mut statics)
                            && d.len() <= rank
                            && ((0..=axis).all(|i| i < lead || d[i - lead] == 1)
                                || spans(&d, &whole_in, axis).is_some())
                    });
                let out_axis = match (&op, &rows_of) {
                    (Op::Reshape { .. }, _) => chunk_axis(&whole_out, t),
                    (_, Some(o)) => Some(axis).filter(|_| whole_out == *o),
                    _ => Some(axis).filter(|_| whole_out.len() == rank),
                };
                match (fits, out_axis) {
                    (true, Some(out_axis)) => {
                        for (i, &v) in ins.iter().enumerate() {
                            if chunks.contains_key(&v) {
                                continue;
                            }
                            let split_name = format!("{name}.sp_split{i}");
                            let split = Split {
                                parts,
                                name: split_name,
                                module,
                            };
                            let read = if dims(v, g) == whole_in {
                                split_once(g, &mut splits, v, axis, None, split)?
                            } else if rows_of.as_ref() == Some(&dims(v, g)) {
                                // A whole activation beside a chunk of rows:
                                // its rows, split.
                                split_once(g, &mut splits, v, 0, Some(&whole_in), split)?
                            } else if let Some(a) = spans(&dims(v, g), &whole_in, axis) {
                                // A static value with the chunk axis (a
                                // position table): each member reads its
                                // rows, the gradient gathered whole.
                                split_once(g, &mut splits, v, a, None, split)?
                            } else if g.node(v.node).op.is_source()
                                && !matches!(g.node(v.node).op, Op::Param { .. })
                            {
                                continue;
                            } else {
                                // A static value with a gradient: summed over
                                // the group, each member's part being partial.
                                g.add1(Op::TpCopy, &[v], format!("{name}.sp_copy{i}"), module)?
                            };
                            g.set_input(n, i as u32, read);
                        }
                        if let Op::Reshape { shape } = &mut g.node_mut(n).op {
                            shape[out_axis] /= t;
                        }
                        if let Op::Dropout { p, .. } = op {
                            if p > 0.0 {
                                place_dropout(g, n, &whole_in, t, &mut offsets)?;
                            }
                        }
                        crate::precision::infer_outputs(g, n)?;
                        chunks.insert(out, out_axis);
                        if let (Some(_), false) = (&rows_of, matches!(op, Op::Reshape { .. })) {
                            flat.insert(out, whole_out);
                        }
                    }
                    _ => {
                        for &i in &chunked {
                            let v = ins[i];
                            let gathered = match gathers.get(&v) {
                                Some(&w) => w,
                                None => {
                                    let w = g.add1(
                                        Op::TpGather {
                                            axis: chunks[&v],
                                            parts,
                                            partial_grad: false,
                                        },
                                        &[v],
                                        format!("{name}.sp_gather{i}"),
                                        module,
                                    )?;
                                    let unrows = format!("{name}.sp_unrows{i}");
                                    let w = whole_shaped(g, &flat, v, w, unrows, module)?;
                                    gathers.insert(v, w);
                                    record.gathered += 1;
                                    w
                                }
                            };
                            g.set_input(n, i as u32, gathered);
                        }
                    }
                }
            }
        }
    }
    // The graph's outputs are whole.
    for k in 0..g.outputs.len() {
        let v = g.outputs[k];
        if let Some(&w) = gathers.get(&v) {
            g.outputs[k] = w;
        } else if let Some(&axis) = chunks.get(&v) {
            let node = g.node(v.node);
            let (name, module) = (format!("{}.sp_gather", node.name), node.module);
            let whole = g.add1(
                Op::TpGather {
                    axis,
                    parts,
                    partial_grad: false,
                },
                &[v],
                name,
                module,
            )?;
            let unrows = format!("{}.sp_unrows", g.node(v.node).name);
            let whole = whole_shaped(g, &flat, v, whole, unrows, module)?;
            g.outputs[k] = whole;
            record.gathered += 1;
        }
    }
    let (renumbered, loss) = crate::precision::just_in_time(g, loss, &kept)?;
    *g = renumbered;
    Ok((record, loss))
}

/// Where a `TpSplit` goes and what it is called.
struct Split {
    parts: u32,
    name: String,
    module: ModuleId,
}

/// This member's part of `v` split on `axis` over `parts` members (`v`
/// reshaped to `rows` first, when given: a whole beside chunks of rows):
/// one `TpSplit` of `v` however many ops read it (`splits`).
fn split_once(
    g: &mut Graph,
    splits: &mut HashMap<ValueId, ValueId>,
    v: ValueId,
    axis: usize,
    rows: Option<&[usize]>,
    at: Split,
) -> Result<ValueId, IrError> {
    if let Some(&c) = splits.get(&v) {
        return Ok(c);
    }
    let src = match rows {
        Some(shape) => g.add1(
            Op::Reshape {
                shape: shape.to_vec(),
            },
            &[v],
            format!("{}.rows", at.name),
            at.module,
        )?,
        None => v,
    };
    let parts = at.parts;
    let c = g.add1(Op::TpSplit { axis, parts }, &[src], at.name, at.module)?;
    splits.insert(v, c);
    Ok(c)
}

/// `gathered`, the whole of `chunk`, in the shape the whole had before it
/// was taken as rows (`flat`); `gathered` itself for any other chunk.
fn whole_shaped(
    g: &mut Graph,
    flat: &HashMap<ValueId, Vec<usize>>,
    chunk: ValueId,
    gathered: ValueId,
    name: String,
    module: ModuleId,
) -> Result<ValueId, IrError> {
    match flat.get(&chunk) {
        Some(shape) => g.add1(
            Op::Reshape {
                shape: shape.clone(),
            },
            &[gathered],
            name,
            module,
        ),
        None => Ok(gathered),
    }
}

/// Dropout node `n`, now reading a chunk of `whole` (its input's whole
/// shape), draws the whole's mask: it reads the chunk's offset in the
/// whole, member k's being `k` chunks, from a constant of every member's
/// offset split over the group (one per chunk size, in `offsets`).
fn place_dropout(
    g: &mut Graph,
    n: NodeId,
    whole: &[usize],
    t: usize,
    offsets: &mut HashMap<u64, ValueId>,
) -> Result<(), IrError> {
    let numel: u64 = whole.iter().map(|&d| d as u64).product();
    let chunk = numel / t as u64;
    let rows = whole.first().copied().unwrap_or(1).max(1) as u64;
    let module = g.node(n).module;
    let offset = match offsets.get(&chunk) {
        Some(&o) => o,
        None => {
            let o = super::member_offset(g, chunk, t, "sp_dropout_offset", module)?;
            offsets.insert(chunk, o);
            o
        }
    };
    if let Op::Dropout { whole_sample, .. } = &mut g.node_mut(n).op {
        *whole_sample = Some(numel / rows);
    }
    g.set_input(n, 1, offset);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{chunk_axis, spans};

    #[test]
    fn a_position_table_spans_the_chunk_axis() {
        // [8, 32] against [1, 8, 32] chunked on the sequence.
        assert_eq!(spans(&[8, 32], &[1, 8, 32], 1), Some(0));
        assert_eq!(spans(&[1, 8, 1], &[1, 8, 32], 1), Some(1));
        // Missing the chunk axis, or of another extent there.
        assert_eq!(spans(&[32], &[1, 8, 32], 1), None);
        assert_eq!(spans(&[4, 32], &[1, 8, 32], 1), None);
        // Another extent after it; a batch of several before it.
        assert_eq!(spans(&[8, 16], &[1, 8, 32], 1), None);
        assert_eq!(spans(&[2, 8, 32], &[1, 8, 32], 1), None);
    }

    #[test]
    fn chunks_lie_on_the_first_axis_not_of_size_one() {
        assert_eq!(chunk_axis(&[8, 16, 32], 2), Some(0));
        assert_eq!(chunk_axis(&[1, 16, 32], 4), Some(1));
        assert_eq!(chunk_axis(&[2, 16, 32], 4), None);
        assert_eq!(chunk_axis(&[1, 1, 32], 2), None);
        assert_eq!(chunk_axis(&[64, 32], 8), Some(0));
    }
}
