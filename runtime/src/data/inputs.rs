//! What each data input of a graph is: its type and, for an integer input,
//! the range of values its consumers accept (an embedding's rows, a loss's
//! classes), found by following the value through shape-only ops.

use fsdpc_ir::{Graph, NodeId, Op, TensorType, ValueId};

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
                range: range_of(graph, ValueId { node: n, slot: 0 }, 0),
            }),
            _ => None,
        })
        .collect()
}

/// The tightest range any consumer of `v` imposes.
fn range_of(graph: &Graph, v: ValueId, depth: usize) -> Option<i64> {
    if depth > 16 {
        return None;
    }
    let mut best: Option<i64> = None;
    for (user, slot) in graph.users(v) {
        let node = graph.node(user);
        let ins = graph.inputs(user);
        let dims = |i: usize| ins.get(i).map(|x| graph.value_type(*x).shape.0.clone());
        let r = match (&node.op, slot) {
            (Op::Gather { axis }, 1) => dims(0).and_then(|d| d.get(*axis).map(|&x| x as i64)),
            (Op::CrossEntropy { .. } | Op::CrossEntropyGrad { .. }, 1) => {
                dims(0).and_then(|d| d.last().map(|&x| x as i64))
            }
            (Op::GatherGrad { axis, data_shape }, 0) => data_shape.get(*axis).map(|&x| x as i64),
            (
                Op::Reshape { .. }
                | Op::Cast { .. }
                | Op::Slice { .. }
                | Op::Transpose { .. }
                | Op::Expand { .. },
                0,
            ) => range_of(
                graph,
                ValueId {
                    node: user,
                    slot: 0,
                },
                depth + 1,
            ),
            _ => None,
        };
        best = match (best, r) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
    best
}
