//! The Llama family of the zoo: every preset has the parameter count of the
//! published Hugging Face model (the sum of its checkpoint's tensors,
//! `total_size` of `model.safetensors.index.json` over the bytes per
//! element), checked against a closed form written out here, independent of
//! `LlamaConfig::param_count`, and against the built graph; parameters carry
//! Hugging Face's names and layouts; bad specs are refused with a reason.

use fsdpc_frontends::zoo::{self, llama::LlamaConfig, rope::Rope, ZooConfig};

/// A Llama-family decoder's parameter count written out: embedding, per
/// layer q/k/v/o (+ q/k/v bias) + gate/up/down + two norms (+ q/k norms),
/// the final norm, and an untied head.
#[allow(clippy::too_many_arguments)]
fn formula(
    layers: u64,
    d: u64,
    heads: u64,
    kv: u64,
    head_dim: u64,
    ffn: u64,
    vocab: u64,
    tie: bool,
    bias: bool,
    qk_norm: bool,
) -> u64 {
    let (q, k) = (heads * head_dim, kv * head_dim);
    let attn = d * q + 2 * d * k + q * d + if bias { q + 2 * k } else { 0 };
    let layer = attn + 3 * d * ffn + 2 * d + if qk_norm { 2 * head_dim } else { 0 };
    vocab * d * if tie { 1 } else { 2 } + layers * layer + d
}

fn check(spec: &str, published: u64, by_formula: u64) {
    assert_eq!(by_formula, published, "{spec}: the formula");
    let m = zoo::build(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(m.graph.param_numel(), published, "{spec}: graph");
    let cfg = zoo::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(cfg.param_count(), published, "{spec}: config");
}

#[test]
fn llama_presets_have_the_published_parameter_counts() {
    let f = formula;
    check(
        "llama2-7b",
        6_738_415_616,
        f(32, 4096, 32, 32, 128, 11008, 32000, false, false, false),
    );
    check(
        "llama2-13b",
        13_015_864_320,
        f(40, 5120, 40, 40, 128, 13824, 32000, false, false, false),
    );
    check(
        "llama2-70b",
        68_976_648_192,
        f(80, 8192, 64, 8, 128, 28672, 32000, false, false, false),
    );
    let v3 = 128_256;
    check(
        "llama3-8b",
        8_030_261_248,
        f(32, 4096, 32, 8, 128, 14336, v3, false, false, false),
    );
    check(
        "llama3-70b",
        70_553_706_496,
        f(80, 8192, 64, 8, 128, 28672, v3, false, false, false),
    );
    check(
        "llama3.1-8b",
        8_030_261_248,
        f(32, 4096, 32, 8, 128, 14336, v3, false, false, false),
    );
    check(
        "llama3.1-70b",
        70_553_706_496,
        f(80, 8192, 64, 8, 128, 28672, v3, false, false, false),
    );
    check(
        "llama3.1-405b",
        405_853_388_800,
        f(126, 16384, 128, 8, 128, 53248, v3, false, false, false),
    );
    check(
        "llama3.2-1b",
        1_235_814_400,
        f(16, 2048, 32, 8, 64, 8192, v3, true, false, false),
    );
    check(
        "llama3.2-3b",
        3_212_749_824,
        f(28, 3072, 24, 8, 128, 8192, v3, true, false, false),
    );
}

#[test]
fn qwen_presets_have_the_published_parameter_counts() {
    let f = formula;
    let (small, big) = (151_936, 152_064);
    check(
        "qwen2.5-0.5b",
        494_032_768,
        f(24, 896, 14, 2, 64, 4864, small, true, true, false),
    );
    check(
        "qwen2.5-1.5b",
        1_543_714_304,
        f(28, 1536, 12, 2, 128, 8960, small, true, true, false),
    );
    check(
        "qwen2.5-7b",
        7_615_616_512,
        f(28, 3584, 28, 4, 128, 18944, big, false, true, false),
    );
    check(
        "qwen2.5-14b",
        14_770_033_664,
        f(48, 5120, 40, 8, 128, 13824, big, false, true, false),
    );
    check(
        "qwen2.5-32b",
        32_763_876_352,
        f(64, 5120, 40, 8, 128, 27648, big, false, true, false),
    );
    check(
        "qwen2.5-72b",
        72_706_203_648,
        f(80, 8192, 64, 8, 128, 29568, big, false, true, false),
    );
    check(
        "qwen3-0.6b",
        596_049_920,
        f(28, 1024, 16, 8, 128, 3072, small, true, false, true),
    );
    check(
        "qwen3-8b",
        8_190_735_360,
        f(36, 4096, 32, 8, 128, 12288, small, false, false, true),
    );
    check(
        "qwen3-32b",
        32_762_123_264,
        f(64, 5120, 64, 8, 128, 25600, small, false, false, true),
    );
}

#[test]
fn mistral_and_phi3_presets_have_the_published_parameter_counts() {
    let f = formula;
    check(
        "mistral-7b",
        7_241_732_096,
        f(32, 4096, 32, 8, 128, 14336, 32000, false, false, false),
    );
    check(
        "mistral-7b-v0.3",
        7_248_023_552,
        f(32, 4096, 32, 8, 128, 14336, 32768, false, false, false),
    );
    check(
        "phi3-mini",
        3_821_079_552,
        f(32, 3072, 32, 32, 96, 8192, 32064, false, false, false),
    );
    check(
        "phi3-medium",
        13_960_238_080,
        f(40, 5120, 40, 10, 128, 17920, 32064, false, false, false),
    );
}

fn llama(spec: &str) -> LlamaConfig {
    match zoo::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}")) {
        ZooConfig::Llama(c) => c,
        other => panic!("{spec}: not a Llama config: {other:?}"),
    }
}

