//! The Llama family's forward graph and loss (see `mod.rs` for the
//! architecture and the parameters' names).

use super::super::builder::{
    binary, matmul, reshape, transpose_heads, Builder, CausalLm, LORA_A, LORA_B,
};
use super::super::rope;
use super::super::ZooModel;
use super::LlamaConfig;
use crate::error::FrontendError;
use fsdpc_ir::Init;
use fsdpc_ir::{BinaryFn, DType, IrError, ModuleId, Op, TensorData, TensorType, UnaryFn, ValueId};

/// Std of every Linear and embedding initialisation (`initializer_range`).
const STD: f64 = 0.02;

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
    // Labels are already shifted: label `t` is the token after position `t`.
    let lm = CausalLm {
        tied: cfg.tie.then_some(emb),
        batch,
        seq,
        hidden: cfg.hidden,
        vocab: cfg.vocab,
        std: STD,
        lora: cfg.lora > 0,
    };
    Ok(b.finish_causal_lm(name, x, labels, lm)?)
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
