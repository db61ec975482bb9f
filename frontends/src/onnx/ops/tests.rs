//! Unit tests of the op converters: each runs one ONNX node on inputs that are
//! graph values or constants and checks the IR it produced or the constant it
//! folded.

use super::registry;
use crate::onnx::context::{Importer, NodeCx, Val};
use crate::onnx::tensor::{HostData, HostTensor};
use fsdpc_ir::{DType, Graph, ModuleId, Op, TensorType};
use onnx_protobuf::attribute_proto::AttributeType;
use onnx_protobuf::{AttributeProto, NodeProto};
use std::collections::HashMap;

struct T {
    imp: Importer,
}

fn importer(opset: i64) -> Importer {
    Importer {
        g: Graph::new("t"),
        vals: HashMap::new(),
        opset,
        next_seed: 0,
        log_softmax_of: HashMap::new(),
        decode: Box::new(|_| Err("no tensors here".into())),
        bound: HashMap::new(),
        seqs: HashMap::new(),
        from_pytorch: false,
        forward_only: false,
    }
}

impl T {
    fn new(opset: i64) -> T {
        T {
            imp: importer(opset),
        }
    }

    fn input(&mut self, name: &str, dtype: DType, shape: &[usize]) -> &mut T {
        let v = self
            .imp
            .g
            .add_input(name, TensorType::new(dtype, shape.to_vec()));
        self.imp.vals.insert(name.into(), Val::Ir(v));
        self
    }

    fn konst(&mut self, name: &str, t: HostTensor) -> &mut T {
        self.imp.vals.insert(name.into(), Val::Const(t));
        self
    }

    fn run(
        &mut self,
        op: &str,
        ins: &[&str],
        outs: &[&str],
        attrs: Vec<AttributeProto>,
    ) -> Result<(), String> {
        let node = NodeProto {
            op_type: op.into(),
            name: format!("/m/{op}"),
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: outs.iter().map(|s| s.to_string()).collect(),
            attribute: attrs,
            ..NodeProto::default()
        };
        let table = registry();
        let convert = table.get(op).ok_or(format!("{op} is not in the table"))?;
        let mut cx = NodeCx {
            imp: &mut self.imp,
            node: &node,
            module: ModuleId::ROOT,
        };
        convert(&mut cx)
    }

    fn ok(&mut self, op: &str, ins: &[&str], outs: &[&str], attrs: Vec<AttributeProto>) -> &mut T {
        if let Err(e) = self.run(op, ins, outs, attrs) {
            panic!("{op}: {e}");
        }
        self
    }

    /// The folded constant `name`.
    fn c(&self, name: &str) -> HostTensor {
        match self.imp.vals.get(name) {
            Some(Val::Const(t)) => t.clone(),
            other => panic!("{name} is not a constant: {other:?}"),
        }
    }

    /// `op name` and type of graph value `name`.
    fn ir(&self, name: &str) -> String {
        match self.imp.vals.get(name) {
            Some(Val::Ir(v)) => {
                let n = self.imp.g.node(v.node);
                format!("{} {}", n.op.name(), n.outputs[v.slot as usize])
            }
            other => panic!("{name} is not a graph value: {other:?}"),
        }
    }

    fn op(&self, name: &str) -> Op {
        match self.imp.vals.get(name) {
            Some(Val::Ir(v)) => self.imp.g.node(v.node).op.clone(),
            other => panic!("{name} is not a graph value: {other:?}"),
        }
    }
}

fn ints(v: &[i64]) -> HostTensor {
    HostTensor::vec_i64(v.to_vec())
}

fn scalar_i(v: i64) -> HostTensor {
    HostTensor::ints(DType::I64, vec![], vec![v])
}

fn scalar_f(v: f64) -> HostTensor {
    HostTensor::floats(DType::F32, vec![], vec![v])
}

fn a_i(name: &str, v: i64) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        i: v,
        type_: AttributeType::INT.into(),
        ..AttributeProto::default()
    }
}

fn a_ints(name: &str, v: &[i64]) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        ints: v.to_vec(),
        type_: AttributeType::INTS.into(),
        ..AttributeProto::default()
    }
}

