//! T5 (Raffel et al. 2020), the encoder-decoder as Hugging Face's
//! `T5ForConditionalGeneration` defines it: pre-norm blocks with T5's
//! LayerNorm (a scale, no bias, no mean subtraction: the IR's `RmsNorm`,
//! eps 1e-6), bidirectional self-attention in the encoder, causal
//! self-attention and cross-attention in the decoder, a ReLU feed-forward
//! (`act=relu`, T5 v1.0) or a gated-GELU one (`act=gated-gelu`, v1.1:
//! `gelu_tanh(x Wi0) * (x Wi1)`), no biases anywhere, and the LM head tied
//! to the shared embedding (`tie=true`, v1.0: the decoder output is scaled
//! by `hidden^-0.5` first) or untied (v1.1).
//!
//! Conventions:
//! - Module paths, kinds and parameter names follow Hugging Face
//!   (`encoder.block.3.layer.0.SelfAttention.q.weight`), and Linear weights
//!   are `[out, in]` as `nn.Linear` stores them (the matmul reads them
//!   transposed). Blocks are `encoder.block.i` and `decoder.block.i`, both
//!   of kind `T5Block`, so `--wrap blocks` makes `2 * layers` units.
//! - Attention scores are not scaled (T5 folds `kv^-0.5` into the query's
//!   initialisation). Self-attention is written out as matmuls, an add of
//!   the position bias, a softmax and a matmul, because the IR's fused
//!   `Attention` takes no bias; cross-attention has no bias and uses it.
//! - Relative position bias: the bucket of every (query, key) pair is a
//!   constant computed here at build time (T5's log-bucketed relative
//!   distance: `buckets` buckets, exact below half of them, logarithmic up
//!   to `max_distance`; split by sign in the encoder, past-only in the
//!   decoder). The bias table `[buckets, heads]` is a parameter of each
//!   stack's first self-attention
//!   (`encoder.block.0.layer.0.SelfAttention.relative_attention_bias`);
//!   the bias it gives (with the decoder's causal mask added there) is
//!   computed in that first layer and added in every layer of the stack.
//! - Data: `ids [batch, seq]` (encoder tokens) and `labels [batch,
//!   dec_seq]`; the decoder reads the labels shifted right by one with
//!   start token 0 (`_shift_right`), built in the graph, and the loss is
//!   the mean cross-entropy over every decoder position (ignore index
//!   -100). Label values must be tokens (the shift feeds them to the
//!   embedding). The runtime's data feeds the labels as the next tokens of
//!   the first `dec_seq` positions of the ids' window, so training data
//!   needs `dec_seq <= seq`; planning and simulation do not.
//! - Initialisation as Hugging Face's `_init_weights` with factor 1:
//!   embedding and untied head Normal(0, 1); q Normal(0, (hidden *
//!   kv)^-0.5), k and v Normal(0, hidden^-0.5), o Normal(0, (heads *
//!   kv)^-0.5); the feed-forward's input projections Normal(0,
//!   hidden^-0.5), its output Normal(0, ff^-0.5); bias table Normal(0,
//!   hidden^-0.5); norms ones.

use super::builder::{binary, matmul, reshape, transpose_heads, Builder};
use super::spec::{required, Spec};
use super::ZooModel;
use crate::error::FrontendError;
use fsdpc_ir::Init;
use fsdpc_ir::{BinaryFn, DType, IrError, ModuleId, Op, TensorData, TensorType, UnaryFn, ValueId};

/// T5's LayerNorm epsilon.
const NORM_EPS: f64 = 1e-6;
/// What the decoder's causal mask adds to a future position's score.
const MASKED: f64 = -1e9;

/// The feed-forward's activation.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum T5Act {
    /// `wo(relu(wi(x)))` (T5 v1.0).
    Relu,
    /// `wo(gelu_tanh(wi_0(x)) * wi_1(x))` (T5 v1.1, `gated-gelu`).
    GatedGelu,
}

