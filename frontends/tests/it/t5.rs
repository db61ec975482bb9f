//! The T5 family of the zoo: presets have the parameter counts of the
//! published Hugging Face models (checked against a closed form written out
//! here, independent of `T5Config::param_count`), the graphs validate and
//! differentiate, blocks and parameters carry Hugging Face's names, the
//! relative-position buckets match T5's definition, and bad specs are
//! refused with a reason.

use fsdpc_frontends::zoo::{self, t5::bucket, ZooConfig};
use fsdpc_frontends::FrontendError;
use fsdpc_ir::{Graph, Op, Optimizer};

/// T5's parameter count written out: shared embedding, per encoder block
/// q/k/v/o + feed-forward + 2 norms, per decoder block two attentions +
/// feed-forward + 3 norms, a bias table and a final norm per stack, and an
/// untied head.
#[allow(clippy::too_many_arguments)]
fn formula(
    layers: u64,
    d: u64,
    ff: u64,
    heads: u64,
    kv: u64,
    gated: bool,
    tie: bool,
    vocab: u64,
) -> u64 {
    let attn = 4 * d * heads * kv;
    let ffn = if gated { 3 } else { 2 } * d * ff;
    let enc = layers * (attn + ffn + 2 * d) + 32 * heads + d;
    let dec = layers * (2 * attn + ffn + 3 * d) + 32 * heads + d;
    let emb = vocab * d * if tie { 1 } else { 2 };
    emb + enc + dec
}

fn check(spec: &str, published: u64, by_formula: u64) {
    assert_eq!(by_formula, published, "{spec}: the formula");
    let m = zoo::build(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(m.graph.param_numel(), published, "{spec}: graph");
    let cfg = zoo::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(cfg.param_count(), published, "{spec}: config");
}

#[test]
fn v1_0_presets_have_the_published_parameter_counts() {
    // Hugging Face t5-small .. t5-11b (vocabulary 32128, tied head).
    let v = 32128;
    check(
        "t5-small",
        60_506_624,
        formula(6, 512, 2048, 8, 64, false, true, v),
    );
    check(
        "t5-base",
        222_903_552,
        formula(12, 768, 3072, 12, 64, false, true, v),
    );
    check(
        "t5-large",
        737_668_096,
        formula(24, 1024, 4096, 16, 64, false, true, v),
    );
    check(
        "t5-3b",
        2_851_598_336,
        formula(24, 1024, 16384, 32, 128, false, true, v),
    );
    check(
        "t5-11b",
        11_307_321_344,
        formula(24, 1024, 65536, 128, 128, false, true, v),
    );
}

#[test]
fn v1_1_presets_have_the_published_parameter_counts() {
    // google/t5-v1_1-large, -xl, -xxl (gated GELU, untied head).
    let v = 32128;
    check(
        "t5-v1_1-large",
        783_150_080,
        formula(24, 1024, 2816, 16, 64, true, false, v),
    );
    check(
        "t5-v1_1-xl",
        2_849_757_184,
        formula(24, 2048, 5120, 32, 64, true, false, v),
    );
    check(
        "t5-v1_1-xxl",
        11_135_332_352,
        formula(24, 4096, 10240, 64, 64, true, false, v),
    );
}

#[test]
fn custom_spec_counts_and_defaults() {
    let spec = "t5:layers=2,hidden=16,ff=32,heads=2,kv=8,vocab=64,seq=8,dec_seq=4,batch=3";
    // 64*16 + 2*(1024 + 1024 + 32) + 2*32 + 16 + 2*(2048 + 1024 + 48) + 2*32 + 16.
    check(spec, 11_584, formula(2, 16, 32, 2, 8, false, true, 64));
    // kv defaults to hidden / heads; gated-gelu defaults to an untied head.
    let spec = "t5:layers=1,hidden=16,ff=32,heads=4,vocab=64,seq=8,act=gated-gelu";
    let by_formula = formula(1, 16, 32, 4, 4, true, false, 64);
    check(spec, by_formula, by_formula);
    let tied = "t5:layers=1,hidden=16,ff=32,heads=4,vocab=64,seq=8,act=gated-gelu,tie=true";
    let m = zoo::build(tied).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.graph.param_numel(), by_formula - 64 * 16);
}

#[test]
fn graph_validates_and_differentiates() {
    for spec in [
        "t5-mini",
        "t5:layers=2,hidden=16,ff=32,heads=2,kv=8,vocab=64,seq=8,dec_seq=4,batch=2",
        "t5:layers=2,hidden=16,ff=32,heads=2,vocab=64,seq=6,dec_seq=1,act=gated-gelu,dropout=0.1",
    ] {
        let m = zoo::build(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        fsdpc_ir::validate(&m.graph).unwrap_or_else(|p| panic!("{spec}: {p:?}"));
        assert_eq!(m.graph.outputs, vec![m.loss]);
        assert_eq!(m.graph.value_type(m.loss).shape.rank(), 0, "{spec}");
        let n = m.graph.params.len();
        let p = fsdpc_ir::build_training_program(
            m.graph,
            m.loss,
            Optimizer::Sgd {
                lr: 0.1,
                momentum: 0.0,
                weight_decay: 0.0,
            },
        )
        .unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(p.grads.len(), n, "{spec}: every parameter gets a gradient");
    }
}

#[test]
fn the_11b_model_builds_without_parameter_memory() {
    let m = zoo::build("t5-11b:batch=8").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.tokens_per_sample, 1024);
    assert_eq!(input_dims(&m.graph, "ids"), vec![8, 512]);
    assert_eq!(input_dims(&m.graph, "labels"), vec![8, 512]);
}