fn a_f(name: &str, v: f32) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        f: v,
        type_: AttributeType::FLOAT.into(),
        ..AttributeProto::default()
    }
}

fn a_s(name: &str, v: &str) -> AttributeProto {
    AttributeProto {
        name: name.into(),
        s: v.as_bytes().to_vec(),
        type_: AttributeType::STRING.into(),
        ..AttributeProto::default()
    }
}

#[test]
fn shape_gather_concat_reshape_folds() {
    let mut t = T::new(17);
    t.input("x", DType::F32, &[2, 3, 8])
        .konst("zero", scalar_i(0))
        .konst("axes0", ints(&[0]))
        .konst("heads", ints(&[2, 4]))
        .ok("Shape", &["x"], &["s"], vec![])
        .ok("Gather", &["s", "zero"], &["b"], vec![a_i("axis", 0)])
        .ok("Unsqueeze", &["b", "axes0"], &["b1"], vec![])
        .ok(
            "Shape",
            &["x"],
            &["s2"],
            vec![a_i("start", 1), a_i("end", 2)],
        )
        .ok(
            "Concat",
            &["b1", "s2", "heads"],
            &["shape"],
            vec![a_i("axis", 0)],
        )
        .ok("Reshape", &["x", "shape"], &["y"], vec![]);
    assert_eq!(t.c("shape").as_i64(), vec![2, 3, 2, 4]);
    assert_eq!(t.ir("y"), "reshape f32[2, 3, 2, 4]");
}

#[test]
fn reshape_with_zero_and_minus_one() {
    let mut t = T::new(17);
    t.input("x", DType::F32, &[2, 3, 8])
        .konst("s", ints(&[0, -1]))
        .ok("Reshape", &["x", "s"], &["y"], vec![]);
    assert_eq!(t.ir("y"), "reshape f32[2, 24]");
    t.konst("bad", ints(&[5, -1]));
    assert!(t.run("Reshape", &["x", "bad"], &["z"], vec![]).is_err());
}

#[test]
fn run_time_shapes_are_refused_with_a_reason() {
    let mut t = T::new(17);
    t.input("x", DType::F32, &[2, 3])
        .input("s", DType::I64, &[2]);
    let e = t
        .run("Reshape", &["x", "s"], &["y"], vec![])
        .err()
        .unwrap_or_default();
    assert!(
        e.contains("must be known when the model is compiled"),
        "{e}"
    );
}

#[test]
fn slice_clamps_counts_from_the_end_and_steps() {
    let mut t = T::new(17);
    t.konst("v", ints(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]))
        .konst("st", ints(&[-8]))
        .konst("en", ints(&[i64::MAX]))
        .konst("ax", ints(&[-1]))
        .konst("step", ints(&[3]))
        .ok("Slice", &["v", "st", "en", "ax", "step"], &["y"], vec![]);
    assert_eq!(t.c("y").as_i64(), vec![2, 5, 8]);
    t.input("x", DType::F32, &[4, 6])
        .konst("s1", ints(&[1]))
        .konst("e1", ints(&[-1]))
        .konst("a1", ints(&[1]));
    t.ok("Slice", &["x", "s1", "e1", "a1"], &["z"], vec![]);
    assert_eq!(t.ir("z"), "slice f32[4, 4]");
    // A negative step gathers the indices it visits: 4, 3, 2, 1.
    t.konst("neg", ints(&[-1]))
        .konst("e2", ints(&[0]))
        .konst("s2", ints(&[-2]));
    t.ok("Slice", &["x", "s2", "e2", "a1", "neg"], &["w"], vec![]);
    assert_eq!(t.ir("w"), "gather f32[4, 4]");
}

