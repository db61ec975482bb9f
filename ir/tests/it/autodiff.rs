//! Structure of the programs autodiff builds: phases, modules, names, tied and
//! frozen parameters, the planner's contract on gradients, and that every
//! op's VJP produces a well-typed program.

use crate::common::{f32t, linear, param, tiny_mlp};
use fsdpc_ir::{
    build_training_program, BinaryFn, CompareFn, DType, Graph, Init, ModuleId, NodeId, Op,
    Optimizer, ParamId, Phase, ReduceFn, TensorData, TensorType, TrainingProgram, UnaryFn, ValueId,
};

fn sgd() -> Optimizer {
    Optimizer::Sgd {
        lr: 0.1,
        momentum: 0.0,
        weight_decay: 0.0,
    }
}

fn build(g: Graph, loss: ValueId) -> TrainingProgram {
    let p = build_training_program(g, loss, sgd()).unwrap_or_else(|e| panic!("{e}"));
    p.validate().unwrap_or_else(|e| panic!("{e}"));
    p
}

/// The planner's contract: a backward, non-source producer, unshared.
fn assert_contract(p: &TrainingProgram) {
    let mut seen = std::collections::HashSet::new();
    for pg in &p.grads {
        let node = p.graph.node(pg.grad.node);
        assert_eq!(node.phase, Phase::Backward, "{}", node.name);
        assert!(!node.op.is_source(), "{}", node.name);
        assert!(seen.insert(pg.grad), "grad {} shared", pg.grad);
        assert!(
            p.graph.users(pg.grad).is_empty(),
            "grad {} is read",
            pg.grad
        );
        assert_eq!(p.graph.value_type(pg.grad), &p.graph.param(pg.param).ty);
    }
}

#[test]
fn mlp_structure() {
    let (g, loss) = tiny_mlp();
    let forward: Vec<NodeId> = g.node_ids().collect();
    let modules: std::collections::HashMap<String, ModuleId> = forward
        .iter()
        .map(|&n| (g.node(n).name.clone(), g.node(n).module))
        .collect();
    let p = build(g, loss);
    assert_eq!(p.graph.outputs, vec![loss]);
    assert_eq!(
        p.grads.iter().map(|g| g.param).collect::<Vec<_>>(),
        (0..4).map(ParamId).collect::<Vec<_>>()
    );
    assert_contract(&p);
    let order = p.graph.topo_order().unwrap();
    assert_eq!(
        order,
        p.graph.node_ids().collect::<Vec<_>>(),
        "ids are a topological order"
    );
    for n in p.graph.node_ids().filter(|n| !forward.contains(n)) {
        let node = p.graph.node(n);
        assert_eq!(node.phase, Phase::Backward);
        assert!(n > *forward.last().unwrap());
        let fwd = node
            .name
            .strip_prefix("grad(")
            .and_then(|s| s.strip_suffix(')'));
        let fwd = fwd.unwrap_or_else(|| panic!("backward node named {:?}", node.name));
        assert_eq!(
            Some(&node.module),
            modules.get(fwd),
            "module of {}",
            node.name
        );
    }
    // fc1's weight gradient is computed in fc1's module.
    let w1 = p.grads[0].grad;
    assert_eq!(
        p.graph.module_info(p.graph.node(w1.node).module).path,
        "fc1"
    );
}

#[test]
fn bias_grad_that_would_alias_dy_gets_its_own_node() {
    // A broadcast bias: its gradient is a `SumTo` of its own.
    let (g, loss) = tiny_mlp();
    let p = build(g, loss);
    for pg in [&p.grads[1], &p.grads[3]] {
        assert_eq!(p.graph.node(pg.grad.node).op.name(), "sum_to");
    }
    // A bias with the output's exact shape: its natural gradient is `dy`
    // itself, which the scale's gradient also reads, so it gets a copy.
    let mut g = Graph::new("alias");
    let x = g.add_input("x", f32t(&[3]));
    let m = g.module("lin", "Linear");
    let w = param(&mut g, "lin.scale", &[3], Init::Ones, m);
    let b = param(&mut g, "lin.bias", &[3], Init::Zeros, m);
    let y = g
        .add1(Op::Binary { f: BinaryFn::Mul }, &[x, w], "lin.mul", m)
        .unwrap();
    let y = g
        .add1(Op::Binary { f: BinaryFn::Add }, &[y, b], "lin.add", m)
        .unwrap();
    let mean = Op::Reduce {
        f: ReduceFn::Mean,
        axes: vec![],
        keepdims: false,
    };
    let loss = g.add1(mean, &[y], "loss", ModuleId::ROOT).unwrap();
    let p = build(g, loss);
    assert_contract(&p);
    let bias = p.grads[1].grad;
    assert_eq!(
        p.graph.node(bias.node).op.name(),
        "reshape",
        "an explicit copy"
    );
    assert_eq!(p.graph.node(bias.node).module, m);
}