/// Every size and option of a T5 model.
#[derive(Clone, Debug, PartialEq)]
pub struct T5Config {
    /// Blocks in the encoder, and in the decoder.
    pub layers: usize,
    /// Model width (`d_model`).
    pub hidden: usize,
    /// Feed-forward width (`d_ff`).
    pub ff: usize,
    /// Attention heads.
    pub heads: usize,
    /// Width of one head (`d_kv`); `heads * kv` need not equal `hidden`.
    pub kv: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Encoder sequence length.
    pub seq: usize,
    /// Decoder sequence length.
    pub dec_seq: usize,
    /// Samples per step on one rank.
    pub batch: usize,
    /// Feed-forward activation.
    pub act: T5Act,
    /// Whether the LM head reuses the shared embedding.
    pub tie: bool,
    /// Relative-position buckets.
    pub buckets: usize,
    /// Distance beyond which relative positions share the last bucket.
    pub max_distance: usize,
    /// Dropout probability (embeddings, sublayer outputs, attention
    /// weights, feed-forward hidden, final outputs).
    pub dropout: f64,
}

/// The keys a `t5` spec accepts.
pub(crate) const KEYS: &[&str] = &[
    "layers",
    "hidden",
    "ff",
    "heads",
    "kv",
    "vocab",
    "seq",
    "dec_seq",
    "batch",
    "act",
    "tie",
    "buckets",
    "max_distance",
    "dropout",
];

impl T5Config {
    /// A published configuration (Hugging Face `config.json`): batch 1,
    /// sequence 512 in and out, 32 buckets up to distance 128, no dropout;
    /// vocabulary 32128. v1.0 (`Relu`) ties the head, v1.1 does not.
    pub(crate) fn preset(
        layers: usize,
        hidden: usize,
        ff: usize,
        heads: usize,
        kv: usize,
        act: T5Act,
    ) -> T5Config {
        T5Config {
            layers,
            hidden,
            ff,
            heads,
            kv,
            vocab: 32128,
            seq: 512,
            dec_seq: 512,
            batch: 1,
            act,
            tie: act == T5Act::Relu,
            buckets: 32,
            max_distance: 128,
            dropout: 0.0,
        }
    }

    /// The config `spec` describes, starting from `base` (a preset) if given.
    pub(crate) fn from_spec(
        spec: &mut Spec<'_>,
        base: Option<&T5Config>,
    ) -> Result<T5Config, FrontendError> {
        let need = "layers, hidden, ff, heads, vocab and seq";
        let layers = spec.size("layers")?;
        let hidden = spec.size("hidden")?;
        let ff = spec.size("ff")?;
        let heads = spec.size("heads")?;
        let kv = spec.size("kv")?;
        let vocab = spec.size("vocab")?;
        let seq = spec.size("seq")?;
        let dec_seq = spec.size("dec_seq")?;
        let batch = spec.size("batch")?;
        let act = spec.choice("act", &["relu", "gated-gelu"])?;
        let tie = spec.flag("tie")?;
        let buckets = spec.size("buckets")?;
        let max_distance = spec.size("max_distance")?;
        let dropout = spec.probability("dropout")?;
        spec.finish(KEYS)?;
        let hidden = required(spec, "hidden", hidden, base.map(|b| b.hidden), need)?;
        let heads = required(spec, "heads", heads, base.map(|b| b.heads), need)?;
        let seq = required(spec, "seq", seq, base.map(|b| b.seq), need)?;
        let act = match act {
            Some("gated-gelu") => T5Act::GatedGelu,
            Some(_) => T5Act::Relu,
            None => base.map_or(T5Act::Relu, |b| b.act),
        };
        let cfg = T5Config {
            layers: required(spec, "layers", layers, base.map(|b| b.layers), need)?,
            hidden,
            ff: required(spec, "ff", ff, base.map(|b| b.ff), need)?,
            heads,
            // A custom spec without kv splits the width over the heads.
            kv: kv.or(base.map(|b| b.kv)).unwrap_or(hidden / heads),
            vocab: required(spec, "vocab", vocab, base.map(|b| b.vocab), need)?,
            seq,
            dec_seq: dec_seq.or(base.map(|b| b.dec_seq)).unwrap_or(seq),
            batch: batch.or(base.map(|b| b.batch)).unwrap_or(1),
            act,
            tie: tie.or(base.map(|b| b.tie)).unwrap_or(act == T5Act::Relu),
            buckets: buckets.or(base.map(|b| b.buckets)).unwrap_or(32),
            max_distance: max_distance.or(base.map(|b| b.max_distance)).unwrap_or(128),
            dropout: dropout.or(base.map(|b| b.dropout)).unwrap_or(0.0),
        };
        cfg.check(spec)?;
        Ok(cfg)
    }