#[test]
fn split_by_sizes_and_by_count() {
    let mut t = T::new(18);
    t.input("x", DType::F32, &[2, 8]).ok(
        "Split",
        &["x"],
        &["a", "b", "c"],
        vec![a_i("axis", 1), a_i("num_outputs", 3)],
    );
    assert_eq!(
        [t.ir("a"), t.ir("b"), t.ir("c")],
        ["slice f32[2, 3]", "slice f32[2, 3]", "slice f32[2, 2]"].map(String::from)
    );
    t.konst("sizes", ints(&[5, 3])).ok(
        "Split",
        &["x", "sizes"],
        &["d", "e"],
        vec![a_i("axis", -1)],
    );
    assert_eq!(t.ir("e"), "slice f32[2, 3]");
}

#[test]
fn squeeze_unsqueeze_expand() {
    let mut t = T::new(17);
    t.input("x", DType::F32, &[1, 3, 1])
        .ok("Squeeze", &["x"], &["a"], vec![])
        .konst("ax", ints(&[0, -1]))
        .ok("Unsqueeze", &["a", "ax"], &["b"], vec![])
        .konst("shape", ints(&[2, 1, 4]))
        .konst(
            "col",
            HostTensor::ints(DType::I64, vec![3, 1], vec![1, 2, 3]),
        )
        .ok("Expand", &["b", "shape"], &["c"], vec![])
        .ok("Expand", &["col", "shape"], &["d"], vec![]);
    assert_eq!(t.ir("a"), "reshape f32[3]");
    assert_eq!(t.ir("b"), "reshape f32[1, 3, 1]");
    assert_eq!(t.ir("c"), "expand f32[2, 3, 4]");
    assert_eq!(t.c("d").shape, vec![2, 3, 4]);
    assert_eq!(t.c("d").as_i64()[..8], [1, 1, 1, 1, 2, 2, 2, 2]);
}

#[test]
fn range_trilu_equal_where_fold_a_causal_mask() {
    let mut t = T::new(17);
    t.konst("n", ints(&[3, 3]))
        .ok("ConstantOfShape", &["n"], &["ones"], vec![])
        .konst("one", scalar_f(1.0))
        .ok("Add", &["ones", "one"], &["ones1"], vec![])
        .ok("Trilu", &["ones1"], &["tril"], vec![a_i("upper", 0)])
        .konst("zero", scalar_f(0.0))
        .ok("Equal", &["tril", "zero"], &["masked"], vec![])
        .konst("ninf", scalar_f(f64::NEG_INFINITY))
        .input("s", DType::F32, &[2, 3, 3])
        .ok("Where", &["masked", "ninf", "s"], &["y"], vec![]);
    assert_eq!(t.c("masked").as_i64(), vec![0, 1, 1, 0, 0, 1, 0, 0, 0]);
    assert_eq!(t.ir("y"), "where f32[2, 3, 3]");
    t.konst("a", scalar_i(1))
        .konst("b", scalar_i(8))
        .konst("d", scalar_i(3));
    t.ok("Range", &["a", "b", "d"], &["r"], vec![]);
    assert_eq!(t.c("r").as_i64(), vec![1, 4, 7]);
}

#[test]
fn trilu_of_a_run_time_tensor_is_a_where() {
    let mut t = T::new(17);
    t.input("x", DType::F32, &[2, 4, 4])
        .ok("Trilu", &["x"], &["y"], vec![]);
    assert_eq!(t.ir("y"), "where f32[2, 4, 4]");
}

#[test]
fn gemm_with_alpha_beta_and_transposes() {
    let mut t = T::new(13);
    t.input("a", DType::F32, &[3, 5])
        .input("b", DType::F32, &[4, 5])
        .input("c", DType::F32, &[4]);
    t.ok(
        "Gemm",
        &["a", "b", "c"],
        &["y"],
        vec![a_i("transB", 1), a_f("alpha", 2.0), a_f("beta", 0.5)],
    );
    assert_eq!(t.ir("y"), "binary.add f32[3, 4]");
}

