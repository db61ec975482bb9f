//! A Hugging Face `config.json` as a zoo config, and back: the fields of
//! each `model_type` the zoo builds (`llama`, `qwen2`, `qwen3`, `mistral`,
//! `phi3`, `gpt2`, `t5`), read with the defaults `transformers` gives them;
//! anything the zoo cannot build (a mixture of experts, a bias or
//! activation the family lacks, a RoPE scaling it does not implement) is an
//! error naming the field.

use crate::zoo::gpt::{Gelu, GptConfig};
use crate::zoo::llama::{Arch, LlamaConfig};
use crate::zoo::rope::{Rope, Scaling};
use crate::zoo::t5::{T5Act, T5Config};
use crate::zoo::ZooConfig;
use serde_json::{json, Map, Value};

/// The longest default sequence: a config's context beyond it (Llama 3.1's
/// 131,072) is capped unless `seq=` asks for more.
pub const MAX_DEFAULT_SEQ: usize = 8192;

/// `model_type`s of mixtures of experts, refused by name.
const MOE: &[&str] = &[
    "mixtral",
    "qwen2_moe",
    "qwen3_moe",
    "deepseek_v2",
    "deepseek_v3",
    "dbrx",
    "olmoe",
    "phimoe",
    "granitemoe",
    "jamba",
    "gpt_oss",
    "llama4",
];

/// The `model_type`s this module reads.
pub const MODEL_TYPES: &[&str] = &["llama", "qwen2", "qwen3", "mistral", "phi3", "gpt2", "t5"];

/// Reads fields of one config, naming the field in every error.
struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    fn get(&self, key: &str) -> Option<&Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    fn size(&self, key: &str) -> Result<Option<usize>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if (1..=1 << 24).contains(&n) => Ok(Some(n as usize)),
                _ => Err(format!(
                    "`{key}` is {v}, not a size between 1 and {}",
                    1 << 24
                )),
            },
        }
    }

    fn need(&self, key: &str) -> Result<usize, String> {
        self.size(key)?.ok_or_else(|| format!("`{key}` is missing"))
    }

    fn number(&self, key: &str) -> Result<Option<f64>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                _ => Err(format!("`{key}` is {v}, not a positive number")),
            },
        }
    }

    fn flag(&self, key: &str) -> Result<Option<bool>, String> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(format!("`{key}` is {v}, not true or false")),
        }
    }

    fn text(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
}

/// The zoo config of `config.json`'s contents, with `seq` (default: the
/// context, capped at [`MAX_DEFAULT_SEQ`]), `batch` and `lora` set.
pub fn zoo_config(
    config: &Value,
    seq: Option<usize>,
    batch: usize,
    lora: usize,
) -> Result<ZooConfig, String> {
    let map = config.as_object().ok_or("the file is not a JSON object")?;
    let f = Fields(map);
    let model_type = f
        .text("model_type")
        .ok_or("`model_type` is missing; a Hugging Face config names its architecture there")?;
    if MOE.contains(&model_type)
        || f.get("num_local_experts").is_some()
        || f.get("num_experts").is_some()
    {
        return Err(format!(
            "`{model_type}` is a mixture-of-experts model; fsdpc builds dense models \
             (model types {})",
            MODEL_TYPES.join(", ")
        ));
    }
    if let Some(arch) = Arch::from_model_type(model_type) {
        return llama(&f, arch, seq, batch, lora).map(ZooConfig::Llama);
    }
    match model_type {
        "gpt2" => gpt2(&f, seq, batch, lora).map(ZooConfig::Gpt),
        "t5" => t5(&f, seq, batch, lora).map(ZooConfig::T5),
        other => Err(format!(
            "model type `{other}` is not one fsdpc builds; it builds {}",
            MODEL_TYPES.join(", ")
        )),
    }
}

fn llama(
    f: &Fields<'_>,
    arch: Arch,
    seq: Option<usize>,
    batch: usize,
    lora: usize,
) -> Result<LlamaConfig, String> {
    let hidden = f.need("hidden_size")?;
    let heads = f.need("num_attention_heads")?;
    let positions = f
        .size("max_position_embeddings")?
        .unwrap_or(MAX_DEFAULT_SEQ);
    if let Some(act) = f.text("hidden_act").filter(|a| *a != "silu") {
        return Err(format!(
            "`hidden_act` is `{act}`; the family's MLP is SwiGLU (`silu`)"
        ));
    }
    if f.flag("attention_bias")? == Some(true) {
        return Err("`attention_bias` is true (a bias on q, k, v and o); fsdpc builds only Qwen2's q, k, v bias".into());
    }
    if f.flag("mlp_bias")? == Some(true) {
        return Err("`mlp_bias` is true; the family's MLP has no bias".into());
    }
    if f.number("partial_rotary_factor")?.is_some_and(|p| p != 1.0) {
        return Err("`partial_rotary_factor` is not 1; fsdpc rotates whole heads".into());
    }
    let window = match arch {
        Arch::Mistral | Arch::Phi3 => f.size("sliding_window")?,
        Arch::Qwen2 | Arch::Qwen3 => {
            if f.flag("use_sliding_window")? == Some(true) {
                return Err("`use_sliding_window` is true (a window on some layers only); fsdpc windows every layer or none".into());
            }
            None
        }
        Arch::Llama => None,
    };
    let cfg = LlamaConfig {
        arch,
        layers: f.need("num_hidden_layers")?,
        hidden,
        heads,
        kv_heads: f.size("num_key_value_heads")?.unwrap_or(heads),
        head_dim: f.size("head_dim")?.unwrap_or(hidden / heads),
        ffn: f.need("intermediate_size")?,
        vocab: f.need("vocab_size")?,
        seq: seq.unwrap_or(positions.min(MAX_DEFAULT_SEQ)),
        positions,
        batch,
        eps: f.number("rms_norm_eps")?.unwrap_or(1e-6),
        rope: rope(f)?,
        qkv_bias: arch == Arch::Qwen2,
        qk_norm: arch == Arch::Qwen3,
        tie: f.flag("tie_word_embeddings")?.unwrap_or(false),
        window,
        fused: arch == Arch::Phi3,
        lora,
    };
    let cfg = LlamaConfig {
        positions: cfg.positions.max(cfg.seq),
        ..cfg
    };
    cfg.check()?;
    Ok(cfg)
}