    fn check(&self, spec: &Spec<'_>) -> Result<(), FrontendError> {
        if self.kv == 0 {
            return Err(spec.error(format!(
                "heads={} is wider than hidden={}; give kv= (the width of one head)",
                self.heads, self.hidden
            )));
        }
        if self.buckets < 4 {
            return Err(spec.error(format!(
                "buckets={} is too few; the encoder splits them by sign and each half \
                 needs exact and logarithmic buckets (T5 uses 32)",
                self.buckets
            )));
        }
        if self.max_distance * 4 <= self.buckets {
            return Err(spec.error(format!(
                "max_distance={} must exceed a quarter of buckets={} (T5 uses 128 and 32)",
                self.max_distance, self.buckets
            )));
        }
        Ok(())
    }

    /// Width of the attention's projections, `heads * kv`.
    pub fn inner(&self) -> usize {
        self.heads * self.kv
    }

    /// Parameter elements of the model (a tied head counted once).
    pub fn param_count(&self) -> u64 {
        let (h, v) = (self.hidden as u64, self.vocab as u64);
        let attn = 4 * h * self.inner() as u64;
        let ff = match self.act {
            T5Act::Relu => 2,
            T5Act::GatedGelu => 3,
        } * h
            * self.ff as u64;
        let bias = (self.buckets * self.heads) as u64;
        let enc_block = attn + ff + 2 * h;
        let dec_block = 2 * attn + ff + 3 * h;
        let stacks = self.layers as u64 * (enc_block + dec_block) + 2 * (bias + h);
        let head = if self.tie { 0 } else { v * h };
        v * h + stacks + head
    }
}

/// Builds the forward graph (with its loss) of `cfg`, named `name`.
pub(crate) fn build(name: &str, cfg: &T5Config) -> Result<ZooModel, FrontendError> {
    let mut b = Builder::new(name, "T5ForConditionalGeneration");
    let (batch, seq, dseq) = (cfg.batch, cfg.seq, cfg.dec_seq);
    let ids =
        b.g.add_input("ids", TensorType::new(DType::I64, [batch, seq]));
    let labels =
        b.g.add_input("labels", TensorType::new(DType::I64, [batch, dseq]));
    let shared_m = b.module("shared", "Embedding");
    let shared = b.param(
        shared_m,
        "weight",
        &[cfg.vocab, cfg.hidden],
        Init::Normal { std: 1.0 },
    );
    let enc = encoder(&mut b, cfg, shared, ids)?;
    let dec_ids = shift_right(&mut b, cfg, labels)?;
    let x = decoder(&mut b, cfg, shared, dec_ids, enc)?;
    let loss = lm_head_and_loss(&mut b, cfg, x, shared, labels)?;
    b.g.outputs = vec![loss];
    Ok(ZooModel {
        name: name.to_string(),
        graph: b.g,
        loss,
        tokens_per_sample: (seq + dseq) as u64,
    })
}

/// The encoder stack: embedding, blocks, final norm.
fn encoder(
    b: &mut Builder,
    cfg: &T5Config,
    shared: ValueId,
    ids: ValueId,
) -> Result<ValueId, IrError> {
    let m = b.module("encoder", "T5Stack");
    let mut x = embed(b, cfg, "encoder", shared, ids)?;
    b.module("encoder.block", "ModuleList");
    let mut bias = None;
    for i in 0..cfg.layers {
        let path = format!("encoder.block.{i}");
        b.module(&path, "T5Block");
        let (y, pb) = self_attention_layer(b, cfg, x, &format!("{path}.layer.0"), false, bias)?;
        bias = Some(pb);
        x = ff_layer(b, cfg, y, &format!("{path}.layer.1"))?;
    }
    let x = norm(b, x, "encoder.final_layer_norm", cfg.hidden)?;
    b.dropout(x, m, "dropout", cfg.dropout)
}