#[test]
fn reduce_axes_as_attribute_then_input() {
    let mut t = T::new(17);
    t.input("x", DType::F32, &[2, 3, 4]).ok(
        "ReduceMean",
        &["x"],
        &["m"],
        vec![a_ints("axes", &[-1]), a_i("keepdims", 0)],
    );
    assert_eq!(t.ir("m"), "reduce.mean f32[2, 3]");
    let mut t = T::new(18);
    t.input("x", DType::F32, &[2, 3, 4])
        .konst("ax", ints(&[1]))
        .ok("ReduceMax", &["x", "ax"], &["m"], vec![]);
    assert_eq!(t.ir("m"), "reduce.max f32[2, 1, 4]");
    t.ok("ReduceSum", &["x"], &["s"], vec![a_i("keepdims", 0)]);
    assert_eq!(t.ir("s"), "reduce.sum f32[]");
}

#[test]
fn dropout_only_in_training_mode() {
    let mut t = T::new(17);
    t.input("x", DType::F32, &[2, 3])
        .ok("Dropout", &["x"], &["y"], vec![]);
    assert_eq!(t.ir("y"), "input f32[2, 3]");
    let on = HostTensor::ints(DType::Bool, vec![], vec![1]);
    t.konst("p", scalar_f(0.1))
        .konst("on", on)
        .ok("Dropout", &["x", "p", "on"], &["z"], vec![]);
    assert!(matches!(t.op("z"), Op::Dropout { p, seed: 0, .. } if (p - 0.1).abs() < 1e-9));
}

#[test]
fn split_sizes_that_overflow_or_are_negative_are_errors() {
    let mut t = T::new(18);
    t.input("x", DType::F32, &[2, 8]);
    // 3 · (2^63 - 1) wraps in a release build's sum; it must not add up to 8.
    let huge = ints(&[i64::MAX, i64::MAX, i64::MAX, 11]);
    let e = t
        .konst("huge", huge)
        .run("Split", &["x", "huge"], &["a", "b", "c", "d"], vec![]);
    assert_eq!(
        e.unwrap_err(),
        format!(
            "split sizes {:?} do not add up to 2",
            [i64::MAX as usize; 3]
                .iter()
                .chain(&[11])
                .collect::<Vec<_>>()
        )
    );
    let e = t.konst("neg", ints(&[10, -2])).run(
        "Split",
        &["x", "neg"],
        &["a", "b"],
        vec![a_i("axis", 1)],
    );
    assert_eq!(e.unwrap_err(), "split sizes [10, -2] must not be negative");
    let e = t.run(
        "Split",
        &["x"],
        &["a", "b"],
        vec![a_i("num_outputs", i64::MAX)],
    );
    assert_eq!(
        e.unwrap_err(),
        format!(
            "num_outputs {} does not match the node's 2 outputs",
            i64::MAX
        )
    );
}

#[test]
fn concat_of_constants_whose_axis_overflows_is_an_error() {
    let empty = |n| HostTensor::ints(DType::I64, vec![0, n], vec![]);
    let mut t = T::new(17);
    t.konst("a", empty(1 << 63)).konst("b", empty(1 << 63));
    let e = t.run("Concat", &["a", "b"], &["c"], vec![a_i("axis", 1)]);
    assert!(e.unwrap_err().contains("overflows"));
}

#[test]
fn a_cross_entropy_without_classes_is_an_error() {
    for op in ["SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"] {
        let mut t = T::new(17);
        t.input("x", DType::F32, &[4, 0, 3])
            .input("y", DType::I64, &[4, 3]);
        let e = t.run(op, &["x", "y"], &["loss"], vec![a_i("ignore_index", -100)]);
        assert_eq!(
            e.unwrap_err(),
            "the scores f32[4, 0, 3] have no classes (axis 1 has length 0)",
            "{op}"
        );
    }
}

