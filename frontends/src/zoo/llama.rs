//! The Llama family of decoders as Hugging Face's `transformers` defines
//! them: Llama 2/3/3.1/3.2 (`LlamaForCausalLM`), Qwen2/2.5 (`Qwen2ForCausalLM`:
//! QKV bias), Qwen3 (`Qwen3ForCausalLM`: per-head RMSNorm of q and k),
//! Mistral (`MistralForCausalLM`: sliding-window attention) and Phi-3
//! (`Phi3ForCausalLM`: fused `qkv_proj` and `gate_up_proj`).
//!
//! A block is `x + o_proj(attn(rope(q), rope(k), v))` over
//! `input_layernorm(x)`, then `x + down_proj(silu(gate_proj(h)) * up_proj(h))`
//! over `post_attention_layernorm(x)`; both norms are RMSNorm. Attention is
//! grouped-query: `kv_heads` key/value heads each serve `heads / kv_heads`
//! query heads. Rotary embeddings (`rope.rs`) are constants of the graph.
//! Weights are `[out, in]` as `nn.Linear` stores them and parameter names are
//! the Hugging Face ones (`model.layers.3.self_attn.q_proj.weight`), so a
//! checkpoint's tensors map one to one onto the parameters.
//!
//! `lora=R` adds LoRA adapters (Hu et al. 2021) of rank R to every attention
//! projection (q, k, v and o; `qkv_proj` and `o_proj` for Phi-3), as the GPT
//! family does: `A: [R, in]` Kaiming-uniform, `B: [out, R]` zero, scaling 1,
//! and every other parameter frozen.

use super::builder::{binary, matmul, Builder};
use super::rope::{self, Rope};
use super::spec::{required, Spec};
use super::ZooModel;
use crate::error::FrontendError;
use fsdpc_ir::Init;
use fsdpc_ir::{BinaryFn, DType, IrError, ModuleId, Op, TensorData, TensorType, UnaryFn, ValueId};

/// Std of every Linear and embedding initialisation (`initializer_range`).
const STD: f64 = 0.02;

/// Which `transformers` architecture a config is: the names of its modules,
/// its `model_type` and the defaults its family spec starts from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
    Mistral,
    Phi3,
}

impl Arch {
    /// Every architecture, in the order `model_type`s are listed.
    pub const ALL: [Arch; 5] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen3,
        Arch::Mistral,
        Arch::Phi3,
    ];

    /// The `model_type` of a Hugging Face `config.json` (also the family spec name).
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Mistral => "mistral",
            Arch::Phi3 => "phi3",
        }
    }

    /// The architecture whose `model_type` is `name`.
    pub fn from_model_type(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.model_type() == name)
    }

    /// The class name `transformers` gives the causal LM (`config.json`'s
    /// `architectures`).
    pub fn class(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Mistral => "MistralForCausalLM",
            Arch::Phi3 => "Phi3ForCausalLM",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Arch::Llama => "Llama",
            Arch::Qwen2 => "Qwen2",
            Arch::Qwen3 => "Qwen3",
            Arch::Mistral => "Mistral",
            Arch::Phi3 => "Phi3",
        }
    }
}

/// Every size and option of a Llama-family decoder.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    pub arch: Arch,
    /// Decoder layers (`num_hidden_layers`).
    pub layers: usize,
    /// Model width (`hidden_size`).
    pub hidden: usize,
    /// Query heads (`num_attention_heads`).
    pub heads: usize,
    /// Key/value heads (`num_key_value_heads`); divides `heads`.
    pub kv_heads: usize,
    /// Width of one head (`head_dim`; `hidden / heads` unless given).
    pub head_dim: usize,
    /// MLP width (`intermediate_size`).
    pub ffn: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Sequence length of one sample.
    pub seq: usize,
    /// Context the model was configured for (`max_position_embeddings`).
    pub positions: usize,
    /// Samples per step on one rank.
    pub batch: usize,
    /// RMSNorm epsilon (`rms_norm_eps`).
    pub eps: f64,
    /// Rotary embedding base and scaling.
    pub rope: Rope,
    /// Whether q, k and v projections have a bias (Qwen2).
    pub qkv_bias: bool,
    /// Whether q and k are RMS-normalised per head before the rotation (Qwen3).
    pub qk_norm: bool,
    /// Whether the output projection reuses the token embedding.
    pub tie: bool,
    /// Keys a query sees, itself included (Mistral, Phi-3); `None`: all before it.
    pub window: Option<usize>,
    /// Whether q, k, v and gate, up are fused projections (Phi-3).
    pub fused: bool,
    /// LoRA rank of the attention adapters (0: none; the base is frozen
    /// when it is not 0).
    pub lora: usize,
}

