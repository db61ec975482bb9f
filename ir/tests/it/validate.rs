//! The verifier collects every problem, each naming its node.

use crate::common::{f32t, tiny_mlp};
use fsdpc_ir::{
    build_training_program, validate, Graph, IrError, ModuleId, Node, NodeId, Op, Optimizer,
    ParamId, Phase, UnaryFn, ValueId,
};

fn messages(g: &Graph) -> Vec<String> {
    match validate(g) {
        Ok(()) => Vec::new(),
        Err(p) => p.0.iter().map(ToString::to_string).collect(),
    }
}

fn has(msgs: &[String], parts: &[&str]) -> bool {
    msgs.iter().any(|m| parts.iter().all(|p| m.contains(p)))
}

#[test]
fn a_valid_graph_and_program_pass() {
    let (g, loss) = tiny_mlp();
    assert_eq!(messages(&g), Vec::<String>::new());
    let p = build_training_program(g, loss, Optimizer::adamw(1e-3)).unwrap();
    p.validate().unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn every_problem_is_collected_with_its_node() {
    let (mut g, _) = tiny_mlp();
    // A stored type that disagrees with the rule.
    g.node_mut(NodeId(6)).outputs = vec![f32t(&[4, 6])];
    // A parameter node naming a parameter that does not exist.
    let bogus = Node {
        op: Op::Param { param: ParamId(99) },
        name: "ghost.weight".into(),
        module: ModuleId::ROOT,
        phase: Phase::Forward,
        outputs: vec![f32t(&[1])],
    };
    g.add_node_typed(bogus, &[]);
    // A second input named `x`.
    g.add_input("x", f32t(&[1]));
    // A graph output that does not exist.
    g.outputs.push(ValueId {
        node: NodeId(500),
        slot: 0,
    });
    // A cycle: `a = exp(b)`, `b = neg(a)`.
    let x = ValueId {
        node: NodeId(0),
        slot: 0,
    };
    let a = g
        .add1(Op::Unary { f: UnaryFn::Exp }, &[x], "cyc.a", ModuleId::ROOT)
        .unwrap();
    let b = g
        .add1(Op::Unary { f: UnaryFn::Neg }, &[a], "cyc.b", ModuleId::ROOT)
        .unwrap();
    g.set_input(a.node, 0, b);
    let msgs = messages(&g);
    assert!(
        has(
            &msgs,
            &["act", "stored output types [f32[4, 6]]", "f32[4, 5]"]
        ),
        "{msgs:#?}"
    );
    assert!(
        has(&msgs, &["ghost.weight", "parameter 99 does not exist"]),
        "{msgs:#?}"
    );
    assert!(has(&msgs, &["input name `x`"]), "{msgs:#?}");
    assert!(has(&msgs, &["graph output %500"]), "{msgs:#?}");
    assert!(has(&msgs, &["cycle", "cyc.a", "cyc.b"]), "{msgs:#?}");
    // The type of `act` is wrong, so its consumer's rule fails too.
    assert!(has(&msgs, &["fc2"]), "{msgs:#?}");
    let err: IrError = validate(&g).unwrap_err().into();
    assert!(err.to_string().contains("ghost.weight"));
}

#[test]
fn program_checks_grads_and_loss() {
    let (g, loss) = tiny_mlp();
    let mut p = build_training_program(g, loss, Optimizer::adamw(1e-3)).unwrap();
    p.grads.swap(0, 1);
    p.grads[2].grad = p.grads[3].grad;
    p.graph.outputs.clear();
    let msgs: Vec<String> = match p.validate() {
        Ok(()) => panic!("expected problems"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    };
    assert!(has(&msgs, &["increasing ParamId order"]), "{msgs:#?}");
    assert!(has(&msgs, &["also another parameter's grad"]), "{msgs:#?}");
    assert!(has(&msgs, &["not among the graph's outputs"]), "{msgs:#?}");
    assert!(
        has(&msgs, &["grads[2]", "type f32[2], the parameter f32[5, 2]"]),
        "{msgs:#?}"
    );
}

/// A module buffer: read before its one write, never after it, of its type.
#[test]
fn module_buffer_writes_are_checked() {
    use fsdpc_ir::{BinaryFn, Init, ModuleBufferId, ModuleBufferSpec};
    let mut g = Graph::new("bn");
    let r = ModuleId::ROOT;
    let x = g.add_input("x", f32t(&[3]));
    let spec = ModuleBufferSpec {
        name: "bn.running_mean".into(),
        ty: f32t(&[3]),
        init: Init::Zeros,
    };
    let running = g.add_buffer(spec, r);
    let new = g
        .add1(Op::Binary { f: BinaryFn::Add }, &[running, x], "new", r)
        .unwrap();
    let buffer = ModuleBufferId(0);
    g.add(Op::WriteBuffer { buffer }, &[new], "write", r)
        .unwrap();
    g.outputs = vec![new];
    assert_eq!(messages(&g), Vec::<String>::new());
    // A reader that does not feed the write could see the new value.
    let late = g
        .add1(Op::Unary { f: UnaryFn::Neg }, &[running], "late", r)
        .unwrap();
    assert!(has(&messages(&g), &["late", "does not feed its write"]));
    g.remove_node(late.node);
    // A second writer, and a value of another type.
    let half = g
        .add1(
            Op::Cast {
                to: fsdpc_ir::DType::Bf16,
            },
            &[new],
            "half",
            r,
        )
        .unwrap();
    g.add(Op::WriteBuffer { buffer }, &[half], "write2", r)
        .unwrap();
    let msgs = messages(&g);
    assert!(has(&msgs, &["write2", "also written by"]), "{msgs:?}");
    assert!(
        has(&msgs, &["write2", "into module buffer `bn.running_mean`"]),
        "{msgs:?}"
    );
}
