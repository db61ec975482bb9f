//! GPT-2 (Radford et al. 2019) exactly as nanoGPT and Hugging Face's
//! `GPT2LMHeadModel` define it: pre-LayerNorm blocks of causal self-attention
//! and a GELU MLP, learned position embeddings, and an output projection tied
//! to the token embedding. Module paths and parameter names follow Hugging
//! Face (`transformer.h.3.attn.c_attn.weight`).
//!
//! `lora=R` adds LoRA adapters (Hu et al. 2021) of rank R to each block's
//! attention projections `c_attn` and `c_proj`: `y = x W + b + (x A) B`
//! with `A: [fan_in, R]` drawn from Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))
//! (PEFT's Kaiming-uniform bound), `B: [R, fan_out]` zero (so the model
//! starts as the base model) and scaling alpha / R = 1 (alpha = R). Every
//! other parameter is frozen (`requires_grad: false`), so an adapter and its
//! frozen base share a module, and an FSDP unit.

use super::builder::{binary, matmul, reshape, transpose_heads, Builder, CausalLm, LORA_A, LORA_B};
use super::spec::{required, Spec};
use super::ZooModel;
use crate::error::FrontendError;
use fsdpc_ir::Init;
use fsdpc_ir::{BinaryFn, DType, IrError, ModuleId, Op, TensorData, TensorType, UnaryFn, ValueId};

/// LayerNorm epsilon of GPT-2.
const LN_EPS: f64 = 1e-5;
/// Std of GPT-2's Linear and token-embedding initialisation.
const STD: f64 = 0.02;
/// Std of the position embedding's initialisation.
const POS_STD: f64 = 0.01;

/// The GELU form used in the MLP.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Gelu {
    /// The tanh approximation GPT-2 was trained with (`gelu_new`).
    Tanh,
    /// The exact erf form.
    Erf,
}

/// Every size and option of a GPT-2-style model.
#[derive(Clone, Debug, PartialEq)]
pub struct GptConfig {
    /// Number of transformer blocks.
    pub layers: usize,
    /// Model width.
    pub hidden: usize,
    /// Attention heads; `hidden` must be divisible by it.
    pub heads: usize,
    /// Sequence length of one sample.
    pub seq: usize,
    /// Rows of the position embedding (`n_positions`); at least `seq`.
    pub positions: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Samples per step on one rank.
    pub batch: usize,
    /// MLP width as a multiple of `hidden`.
    pub mlp_ratio: usize,
    /// Dropout probability (embeddings, attention output, MLP output).
    pub dropout: f64,
    /// Whether the output projection reuses the token embedding.
    pub tie: bool,
    /// GELU form.
    pub gelu: Gelu,
    /// LoRA rank of the attention adapters (0: none; the base is frozen
    /// when it is not 0).
    pub lora: usize,
}

/// The keys a `gpt` spec accepts.
pub(crate) const KEYS: &[&str] = &[
    "layers",
    "hidden",
    "heads",
    "seq",
    "positions",
    "vocab",
    "batch",
    "mlp_ratio",
    "dropout",
    "tie",
    "gelu",
    "lora",
];

impl GptConfig {
    /// A preset's sizes with batch 1, ratio 4, no dropout, tied, tanh GELU.
    pub(crate) fn preset(
        layers: usize,
        hidden: usize,
        heads: usize,
        seq: usize,
        vocab: usize,
    ) -> GptConfig {
        GptConfig {
            layers,
            hidden,
            heads,
            seq,
            positions: seq,
            vocab,
            batch: 1,
            mlp_ratio: 4,
            dropout: 0.0,
            tie: true,
            gelu: Gelu::Tanh,
            lora: 0,
        }
    }