/// The keys a Llama-family spec accepts.
pub(crate) const KEYS: &[&str] = &[
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn",
    "vocab",
    "seq",
    "positions",
    "batch",
    "eps",
    "theta",
    "rope",
    "rope_factor",
    "rope_low",
    "rope_high",
    "rope_orig",
    "qkv_bias",
    "qk_norm",
    "tie",
    "window",
    "fused",
    "lora",
];

impl LlamaConfig {
    /// A preset's shape: batch 1, untied, no bias, no window, RoPE base
    /// `theta` unscaled, eps 1e-5; `seq` is both the sample length and
    /// `positions`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn preset(
        arch: Arch,
        layers: usize,
        hidden: usize,
        heads: usize,
        kv_heads: usize,
        ffn: usize,
        vocab: usize,
        seq: usize,
        theta: f64,
    ) -> LlamaConfig {
        LlamaConfig {
            arch,
            layers,
            hidden,
            heads,
            kv_heads,
            head_dim: hidden / heads,
            ffn,
            vocab,
            seq,
            positions: seq,
            batch: 1,
            eps: 1e-5,
            rope: Rope::plain(theta),
            qkv_bias: arch == Arch::Qwen2,
            qk_norm: arch == Arch::Qwen3,
            tie: false,
            window: None,
            fused: arch == Arch::Phi3,
            lora: 0,
        }
    }

    /// The config `spec` describes, starting from `base` (a preset) if
    /// given, else from the defaults of `arch`.
    pub(crate) fn from_spec(
        spec: &mut Spec<'_>,
        arch: Arch,
        base: Option<&LlamaConfig>,
    ) -> Result<LlamaConfig, FrontendError> {
        let need = "layers, hidden, heads, ffn, vocab and seq";
        let layers = spec.size("layers")?;
        let hidden = spec.size("hidden")?;
        let heads = spec.size("heads")?;
        let kv_heads = spec.size("kv_heads")?;
        let head_dim = spec.size("head_dim")?;
        let ffn = spec.size("ffn")?;
        let vocab = spec.size("vocab")?;
        let seq = spec.size("seq")?;
        let positions = spec.size("positions")?;
        let batch = spec.size("batch")?;
        let eps = spec.positive("eps")?;
        let theta = spec.positive("theta")?;
        let kind = spec.choice("rope", &["default", "linear", "llama3", "yarn"])?;
        let factor = spec.positive("rope_factor")?;
        let low = spec.positive("rope_low")?;
        let high = spec.positive("rope_high")?;
        let orig = spec.size("rope_orig")?;
        let qkv_bias = spec.flag("qkv_bias")?;
        let qk_norm = spec.flag("qk_norm")?;
        let tie = spec.flag("tie")?;
        let window = spec.size("window")?;
        let fused = spec.flag("fused")?;
        let lora = spec.size("lora")?;
        spec.finish(KEYS)?;
        let hidden = required(spec, "hidden", hidden, base.map(|b| b.hidden), need)?;
        let heads = required(spec, "heads", heads, base.map(|b| b.heads), need)?;
        // A preset's own head width, unless its width or head count changes.
        let base_head_dim = base
            .filter(|b| b.hidden == hidden && b.heads == heads)
            .map(|b| b.head_dim);
        let plain = Rope::plain(10_000.0);
        let base_rope = base.map_or(&plain, |b| &b.rope);
        let rope = rope::from_parts(
            theta.unwrap_or(base_rope.theta),
            kind,
            [factor, low, high],
            orig,
            base_rope,
        )
        .map_err(|e| spec.error(e))?;
        let seq = required(spec, "seq", seq, base.map(|b| b.seq), need)?;
        if head_dim.is_none() && base_head_dim.is_none() && hidden % heads != 0 {
            return Err(spec.error(format!(
                "hidden={hidden} is not divisible by heads={heads}; give head_dim= as well"
            )));
        }
        let cfg = LlamaConfig {
            arch,
            layers: required(spec, "layers", layers, base.map(|b| b.layers), need)?,
            hidden,
            heads,
            kv_heads: kv_heads.or(base.map(|b| b.kv_heads)).unwrap_or(heads),
            head_dim: head_dim.or(base_head_dim).unwrap_or(hidden / heads),
            ffn: required(spec, "ffn", ffn, base.map(|b| b.ffn), need)?,
            vocab: required(spec, "vocab", vocab, base.map(|b| b.vocab), need)?,
            seq,
            // A preset keeps its configured context when seq shrinks.
            positions: positions
                .or(base.map(|b| b.positions.max(seq)))
                .unwrap_or(seq),
            batch: batch.or(base.map(|b| b.batch)).unwrap_or(1),
            eps: eps.or(base.map(|b| b.eps)).unwrap_or(1e-5),
            rope,
            qkv_bias: qkv_bias
                .or(base.map(|b| b.qkv_bias))
                .unwrap_or(arch == Arch::Qwen2),
            qk_norm: qk_norm
                .or(base.map(|b| b.qk_norm))
                .unwrap_or(arch == Arch::Qwen3),
            tie: tie.or(base.map(|b| b.tie)).unwrap_or(false),
            window: window.or(base.and_then(|b| b.window)),
            fused: fused
                .or(base.map(|b| b.fused))
                .unwrap_or(arch == Arch::Phi3),
            lora: lora.or(base.map(|b| b.lora)).unwrap_or(0),
        };
        cfg.check().map_err(|e| spec.error(e))?;
        Ok(cfg)
    }

    /// Why this config cannot be built, if it cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.heads % self.kv_heads != 0 {
            return Err(format!(
                "heads={} is not a multiple of kv_heads={}; each key/value head serves a whole number of query heads",
                self.heads, self.kv_heads
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(format!(
                "head_dim={} is odd; rotary embeddings rotate pairs of dimensions",
                self.head_dim
            ));
        }
        if self.seq > self.positions {
            return Err(format!(
                "seq={} is longer than the configured context of {} positions; give positions={} as well",
                self.seq, self.positions, self.seq
            ));
        }
        Ok(())
    }

    /// Parameter elements (the tied head counted once).
    pub fn param_count(&self) -> u64 {
        let (h, v, f) = (self.hidden as u64, self.vocab as u64, self.ffn as u64);
        let q = (self.heads * self.head_dim) as u64;
        let kv = (self.kv_heads * self.head_dim) as u64;
        let attn = h * (q + 2 * kv) + q * h + if self.qkv_bias { q + 2 * kv } else { 0 };
        let norms = 2 * h
            + if self.qk_norm {
                2 * self.head_dim as u64
            } else {
                0
            };
        let lora = self.lora as u64 * ((h + q) + 2 * (h + kv) + (q + h));
        let lora = if self.fused && self.lora > 0 {
            self.lora as u64 * ((h + q + 2 * kv) + (q + h))
        } else {
            lora
        };
        let block = attn + 3 * h * f + norms + lora;
        let head = if self.tie { 0 } else { v * h };
        v * h + self.layers as u64 * block + h + head
    }

    /// The width of q (all query heads).
    fn q_width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The width of k or v (all key/value heads).
    fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim
    }
}

