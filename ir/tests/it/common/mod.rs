//! Small graphs shared by the integration tests.
#![allow(dead_code)]

use fsdpc_ir::{
    BinaryFn, DType, Graph, Init, ModuleId, Op, ParamSpec, TensorType, UnaryFn, ValueId,
};

pub fn f32t(shape: &[usize]) -> TensorType {
    TensorType::new(DType::F32, shape.to_vec())
}

pub fn param(g: &mut Graph, name: &str, shape: &[usize], init: Init, m: ModuleId) -> ValueId {
    let spec = ParamSpec {
        name: name.to_string(),
        ty: f32t(shape),
        init,
        requires_grad: true,
        tied_to: None,
        tp: None,
    };
    g.add_param(spec, m)
}

/// `x @ w + b` in a `Linear` module at `path`.
pub fn linear(g: &mut Graph, x: ValueId, path: &str, fan_in: usize, fan_out: usize) -> ValueId {
    let m = g.module(path, "Linear");
    let w = param(
        g,
        &format!("{path}.weight"),
        &[fan_in, fan_out],
        Init::Normal { std: 0.02 },
        m,
    );
    let b = param(g, &format!("{path}.bias"), &[fan_out], Init::Zeros, m);
    let mm = Op::MatMul {
        trans_a: false,
        trans_b: false,
    };
    let y = g.add1(mm, &[x, w], path, m).unwrap();
    g.add1(
        Op::Binary { f: BinaryFn::Add },
        &[y, b],
        format!("{path}.bias_add"),
        m,
    )
    .unwrap()
}

/// A two-layer MLP on `x[4, 3]` with a cross-entropy loss over 2 classes;
/// returns the graph and its loss.
pub fn tiny_mlp() -> (Graph, ValueId) {
    let mut g = Graph::new("tiny_mlp");
    let x = g.add_input("x", f32t(&[4, 3]));
    let labels = g.add_input("labels", TensorType::new(DType::I64, vec![4]));
    let h = linear(&mut g, x, "fc1", 3, 5);
    let act = g.module("act", "GELU");
    let h = g
        .add1(
            Op::Unary {
                f: UnaryFn::GeluTanh,
            },
            &[h],
            "act",
            act,
        )
        .unwrap();
    let logits = linear(&mut g, h, "fc2", 5, 2);
    let ce = Op::CrossEntropy { ignore_index: None };
    let loss = g
        .add1(ce, &[logits, labels], "loss", ModuleId::ROOT)
        .unwrap();
    g.outputs = vec![loss];
    (g, loss)
}