#[test]
fn training_dropout_mask_is_the_same_dropout_of_ones() {
    let mut t = T::new(17);
    let on = HostTensor::ints(DType::Bool, vec![], vec![1]);
    t.input("x", DType::F32, &[2, 3])
        .konst("p", scalar_f(0.25))
        .konst("on", on)
        .ok("Dropout", &["x", "p", "on"], &["y", "mask"], vec![]);
    assert!(matches!(t.op("y"), Op::Dropout { seed: 0, .. }));
    assert_eq!(t.ir("mask"), "compare.greater bool[2, 3]");
    // mask = Dropout(expand(1)) > 0, with the output's seed and ratio.
    let Some(Val::Ir(m)) = t.imp.vals.get("mask") else {
        panic!("mask is not a graph value")
    };
    let g = &t.imp.g;
    let kept = g.inputs(m.node)[0];
    assert_eq!(g.node(kept.node).op, t.op("y"));
    let ones = g.inputs(kept.node)[0];
    assert_eq!(g.node(ones.node).op, Op::Expand { shape: vec![2, 3] });
    // A second site draws another seed; its unread mask adds nothing.
    let before = t.imp.g.node_count();
    t.ok("Dropout", &["x", "p", "on"], &["y2", ""], vec![]);
    assert!(matches!(t.op("y2"), Op::Dropout { seed: 1, .. }));
    assert_eq!(t.imp.g.node_count(), before + 1);
}

#[test]
fn nll_after_log_softmax_is_a_cross_entropy() {
    let mut t = T::new(17);
    t.input("logits", DType::F32, &[6, 10])
        .input("y", DType::I64, &[6]);
    t.ok("LogSoftmax", &["logits"], &["lp"], vec![a_i("axis", 1)]);
    t.ok(
        "NegativeLogLikelihoodLoss",
        &["lp", "y"],
        &["loss"],
        vec![a_i("ignore_index", -1)],
    );
    assert_eq!(
        t.op("loss"),
        Op::CrossEntropy {
            ignore_index: Some(-1)
        }
    );
    assert_eq!(t.ir("loss"), "cross_entropy f32[]");
    // On other log-probabilities, the general form (a mean of picked entries).
    t.input("q", DType::F32, &[6, 10]);
    t.ok("NegativeLogLikelihoodLoss", &["q", "y"], &["l2"], vec![]);
    assert_eq!(t.ir("l2"), "reduce.mean f32[]");
}

#[test]
fn softmax_cross_entropy_moves_classes_last() {
    let mut t = T::new(13);
    t.input("scores", DType::F32, &[2, 10, 5])
        .input("y", DType::I64, &[2, 5]);
    t.ok(
        "SoftmaxCrossEntropyLoss",
        &["scores", "y"],
        &["loss"],
        vec![],
    );
    assert_eq!(t.ir("loss"), "cross_entropy f32[]");
    t.ok(
        "SoftmaxCrossEntropyLoss",
        &["scores", "y"],
        &["l"],
        vec![a_s("reduction", "sum")],
    );
    assert_eq!(t.ir("l"), "reduce.sum f32[]");
    let e = t.run(
        "SoftmaxCrossEntropyLoss",
        &["scores", "y"],
        &["l3"],
        vec![a_s("reduction", "max")],
    );
    assert!(e.is_err_and(|e| e.contains("expected none, sum or mean")));
}

#[test]
fn constants_take_the_other_operands_dtype() {
    let mut t = T::new(17);
    t.input("x", DType::Bf16, &[4])
        .konst("half", scalar_f(0.5))
        .ok("Mul", &["x", "half"], &["y"], vec![]);
    assert_eq!(t.ir("y"), "binary.mul bf16[4]");
    t.konst("lo", scalar_f(-1.0))
        .ok("Clip", &["x", "lo"], &["c"], vec![]);
    assert_eq!(t.ir("c"), "binary.max bf16[4]");
}

#[test]
fn gather_with_negative_constant_indices() {
    let mut t = T::new(17);
    t.konst("v", ints(&[10, 20, 30]))
        .konst("i", ints(&[-1, 0]))
        .ok("Gather", &["v", "i"], &["y"], vec![]);
    assert_eq!(t.c("y").as_i64(), vec![30, 10]);
    t.konst("oob", ints(&[3]));
    assert!(t.run("Gather", &["v", "oob"], &["z"], vec![]).is_err());
    t.input("emb", DType::F32, &[16, 8])
        .input("ids", DType::I64, &[2, 4]);
    t.ok("Gather", &["emb", "ids"], &["e"], vec![]);
    assert_eq!(t.ir("e"), "gather f32[2, 4, 8]");
}