#[test]
fn parameters_have_hugging_face_names_and_layouts() {
    let names = |spec: &str| -> Vec<(String, Vec<usize>)> {
        let m = zoo::build(spec).unwrap();
        m.graph
            .params
            .iter()
            .map(|p| (p.name.clone(), p.ty.shape.dims().to_vec()))
            .collect()
    };
    let q = names("qwen3:layers=1,hidden=32,heads=4,kv_heads=2,head_dim=16,ffn=48,vocab=64,seq=8");
    let want = [
        ("model.embed_tokens.weight", vec![64, 32]),
        ("model.layers.0.input_layernorm.weight", vec![32]),
        ("model.layers.0.self_attn.q_proj.weight", vec![64, 32]),
        ("model.layers.0.self_attn.q_norm.weight", vec![16]),
        ("model.layers.0.self_attn.k_proj.weight", vec![32, 32]),
        ("model.layers.0.self_attn.k_norm.weight", vec![16]),
        ("model.layers.0.self_attn.v_proj.weight", vec![32, 32]),
        ("model.layers.0.self_attn.o_proj.weight", vec![32, 64]),
        ("model.layers.0.post_attention_layernorm.weight", vec![32]),
        ("model.layers.0.mlp.gate_proj.weight", vec![48, 32]),
        ("model.layers.0.mlp.up_proj.weight", vec![48, 32]),
        ("model.layers.0.mlp.down_proj.weight", vec![32, 48]),
        ("model.norm.weight", vec![32]),
        ("lm_head.weight", vec![64, 32]),
    ];
    let want: Vec<(String, Vec<usize>)> = want
        .iter()
        .map(|(n, s)| (n.to_string(), s.clone()))
        .collect();
    let mut got = q.clone();
    got.sort();
    let mut sorted = want.clone();
    sorted.sort();
    assert_eq!(got, sorted);

    let p = names("phi3:layers=1,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=8,tie=true");
    let p: Vec<&str> = p.iter().map(|(n, _)| n.as_str()).collect();
    assert!(
        p.contains(&"model.layers.0.self_attn.qkv_proj.weight"),
        "{p:?}"
    );
    assert!(
        p.contains(&"model.layers.0.mlp.gate_up_proj.weight"),
        "{p:?}"
    );
    assert!(!p.contains(&"lm_head.weight"), "tied: {p:?}");

    let qwen2 = names("qwen2:layers=1,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=8");
    for leaf in ["q_proj", "k_proj", "v_proj"] {
        let bias = format!("model.layers.0.self_attn.{leaf}.bias");
        assert!(qwen2.iter().any(|(n, _)| *n == bias), "{bias}");
    }
    assert!(!qwen2.iter().any(|(n, _)| n.ends_with("o_proj.bias")));
}