/// The decoder stack over the encoder's output `enc`.
fn decoder(
    b: &mut Builder,
    cfg: &T5Config,
    shared: ValueId,
    ids: ValueId,
    enc: ValueId,
) -> Result<ValueId, IrError> {
    let m = b.module("decoder", "T5Stack");
    let mut x = embed(b, cfg, "decoder", shared, ids)?;
    b.module("decoder.block", "ModuleList");
    let mut bias = None;
    for i in 0..cfg.layers {
        let path = format!("decoder.block.{i}");
        b.module(&path, "T5Block");
        let (y, pb) = self_attention_layer(b, cfg, x, &format!("{path}.layer.0"), true, bias)?;
        bias = Some(pb);
        x = cross_attention_layer(b, cfg, y, enc, &format!("{path}.layer.1"))?;
        x = ff_layer(b, cfg, x, &format!("{path}.layer.2"))?;
    }
    let x = norm(b, x, "decoder.final_layer_norm", cfg.hidden)?;
    b.dropout(x, m, "dropout", cfg.dropout)
}

/// `dropout(shared[ids])` in `{stack}.embed_tokens`.
fn embed(
    b: &mut Builder,
    cfg: &T5Config,
    stack: &str,
    shared: ValueId,
    ids: ValueId,
) -> Result<ValueId, IrError> {
    let m = b.module(&format!("{stack}.embed_tokens"), "Embedding");
    let x = b.op(m, "gather", Op::Gather { axis: 0 }, &[shared, ids])?;
    let s = b.module(stack, "T5Stack");
    b.dropout(x, s, "embed_dropout", cfg.dropout)
}

/// The decoder's input ids: `labels` shifted right by one position with
/// start token 0.
fn shift_right(b: &mut Builder, cfg: &T5Config, labels: ValueId) -> Result<ValueId, IrError> {
    let m = ModuleId::ROOT;
    let start = b.op(
        m,
        "decoder_start",
        Op::Constant {
            value: i64_tensor(&[cfg.batch, 1], &vec![0; cfg.batch]),
        },
        &[],
    )?;
    if cfg.dec_seq == 1 {
        return Ok(start);
    }
    let prev = Op::Slice {
        axis: 1,
        start: 0,
        end: cfg.dec_seq - 1,
        step: 1,
    };
    let prev = b.op(m, "labels_prev", prev, &[labels])?;
    b.op(
        m,
        "decoder_input_ids",
        Op::Concat { axis: 1 },
        &[start, prev],
    )
}

/// `x + dropout(attn(norm(x)))` of a self-attention layer at `path`; the
/// position bias is computed here when `bias` is `None` (the stack's first
/// layer) and returned for the next layers.
fn self_attention_layer(
    b: &mut Builder,
    cfg: &T5Config,
    x: ValueId,
    path: &str,
    causal: bool,
    bias: Option<ValueId>,
) -> Result<(ValueId, ValueId), IrError> {
    let m = b.module(path, "T5LayerSelfAttention");
    let h = norm(b, x, &format!("{path}.layer_norm"), cfg.hidden)?;
    let apath = format!("{path}.SelfAttention");
    let am = b.module(&apath, "T5Attention");
    let bias = match bias {
        Some(v) => v,
        None => position_bias(b, cfg, &apath, causal)?,
    };
    let seq = if causal { cfg.dec_seq } else { cfg.seq };
    let q = project_heads(b, cfg, h, &apath, "q", seq, q_std(cfg))?;
    let k = project_heads(b, cfg, h, &apath, "k", seq, k_std(cfg))?;
    let v = project_heads(b, cfg, h, &apath, "v", seq, k_std(cfg))?;
    let scores = b.op(am, "scores", matmul(true), &[q, k])?;
    let scores = b.op(
        am,
        "add_position_bias",
        binary(BinaryFn::Add),
        &[scores, bias],
    )?;
    let w = b.op(am, "softmax", Op::Softmax { axis: 3 }, &[scores])?;
    let w = b.dropout(w, am, "attn_dropout", cfg.dropout)?;
    let y = b.op(am, "context", matmul(false), &[w, v])?;
    let y = merge_heads(b, cfg, am, y, seq)?;
    let y = linear(
        b,
        y,
        &format!("{apath}.o"),
        cfg.inner(),
        cfg.hidden,
        o_std(cfg),
    )?;
    let y = b.dropout(y, m, "dropout", cfg.dropout)?;
    let x = b.op(m, "residual", binary(BinaryFn::Add), &[x, y])?;
    Ok((x, bias))
}