/// RoPE from `rope_parameters` (transformers 5) or `rope_theta` and
/// `rope_scaling` (transformers 4).
fn rope(f: &Fields<'_>) -> Result<Rope, String> {
    let params = f.get("rope_parameters").or_else(|| f.get("rope_scaling"));
    let params = match params {
        None => Map::new(),
        Some(Value::Object(m)) => m.clone(),
        Some(v) => return Err(format!("`rope_parameters` is {v}, not an object")),
    };
    let p = Fields(&params);
    let theta = p
        .number("rope_theta")?
        .or(f.number("rope_theta")?)
        .unwrap_or(10_000.0);
    let kind = p.text("rope_type").or(p.text("type")).unwrap_or("default");
    let factor = || {
        p.number("factor")?
            .ok_or_else(|| format!("rope type `{kind}` needs `factor`"))
    };
    let original = || {
        p.size("original_max_position_embeddings")?
            .ok_or_else(|| format!("rope type `{kind}` needs `original_max_position_embeddings`"))
    };
    let scaling = match kind {
        "default" => Scaling::None,
        "linear" => Scaling::Linear { factor: factor()? },
        "llama3" => Scaling::Llama3 {
            factor: factor()?,
            low: p
                .number("low_freq_factor")?
                .ok_or("rope type `llama3` needs `low_freq_factor`")?,
            high: p
                .number("high_freq_factor")?
                .ok_or("rope type `llama3` needs `high_freq_factor`")?,
            original: original()?,
        },
        "yarn" => {
            for key in [
                "attention_factor",
                "beta_fast",
                "beta_slow",
                "mscale",
                "mscale_all_dim",
            ] {
                if p.get(key).is_some() {
                    return Err(format!(
                        "rope type `yarn` with `{key}`: fsdpc implements YaRN with its defaults only"
                    ));
                }
            }
            Scaling::Yarn {
                factor: factor()?,
                original: original()?,
            }
        }
        other => {
            return Err(format!(
            "rope type `{other}` is not implemented (fsdpc has default, linear, llama3 and yarn)"
        ))
        }
    };
    Ok(Rope { theta, scaling })
}

fn gpt2(
    f: &Fields<'_>,
    seq: Option<usize>,
    batch: usize,
    lora: usize,
) -> Result<GptConfig, String> {
    let positions = f.size("n_positions")?.unwrap_or(1024);
    let gelu = match f.text("activation_function").unwrap_or("gelu_new") {
        "gelu_new" | "gelu_pytorch_tanh" => Gelu::Tanh,
        "gelu" => Gelu::Erf,
        other => {
            return Err(format!(
                "`activation_function` is `{other}`; fsdpc's GPT-2 has gelu_new and gelu"
            ))
        }
    };
    let hidden = f.size("n_embd")?.unwrap_or(768);
    if let Some(inner) = f.size("n_inner")? {
        if inner % hidden != 0 {
            return Err(format!(
                "`n_inner` {inner} is not a multiple of `n_embd` {hidden}"
            ));
        }
    }
    let dropout = |key: &str| -> Result<f64, String> {
        match f.get(key).and_then(Value::as_f64) {
            Some(p) if (0.0..1.0).contains(&p) => Ok(p),
            None => Ok(0.1),
            Some(p) => Err(format!("`{key}` is {p}, not a probability")),
        }
    };
    Ok(GptConfig {
        layers: f.size("n_layer")?.unwrap_or(12),
        hidden,
        heads: f.size("n_head")?.unwrap_or(12),
        seq: seq.unwrap_or(positions),
        positions: positions.max(seq.unwrap_or(0)),
        vocab: f.size("vocab_size")?.unwrap_or(50257),
        batch,
        mlp_ratio: f.size("n_inner")?.map_or(4, |i| i / hidden),
        dropout: dropout("resid_pdrop")?,
        tie: f.flag("tie_word_embeddings")?.unwrap_or(true),
        gelu,
        lora,
    })
}