#[test]
fn tied_parameter_gets_one_summed_grad() {
    let mut g = Graph::new("tied");
    let ids = g.add_input("ids", TensorType::new(DType::I64, vec![4]));
    let labels = g.add_input("labels", TensorType::new(DType::I64, vec![4]));
    let emb_m = g.module("wte", "Embedding");
    let emb = param(
        &mut g,
        "wte.weight",
        &[10, 6],
        Init::Normal { std: 0.02 },
        emb_m,
    );
    let h = g
        .add1(Op::Gather { axis: 0 }, &[emb, ids], "wte", emb_m)
        .unwrap();
    let h = linear(&mut g, h, "mid", 6, 6);
    let head = g.module("lm_head", "Linear");
    let mm = Op::MatMul {
        trans_a: false,
        trans_b: true,
    };
    let logits = g.add1(mm, &[h, emb], "lm_head", head).unwrap();
    let ce = Op::CrossEntropy {
        ignore_index: Some(-100),
    };
    let loss = g
        .add1(ce, &[logits, labels], "loss", ModuleId::ROOT)
        .unwrap();
    let p = build(g, loss);
    assert_contract(&p);
    let emb_grads: Vec<_> = p.grads.iter().filter(|pg| pg.param == ParamId(0)).collect();
    assert_eq!(emb_grads.len(), 1);
    let sum = p.graph.node(emb_grads[0].grad.node);
    assert_eq!(sum.op, Op::Binary { f: BinaryFn::Add });
    assert_eq!(sum.module, emb_m, "the sum lands in the parameter's module");
    let parts: Vec<String> = p
        .graph
        .inputs(emb_grads[0].grad.node)
        .iter()
        .map(|v| p.graph.node(v.node).op.name())
        .collect();
    assert!(parts.contains(&"gather_grad".to_string()), "{parts:?}");
    assert!(parts.contains(&"mat_mul".to_string()), "{parts:?}");
}

#[test]
fn tied_to_parameters_share_the_summed_grad() {
    let mut g = Graph::new("tied_to");
    let x = g.add_input("x", f32t(&[2, 3]));
    let a = param(&mut g, "a", &[3], Init::Ones, ModuleId::ROOT);
    let mut spec = g.param(ParamId(0)).clone();
    spec.name = "b".into();
    spec.tied_to = Some(ParamId(0));
    let b = g.add_param(spec, ModuleId::ROOT);
    let y = g
        .add1(
            Op::Binary { f: BinaryFn::Mul },
            &[x, a],
            "mul_a",
            ModuleId::ROOT,
        )
        .unwrap();
    let y = g
        .add1(
            Op::Binary { f: BinaryFn::Mul },
            &[y, b],
            "mul_b",
            ModuleId::ROOT,
        )
        .unwrap();
    let sum = Op::Reduce {
        f: ReduceFn::Sum,
        axes: vec![0, 1],
        keepdims: false,
    };
    let loss = g.add1(sum, &[y], "loss", ModuleId::ROOT).unwrap();
    let p = build(g, loss);
    assert_contract(&p);
    assert_eq!(p.grads.len(), 2);
    for pg in &p.grads {
        let node = p.graph.node(pg.grad.node);
        assert_eq!(node.op, Op::Binary { f: BinaryFn::Add }, "{}", node.name);
    }
}