/// `x + dropout(attn(norm(x), enc))` of a decoder's cross-attention layer.
fn cross_attention_layer(
    b: &mut Builder,
    cfg: &T5Config,
    x: ValueId,
    enc: ValueId,
    path: &str,
) -> Result<ValueId, IrError> {
    let m = b.module(path, "T5LayerCrossAttention");
    let h = norm(b, x, &format!("{path}.layer_norm"), cfg.hidden)?;
    let apath = format!("{path}.EncDecAttention");
    let am = b.module(&apath, "T5Attention");
    let q = project_heads(b, cfg, h, &apath, "q", cfg.dec_seq, q_std(cfg))?;
    let k = project_heads(b, cfg, enc, &apath, "k", cfg.seq, k_std(cfg))?;
    let v = project_heads(b, cfg, enc, &apath, "v", cfg.seq, k_std(cfg))?;
    let attn = Op::Attention {
        causal: false,
        scale: 1.0,
    };
    let y = if cfg.dropout > 0.0 {
        // The fused op has no dropout on its weights; write it out.
        let s = b.op(am, "scores", matmul(true), &[q, k])?;
        let w = b.op(am, "softmax", Op::Softmax { axis: 3 }, &[s])?;
        let w = b.dropout(w, am, "attn_dropout", cfg.dropout)?;
        b.op(am, "context", matmul(false), &[w, v])?
    } else {
        b.op(am, "attention", attn, &[q, k, v])?
    };
    let y = merge_heads(b, cfg, am, y, cfg.dec_seq)?;
    let y = linear(
        b,
        y,
        &format!("{apath}.o"),
        cfg.inner(),
        cfg.hidden,
        o_std(cfg),
    )?;
    let y = b.dropout(y, m, "dropout", cfg.dropout)?;
    b.op(m, "residual", binary(BinaryFn::Add), &[x, y])
}

/// `x + dropout(ff(norm(x)))` of a feed-forward layer at `path`.
fn ff_layer(b: &mut Builder, cfg: &T5Config, x: ValueId, path: &str) -> Result<ValueId, IrError> {
    let m = b.module(path, "T5LayerFF");
    let h = norm(b, x, &format!("{path}.layer_norm"), cfg.hidden)?;
    let dpath = format!("{path}.DenseReluDense");
    let (hd, ffw) = (cfg.hidden, cfg.ff);
    let in_std = (hd as f64).powf(-0.5);
    let y = match cfg.act {
        T5Act::Relu => {
            let dm = b.module(&dpath, "T5DenseActDense");
            let y = linear(b, h, &format!("{dpath}.wi"), hd, ffw, in_std)?;
            let y = b.op(dm, "relu", Op::Unary { f: UnaryFn::Relu }, &[y])?;
            b.dropout(y, dm, "dropout", cfg.dropout)?
        }
        T5Act::GatedGelu => {
            let dm = b.module(&dpath, "T5DenseGatedActDense");
            let g = linear(b, h, &format!("{dpath}.wi_0"), hd, ffw, in_std)?;
            let f = UnaryFn::GeluTanh;
            let g = b.op(dm, "gelu", Op::Unary { f }, &[g])?;
            let l = linear(b, h, &format!("{dpath}.wi_1"), hd, ffw, in_std)?;
            let y = b.op(dm, "gate", binary(BinaryFn::Mul), &[g, l])?;
            b.dropout(y, dm, "dropout", cfg.dropout)?
        }
    };
    let ff_std = (ffw as f64).powf(-0.5);
    let y = linear(b, y, &format!("{dpath}.wo"), ffw, hd, ff_std)?;
    let y = b.dropout(y, m, "dropout", cfg.dropout)?;
    b.op(m, "residual", binary(BinaryFn::Add), &[x, y])
}

