//! What each data input of a graph is: its type and, for an integer input,
//! the range of values its consumers accept (an embedding's rows, a loss's
//! classes), found by following the value through the ops that only move
//! values (reshapes, slices, pads, concatenations, gathers of it, selections);
//! and, for a `[batch, seq]` integer input, whether the graph shifts it by
//! one position along the sequence before a loss reads it as labels (the
//! causal-LM loss of a Hugging Face export: `labels[:, 1:]`, often after a
//! pad, against `logits[:, :-1]`).

use fsdpc_ir::{Graph, NodeId, Op, TensorType, ValueId};
use std::collections::HashSet;

/// The most values the search for a range visits from one input (a bound on
/// the work for pathological graphs; real index paths are a few ops long).
const MAX_VISITED: usize = 4096;

/// One data input.
#[derive(Clone, Debug, PartialEq)]
pub struct InputDesc {
    /// The input's name.
    pub name: String,
    /// Its `Input` node.
    pub node: NodeId,
    /// Its type (axis 0 is the batch).
    pub ty: TensorType,
    /// Exclusive upper bound of valid integer values, if a consumer fixes one.
    pub range: Option<i64>,
    /// True when the input is `[batch, seq]`, reaches the label slot of a
    /// cross-entropy, and every such path moves it one position to the left
    /// along the sequence axis first (a `Slice` starting at 1 on axis 1,
    /// net of any pad before it): the loss at position `t` reads the
    /// input's position `t + 1`, so the input holds the same tokens as the
    /// ids, not the next ones.
    pub shifted_in_graph: bool,
}

/// Every `Input` node of `graph`.
pub fn analyse(graph: &Graph) -> Vec<InputDesc> {
    graph
        .node_ids()
        .filter_map(|n| match &graph.node(n).op {
            Op::Input { name } => Some(InputDesc {
                name: name.clone(),
                node: n,
                ty: graph.node(n).outputs.first()?.clone(),
                range: range_of(graph, ValueId { node: n, slot: 0 }),
                shifted_in_graph: label_shift(graph, ValueId { node: n, slot: 0 }) == Some(1),
            }),
            _ => None,
        })
        .collect()
}

/// The tightest range any consumer of `v`'s values imposes, following the
/// values through every op that only moves them. Values an op adds (a pad's
/// constant, the other branch of a `Where`) do not widen the range: it is
/// the range the input's own values must lie in. The result is the minimum
/// over all consumers, so it does not depend on the order of the search.
fn range_of(graph: &Graph, v: ValueId) -> Option<i64> {
    let mut seen = HashSet::from([v]);
    let mut todo = vec![v];
    let mut best: Option<i64> = None;
    while let Some(v) = todo.pop() {
        for (user, slot) in graph.users(v) {
            let op = &graph.node(user).op;
            if moves_values(op, slot) {
                let out = ValueId {
                    node: user,
                    slot: 0,
                };
                if seen.len() < MAX_VISITED && seen.insert(out) {
                    todo.push(out);
                }
            } else if let Some(r) = bound(graph, user, op, slot) {
                best = Some(best.map_or(r, |b| b.min(r)));
            }
        }
    }
    best
}

/// True when input `slot` of `op` reaches its output unchanged (some of its
/// elements, in another layout or dtype): every pure data-movement op of the
/// IR. `Flatten`, `Squeeze` and `Unsqueeze` arrive as `Reshape`.
fn moves_values(op: &Op, slot: u32) -> bool {
    match op {
        Op::Reshape { .. }
        | Op::Transpose { .. }
        | Op::Slice { .. }
        | Op::Expand { .. }
        | Op::Pad { .. }
        | Op::Cast { .. }
        // The gathered data (slot 0); its indices (slot 1) are a consumer.
        | Op::Gather { .. } => slot == 0,
        Op::Concat { .. } => true,
        // `(cond, a, b)`: both value slots.
        Op::Where => slot == 1 || slot == 2,
        _ => false,
    }
}

