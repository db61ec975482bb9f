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
//! query heads. Rotary embeddings (`../rope.rs`) are constants of the graph.
//! The config and its spec are here, the graph in `graph.rs`, the presets in
//! `presets.rs`.
//! Weights are `[out, in]` as `nn.Linear` stores them and parameter names are
//! the Hugging Face ones (`model.layers.3.self_attn.q_proj.weight`), so a
//! checkpoint's tensors map one to one onto the parameters.
//!
//! `lora=R` adds LoRA adapters (Hu et al. 2021) of rank R to every attention
//! projection (q, k, v and o; `qkv_proj` and `o_proj` for Phi-3), as the GPT
//! family does: `A: [R, in]` Kaiming-uniform, `B: [out, R]` zero, scaling 1,
//! and every other parameter frozen.

mod graph;
mod presets;

use super::rope::{self, Rope};
use super::spec::{required, Spec};
use crate::error::FrontendError;

pub(crate) use graph::build;
pub(crate) use presets::presets;

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