/// Logits of the decoder output `x` (scaled by `hidden^-0.5` when tied) as
/// `[batch * dec_seq, vocab]` and the mean cross-entropy against `labels`.
fn lm_head_and_loss(
    b: &mut Builder,
    cfg: &T5Config,
    x: ValueId,
    shared: ValueId,
    labels: ValueId,
) -> Result<ValueId, IrError> {
    let m = b.module("lm_head", "Linear");
    let rows = cfg.batch * cfg.dec_seq;
    let x = b.op(m, "flatten", reshape(&[rows, cfg.hidden]), &[x])?;
    let (x, w) = if cfg.tie {
        let scale = (cfg.hidden as f64).powf(-0.5);
        let c = b.op(
            m,
            "tie_scale",
            Op::Constant {
                value: TensorData::scalar(DType::F32, scale),
            },
            &[],
        )?;
        (b.op(m, "scale", binary(BinaryFn::Mul), &[x, c])?, shared)
    } else {
        let w = b.param(
            m,
            "weight",
            &[cfg.vocab, cfg.hidden],
            Init::Normal { std: 1.0 },
        );
        (x, w)
    };
    let logits = b.op(m, "matmul", matmul(true), &[x, w])?;
    let labels = b.op(ModuleId::ROOT, "labels_flat", reshape(&[rows]), &[labels])?;
    let ce = Op::CrossEntropy {
        ignore_index: Some(-100),
    };
    b.op(ModuleId::ROOT, "loss", ce, &[logits, labels])
}

/// The position bias `[1, heads, q, k]` of a stack's self-attention, in
/// the attention module at `path` (which owns the bias table); the
/// decoder's adds the causal mask.
fn position_bias(
    b: &mut Builder,
    cfg: &T5Config,
    path: &str,
    causal: bool,
) -> Result<ValueId, IrError> {
    let seq = if causal { cfg.dec_seq } else { cfg.seq };
    let m = b.module(&format!("{path}.relative_attention_bias"), "Embedding");
    let table = b.param(
        m,
        "weight",
        &[cfg.buckets, cfg.heads],
        Init::Normal {
            std: (cfg.hidden as f64).powf(-0.5),
        },
    );
    let idx: Vec<i64> = (0..seq)
        .flat_map(|q| {
            (0..seq)
                .map(move |k| bucket(k as i64 - q as i64, !causal, cfg.buckets, cfg.max_distance))
        })
        .collect();
    let am = b.module(path, "T5Attention");
    let idx = b.op(
        am,
        "relative_position_bucket",
        Op::Constant {
            value: i64_tensor(&[seq, seq], &idx),
        },
        &[],
    )?;
    let v = b.op(m, "gather", Op::Gather { axis: 0 }, &[table, idx])?;
    let v = b.op(
        am,
        "position_bias_heads_first",
        Op::Transpose {
            perm: vec![2, 0, 1],
        },
        &[v],
    )?;
    let v = b.op(
        am,
        "position_bias",
        reshape(&[1, cfg.heads, seq, seq]),
        &[v],
    )?;
    if !causal {
        return Ok(v);
    }
    let mask: Vec<f64> = (0..seq)
        .flat_map(|q| (0..seq).map(move |k| if k > q { MASKED } else { 0.0 }))
        .collect();
    let ty = TensorType::new(DType::F32, [seq, seq]);
    let Some(mask) = TensorData::from_f64s(ty, &mask) else {
        return Err(IrError::Invalid(format!(
            "causal mask of {seq}x{seq} values does not fit its type"
        )));
    };
    let mask = b.op(am, "causal_mask", Op::Constant { value: mask }, &[])?;
    b.op(
        am,
        "position_bias_masked",
        binary(BinaryFn::Add),
        &[v, mask],
    )
}