    /// The config `spec` describes, starting from `base` (a preset) if given.
    pub(crate) fn from_spec(
        spec: &mut Spec<'_>,
        base: Option<&GptConfig>,
    ) -> Result<GptConfig, FrontendError> {
        let need = "layers, hidden, heads, seq and vocab";
        let layers = spec.size("layers")?;
        let hidden = spec.size("hidden")?;
        let heads = spec.size("heads")?;
        let seq = spec.size("seq")?;
        let positions = spec.size("positions")?;
        let vocab = spec.size("vocab")?;
        let batch = spec.size("batch")?;
        let mlp_ratio = spec.size("mlp_ratio")?;
        let dropout = spec.probability("dropout")?;
        let tie = spec.flag("tie")?;
        let gelu = spec.choice("gelu", &["tanh", "erf"])?;
        let lora = spec.size("lora")?;
        spec.finish(KEYS)?;
        let seq = required(spec, "seq", seq, base.map(|b| b.seq), need)?;
        let cfg = GptConfig {
            layers: required(spec, "layers", layers, base.map(|b| b.layers), need)?,
            hidden: required(spec, "hidden", hidden, base.map(|b| b.hidden), need)?,
            heads: required(spec, "heads", heads, base.map(|b| b.heads), need)?,
            seq,
            // A preset keeps its embedding table when seq shrinks (as GPT-2's
            // 1024 positions do); a custom spec sizes it to seq.
            positions: positions
                .or(base.map(|b| b.positions.max(seq)))
                .unwrap_or(seq),
            vocab: required(spec, "vocab", vocab, base.map(|b| b.vocab), need)?,
            batch: batch.or(base.map(|b| b.batch)).unwrap_or(1),
            mlp_ratio: mlp_ratio.or(base.map(|b| b.mlp_ratio)).unwrap_or(4),
            dropout: dropout.or(base.map(|b| b.dropout)).unwrap_or(0.0),
            tie: tie.or(base.map(|b| b.tie)).unwrap_or(true),
            gelu: match gelu {
                Some("erf") => Gelu::Erf,
                Some(_) => Gelu::Tanh,
                None => base.map_or(Gelu::Tanh, |b| b.gelu),
            },
            lora: lora.or(base.map(|b| b.lora)).unwrap_or(0),
        };
        cfg.check(spec)?;
        Ok(cfg)
    }

    fn check(&self, spec: &Spec<'_>) -> Result<(), FrontendError> {
        if self.hidden % self.heads != 0 {
            return Err(spec.error(format!(
                "hidden={} is not divisible by heads={}; each head needs hidden/heads whole dimensions",
                self.hidden, self.heads
            )));
        }
        if self.seq > self.positions {
            return Err(spec.error(format!(
                "seq={} is longer than the {} position embeddings; give positions={} as well",
                self.seq, self.positions, self.seq
            )));
        }
        if self.mlp_ratio > 64 {
            return Err(spec.error(format!(
                "mlp_ratio={} is too large; use 1..=64 (GPT-2 uses 4)",
                self.mlp_ratio
            )));
        }
        Ok(())
    }

    /// Parameter elements of the model (the tied projection counted once).
    pub fn param_count(&self) -> u64 {
        let (h, v, p) = (self.hidden as u64, self.vocab as u64, self.positions as u64);
        let inner = h * self.mlp_ratio as u64;
        let block =
            4 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * inner + inner) + (inner * h + h);
        let head = if self.tie { 0 } else { v * h };
        // Adapters of c_attn (h -> 3h) and c_proj (h -> h).
        let lora = self.lora as u64 * ((h + 3 * h) + (h + h));
        v * h + p * h + self.layers as u64 * (block + lora) + 2 * h + head
    }
}

