//! A small GPT (embedding, one pre-LN block with causal attention, tied
//! output head) differentiates into a valid program whose backward nodes land
//! in the forward nodes' modules.

use crate::common::{linear, param};
use fsdpc_ir::{
    build_training_program, DType, Graph, Init, ModuleId, Op, Optimizer, Phase, TensorData,
    TensorType, UnaryFn, ValueId,
};

const B: usize = 2;
const S: usize = 8;
const C: usize = 16;
const H: usize = 2;
const V: usize = 32;

fn op(g: &mut Graph, op: Op, ins: &[ValueId], m: ModuleId) -> ValueId {
    let name = g.module_info(m).path.clone();
    g.add1(op, ins, name, m).unwrap_or_else(|e| panic!("{e}"))
}

fn layer_norm(g: &mut Graph, x: ValueId, path: &str) -> ValueId {
    let m = g.module(path, "LayerNorm");
    let w = param(g, &format!("{path}.weight"), &[C], Init::Ones, m);
    let b = param(g, &format!("{path}.bias"), &[C], Init::Zeros, m);
    op(g, Op::LayerNorm { eps: 1e-5 }, &[x, w, b], m)
}

/// `[B, S, C]` -> `[B, H, S, C/H]`.
fn heads(g: &mut Graph, x: ValueId, m: ModuleId) -> ValueId {
    let x = op(
        g,
        Op::Reshape {
            shape: vec![B, S, H, C / H],
        },
        &[x],
        m,
    );
    op(
        g,
        Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        &[x],
        m,
    )
}

fn attention(g: &mut Graph, x: ValueId) -> ValueId {
    let m = g.module("h.0.attn", "Attention");
    let qkv = linear(g, x, "h.0.attn.qkv", C, 3 * C);
    let part = |g: &mut Graph, i: usize| {
        let s = op(
            g,
            Op::Slice {
                axis: 2,
                start: i * C,
                end: (i + 1) * C,
                step: 1,
            },
            &[qkv],
            m,
        );
        heads(g, s, m)
    };
    let (q, k, v) = (part(g, 0), part(g, 1), part(g, 2));
    let scale = 1.0 / ((C / H) as f64).sqrt();
    let y = op(
        g,
        Op::Attention {
            causal: true,
            scale,
        },
        &[q, k, v],
        m,
    );
    let y = op(
        g,
        Op::Transpose {
            perm: vec![0, 2, 1, 3],
        },
        &[y],
        m,
    );
    let y = op(
        g,
        Op::Reshape {
            shape: vec![B, S, C],
        },
        &[y],
        m,
    );
    let y = linear(g, y, "h.0.attn.proj", C, C);
    op(
        g,
        Op::Dropout {
            p: 0.1,
            seed: 1,
            whole_sample: None,
        },
        &[y],
        m,
    )
}

fn mlp(g: &mut Graph, x: ValueId) -> ValueId {
    let m = g.module("h.0.mlp", "MLP");
    let h = linear(g, x, "h.0.mlp.fc", C, 4 * C);
    let h = op(
        g,
        Op::Unary {
            f: UnaryFn::GeluTanh,
        },
        &[h],
        m,
    );
    linear(g, h, "h.0.mlp.proj", 4 * C, C)
}

fn gpt() -> (Graph, ValueId) {
    let mut g = Graph::new("gpt-tiny");
    let ids = g.add_input("ids", TensorType::new(DType::I64, vec![B, S]));
    let labels = g.add_input("labels", TensorType::new(DType::I64, vec![B * S]));
    let wte_m = g.module("wte", "Embedding");
    let wte = param(
        &mut g,
        "wte.weight",
        &[V, C],
        Init::Normal { std: 0.02 },
        wte_m,
    );
    let tok = op(&mut g, Op::Gather { axis: 0 }, &[wte, ids], wte_m);
    let wpe_m = g.module("wpe", "Embedding");
    let wpe = param(
        &mut g,
        "wpe.weight",
        &[S, C],
        Init::Normal { std: 0.01 },
        wpe_m,
    );
    let pos_ty = TensorType::new(DType::I64, vec![S]);
    let pos: Vec<f64> = (0..S).map(|i| i as f64).collect();
    let value = TensorData::from_f64s(pos_ty, &pos).unwrap();
    let pos = op(&mut g, Op::Constant { value }, &[], wpe_m);
    let pos = op(&mut g, Op::Gather { axis: 0 }, &[wpe, pos], wpe_m);
    let x = op(
        &mut g,
        Op::Binary {
            f: fsdpc_ir::BinaryFn::Add,
        },
        &[tok, pos],
        ModuleId::ROOT,
    );
    g.module("h.0", "GPTBlock");
    let a = layer_norm(&mut g, x, "h.0.ln_1");
    let a = attention(&mut g, a);
    let x = op(
        &mut g,
        Op::Binary {
            f: fsdpc_ir::BinaryFn::Add,
        },
        &[x, a],
        ModuleId::ROOT,
    );
    let m = layer_norm(&mut g, x, "h.0.ln_2");
    let m = mlp(&mut g, m);
    let x = op(
        &mut g,
        Op::Binary {
            f: fsdpc_ir::BinaryFn::Add,
        },
        &[x, m],
        ModuleId::ROOT,
    );
    let x = layer_norm(&mut g, x, "ln_f");
    let head = g.module("lm_head", "Linear");
    let logits = op(
        &mut g,
        Op::MatMul {
            trans_a: false,
            trans_b: true,
        },
        &[x, wte],
        head,
    );
    let logits = op(
        &mut g,
        Op::Reshape {
            shape: vec![B * S, V],
        },
        &[logits],
        head,
    );
    let ce = Op::CrossEntropy {
        ignore_index: Some(-100),
    };
    let loss = g
        .add1(ce, &[logits, labels], "loss", ModuleId::ROOT)
        .unwrap();
    (g, loss)
}

#[test]
fn gpt_block_program_is_valid() {
    let (g, loss) = gpt();
    let n_params = g.params.len();
    let forward = g.node_count();
    let p = build_training_program(g, loss, Optimizer::adamw(3e-4)).unwrap();
    p.validate().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.grads.len(), n_params);
    let kinds: Vec<(String, String)> = p
        .graph
        .node_ids()
        .skip(forward)
        .map(|n| {
            let node = p.graph.node(n);
            assert_eq!(node.phase, Phase::Backward);
            (
                node.op.name(),
                p.graph.module_info(node.module).path.clone(),
            )
        })
        .collect();
    let has = |op: &str, module: &str| kinds.iter().any(|(o, m)| o == op && m == module);
    assert!(has("attention_grad", "h.0.attn"), "{kinds:?}");
    assert!(has("layer_norm_grad", "h.0.ln_1"));
    assert!(has("dropout", "h.0.attn"));
    assert!(has("slice_grad", "h.0.attn"));
    assert!(has("gather_grad", "wte"));
    assert!(has("gather_grad", "wpe"));
    assert!(has("cross_entropy_grad", ""));
    // The tied embedding: one grad, the sum of the lookup's and the head's.
    let wte = p.grads[0].grad;
    assert_eq!(p.graph.node(wte.node).op.name(), "binary.add");
}