/// T5's relative-position bucket of `rel = key - query`: with
/// `bidirectional`, half the buckets for keys after the query; of the rest
/// (the past only, without it), the first half are exact distances and the
/// others grow logarithmically up to `max_distance`, beyond which all
/// share the last. Computed in f32 as the reference implementation does.
pub fn bucket(rel: i64, bidirectional: bool, buckets: usize, max_distance: usize) -> i64 {
    let mut n = buckets as i64;
    let mut base = 0;
    let dist = if bidirectional {
        n /= 2;
        if rel > 0 {
            base = n;
        }
        rel.abs()
    } else {
        (-rel).max(0)
    };
    let exact = n / 2;
    if dist < exact {
        return base + dist;
    }
    // The denominator is a double in the reference, the rest f32.
    let span = (max_distance as f64 / exact as f64).ln() as f32;
    let ratio = (dist as f32 / exact as f32).ln() / span;
    let large = exact + (ratio * (n - exact) as f32) as i64;
    base + large.min(n - 1)
}

/// Projection `{path}.{leaf}` (`hidden -> heads * kv`, no bias) of `x:
/// [batch, seq, hidden]`, as `[batch, heads, seq, kv]`.
fn project_heads(
    b: &mut Builder,
    cfg: &T5Config,
    x: ValueId,
    path: &str,
    leaf: &str,
    seq: usize,
    std: f64,
) -> Result<ValueId, IrError> {
    let y = linear(
        b,
        x,
        &format!("{path}.{leaf}"),
        cfg.hidden,
        cfg.inner(),
        std,
    )?;
    let m = b.module(path, "T5Attention");
    let shape = [cfg.batch, seq, cfg.heads, cfg.kv];
    let y = b.op(m, &format!("{leaf}_reshape"), reshape(&shape), &[y])?;
    b.op(m, &format!("{leaf}_transpose"), transpose_heads(), &[y])
}

/// `[batch, heads, seq, kv]` back to `[batch, seq, heads * kv]`.
fn merge_heads(
    b: &mut Builder,
    cfg: &T5Config,
    m: ModuleId,
    y: ValueId,
    seq: usize,
) -> Result<ValueId, IrError> {
    let y = b.op(m, "merge_heads", transpose_heads(), &[y])?;
    b.op(
        m,
        "merge_heads_reshape",
        reshape(&[cfg.batch, seq, cfg.inner()]),
        &[y],
    )
}

/// `x @ weight^T` in a new bias-free `Linear` module at `path`, weight
/// `[fan_out, fan_in]` drawn from Normal(0, std).
fn linear(
    b: &mut Builder,
    x: ValueId,
    path: &str,
    fan_in: usize,
    fan_out: usize,
    std: f64,
) -> Result<ValueId, IrError> {
    let m = b.module(path, "Linear");
    let w = b.param(m, "weight", &[fan_out, fan_in], Init::Normal { std });
    b.op(m, "matmul", matmul(true), &[x, w])
}

/// T5's LayerNorm: `x / sqrt(mean(x^2) + eps) * weight`, weight ones.
fn norm(b: &mut Builder, x: ValueId, path: &str, dim: usize) -> Result<ValueId, IrError> {
    let m = b.module(path, "T5LayerNorm");
    let w = b.param(m, "weight", &[dim], Init::Ones);
    b.op(m, "rms_norm", Op::RmsNorm { eps: NORM_EPS }, &[x, w])
}

fn q_std(cfg: &T5Config) -> f64 {
    ((cfg.hidden * cfg.kv) as f64).powf(-0.5)
}

fn k_std(cfg: &T5Config) -> f64 {
    (cfg.hidden as f64).powf(-0.5)
}

fn o_std(cfg: &T5Config) -> f64 {
    (cfg.inner() as f64).powf(-0.5)
}

/// An i64 tensor of `shape` holding `values`.
fn i64_tensor(shape: &[usize], values: &[i64]) -> TensorData {
    TensorData {
        ty: TensorType::new(DType::I64, shape.to_vec()),
        bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}