/// The exclusive bound that input `slot` of `user` (computing `op`) puts on
/// the integer values it reads: an index's axis length, a label's classes.
fn bound(graph: &Graph, user: NodeId, op: &Op, slot: u32) -> Option<i64> {
    let dim = |input: usize, axis: Option<usize>| {
        let x = *graph.inputs(user).get(input)?;
        let dims = graph.value_type(x).shape.dims();
        let d = match axis {
            Some(a) => dims.get(a),
            None => dims.last(),
        };
        d.and_then(|&d| i64::try_from(d).ok())
    };
    match (op, slot) {
        (Op::Gather { axis }, 1) => dim(0, Some(*axis)),
        (Op::CrossEntropy { .. } | Op::CrossEntropyGrad { .. }, 1) => dim(0, None),
        // A vocabulary split over `parts` members: the whole table's rows,
        // the whole logits' classes (without a padded vocabulary's padding).
        (Op::TpLookup { parts, vocab }, 1) => split(dim(0, Some(0)), *parts, *vocab),
        (Op::TpLogitStats { parts, vocab, .. } | Op::TpLogitStatsGrad { parts, vocab, .. }, 1) => {
            split(dim(0, None), *parts, *vocab)
        }
        (
            Op::TpLookupGrad {
                table_shape,
                parts,
                vocab,
            },
            0,
        ) => split(
            table_shape.first().and_then(|&d| i64::try_from(d).ok()),
            *parts,
            *vocab,
        ),
        (Op::GatherGrad { axis, data_shape }, 0) => {
            data_shape.get(*axis).and_then(|&d| i64::try_from(d).ok())
        }
        _ => None,
    }
}

/// The whole vocabulary of a split of `parts` members holding `local`
/// rows or columns each: `vocab` when the parts are padded.
fn split(local: Option<i64>, parts: u32, vocab: Option<usize>) -> Option<i64> {
    match vocab {
        Some(v) => i64::try_from(v).ok(),
        None => local.map(|d| d * i64::from(parts)),
    }
}

/// Where a search for the label shift stands: a value holding (some of) the
/// input's elements, the axis that is the input's sequence axis (`None` once
/// a reshape merged it away), and the sequence offset: position `p` of
/// `axis` holds the input's position `p + offset` (`None`: unknown).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
struct Track {
    value: ValueId,
    axis: Option<usize>,
    offset: Option<i64>,
}

/// The sequence offset at which every cross-entropy reads `v` as labels, if
/// `v` is `[batch, seq]`, reaches at least one, and all agree (`Some(1)`: the
/// graph shifts the labels; `Some(0)`: it reads them where they are).
fn label_shift(graph: &Graph, v: ValueId) -> Option<i64> {
    if graph.value_type(v).shape.rank() != 2 {
        return None;
    }
    let start = Track {
        value: v,
        axis: Some(1),
        offset: Some(0),
    };
    let mut seen = HashSet::from([start]);
    let mut todo = vec![start];
    let mut offsets = Vec::new();
    while let Some(t) = todo.pop() {
        for (user, slot) in graph.users(t.value) {
            let op = &graph.node(user).op;
            let loss = matches!(
                op,
                Op::CrossEntropy { .. }
                    | Op::CrossEntropyGrad { .. }
                    | Op::TpLogitStats { .. }
                    | Op::TpLogitStatsGrad { .. }
            );
            if loss && slot == 1 {
                offsets.push(t.offset);
            } else if moves_values(op, slot) {
                let next = moved(graph, &t, user, op);
                if seen.len() < MAX_VISITED && seen.insert(next) {
                    todo.push(next);
                }
            }
        }
    }
    let first = *offsets.first()?;
    if offsets.iter().all(|&o| o == first) {
        first
    } else {
        None
    }
}