fn t5(f: &Fields<'_>, seq: Option<usize>, batch: usize, lora: usize) -> Result<T5Config, String> {
    if lora > 0 {
        return Err("lora= is not available for T5".into());
    }
    let act = match f.text("feed_forward_proj").unwrap_or("relu") {
        "relu" => T5Act::Relu,
        "gated-gelu" => T5Act::GatedGelu,
        other => {
            return Err(format!(
                "`feed_forward_proj` is `{other}`; fsdpc's T5 has relu and gated-gelu"
            ))
        }
    };
    let layers = f.size("num_layers")?.unwrap_or(6);
    if f.size("num_decoder_layers")?.is_some_and(|d| d != layers) {
        return Err(
            "`num_decoder_layers` differs from `num_layers`; fsdpc's T5 has equal stacks".into(),
        );
    }
    let seq = seq.unwrap_or(512);
    Ok(T5Config {
        layers,
        hidden: f.size("d_model")?.unwrap_or(512),
        ff: f.size("d_ff")?.unwrap_or(2048),
        heads: f.size("num_heads")?.unwrap_or(8),
        kv: f.size("d_kv")?.unwrap_or(64),
        vocab: f.size("vocab_size")?.unwrap_or(32128),
        seq,
        dec_seq: seq,
        batch,
        act,
        tie: f.flag("tie_word_embeddings")?.unwrap_or(true),
        buckets: f.size("relative_attention_num_buckets")?.unwrap_or(32),
        max_distance: f.size("relative_attention_max_distance")?.unwrap_or(128),
        dropout: f.get("dropout_rate").and_then(Value::as_f64).unwrap_or(0.1),
    })
}

/// The `config.json` `transformers` reads for `cfg` (Llama family and
/// GPT-2; `None` for the others), in float32.
pub fn hf_config(cfg: &ZooConfig) -> Option<Value> {
    match cfg {
        ZooConfig::Llama(c) => Some(llama_json(c)),
        ZooConfig::Gpt(c) => Some(json!({
            "architectures": ["GPT2LMHeadModel"],
            "model_type": "gpt2",
            "n_layer": c.layers,
            "n_embd": c.hidden,
            "n_head": c.heads,
            "n_positions": c.positions,
            "n_inner": c.hidden * c.mlp_ratio,
            "vocab_size": c.vocab,
            "activation_function": match c.gelu { Gelu::Tanh => "gelu_new", Gelu::Erf => "gelu" },
            "resid_pdrop": c.dropout,
            "embd_pdrop": c.dropout,
            "attn_pdrop": 0.0,
            "layer_norm_epsilon": 1e-5,
            "tie_word_embeddings": c.tie,
            "torch_dtype": "float32",
        })),
        _ => None,
    }
}

fn llama_json(c: &LlamaConfig) -> Value {
    let mut rope = Map::new();
    rope.insert("rope_theta".into(), json!(c.rope.theta));
    rope.insert("rope_type".into(), json!(c.rope.kind()));
    match c.rope.scaling {
        Scaling::None => {}
        Scaling::Linear { factor } => {
            rope.insert("factor".into(), json!(factor));
        }
        Scaling::Llama3 {
            factor,
            low,
            high,
            original,
        } => {
            rope.insert("factor".into(), json!(factor));
            rope.insert("low_freq_factor".into(), json!(low));
            rope.insert("high_freq_factor".into(), json!(high));
            rope.insert("original_max_position_embeddings".into(), json!(original));
        }
        Scaling::Yarn { factor, original } => {
            rope.insert("factor".into(), json!(factor));
            rope.insert("original_max_position_embeddings".into(), json!(original));
        }
    }
    let mut v = json!({
        "architectures": [c.arch.class()],
        "model_type": c.arch.model_type(),
        "hidden_size": c.hidden,
        "num_hidden_layers": c.layers,
        "num_attention_heads": c.heads,
        "num_key_value_heads": c.kv_heads,
        "head_dim": c.head_dim,
        "intermediate_size": c.ffn,
        "vocab_size": c.vocab,
        "max_position_embeddings": c.positions,
        "rms_norm_eps": c.eps,
        "hidden_act": "silu",
        "rope_theta": c.rope.theta,
        "rope_parameters": Value::Object(rope.clone()),
        "tie_word_embeddings": c.tie,
        "attention_dropout": 0.0,
        "torch_dtype": "float32",
        // No tokenizer goes with a zoo model: no special tokens (Phi-3's
        // defaults lie outside a small vocabulary).
        "pad_token_id": null,
        "bos_token_id": null,
        "eos_token_id": null,
    });
    if c.rope.scaling != Scaling::None {
        v["rope_scaling"] = Value::Object(rope);
    }
    if c.arch == Arch::Llama || c.arch == Arch::Qwen3 {
        v["attention_bias"] = json!(false);
    }
    if let Some(w) = c.window {
        v["sliding_window"] = json!(w);
    } else if matches!(c.arch, Arch::Mistral | Arch::Phi3) {
        v["sliding_window"] = Value::Null;
    }
    v
}
