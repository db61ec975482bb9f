//! `Graph::reordered`: renumbering a graph in a chosen topological order.

use crate::common::tiny_mlp;
use fsdpc_ir::NodeId;

#[test]
fn reordered_follows_the_order_and_keeps_the_graph() {
    let (g, loss) = tiny_mlp();
    let mut order = g.topo_order().unwrap();
    // Another topological order: the leading source nodes reversed.
    let sources = order
        .iter()
        .take_while(|&&n| g.node(n).op.is_source())
        .count();
    order[..sources].reverse();
    let (r, map) = g.reordered(&order).unwrap();
    assert!(r.ids_are_topological());
    assert_eq!(
        r.topo_order().unwrap(),
        (0..order.len() as u32).map(NodeId).collect::<Vec<_>>()
    );
    assert_eq!(r.node_count(), g.node_count());
    for (i, &n) in order.iter().enumerate() {
        assert_eq!(map[&n], NodeId(i as u32));
        assert_eq!(r.node(NodeId(i as u32)), g.node(n));
        let inputs: Vec<_> = g
            .inputs(n)
            .into_iter()
            .map(|v| (map[&v.node], v.slot))
            .collect();
        let got: Vec<_> = r
            .inputs(NodeId(i as u32))
            .into_iter()
            .map(|v| (v.node, v.slot))
            .collect();
        assert_eq!(got, inputs);
    }
    assert_eq!(
        r.outputs,
        vec![fsdpc_ir::ValueId {
            node: map[&loss.node],
            ..loss
        }]
    );
}

#[test]
fn reordered_rejects_bad_orders() {
    let (g, _) = tiny_mlp();
    let order = g.topo_order().unwrap();
    let mut backwards = order.clone();
    backwards.reverse();
    assert!(
        g.reordered(&backwards).is_err(),
        "a reader before its producer"
    );
    assert!(g.reordered(&order[1..]).is_err(), "a node left out");
    let mut twice = order.clone();
    twice.push(order[0]);
    assert!(g.reordered(&twice).is_err(), "a node named twice");
    let mut missing = order.clone();
    missing.push(NodeId(10_000));
    assert!(g.reordered(&missing).is_err(), "a node that does not exist");
}