/// Where `t` stands after `op` (at node `user`) moves the value it reads
/// to its output.
fn moved(graph: &Graph, t: &Track, user: NodeId, op: &Op) -> Track {
    let out = ValueId {
        node: user,
        slot: 0,
    };
    let in_dims = graph.value_type(t.value).shape.dims();
    let out_dims = graph.value_type(out).shape.dims();
    // Elementwise broadcasting (`Expand`, `Where`) prepends axes.
    let prepended = out_dims.len().saturating_sub(in_dims.len());
    let unknown = Track {
        value: out,
        axis: None,
        offset: None,
    };
    let (axis, offset) = match (op, t.axis) {
        (Op::Cast { .. }, a) => (a, t.offset),
        (Op::Pad { pads, .. }, Some(a)) => {
            let before = pads.get(a).map_or(0, |p| p.0) as i64;
            (Some(a), t.offset.map(|o| o - before))
        }
        (Op::Pad { pads, .. }, None) if pads.iter().all(|&p| p == (0, 0)) => (None, t.offset),
        (Op::Slice { axis, .. }, Some(a)) if *axis != a => (Some(a), t.offset),
        (Op::Slice { start, step: 1, .. }, Some(a)) => {
            let start = i64::try_from(*start).ok();
            (
                Some(a),
                t.offset.zip(start).and_then(|(o, s)| o.checked_add(s)),
            )
        }
        (Op::Transpose { perm }, Some(a)) => (perm.iter().position(|&p| p == a), t.offset),
        (Op::Reshape { .. }, Some(a)) => {
            // The axis survives if nothing before it or of it changed.
            let kept = in_dims.get(..=a) == out_dims.get(..=a);
            (kept.then_some(a), t.offset)
        }
        (Op::Reshape { .. }, None) => (None, t.offset),
        (Op::Expand { .. } | Op::Where, Some(a)) => {
            let same = in_dims.get(a) == out_dims.get(a + prepended);
            (Some(a + prepended), t.offset.filter(|_| same))
        }
        (Op::Where, None) if prepended == 0 => (None, t.offset),
        (Op::Gather { axis }, Some(a)) if *axis != a => {
            let index_rank = graph
                .inputs(user)
                .get(1)
                .map_or(1, |&i| graph.value_type(i).shape.rank());
            let a = if a < *axis { a } else { a + index_rank - 1 };
            (Some(a), t.offset)
        }
        (Op::Concat { axis }, Some(a)) if *axis != a => (Some(a), t.offset),
        _ => return unknown,
    };
    Track {
        value: out,
        axis,
        offset,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fsdpc_ir::{DType, ModuleId, TensorData};
    use std::collections::HashMap;

    const ROOT: ModuleId = ModuleId::ROOT;

    fn int(g: &mut Graph, name: &str, dims: &[usize]) -> ValueId {
        g.add_input(name, TensorType::new(DType::I64, dims.to_vec()))
    }

    fn float(g: &mut Graph, name: &str, dims: &[usize]) -> ValueId {
        g.add_input(name, TensorType::new(DType::F32, dims.to_vec()))
    }

    fn add(g: &mut Graph, op: Op, ins: &[ValueId]) -> ValueId {
        let name = format!("n{}", g.node_count());
        g.add1(op, ins, name, ROOT).unwrap()
    }

    /// `(name, range)` of every input, in node order.
    fn ranges(g: &Graph) -> Vec<(String, Option<i64>)> {
        analyse(g).into_iter().map(|d| (d.name, d.range)).collect()
    }

    /// An embedding table of `rows` rows gathering `ids`.
    fn embed(g: &mut Graph, ids: ValueId, rows: usize) -> ValueId {
        let table = float(g, &format!("table{rows}"), &[rows, 4]);
        add(g, Op::Gather { axis: 0 }, &[table, ids])
    }

    #[test]
    fn shifted_labels_through_pad_slice_reshape_reach_the_loss() {
        // What the causal-LM loss of a dynamo export does with `labels`:
        // pad one -100 at the end of the sequence, drop the first position,
        // flatten, and feed a cross-entropy that ignores -100.
        let mut g = Graph::new("shifted");
        let labels = int(&mut g, "labels", &[2, 8]);
        let logits = float(&mut g, "logits", &[16, 50]);
        let pads = vec![(0, 0), (0, 1)];
        let padded = add(
            &mut g,
            Op::Pad {
                pads,
                value: -100.0,
            },
            &[labels],
        );
        let slice = Op::Slice {
            axis: 1,
            start: 1,
            end: 9,
            step: 1,
        };
        let shifted = add(&mut g, slice, &[padded]);
        let flat = add(&mut g, Op::Reshape { shape: vec![16] }, &[shifted]);
        let ce = Op::CrossEntropy {
            ignore_index: Some(-100),
        };
        add(&mut g, ce, &[logits, flat]);
        let want = [("labels", Some(50)), ("logits", None)];
        let want: Vec<(String, Option<i64>)> =
            want.iter().map(|(n, r)| (n.to_string(), *r)).collect();
        assert_eq!(ranges(&g), want);
    }

    /// `shifted_in_graph` of every input, by name.
    fn shifted(g: &Graph) -> HashMap<String, bool> {
        analyse(g)
            .into_iter()
            .map(|d| (d.name, d.shifted_in_graph))
            .collect()
    }

    /// A cross-entropy of `[n, 50]` logits against `labels`, flattened.
    fn loss_on(g: &mut Graph, labels: ValueId) {
        let n = g.value_type(labels).shape.numel() as usize;
        let logits = float(g, "logits", &[n, 50]);
        let flat = add(g, Op::Reshape { shape: vec![n] }, &[labels]);
        let ce = Op::CrossEntropy {
            ignore_index: Some(-100),
        };
        add(g, ce, &[logits, flat]);
    }

    fn slice(axis: usize, start: usize, end: usize) -> Op {
        Op::Slice {
            axis,
            start,
            end,
            step: 1,
        }
    }

    fn pad(pads: Vec<(usize, usize)>) -> Op {
        Op::Pad {
            pads,
            value: -100.0,
        }
    }

    #[test]
    fn pad_then_slice_from_one_shifts_the_labels() {
        // The dynamo export: labels -> Pad(-100 at the end) -> Slice[1:].
        let mut g = Graph::new("hf");
        let labels = int(&mut g, "labels", &[2, 8]);
        let padded = add(&mut g, pad(vec![(0, 0), (0, 1)]), &[labels]);
        let s = add(&mut g, slice(1, 1, 9), &[padded]);
        loss_on(&mut g, s);
        assert!(shifted(&g)["labels"]);
    }

    #[test]
    fn slicing_labels_from_one_shifts_them() {
        // Older transformers: `labels[:, 1:]` against `logits[:, :-1]`.
        let mut g = Graph::new("old");
        let labels = int(&mut g, "labels", &[2, 8]);
        let s = add(&mut g, slice(1, 1, 8), &[labels]);
        let c = add(&mut g, Op::Cast { to: DType::I32 }, &[s]);
        loss_on(&mut g, c);
        assert!(shifted(&g)["labels"]);
    }

    #[test]
    fn labels_read_where_they_are_are_not_shifted() {
        // nanoGPT and fsdpc's zoo: the targets come shifted already.
        let mut g = Graph::new("pre");
        let labels = int(&mut g, "labels", &[2, 8]);
        loss_on(&mut g, labels);
        assert!(!shifted(&g)["labels"]);
    }

    #[test]
    fn a_shift_on_another_axis_or_undone_by_a_pad_is_not_a_shift() {
        let mut g = Graph::new("other");
        // A slice from 1 on the batch axis.
        let a = int(&mut g, "a", &[3, 8]);
        let s = add(&mut g, slice(0, 1, 3), &[a]);
        loss_on(&mut g, s);
        // A pad of one at the start, then a slice from 1: back in place.
        let b = int(&mut g, "b", &[2, 8]);
        let p = add(&mut g, pad(vec![(0, 0), (1, 0)]), &[b]);
        let s = add(&mut g, slice(1, 1, 9), &[p]);
        loss_on(&mut g, s);
        // A slice from 1 of the flattened labels: not per sequence.
        let c = int(&mut g, "c", &[2, 8]);
        let f = add(&mut g, Op::Reshape { shape: vec![16] }, &[c]);
        let s = add(&mut g, slice(0, 1, 16), &[f]);
        loss_on(&mut g, s);
        // A shift by two.
        let d = int(&mut g, "d", &[2, 8]);
        let s = add(&mut g, slice(1, 2, 8), &[d]);
        loss_on(&mut g, s);
        let r = shifted(&g);
        assert!(!r["a"] && !r["b"] && !r["c"] && !r["d"], "{r:?}");
    }

    #[test]
    fn the_sequence_axis_is_followed_through_a_transpose() {
        let mut g = Graph::new("transposed");
        let labels = int(&mut g, "labels", &[2, 8]);
        let t = add(&mut g, Op::Transpose { perm: vec![1, 0] }, &[labels]);
        let s = add(&mut g, slice(0, 1, 8), &[t]);
        loss_on(&mut g, s);
        assert!(shifted(&g)["labels"]);
    }

    #[test]
    fn two_losses_that_disagree_leave_the_labels_unshifted() {
        let mut g = Graph::new("two");
        let labels = int(&mut g, "labels", &[2, 8]);
        let s = add(&mut g, slice(1, 1, 8), &[labels]);
        loss_on(&mut g, s);
        loss_on(&mut g, labels);
        assert!(!shifted(&g)["labels"]);
    }

    #[test]
    fn an_input_that_reaches_no_loss_is_not_shifted() {
        let mut g = Graph::new("ids");
        let ids = int(&mut g, "ids", &[2, 8]);
        let s = add(&mut g, slice(1, 1, 8), &[ids]);
        embed(&mut g, s, 10);
        assert!(!shifted(&g)["ids"]);
    }

    #[test]
    fn every_data_slot_of_a_concat_gets_the_range() {
        let mut g = Graph::new("concat");
        let a = int(&mut g, "a", &[2, 3]);
        let b = int(&mut g, "b", &[2, 5]);
        let both = add(&mut g, Op::Concat { axis: 1 }, &[a, b]);
        embed(&mut g, both, 30);
        let r = ranges(&g);
        assert_eq!(r[0], ("a".to_string(), Some(30)));
        assert_eq!(r[1], ("b".to_string(), Some(30)));
    }

    #[test]
    fn gathered_values_keep_the_range_but_gather_indices_are_a_consumer() {
        let mut g = Graph::new("gather");
        let ids = int(&mut g, "ids", &[6]);
        let which = int(&mut g, "which", &[3]);
        // `ids[which]`: `which` indexes 6 rows; the gathered ids index 40.
        let picked = add(&mut g, Op::Gather { axis: 0 }, &[ids, which]);
        embed(&mut g, picked, 40);
        let r = ranges(&g);
        assert_eq!(r[0], ("ids".to_string(), Some(40)));
        assert_eq!(r[1], ("which".to_string(), Some(6)));
    }

    #[test]
    fn both_value_slots_of_a_where_get_the_range_and_the_condition_none() {
        let mut g = Graph::new("where");
        let cond = g.add_input("cond", TensorType::new(DType::Bool, vec![4]));
        let a = int(&mut g, "a", &[4]);
        let b = int(&mut g, "b", &[4]);
        let w = add(&mut g, Op::Where, &[cond, a, b]);
        embed(&mut g, w, 12);
        let r = ranges(&g);
        assert_eq!(r[0], ("cond".to_string(), None));
        assert_eq!(r[1], ("a".to_string(), Some(12)));
        assert_eq!(r[2], ("b".to_string(), Some(12)));
    }

    #[test]
    fn transpose_expand_and_cast_pass_the_range_through() {
        let mut g = Graph::new("layout");
        let ids = int(&mut g, "ids", &[3, 1]);
        let t = add(&mut g, Op::Transpose { perm: vec![1, 0] }, &[ids]);
        let e = add(&mut g, Op::Expand { shape: vec![2, 3] }, &[t]);
        let c = add(&mut g, Op::Cast { to: DType::I32 }, &[e]);
        embed(&mut g, c, 9);
        assert_eq!(ranges(&g)[0], ("ids".to_string(), Some(9)));
    }

    #[test]
    fn the_tightest_consumer_wins_and_a_value_that_only_computes_has_none() {
        let mut g = Graph::new("two");
        let ids = int(&mut g, "ids", &[4]);
        embed(&mut g, ids, 100);
        let r = add(&mut g, Op::Reshape { shape: vec![2, 2] }, &[ids]);
        embed(&mut g, r, 7);
        let other = int(&mut g, "other", &[4]);
        // An arithmetic consumer computes new values: no range follows.
        let one = TensorData {
            ty: TensorType::new(DType::I64, vec![4]),
            bytes: [1i64; 4].iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        let one = add(&mut g, Op::Constant { value: one }, &[]);
        let plus = add(
            &mut g,
            Op::Binary {
                f: fsdpc_ir::BinaryFn::Add,
            },
            &[other, one],
        );
        embed(&mut g, plus, 5);
        let r = ranges(&g);
        assert_eq!(r[0], ("ids".to_string(), Some(7)));
        assert_eq!(r[3], ("other".to_string(), None));
    }

    #[test]
    fn a_lattice_of_shared_paths_is_searched_once_per_value() {
        // Each `Where` reads the previous value in both value slots: 2^60
        // paths, 60 values. A search without a visited set would not end.
        let mut g = Graph::new("lattice");
        let cond = g.add_input("cond", TensorType::new(DType::Bool, vec![4]));
        let ids = int(&mut g, "ids", &[4]);
        let mut v = ids;
        for _ in 0..60 {
            v = add(&mut g, Op::Where, &[cond, v, v]);
        }
        embed(&mut g, v, 3);
        assert_eq!(ranges(&g)[1], ("ids".to_string(), Some(3)));
    }
}