#[test]
fn wrap_units_are_decoder_layers_and_lora_freezes_the_base() {
    let m = zoo::build("llama:layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=8,lora=4")
        .unwrap();
    let trainable: Vec<&str> = m
        .graph
        .params
        .iter()
        .filter(|p| p.requires_grad)
        .map(|p| p.name.as_str())
        .collect();
    // Adapters of q, k, v and o in each of 2 layers.
    assert_eq!(trainable.len(), 2 * 4 * 2, "{trainable:?}");
    assert!(
        trainable.iter().all(|n| n.contains(".lora_")),
        "{trainable:?}"
    );
    let cfg = llama("llama:layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=8,lora=4");
    assert_eq!(cfg.param_count(), m.graph.param_numel());
}

#[test]
fn rope_inverse_frequencies_follow_the_scaling_rules() {
    // Unscaled: 1 / theta^(2j/d).
    let (inv, att) = Rope::plain(10_000.0).inv_freq(8);
    let want = [1.0, 0.1, 0.01, 0.001];
    for (g, w) in inv.iter().zip(want) {
        assert!((g - w).abs() <= 1e-6 * w, "{inv:?}");
    }
    assert_eq!(att, 1.0);
    // Llama 3.1 (factor 8, bands 1..4 of 8192 positions): the highest
    // frequency (wavelength 2 pi) is kept, the lowest (wavelength beyond
    // 8192) divided by 8.
    let c = llama("llama3.1-8b");
    let (inv, _) = c.rope.inv_freq(128);
    let (plain, _) = Rope::plain(500_000.0).inv_freq(128);
    assert_eq!(inv[0], plain[0]);
    assert!((inv[63] - plain[63] / 8.0).abs() <= 1e-6 * inv[63]);
    // In between, scaled by a factor between 1/8 and 1.
    assert!(inv
        .iter()
        .zip(&plain)
        .all(|(s, p)| *s <= *p && *s >= p / 8.0 * (1.0 - 1e-6)));
    // YaRN: attention factor 0.1 ln(4) + 1.
    let y = llama("qwen2.5-7b:rope=yarn,rope_factor=4,rope_orig=32768");
    let (_, att) = y.rope.inv_freq(128);
    assert!((att as f64 - (0.1 * 4f64.ln() + 1.0)).abs() < 1e-6);
}

#[test]
fn bad_llama_specs_are_refused_with_a_reason() {
    let err = |spec: &str| zoo::parse(spec).unwrap_err().to_string();
    let e = err("llama:layers=1,hidden=32,heads=4,kv_heads=3,ffn=48,vocab=64,seq=8");
    assert!(e.contains("kv_heads=3"), "{e}");
    let e = err("llama:layers=1,hidden=30,heads=4,ffn=48,vocab=64,seq=8");
    assert!(e.contains("head_dim"), "{e}");
    let e = err("llama3-8b:rope=ntk");
    assert!(e.contains("rope must be one of"), "{e}");
    let e = err("llama:layers=1,hidden=32,heads=4,ffn=48,vocab=64,seq=8,rope=llama3,rope_factor=8");
    assert!(e.contains("rope_low"), "{e}");
    let e = err("llama3-8b:eps=-1");
    assert!(e.contains("eps"), "{e}");
    let e = err("llama:hidden=32");
    assert!(e.contains("missing"), "{e}");
}