/// Builds the forward graph (with its loss) of `cfg`, named `name`.
pub(crate) fn build(name: &str, cfg: &LlamaConfig) -> Result<ZooModel, FrontendError> {
    cfg.check().map_err(|e| FrontendError::bad_spec(name, e))?;
    let p = cfg.arch.prefix();
    let mut b = Builder::new(name, cfg.arch.class());
    let (batch, seq) = (cfg.batch, cfg.seq);
    let ids =
        b.g.add_input("ids", TensorType::new(DType::I64, [batch, seq]));
    let labels =
        b.g.add_input("labels", TensorType::new(DType::I64, [batch, seq]));
    let model = b.module("model", &format!("{p}Model"));
    let emb_m = b.module("model.embed_tokens", "Embedding");
    let emb = b.param(
        emb_m,
        "weight",
        &[cfg.vocab, cfg.hidden],
        Init::Normal { std: STD },
    );
    let mut x = b.op(emb_m, "gather", Op::Gather { axis: 0 }, &[emb, ids])?;
    let (cos, sin) = rope::tables(&cfg.rope, cfg.head_dim, seq);
    let cos = b.op(model, "rope_cos", Op::Constant { value: cos }, &[])?;
    let sin = b.op(model, "rope_sin", Op::Constant { value: sin }, &[])?;
    let mask = match cfg.window {
        Some(w) if w < seq => Some(b.op(
            model,
            "sliding_window_mask",
            Op::Constant {
                value: window_mask(seq, w),
            },
            &[],
        )?),
        _ => None,
    };
    let ctx = Shared { cos, sin, mask };
    b.module("model.layers", "ModuleList");
    for i in 0..cfg.layers {
        x = layer(&mut b, cfg, &ctx, x, &format!("model.layers.{i}"))?;
    }
    x = rms_norm(
        &mut b,
        x,
        "model.norm",
        cfg.hidden,
        cfg.eps,
        &format!("{p}RMSNorm"),
    )?;
    let loss = head_and_loss(&mut b, cfg, x, emb, labels)?;
    b.g.outputs = vec![loss];
    if cfg.lora > 0 {
        for p in &mut b.g.params {
            p.requires_grad = p.name.ends_with(LORA_A) || p.name.ends_with(LORA_B);
        }
    }
    Ok(ZooModel {
        name: name.to_string(),
        graph: b.g,
        loss,
        tokens_per_sample: seq as u64,
    })
}