/// Builds the forward graph (with its loss) of `cfg`, named `name`.
pub(crate) fn build(name: &str, cfg: &GptConfig) -> Result<ZooModel, FrontendError> {
    let mut b = Builder::new(name, "GPT2LMHeadModel");
    let (batch, seq) = (cfg.batch, cfg.seq);
    let ids =
        b.g.add_input("ids", TensorType::new(DType::I64, [batch, seq]));
    let labels =
        b.g.add_input("labels", TensorType::new(DType::I64, [batch, seq]));
    b.module("transformer", "GPT2Model");
    let (mut x, wte) = embeddings(&mut b, cfg, ids)?;
    b.module("transformer.h", "ModuleList");
    for i in 0..cfg.layers {
        x = block(&mut b, cfg, x, &format!("transformer.h.{i}"))?;
    }
    x = b.layer_norm(x, "transformer.ln_f", cfg.hidden, LN_EPS)?;
    let lm = CausalLm {
        tied: cfg.tie.then_some(wte),
        batch,
        seq,
        hidden: cfg.hidden,
        vocab: cfg.vocab,
        std: STD,
        lora: cfg.lora > 0,
    };
    Ok(b.finish_causal_lm(name, x, labels, lm)?)
}

/// `drop(wte[ids] + wpe[0..seq])`; returns the sum and the `wte` parameter.
fn embeddings(
    b: &mut Builder,
    cfg: &GptConfig,
    ids: ValueId,
) -> Result<(ValueId, ValueId), IrError> {
    let t = b.module("transformer", "GPT2Model");
    let wte_m = b.module("transformer.wte", "Embedding");
    let wte = b.param(
        wte_m,
        "weight",
        &[cfg.vocab, cfg.hidden],
        Init::Normal { std: STD },
    );
    let tok = b.op(wte_m, "gather", Op::Gather { axis: 0 }, &[wte, ids])?;
    let wpe_m = b.module("transformer.wpe", "Embedding");
    let wpe = b.param(
        wpe_m,
        "weight",
        &[cfg.positions, cfg.hidden],
        Init::Normal { std: POS_STD },
    );
    let positions = b.op(
        t,
        "positions",
        Op::Constant {
            value: arange(cfg.seq),
        },
        &[],
    )?;
    let pos = b.op(wpe_m, "gather", Op::Gather { axis: 0 }, &[wpe, positions])?;
    let x = b.op(t, "add_embeddings", binary(BinaryFn::Add), &[tok, pos])?;
    Ok((b.dropout(x, t, "drop", cfg.dropout)?, wte))
}

/// The i64 tensor `[0, 1, ..., n-1]`.
fn arange(n: usize) -> TensorData {
    TensorData {
        ty: TensorType::new(DType::I64, [n]),
        bytes: (0..n as i64).flat_map(i64::to_le_bytes).collect(),
    }
}

/// One pre-LayerNorm block: `x + attn(ln_1(x))`, then `x + mlp(ln_2(x))`.
fn block(b: &mut Builder, cfg: &GptConfig, x: ValueId, path: &str) -> Result<ValueId, IrError> {
    let m = b.module(path, "GPT2Block");
    let h = b.layer_norm(x, &format!("{path}.ln_1"), cfg.hidden, LN_EPS)?;
    let a = attention(b, cfg, h, &format!("{path}.attn"))?;
    let x = b.op(m, "residual_attn", binary(BinaryFn::Add), &[x, a])?;
    let h = b.layer_norm(x, &format!("{path}.ln_2"), cfg.hidden, LN_EPS)?;
    let f = mlp(b, cfg, h, &format!("{path}.mlp"))?;
    b.op(m, "residual_mlp", binary(BinaryFn::Add), &[x, f])
}

/// GPT-2's residual-projection init: std 0.02 / sqrt(2 * layers).
fn proj_std(cfg: &GptConfig) -> f64 {
    STD / (2.0 * cfg.layers as f64).sqrt()
}