#[test]
fn cast_pad_concat_flatten_transpose() {
    let mut t = T::new(17);
    t.konst(
        "v",
        HostTensor::floats(DType::F32, vec![2], vec![1.7, -2.2]),
    );
    t.ok("Cast", &["v"], &["i"], vec![a_i("to", 7)]);
    assert_eq!(t.c("i").data, HostData::I(vec![1, -2]));
    t.input("x", DType::F32, &[2, 3])
        .konst("p", ints(&[0, 1, 0, 2]))
        .ok("Pad", &["x", "p"], &["y"], vec![]);
    assert_eq!(
        t.op("y"),
        Op::Pad {
            pads: vec![(0, 0), (1, 2)],
            value: 0.0
        }
    );
    t.konst(
        "row",
        HostTensor::floats(DType::F32, vec![1, 3], vec![0.0; 3]),
    );
    t.ok("Concat", &["x", "row"], &["z"], vec![a_i("axis", 0)]);
    assert_eq!(t.ir("z"), "concat f32[3, 3]");
    t.input("w", DType::F32, &[2, 3, 4])
        .ok("Flatten", &["w"], &["f"], vec![]);
    assert_eq!(t.ir("f"), "reshape f32[2, 12]");
    t.ok("Transpose", &["w"], &["tw"], vec![]);
    assert_eq!(t.ir("tw"), "transpose f32[4, 3, 2]");
    let m = HostTensor::ints(DType::I64, vec![2, 3], vec![1, 2, 3, 4, 5, 6]);
    t.konst("m", m).ok("Transpose", &["m"], &["mt"], vec![]);
    assert_eq!(t.c("mt").as_i64(), vec![1, 4, 2, 5, 3, 6]);
}

#[test]
fn layer_norm_flattens_the_normalised_axes() {
    let mut t = T::new(17);
    t.input("x", DType::F32, &[2, 3, 4])
        .input("g", DType::F32, &[4])
        .input("b", DType::F32, &[4]);
    t.ok(
        "LayerNormalization",
        &["x", "g", "b"],
        &["y"],
        vec![a_f("epsilon", 1e-6)],
    );
    assert!(matches!(t.op("y"), Op::LayerNorm { eps } if (eps - 1e-6).abs() < 1e-9));
    t.input("g2", DType::F32, &[3, 4])
        .input("b2", DType::F32, &[3, 4]);
    t.ok(
        "LayerNormalization",
        &["x", "g2", "b2"],
        &["z"],
        vec![a_i("axis", 1)],
    );
    assert_eq!(t.ir("z"), "reshape f32[2, 3, 4]");
}

#[test]
fn matmul_with_vector_operands() {
    let mut t = T::new(17);
    t.input("m", DType::F32, &[2, 3, 4])
        .input("v", DType::F32, &[4])
        .input("u", DType::F32, &[3]);
    t.ok("MatMul", &["m", "v"], &["mv"], vec![]);
    assert_eq!(t.ir("mv"), "reshape f32[2, 3]");
    t.ok("MatMul", &["u", "m"], &["um"], vec![]);
    assert_eq!(t.ir("um"), "reshape f32[2, 4]");
    t.input("w", DType::F32, &[4])
        .ok("MatMul", &["v", "w"], &["dot"], vec![]);
    assert_eq!(t.ir("dot"), "reshape f32[]");
}

#[test]
fn cast_like_takes_the_second_inputs_element_type() {
    let mut t = T::new(18);
    t.konst(
        "v",
        HostTensor::floats(DType::F32, vec![2], vec![1.7, -2.2]),
    )
    .input("n", DType::I64, &[])
    .ok("CastLike", &["v", "n"], &["i"], vec![]);
    assert_eq!(t.c("i").data, HostData::I(vec![1, -2]));
    t.input("x", DType::F32, &[2, 3])
        .input("h", DType::F16, &[4])
        .ok("CastLike", &["x", "h"], &["y"], vec![]);
    assert_eq!(t.ir("y"), "cast f16[2, 3]");
    // Already of that type: no node.
    t.ok("CastLike", &["x", "x"], &["z"], vec![]);
    assert_eq!(t.ir("z"), "input f32[2, 3]");
}

