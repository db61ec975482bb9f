//! The text dump (an insta snapshot, reviewed) and JSON round trips.

use crate::common::tiny_mlp;
use fsdpc_ir::{
    build_training_program, Graph, ModuleId, NodeId, Op, Optimizer, TrainingProgram, UnaryFn,
    ValueId,
};

fn program() -> TrainingProgram {
    let (g, loss) = tiny_mlp();
    build_training_program(g, loss, Optimizer::adamw(1e-3)).unwrap()
}

#[test]
fn tiny_mlp_program_dump() {
    insta::assert_snapshot!(program().to_string());
}

#[test]
fn graph_json_round_trip_keeps_ids_of_a_graph_with_holes() {
    let (mut g, _) = tiny_mlp();
    let x = ValueId {
        node: NodeId(0),
        slot: 0,
    };
    let unary = |f| Op::Unary { f };
    let a = g
        .add1(unary(UnaryFn::Exp), &[x], "a", ModuleId::ROOT)
        .unwrap();
    let b = g
        .add1(unary(UnaryFn::Tanh), &[x], "b", ModuleId::ROOT)
        .unwrap();
    let c = g
        .add1(unary(UnaryFn::Neg), &[b], "c", ModuleId::ROOT)
        .unwrap();
    g.remove_node(a.node);
    g.remove_node(NodeId(2)); // fc1.weight: fc1's matmul now lacks an input
    let text = g.to_json().unwrap();
    let back = Graph::from_json(&text).unwrap();
    assert_eq!(
        back.node_ids().collect::<Vec<_>>(),
        g.node_ids().collect::<Vec<_>>()
    );
    assert!(back.contains(c.node) && !back.contains(a.node) && !back.contains(NodeId(2)));
    assert_eq!(back.to_json().unwrap(), text);
    for n in g.node_ids() {
        assert_eq!(back.node(n), g.node(n));
        assert_eq!(back.inputs(n), g.inputs(n));
    }
    assert_eq!(back.to_string(), g.to_string());
}

#[test]
fn program_json_round_trip() {
    let p = program();
    let text = p.to_json().unwrap();
    let back = TrainingProgram::from_json(&text).unwrap();
    assert_eq!(back.to_json().unwrap(), text);
    assert_eq!(back.to_string(), p.to_string());
    back.validate().unwrap();
}

#[test]
fn bad_json_is_an_error() {
    assert!(Graph::from_json("{").is_err());
    assert!(TrainingProgram::from_json("{\"graph\": 3}").is_err());
    let (g, _) = tiny_mlp();
    let text = g.to_json().unwrap().replace("\"node\": 0", "\"node\": 77");
    assert!(
        Graph::from_json(&text).is_err(),
        "an input referring to a missing node"
    );
}