/// Causal multi-head self-attention over `x: [batch, seq, hidden]`.
fn attention(b: &mut Builder, cfg: &GptConfig, x: ValueId, path: &str) -> Result<ValueId, IrError> {
    let m = b.module(path, "GPT2Attention");
    let hd = cfg.hidden / cfg.heads;
    let qkv = b.linear(
        x,
        &format!("{path}.c_attn"),
        cfg.hidden,
        3 * cfg.hidden,
        STD,
    )?;
    let qkv = lora(b, cfg, x, qkv, &format!("{path}.c_attn"), 3 * cfg.hidden)?;
    let mut split = Vec::with_capacity(3);
    for (i, leaf) in ["q", "k", "v"].into_iter().enumerate() {
        split.push(heads_first(b, cfg, m, qkv, i, leaf)?);
    }
    let scale = 1.0 / (hd as f64).sqrt();
    let y = b.op(
        m,
        "attention",
        Op::Attention {
            causal: true,
            scale,
        },
        &split,
    )?;
    let y = b.op(m, "merge_heads", transpose_heads(), &[y])?;
    let y = b.op(
        m,
        "merge_heads_reshape",
        reshape(&[cfg.batch, cfg.seq, cfg.hidden]),
        &[y],
    )?;
    let z = b.linear(
        y,
        &format!("{path}.c_proj"),
        cfg.hidden,
        cfg.hidden,
        proj_std(cfg),
    )?;
    let z = lora(b, cfg, y, z, &format!("{path}.c_proj"), cfg.hidden)?;
    b.dropout(z, m, "resid_dropout", cfg.dropout)
}

/// `y + (x @ A) @ B` in the Linear module at `path` when `cfg.lora > 0`
/// (see the module header); `y` itself otherwise. `x` is the Linear's
/// input `[batch, seq, hidden]`.
fn lora(
    b: &mut Builder,
    cfg: &GptConfig,
    x: ValueId,
    y: ValueId,
    path: &str,
    fan_out: usize,
) -> Result<ValueId, IrError> {
    if cfg.lora == 0 {
        return Ok(y);
    }
    let m = b.module(path, "Linear");
    let bound = 1.0 / (cfg.hidden as f64).sqrt();
    let a = b.param(
        m,
        LORA_A,
        &[cfg.hidden, cfg.lora],
        Init::Uniform {
            low: -bound,
            high: bound,
        },
    );
    let w_b = b.param(m, LORA_B, &[cfg.lora, fan_out], Init::Zeros);
    let down = b.op(m, "lora_down", matmul(false), &[x, a])?;
    let up = b.op(m, "lora_up", matmul(false), &[down, w_b])?;
    b.op(m, "lora_add", binary(BinaryFn::Add), &[y, up])
}

/// Part `i` (q, k or v) of `qkv: [b, s, 3h]` as `[b, heads, s, head_dim]`.
fn heads_first(
    b: &mut Builder,
    cfg: &GptConfig,
    m: ModuleId,
    qkv: ValueId,
    i: usize,
    leaf: &str,
) -> Result<ValueId, IrError> {
    let h = cfg.hidden;
    let slice = Op::Slice {
        axis: 2,
        start: i * h,
        end: (i + 1) * h,
        step: 1,
    };
    let part = b.op(m, &format!("split_{leaf}"), slice, &[qkv])?;
    let shape = [cfg.batch, cfg.seq, cfg.heads, h / cfg.heads];
    let part = b.op(m, &format!("{leaf}_reshape"), reshape(&shape), &[part])?;
    b.op(m, &format!("{leaf}_transpose"), transpose_heads(), &[part])
}

/// `c_proj(gelu(c_fc(x)))`, with dropout on the output.
fn mlp(b: &mut Builder, cfg: &GptConfig, x: ValueId, path: &str) -> Result<ValueId, IrError> {
    let m = b.module(path, "GPT2MLP");
    let inner = cfg.hidden * cfg.mlp_ratio;
    let y = b.linear(x, &format!("{path}.c_fc"), cfg.hidden, inner, STD)?;
    let f = match cfg.gelu {
        Gelu::Tanh => UnaryFn::GeluTanh,
        Gelu::Erf => UnaryFn::GeluErf,
    };
    let y = b.op(m, "gelu", Op::Unary { f }, &[y])?;
    let y = b.linear(
        y,
        &format!("{path}.c_proj"),
        inner,
        cfg.hidden,
        proj_std(cfg),
    )?;
    b.dropout(y, m, "dropout", cfg.dropout)
}