#[test]
fn frozen_parameters_and_integer_branches_get_nothing() {
    let mut g = Graph::new("frozen");
    let x = g.add_input("x", f32t(&[2, 3]));
    let m = g.module("frozen", "Linear");
    let frozen = param(&mut g, "frozen.weight", &[3, 3], Init::Ones, m);
    g.params[0].requires_grad = false;
    let h = g
        .add1(
            Op::MatMul {
                trans_a: false,
                trans_b: false,
            },
            &[x, frozen],
            "frozen",
            m,
        )
        .unwrap();
    let before = g.node_count();
    let h = linear(&mut g, h, "fc", 3, 3);
    // An integer side branch that feeds the loss through a cast.
    let i = g
        .add1(Op::Cast { to: DType::I64 }, &[h], "to_int", ModuleId::ROOT)
        .unwrap();
    let f = g
        .add1(
            Op::Cast { to: DType::F32 },
            &[i],
            "to_float",
            ModuleId::ROOT,
        )
        .unwrap();
    let y = g
        .add1(
            Op::Binary { f: BinaryFn::Add },
            &[h, f],
            "add",
            ModuleId::ROOT,
        )
        .unwrap();
    let mean = Op::Reduce {
        f: ReduceFn::Mean,
        axes: vec![0, 1],
        keepdims: false,
    };
    let loss = g.add1(mean, &[y], "loss", ModuleId::ROOT).unwrap();
    let p = build(g, loss);
    assert_contract(&p);
    assert_eq!(
        p.grads.iter().map(|g| g.param.0).collect::<Vec<_>>(),
        vec![1, 2]
    );
    // Nothing is differentiated below the frozen layer or through the casts.
    for n in p
        .graph
        .node_ids()
        .filter(|&n| p.graph.node(n).phase == Phase::Backward)
    {
        let name = &p.graph.node(n).name;
        assert!(
            !["grad(frozen)", "grad(to_int)", "grad(to_float)"].contains(&name.as_str()),
            "{name}"
        );
    }
    assert!(before > 0);
}

#[test]
fn graph_with_removed_nodes_is_renumbered() {
    let (mut g, _) = tiny_mlp();
    let x = ValueId {
        node: NodeId(0),
        slot: 0,
    };
    let dead = g
        .add1(Op::Unary { f: UnaryFn::Exp }, &[x], "dead", ModuleId::ROOT)
        .unwrap();
    // Remove an early node (the dead branch) to leave a hole, then differentiate.
    let early = g
        .add1(Op::Unary { f: UnaryFn::Neg }, &[x], "early", ModuleId::ROOT)
        .unwrap();
    g.remove_node(early.node);
    g.remove_node(dead.node);
    let loss = g.outputs[0];
    // Re-add a node, which fills a hole with a high-level id.
    let neg = g
        .add1(
            Op::Unary { f: UnaryFn::Neg },
            &[loss],
            "neg_loss",
            ModuleId::ROOT,
        )
        .unwrap();
    let p = build(g, neg);
    assert_eq!(
        p.graph.topo_order().unwrap(),
        p.graph.node_ids().collect::<Vec<_>>()
    );
    assert_eq!(p.grads.len(), 4);
    assert_contract(&p);
}

#[test]
fn bad_loss_is_an_error() {
    let (g, _) = tiny_mlp();
    let x = ValueId {
        node: NodeId(0),
        slot: 0,
    };
    let err = build_training_program(g, x, sgd()).unwrap_err();
    assert!(err.to_string().contains("floating-point scalar"), "{err}");
    let (g, _) = tiny_mlp();
    let missing = ValueId {
        node: NodeId(999),
        slot: 0,
    };
    assert!(build_training_program(g, missing, sgd()).is_err());
}

/// One case of the VJP sweep: an op, the types of its inputs (float inputs
/// become parameters), and extra int inputs given as literal data.
struct Case {
    op: Op,
    inputs: Vec<Src>,
}

enum Src {
    P(Vec<usize>),
    Int(Vec<usize>, Vec<f64>),
    Bool(Vec<usize>),
}

fn case(op: Op, inputs: Vec<Src>) -> Case {
    Case { op, inputs }
}