#[test]
fn split_to_sequence_then_sequence_at_are_slices() {
    let mut t = T::new(18);
    t.input("x", DType::F32, &[2, 6, 4])
        .konst("four", scalar_i(4))
        .ok(
            "SplitToSequence",
            &["x", "four"],
            &["s"],
            vec![a_i("axis", 1)],
        )
        .konst("p1", scalar_i(1))
        .konst("pm2", scalar_i(-2))
        .ok("SequenceAt", &["s", "p1"], &["b"], vec![])
        .ok("SequenceAt", &["s", "pm2"], &["a"], vec![])
        .ok("SequenceLength", &["s"], &["n"], vec![]);
    // Chunks of 4 along axis 1 of length 6: 0..4 and a shorter 4..6.
    assert_eq!(t.ir("a"), "slice f32[2, 4, 4]");
    assert_eq!(t.ir("b"), "slice f32[2, 2, 4]");
    assert_eq!(
        t.op("b"),
        Op::Slice {
            axis: 1,
            start: 4,
            end: 6,
            step: 1
        }
    );
    assert_eq!(t.c("n").as_i64(), vec![2]);
    t.konst("p2", scalar_i(2));
    let e = t
        .run("SequenceAt", &["s", "p2"], &["c"], vec![])
        .err()
        .unwrap_or_default();
    assert!(e.contains("outside the 2 elements"), "{e}");
}

#[test]
fn split_to_sequence_by_sizes_and_into_squeezed_rows() {
    let mut t = T::new(18);
    t.input("x", DType::F32, &[3, 5])
        .konst("sizes", ints(&[2, 3]))
        .ok(
            "SplitToSequence",
            &["x", "sizes"],
            &["s"],
            vec![a_i("axis", -1)],
        )
        .konst("last", scalar_i(-1))
        .ok("SequenceAt", &["s", "last"], &["y"], vec![]);
    assert_eq!(t.ir("y"), "slice f32[3, 3]");
    // Without `split`, parts of length 1; keepdims 0 drops the axis. A
    // constant source folds.
    let m = HostTensor::ints(DType::I64, vec![2, 3], vec![1, 2, 3, 4, 5, 6]);
    t.konst("m", m)
        .ok(
            "SplitToSequence",
            &["m"],
            &["rows"],
            vec![a_i("axis", 1), a_i("keepdims", 0)],
        )
        .ok("SequenceAt", &["rows", "last"], &["col"], vec![]);
    assert_eq!(t.c("col").shape, vec![2]);
    assert_eq!(t.c("col").as_i64(), vec![3, 6]);
    t.konst("bad", ints(&[2, 2]));
    let e = t
        .run(
            "SplitToSequence",
            &["x", "bad"],
            &["s2"],
            vec![a_i("axis", 1)],
        )
        .err()
        .unwrap_or_default();
    assert!(e.contains("add up to 4, not 5"), "{e}");
}

#[test]
fn a_sequence_read_other_than_at_a_constant_position_is_an_error() {
    let mut t = T::new(18);
    t.input("x", DType::F32, &[2, 4])
        .input("pos", DType::I64, &[])
        .ok("SplitToSequence", &["x"], &["s"], vec![]);
    let e = t
        .run("SequenceAt", &["s", "pos"], &["y"], vec![])
        .err()
        .unwrap_or_default();
    assert!(
        e.contains("must be known when the model is compiled"),
        "{e}"
    );
    let e = t
        .run("Relu", &["s"], &["r"], vec![])
        .err()
        .unwrap_or_default();
    assert!(
        e.contains("`s` is a tensor sequence (made by node `/m/SplitToSequence`)"),
        "{e}"
    );
    let e = t
        .run("SequenceAt", &["x", "pos"], &["z"], vec![])
        .err()
        .unwrap_or_default();
    assert!(e.contains("is a tensor, not a sequence"), "{e}");
}

mod conv;