#[test]
fn names_follow_hugging_face_and_blocks_share_one_kind() {
    let m = zoo::build("t5:layers=2,hidden=16,ff=32,heads=2,vocab=64,seq=8,tie=false")
        .unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    let names: Vec<&str> = g.params.iter().map(|p| p.name.as_str()).collect();
    for want in [
        "shared.weight",
        "encoder.block.0.layer.0.SelfAttention.q.weight",
        "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "encoder.block.1.layer.1.DenseReluDense.wi.weight",
        "encoder.final_layer_norm.weight",
        "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
        "decoder.block.1.layer.1.EncDecAttention.k.weight",
        "decoder.block.1.layer.2.DenseReluDense.wo.weight",
        "decoder.final_layer_norm.weight",
        "lm_head.weight",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    // One bias table per stack, in its first block only.
    let tables = names
        .iter()
        .filter(|n| n.contains("relative_attention_bias"))
        .count();
    assert_eq!(tables, 2);
    for stack in ["encoder", "decoder"] {
        for i in 0..2 {
            let path = format!("{stack}.block.{i}");
            let module = g.modules.iter().find(|m| m.path == path);
            let module = module.unwrap_or_else(|| panic!("no module {path}"));
            assert_eq!(module.kind, "T5Block");
        }
    }
    // The shared bias is computed once per stack and read by every layer.
    let bias_adds = g
        .node_ids()
        .filter(|&n| g.node(n).name.ends_with("add_position_bias"))
        .count();
    assert_eq!(bias_adds, 4);
    let tables_read = g
        .node_ids()
        .filter(|&n| g.node(n).name.ends_with("relative_attention_bias.gather"))
        .count();
    assert_eq!(tables_read, 2);
}

#[test]
fn relative_position_buckets_follow_t5() {
    // Encoder (bidirectional): 16 buckets a side, 8 exact distances, then
    // log-spaced up to 128.
    let enc = |r| bucket(r, true, 32, 128);
    assert_eq!(enc(0), 0);
    assert_eq!(enc(-1), 1);
    assert_eq!(enc(-7), 7);
    assert_eq!(enc(-8), 8);
    // ln(12/8) / ln(16) * 8 = 1.17.
    assert_eq!(enc(-12), 9);
    assert_eq!(enc(1), 17);
    assert_eq!(enc(127), 31);
    assert_eq!(enc(-1000), 15);
    assert_eq!(enc(1000), 31);
    // Decoder (past only): 16 exact distances, future keys in bucket 0.
    let dec = |r| bucket(r, false, 32, 128);
    assert_eq!(dec(5), 0);
    assert_eq!(dec(0), 0);
    assert_eq!(dec(-15), 15);
    assert_eq!(dec(-16), 16);
    // ln(64/16) / ln(8) * 16 = 10.67.
    assert_eq!(dec(-64), 26);
    assert_eq!(dec(-500), 31);
    // Buckets never decrease with distance.
    for r in 1..300 {
        assert!(dec(-r) >= dec(-(r - 1)));
        assert!(enc(r) >= enc(r - 1));
    }
}

#[test]
fn bad_specs_are_refused_with_a_reason() {
    for (spec, needle) in [
        (
            "t5:hidden=16,ff=32,heads=2,vocab=64,seq=8",
            "missing `layers=`",
        ),
        (
            "t5:layers=1,hidden=2,ff=32,heads=4,vocab=64,seq=8",
            "give kv=",
        ),
        (
            "t5:layers=1,hidden=16,ff=32,heads=2,vocab=64,seq=8,buckets=2",
            "too few",
        ),
        (
            "t5:layers=1,hidden=16,ff=32,heads=2,vocab=64,seq=8,act=swish",
            "act must be one of",
        ),
        ("t5-large:mlp_ratio=4", "unknown key `mlp_ratio`"),
    ] {
        match zoo::build(spec) {
            Err(FrontendError::BadSpec { reason, .. }) => {
                assert!(reason.contains(needle), "{spec}: {reason}")
            }
            other => panic!("{spec}: expected a bad spec, got {other:?}"),
        }
    }
    assert!(matches!(
        zoo::parse("t5-3b:batch=4"),
        Ok(ZooConfig::T5(c)) if c.batch == 4 && c.ff == 16384
    ));
}

fn input_dims(g: &Graph, name: &str) -> Vec<usize> {
    g.node_ids()
        .map(|n| g.node(n))
        .find(|n| matches!(&n.op, Op::Input { name: x } if x == name))
        .map(|n| n.outputs[0].shape.dims().to_vec())
        .unwrap_or_else(|| panic!("no input {name}"))
}