/// Differentiates `mean(op(params...))` and checks that the program validates
/// and every parameter gets a gradient of its type.
fn sweep(c: Case) {
    let name = c.op.name();
    let mut g = Graph::new(&name);
    let m = g.module("m", "M");
    let mut ins = Vec::new();
    let mut n_params = 0;
    for (i, s) in c.inputs.into_iter().enumerate() {
        ins.push(match s {
            Src::P(shape) => {
                n_params += 1;
                let init = Init::Uniform {
                    low: 0.5,
                    high: 1.5,
                };
                param(&mut g, &format!("p{i}"), &shape, init, m)
            }
            Src::Int(shape, vals) => {
                let ty = TensorType::new(DType::I64, shape);
                let value = TensorData::from_f64s(ty, &vals).unwrap();
                g.add1(Op::Constant { value }, &[], format!("c{i}"), m)
                    .unwrap()
            }
            Src::Bool(shape) => g.add_input(&format!("b{i}"), TensorType::new(DType::Bool, shape)),
        });
    }
    let y = g
        .add1(c.op, &ins, &name, m)
        .unwrap_or_else(|e| panic!("{e}"));
    let rank = g.value_type(y).shape.rank();
    let mean = Op::Reduce {
        f: ReduceFn::Mean,
        axes: (0..rank).collect(),
        keepdims: false,
    };
    let loss = g.add1(mean, &[y], "loss", ModuleId::ROOT).unwrap();
    let p = build_training_program(g, loss, sgd()).unwrap_or_else(|e| panic!("{name}: {e}"));
    p.validate().unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(p.grads.len(), n_params, "{name}");
    assert_contract(&p);
}

#[test]
fn every_differentiable_op_has_a_well_typed_vjp() {
    use Src::*;
    let bin = |f| Op::Binary { f };
    let mut cases = vec![
        case(bin(BinaryFn::Add), vec![P(vec![2, 3]), P(vec![3])]),
        case(bin(BinaryFn::Sub), vec![P(vec![2, 1]), P(vec![1, 3])]),
        case(bin(BinaryFn::Mul), vec![P(vec![2, 3]), P(vec![])]),
        case(bin(BinaryFn::Div), vec![P(vec![4, 2, 3]), P(vec![2, 1])]),
        case(bin(BinaryFn::Pow), vec![P(vec![2, 3]), P(vec![3])]),
        case(bin(BinaryFn::Max), vec![P(vec![2, 3]), P(vec![2, 3])]),
        case(bin(BinaryFn::Min), vec![P(vec![3]), P(vec![2, 3])]),
        case(Op::Where, vec![Bool(vec![2, 1]), P(vec![2, 3]), P(vec![3])]),
        case(Op::Cast { to: DType::Bf16 }, vec![P(vec![3])]),
        case(
            Op::MatMul {
                trans_a: false,
                trans_b: false,
            },
            vec![P(vec![2, 3, 4]), P(vec![4, 5])],
        ),
        case(
            Op::MatMul {
                trans_a: true,
                trans_b: true,
            },
            vec![P(vec![2, 4, 3]), P(vec![5, 4])],
        ),
        case(
            Op::MatMul {
                trans_a: true,
                trans_b: false,
            },
            vec![P(vec![4, 3]), P(vec![2, 4, 5])],
        ),
        case(
            Op::MatMul {
                trans_a: false,
                trans_b: true,
            },
            vec![P(vec![2, 1, 3, 4]), P(vec![3, 5, 4])],
        ),
        case(
            Op::LayerNorm { eps: 1e-5 },
            vec![P(vec![2, 4]), P(vec![4]), P(vec![4])],
        ),
        case(Op::LayerNorm { eps: 1e-5 }, vec![P(vec![2, 4]), P(vec![4])]),
        case(Op::RmsNorm { eps: 1e-6 }, vec![P(vec![2, 4]), P(vec![4])]),
        case(Op::Softmax { axis: 1 }, vec![P(vec![2, 4])]),
        case(Op::LogSoftmax { axis: 0 }, vec![P(vec![2, 4])]),
        case(
            Op::Attention {
                causal: true,
                scale: 0.5,
            },
            vec![
                P(vec![1, 2, 3, 4]),
                P(vec![1, 2, 3, 4]),
                P(vec![1, 2, 3, 4]),
            ],
        ),
        case(
            Op::Gather { axis: 1 },
            vec![P(vec![3, 5]), Int(vec![2], vec![4.0, 0.0])],
        ),
        case(
            Op::Dropout {
                p: 0.1,
                seed: 7,
                whole_sample: None,
            },
            vec![P(vec![2, 3])],
        ),
        case(Op::Reshape { shape: vec![3, 2] }, vec![P(vec![2, 3])]),
        case(
            Op::Transpose {
                perm: vec![1, 2, 0],
            },
            vec![P(vec![2, 3, 4])],
        ),
        case(
            Op::Slice {
                axis: 1,
                start: 1,
                end: 6,
                step: 2,
            },
            vec![P(vec![2, 6])],
        ),
        case(Op::Concat { axis: 0 }, vec![P(vec![1, 3]), P(vec![2, 3])]),
        case(
            Op::Expand {
                shape: vec![4, 2, 3],
            },
            vec![P(vec![2, 1])],
        ),
        case(
            Op::Pad {
                pads: vec![(1, 0), (0, 2)],
                value: 0.0,
            },
            vec![P(vec![2, 3])],
        ),
        case(Op::SumTo { shape: vec![3] }, vec![P(vec![2, 3])]),
        case(
            Op::CrossEntropy { ignore_index: None },
            vec![P(vec![2, 5]), Int(vec![2], vec![1.0, 3.0])],
        ),
    ];
    for f in [ReduceFn::Sum, ReduceFn::Mean, ReduceFn::Max] {
        cases.push(case(
            Op::Reduce {
                f,
                axes: vec![1],
                keepdims: false,
            },
            vec![P(vec![2, 3, 4])],
        ));
        cases.push(case(
            Op::Reduce {
                f,
                axes: vec![],
                keepdims: true,
            },
            vec![P(vec![2, 3])],
        ));
    }
    use UnaryFn::*;
    for f in [
        Neg, Exp, Log, Sqrt, Rsqrt, Reciprocal, Tanh, Relu, Sigmoid, Erf, Abs, GeluTanh, GeluErf,
        Silu, Square,
    ] {
        cases.push(case(Op::Unary { f }, vec![P(vec![2, 3])]));
    }
    for c in cases {
        sweep(c);
    }
}