/// Constants every layer reads.
struct Shared {
    cos: ValueId,
    sin: ValueId,
    /// The additive sliding-window mask `[seq, seq]`, when the window is
    /// shorter than the sequence.
    mask: Option<ValueId>,
}

/// `[seq, seq]` f32: 0 where key `j` is visible to query `i` (`i - window < j
/// <= i`), the lowest f32 elsewhere (as `transformers` masks).
fn window_mask(seq: usize, window: usize) -> TensorData {
    let mut bytes = Vec::with_capacity(seq * seq * 4);
    for i in 0..seq {
        for j in 0..seq {
            let visible = j <= i && i - j < window;
            let v = if visible { 0.0f32 } else { f32::MIN };
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    TensorData {
        ty: TensorType::new(DType::F32, [seq, seq]),
        bytes,
    }
}

/// One decoder layer.
fn layer(
    b: &mut Builder,
    cfg: &LlamaConfig,
    ctx: &Shared,
    x: ValueId,
    path: &str,
) -> Result<ValueId, IrError> {
    let p = cfg.arch.prefix();
    let m = b.module(path, &format!("{p}DecoderLayer"));
    let norm = format!("{p}RMSNorm");
    let h = rms_norm(
        b,
        x,
        &format!("{path}.input_layernorm"),
        cfg.hidden,
        cfg.eps,
        &norm,
    )?;
    let a = attention(b, cfg, ctx, h, &format!("{path}.self_attn"))?;
    let x = b.op(m, "residual_attn", binary(BinaryFn::Add), &[x, a])?;
    let h = rms_norm(
        b,
        x,
        &format!("{path}.post_attention_layernorm"),
        cfg.hidden,
        cfg.eps,
        &norm,
    )?;
    let f = mlp(b, cfg, h, &format!("{path}.mlp"))?;
    b.op(m, "residual_mlp", binary(BinaryFn::Add), &[x, f])
}

/// `RMSNorm(dim, eps)` over the last axis in a new module at `path`, weight ones.
fn rms_norm(
    b: &mut Builder,
    x: ValueId,
    path: &str,
    dim: usize,
    eps: f64,
    kind: &str,
) -> Result<ValueId, IrError> {
    let m = b.module(path, kind);
    let w = b.param(m, "weight", &[dim], Init::Ones);
    b.op(m, "rms_norm", Op::RmsNorm { eps }, &[x, w])
}

/// `x @ weight^T (+ bias)` in a new `Linear` module at `path` with weight
/// `[fan_out, fan_in]`, plus its LoRA adapter when `adapt` and `cfg.lora > 0`.
#[allow(clippy::too_many_arguments)]
fn linear(
    b: &mut Builder,
    cfg: &LlamaConfig,
    x: ValueId,
    path: &str,
    fan_in: usize,
    fan_out: usize,
    bias: bool,
    adapt: bool,
) -> Result<ValueId, IrError> {
    let m = b.module(path, "Linear");
    let w = b.param(m, "weight", &[fan_out, fan_in], Init::Normal { std: STD });
    let mut y = b.op(m, "matmul", matmul(true), &[x, w])?;
    if bias {
        let bias = b.param(m, "bias", &[fan_out], Init::Zeros);
        y = b.op(m, "add_bias", binary(BinaryFn::Add), &[y, bias])?;
    }
    if !adapt || cfg.lora == 0 {
        return Ok(y);
    }
    let bound = 1.0 / (fan_in as f64).sqrt();
    let a = b.param(
        m,
        LORA_A,
        &[cfg.lora, fan_in],
        Init::Uniform {
            low: -bound,
            high: bound,
        },
    );
    let w_b = b.param(m, LORA_B, &[fan_out, cfg.lora], Init::Zeros);
    let down = b.op(m, "lora_down", matmul(true), &[x, a])?;
    let up = b.op(m, "lora_up", matmul(true), &[down, w_b])?;
    b.op(m, "lora_add", binary(BinaryFn::Add), &[y, up])
}

/// Leaf names of the LoRA adapter parameters (PEFT's).
const LORA_A: &str = "lora_A";
const LORA_B: &str = "lora_B";

/// Grouped-query causal self-attention over `x: [batch, seq, hidden]`.
fn attention(
    b: &mut Builder,
    cfg: &LlamaConfig,
    ctx: &Shared,
    x: ValueId,
    path: &str,
) -> Result<ValueId, IrError> {
    let m = b.module(path, &format!("{}Attention", cfg.arch.prefix()));
    let (qw, kvw) = (cfg.q_width(), cfg.kv_width());
    let (q, k, v) = if cfg.fused {
        let qkv = linear(
            b,
            cfg,
            x,
            &format!("{path}.qkv_proj"),
            cfg.hidden,
            qw + 2 * kvw,
            cfg.qkv_bias,
            true,
        )?;
        let part = |b: &mut Builder, leaf: &str, start: usize, end: usize| {
            let s = Op::Slice {
                axis: 2,
                start,
                end,
                step: 1,
            };
            b.op(m, &format!("split_{leaf}"), s, &[qkv])
        };
        (
            part(b, "q", 0, qw)?,
            part(b, "k", qw, qw + kvw)?,
            part(b, "v", qw + kvw, qw + 2 * kvw)?,
        )
    } else {
        let proj = |b: &mut Builder, leaf: &str, width: usize| {
            linear(
                b,
                cfg,
                x,
                &format!("{path}.{leaf}"),
                cfg.hidden,
                width,
                cfg.qkv_bias,
                true,
            )
        };
        (
            proj(b, "q_proj", qw)?,
            proj(b, "k_proj", kvw)?,
            proj(b, "v_proj", kvw)?,
        )
    };
    let q = heads_first(b, cfg, m, q, cfg.heads, "q", path)?;
    let k = heads_first(b, cfg, m, k, cfg.kv_heads, "k", path)?;
    let v = heads_first(b, cfg, m, v, cfg.kv_heads, "v", path)?;
    let q = rotate(b, ctx, m, q, cfg.head_dim, "q")?;
    let k = rotate(b, ctx, m, k, cfg.head_dim, "k")?;
    let k = repeat_kv(b, cfg, m, k, "k")?;
    let v = repeat_kv(b, cfg, m, v, "v")?;
    let scale = 1.0 / (cfg.head_dim as f64).sqrt();
    let y = match ctx.mask {
        None => b.op(
            m,
            "attention",
            Op::Attention {
                causal: true,
                scale,
            },
            &[q, k, v],
        )?,
        Some(mask) => {
            let s = b.op(m, "scores", matmul(true), &[q, k])?;
            let c = b.op(
                m,
                "scale",
                Op::Constant {
                    value: scalar(scale as f32),
                },
                &[],
            )?;
            let s = b.op(m, "scaled_scores", binary(BinaryFn::Mul), &[s, c])?;
            let s = b.op(m, "masked_scores", binary(BinaryFn::Add), &[s, mask])?;
            let w = b.op(m, "softmax", Op::Softmax { axis: 3 }, &[s])?;
            b.op(m, "context", matmul(false), &[w, v])?
        }
    };
    let y = b.op(m, "merge_heads", transpose_heads(), &[y])?;
    let y = b.op(
        m,
        "merge_heads_reshape",
        reshape(&[cfg.batch, cfg.seq, qw]),
        &[y],
    )?;
    linear(
        b,
        cfg,
        y,
        &format!("{path}.o_proj"),
        qw,
        cfg.hidden,
        false,
        true,
    )
}

/// An f32 scalar constant.
fn scalar(v: f32) -> TensorData {
    TensorData {
        ty: TensorType::new(DType::F32, Vec::<usize>::new()),
        bytes: v.to_le_bytes().to_vec(),
    }
}

/// `y: [b, s, n * head_dim]` as `[b, n, s, head_dim]`, RMS-normalised per
/// head first when `cfg.qk_norm` (`{path}.q_norm`, `{path}.k_norm`).
fn heads_first(
    b: &mut Builder,
    cfg: &LlamaConfig,
    m: ModuleId,
    y: ValueId,
    n: usize,
    leaf: &str,
    path: &str,
) -> Result<ValueId, IrError> {
    let shape = [cfg.batch, cfg.seq, n, cfg.head_dim];
    let mut y = b.op(m, &format!("{leaf}_reshape"), reshape(&shape), &[y])?;
    if cfg.qk_norm && leaf != "v" {
        let kind = format!("{}RMSNorm", cfg.arch.prefix());
        let norm = format!("{path}.{leaf}_norm");
        y = rms_norm(b, y, &norm, cfg.head_dim, cfg.eps, &kind)?;
    }
    b.op(m, &format!("{leaf}_transpose"), transpose_heads(), &[y])
}

/// `x * cos + rotate_half(x) * sin` over `x: [b, n, s, d]`, where
/// `rotate_half(x) = [-x2, x1]` for the halves `x1`, `x2` of the last axis.
fn rotate(
    b: &mut Builder,
    ctx: &Shared,
    m: ModuleId,
    x: ValueId,
    d: usize,
    leaf: &str,
) -> Result<ValueId, IrError> {
    let half = |start, end| Op::Slice {
        axis: 3,
        start,
        end,
        step: 1,
    };
    let x1 = b.op(m, &format!("{leaf}_rope_x1"), half(0, d / 2), &[x])?;
    let x2 = b.op(m, &format!("{leaf}_rope_x2"), half(d / 2, d), &[x])?;
    let neg = b.op(
        m,
        &format!("{leaf}_rope_neg"),
        Op::Unary { f: UnaryFn::Neg },
        &[x2],
    )?;
    let rot = b.op(
        m,
        &format!("{leaf}_rope_rotated"),
        Op::Concat { axis: 3 },
        &[neg, x1],
    )?;
    let a = b.op(
        m,
        &format!("{leaf}_rope_cos"),
        binary(BinaryFn::Mul),
        &[x, ctx.cos],
    )?;
    let c = b.op(
        m,
        &format!("{leaf}_rope_sin"),
        binary(BinaryFn::Mul),
        &[rot, ctx.sin],
    )?;
    b.op(m, &format!("{leaf}_rope"), binary(BinaryFn::Add), &[a, c])
}

/// `x: [b, kv_heads, s, d]` with each head repeated `heads / kv_heads`
/// times in place (`transformers`' `repeat_kv`); `x` itself without grouping.
fn repeat_kv(
    b: &mut Builder,
    cfg: &LlamaConfig,
    m: ModuleId,
    x: ValueId,
    leaf: &str,
) -> Result<ValueId, IrError> {
    let rep = cfg.heads / cfg.kv_heads;
    if rep == 1 {
        return Ok(x);
    }
    let (bs, kv, s, d) = (cfg.batch, cfg.kv_heads, cfg.seq, cfg.head_dim);
    let x = b.op(
        m,
        &format!("{leaf}_group"),
        reshape(&[bs, kv, 1, s, d]),
        &[x],
    )?;
    let x = b.op(
        m,
        &format!("{leaf}_repeat"),
        Op::Expand {
            shape: vec![bs, kv, rep, s, d],
        },
        &[x],
    )?;
    b.op(
        m,
        &format!("{leaf}_repeat_reshape"),
        reshape(&[bs, cfg.heads, s, d]),
        &[x],
    )
}

/// Swaps the sequence and head axes.
fn transpose_heads() -> Op {
    Op::Transpose {
        perm: vec![0, 2, 1, 3],
    }
}

fn reshape(shape: &[usize]) -> Op {
    Op::Reshape {
        shape: shape.to_vec(),
    }
}

/// `down_proj(silu(gate_proj(x)) * up_proj(x))` (`gate_up_proj` split in
/// halves, gate first, for Phi-3).
fn mlp(b: &mut Builder, cfg: &LlamaConfig, x: ValueId, path: &str) -> Result<ValueId, IrError> {
    let m = b.module(path, &format!("{}MLP", cfg.arch.prefix()));
    let f = cfg.ffn;
    let (gate, up) = if cfg.fused {
        let gu = linear(
            b,
            cfg,
            x,
            &format!("{path}.gate_up_proj"),
            cfg.hidden,
            2 * f,
            false,
            false,
        )?;
        let half = |start, end| Op::Slice {
            axis: 2,
            start,
            end,
            step: 1,
        };
        (
            b.op(m, "split_gate", half(0, f), &[gu])?,
            b.op(m, "split_up", half(f, 2 * f), &[gu])?,
        )
    } else {
        (
            linear(
                b,
                cfg,
                x,
                &format!("{path}.gate_proj"),
                cfg.hidden,
                f,
                false,
                false,
            )?,
            linear(
                b,
                cfg,
                x,
                &format!("{path}.up_proj"),
                cfg.hidden,
                f,
                false,
                false,
            )?,
        )
    };
    let gate = b.op(m, "silu", Op::Unary { f: UnaryFn::Silu }, &[gate])?;
    let y = b.op(m, "gated", binary(BinaryFn::Mul), &[gate, up])?;
    linear(
        b,
        cfg,
        y,
        &format!("{path}.down_proj"),
        f,
        cfg.hidden,
        false,
        false,
    )
}

/// Logits `x @ lm_head^T` (or the tied embedding) as `[b*s, vocab]`, and the
/// mean cross-entropy against `labels` (already shifted: label `t` is the
/// token after position `t`).
fn head_and_loss(
    b: &mut Builder,
    cfg: &LlamaConfig,
    x: ValueId,
    emb: ValueId,
    labels: ValueId,
) -> Result<ValueId, IrError> {
    let m = b.module("lm_head", "Linear");
    let rows = cfg.batch * cfg.seq;
    let w = if cfg.tie {
        emb
    } else {
        b.param(
            m,
            "weight",
            &[cfg.vocab, cfg.hidden],
            Init::Normal { std: STD },
        )
    };
    let x = b.op(m, "flatten", reshape(&[rows, cfg.hidden]), &[x])?;
    let logits = b.op(m, "matmul", matmul(true), &[x, w])?;
    let labels = b.op(ModuleId::ROOT, "labels_flat", reshape(&[rows]), &[labels])?;
    let ce = Op::CrossEntropy {
        ignore_index: Some(-100),
    };
    b.op(ModuleId::ROOT, "loss", ce, &[logits, labels])
}

/// The Llama-family presets, named as users name them, with the sizes of
/// the Hugging Face `config.json` each is named after (`meta-llama/*`,
/// `Qwen/*`, `mistralai/Mistral-7B-v0.1` and `-v0.3`,
/// `microsoft/Phi-3-mini-4k-instruct` and `-medium-4k-instruct`). `seq` is
/// the configured context capped at 8192; `positions` keeps the full one.
pub(crate) fn presets() -> Vec<(&'static str, LlamaConfig)> {
    use Arch::*;
    let m = |arch, l, h, a, kv, f, v, ctx: usize, theta| {
        let mut c = LlamaConfig::preset(arch, l, h, a, kv, f, v, ctx.min(8192), theta);
        c.positions = ctx;
        c
    };
    let llama31 = |c: LlamaConfig, factor| LlamaConfig {
        rope: Rope {
            theta: 500_000.0,
            scaling: rope::Scaling::Llama3 {
                factor,
                low: 1.0,
                high: 4.0,
                original: 8192,
            },
        },
        positions: 131_072,
        ..c
    };
    let tied = |c: LlamaConfig| LlamaConfig { tie: true, ..c };
    let eps6 = |c: LlamaConfig| LlamaConfig { eps: 1e-6, ..c };
    let head_dim = |c: LlamaConfig, d| LlamaConfig { head_dim: d, ..c };
    let window = |c: LlamaConfig, w| LlamaConfig {
        window: Some(w),
        ..c
    };
    vec![
        (
            "llama-mini",
            // A small Llama for demos: grouped-query attention, vocabulary 1024.
            m(Llama, 2, 128, 4, 2, 344, 1024, 128, 10_000.0),
        ),
        (
            "llama2-7b",
            m(Llama, 32, 4096, 32, 32, 11008, 32000, 4096, 1e4),
        ),
        (
            "llama2-13b",
            m(Llama, 40, 5120, 40, 40, 13824, 32000, 4096, 1e4),
        ),
        (
            "llama2-70b",
            m(Llama, 80, 8192, 64, 8, 28672, 32000, 4096, 1e4),
        ),
        (
            "llama3-8b",
            m(Llama, 32, 4096, 32, 8, 14336, 128256, 8192, 5e5),
        ),
        (
            "llama3-70b",
            m(Llama, 80, 8192, 64, 8, 28672, 128256, 8192, 5e5),
        ),
        (
            "llama3.1-8b",
            llama31(m(Llama, 32, 4096, 32, 8, 14336, 128256, 8192, 5e5), 8.0),
        ),
        (
            "llama3.1-70b",
            llama31(m(Llama, 80, 8192, 64, 8, 28672, 128256, 8192, 5e5), 8.0),
        ),
        (
            "llama3.1-405b",
            llama31(m(Llama, 126, 16384, 128, 8, 53248, 128256, 8192, 5e5), 8.0),
        ),
        (
            "llama3.2-1b",
            tied(llama31(
                m(Llama, 16, 2048, 32, 8, 8192, 128256, 8192, 5e5),
                32.0,
            )),
        ),
        (
            "llama3.2-3b",
            tied(llama31(
                m(Llama, 28, 3072, 24, 8, 8192, 128256, 8192, 5e5),
                32.0,
            )),
        ),
        (
            "qwen2.5-0.5b",
            tied(eps6(m(Qwen2, 24, 896, 14, 2, 4864, 151936, 32768, 1e6))),
        ),
        (
            "qwen2.5-1.5b",
            tied(eps6(m(Qwen2, 28, 1536, 12, 2, 8960, 151936, 32768, 1e6))),
        ),
        (
            "qwen2.5-7b",
            eps6(m(Qwen2, 28, 3584, 28, 4, 18944, 152064, 32768, 1e6)),
        ),
        (
            "qwen2.5-14b",
            eps6(m(Qwen2, 48, 5120, 40, 8, 13824, 152064, 32768, 1e6)),
        ),
        (
            "qwen2.5-32b",
            eps6(m(Qwen2, 64, 5120, 40, 8, 27648, 152064, 32768, 1e6)),
        ),
        (
            "qwen2.5-72b",
            eps6(m(Qwen2, 80, 8192, 64, 8, 29568, 152064, 32768, 1e6)),
        ),
        (
            "qwen3-0.6b",
            tied(head_dim(
                eps6(m(Qwen3, 28, 1024, 16, 8, 3072, 151936, 40960, 1e6)),
                128,
            )),
        ),
        (
            "qwen3-8b",
            head_dim(
                eps6(m(Qwen3, 36, 4096, 32, 8, 12288, 151936, 40960, 1e6)),
                128,
            ),
        ),
        (
            "qwen3-32b",
            head_dim(
                eps6(m(Qwen3, 64, 5120, 64, 8, 25600, 151936, 40960, 1e6)),
                128,
            ),
        ),
        (
            "mistral-7b",
            window(m(Mistral, 32, 4096, 32, 8, 14336, 32000, 32768, 1e4), 4096),
        ),
        (
            "mistral-7b-v0.3",
            m(Mistral, 32, 4096, 32, 8, 14336, 32768, 32768, 1e6),
        ),
        (
            "phi3-mini",
            window(m(Phi3, 32, 3072, 32, 32, 8192, 32064, 4096, 1e4), 2047),
        ),
        (
            "phi3-medium",
            window(m(Phi3, 40, 5120, 40, 10, 17920, 32064, 4096, 1e4), 2047),
        ),
    ]
}