#[test]
fn non_differentiable_ops_say_so() {
    let mut g = Graph::new("nd");
    let x = param(&mut g, "x", &[3], Init::Ones, ModuleId::ROOT);
    let y = param(&mut g, "y", &[3], Init::Ones, ModuleId::ROOT);
    let c = g
        .add1(
            Op::Compare { f: CompareFn::Less },
            &[x, y],
            "lt",
            ModuleId::ROOT,
        )
        .unwrap();
    let dy = g
        .add1(
            Op::Constant {
                value: TensorData::scalar(DType::F32, 1.0),
            },
            &[],
            "one",
            ModuleId::ROOT,
        )
        .unwrap();
    let err = fsdpc_ir::ops::vjp(&mut g, c.node, dy, &[true, true]).unwrap_err();
    assert!(err.to_string().contains("not differentiable"), "{err}");
}

/// Regression (found by `random_graphs_differentiate`): in `x + p1 + p2` both
/// parameters' natural gradient is the same value; each gets its own copy and
/// no grad is read by another node.
#[test]
fn params_sharing_a_natural_grad_get_unread_copies() {
    let mut g = Graph::new("shared");
    let x = g.add_input("x", f32t(&[1, 1]));
    let p1 = param(&mut g, "p1", &[1, 1], Init::Zeros, ModuleId::ROOT);
    let p2 = param(&mut g, "p2", &[1, 1], Init::Zeros, ModuleId::ROOT);
    let add = Op::Binary { f: BinaryFn::Add };
    let y = g.add1(add.clone(), &[x, p1], "a1", ModuleId::ROOT).unwrap();
    let y = g.add1(add, &[y, p2], "a2", ModuleId::ROOT).unwrap();
    let y = g
        .add1(Op::Unary { f: UnaryFn::Tanh }, &[y], "t", ModuleId::ROOT)
        .unwrap();
    let mean = Op::Reduce {
        f: ReduceFn::Mean,
        axes: vec![],
        keepdims: false,
    };
    let loss = g.add1(mean, &[y], "loss", ModuleId::ROOT).unwrap();
    let p = build(g, loss);
    assert_contract(&p);
    assert_ne!(p.grads[0].grad, p.grads[1].grad);
}
