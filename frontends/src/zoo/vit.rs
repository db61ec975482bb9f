//! The Vision Transformer (Dosovitskiy et al. 2021) exactly as torchvision's
//! `VisionTransformer` defines it (`vit_b_16` ... `vit_h_14`; torchvision
//! rather than Hugging Face's `ViTForImageClassification`, whose counts
//! differ by its pooler): a patch embedding `conv_proj` (a Conv2d with
//! kernel and stride `patch`, with bias) flattened to `[batch, patches,
//! hidden]`; a learned `class_token` `[1, 1, hidden]` put before the
//! patches; plus a learned `encoder.pos_embedding` `[1, patches + 1,
//! hidden]`; pre-LayerNorm encoder blocks (`EncoderBlock`, eps 1e-6):
//! `x + self_attention(ln_1(x))`, then `x + mlp(ln_2(x))` with the MLP
//! Linear(hidden, mlp), exact (erf) GELU, Linear(mlp, hidden); a final
//! `encoder.ln`; and the class token's row through `heads.head`
//! Linear(hidden, classes), trained with cross-entropy against integer
//! `labels`. The attention is PyTorch's `nn.MultiheadAttention`, non-causal,
//! with its packed `in_proj_weight` `[3 * hidden, hidden]` and
//! `in_proj_bias`, and `out_proj`. Module paths and parameter names are
//! torchvision's (`encoder.layers.encoder_layer_3.mlp.0.weight`); the blocks
//! are not numbered children, so `--wrap kind:EncoderBlock` makes one unit
//! per block. No dropout (torchvision's default is 0).
//!
//! Initialisation as torchvision: `conv_proj.weight` Normal with std
//! sqrt(1 / fan_in) (torchvision truncates it at two standard deviations;
//! fsdpc's `Init` has no truncated normal), position embedding Normal(0,
//! 0.02), class token zero, `in_proj_weight` and the MLP weights
//! Xavier-uniform, MLP biases Normal(0, 1e-6), `out_proj.weight` PyTorch's
//! Linear default (Uniform(-1/sqrt(hidden), 1/sqrt(hidden))), the other
//! biases zero, and the head zero (weight and bias), so the first step's
//! loss is ln(classes) and only the head moves in it.

use super::builder::{binary, matmul, reshape, transpose_heads, Builder};
use super::spec::{required, Spec};
use super::ZooModel;
use crate::error::FrontendError;
use fsdpc_ir::Window2d;
use fsdpc_ir::{BinaryFn, DType, Init, IrError, ModuleId, Op, TensorType, UnaryFn, ValueId};

/// LayerNorm epsilon of torchvision's ViT.
const LN_EPS: f64 = 1e-6;
/// Std of the position embedding's initialisation.
const POS_STD: f64 = 0.02;
/// Std of the MLP biases' initialisation.
const MLP_BIAS_STD: f64 = 1e-6;

/// Sizes of a Vision Transformer classifier.
#[derive(Clone, Debug, PartialEq)]
pub struct VitConfig {
    /// Encoder blocks.
    pub layers: usize,
    /// Model width.
    pub hidden: usize,
    /// Attention heads; `hidden` must be divisible by it.
    pub heads: usize,
    /// Inner width of each block's MLP.
    pub mlp: usize,
    /// Side of a square patch; it must divide `image`.
    pub patch: usize,
    /// Height and width of the input images.
    pub image: usize,
    /// Output classes.
    pub classes: usize,
    /// Images per step on one rank.
    pub batch: usize,
}

/// The keys a `vit` spec accepts.
pub(crate) const KEYS: &[&str] = &[
    "layers", "hidden", "heads", "mlp", "patch", "image", "classes", "batch",
];

impl VitConfig {
    /// A published ViT's sizes at 224x224 images, 1000 classes, batch 1.
    pub(crate) fn preset(
        layers: usize,
        hidden: usize,
        heads: usize,
        mlp: usize,
        patch: usize,
    ) -> VitConfig {
        VitConfig {
            layers,
            hidden,
            heads,
            mlp,
            patch,
            image: 224,
            classes: 1000,
            batch: 1,
        }
    }

    /// The config `spec` describes, starting from `base` (a preset) if given.
    pub(crate) fn from_spec(
        spec: &mut Spec<'_>,
        base: Option<&VitConfig>,
    ) -> Result<VitConfig, FrontendError> {
        let need = "layers, hidden, heads, mlp and patch";
        let layers = spec.size("layers")?;
        let hidden = spec.size("hidden")?;
        let heads = spec.size("heads")?;
        let mlp = spec.size("mlp")?;
        let patch = spec.size("patch")?;
        let image = spec.size("image")?;
        let classes = spec.size("classes")?;
        let batch = spec.size("batch")?;
        spec.finish(KEYS)?;
        let cfg = VitConfig {
            layers: required(spec, "layers", layers, base.map(|b| b.layers), need)?,
            hidden: required(spec, "hidden", hidden, base.map(|b| b.hidden), need)?,
            heads: required(spec, "heads", heads, base.map(|b| b.heads), need)?,
            mlp: required(spec, "mlp", mlp, base.map(|b| b.mlp), need)?,
            patch: required(spec, "patch", patch, base.map(|b| b.patch), need)?,
            image: image.or(base.map(|b| b.image)).unwrap_or(224),
            classes: classes.or(base.map(|b| b.classes)).unwrap_or(1000),
            batch: batch.or(base.map(|b| b.batch)).unwrap_or(1),
        };
        if cfg.hidden % cfg.heads != 0 {
            return Err(spec.error(format!(
                "hidden={} is not divisible by heads={}; each head needs hidden/heads whole dimensions",
                cfg.hidden, cfg.heads
            )));
        }
        if cfg.image % cfg.patch != 0 {
            return Err(spec.error(format!(
                "patch={} does not divide image={}; the image must cut into whole patches",
                cfg.patch, cfg.image
            )));
        }
        Ok(cfg)
    }

    /// Patches of one image.
    fn patches(&self) -> usize {
        (self.image / self.patch).pow(2)
    }

    /// Parameter elements of the model.
    pub fn param_count(&self) -> u64 {
        let (h, m, c, p) = (
            self.hidden as u64,
            self.mlp as u64,
            self.classes as u64,
            self.patch as u64,
        );
        let seq = self.patches() as u64 + 1;
        let embed = (3 * p * p * h + h) + h + seq * h;
        let attention = (3 * h * h + 3 * h) + (h * h + h);
        let block = 2 * h + attention + 2 * h + (h * m + m) + (m * h + h);
        embed + self.layers as u64 * block + 2 * h + (h * c + c)
    }
}

/// Builds the forward graph (with its loss) of `cfg`, named `name`.
pub(crate) fn build(name: &str, cfg: &VitConfig) -> Result<ZooModel, FrontendError> {
    let mut b = Builder::new(name, "VisionTransformer");
    let root = ModuleId::ROOT;
    let shape = [cfg.batch, 3, cfg.image, cfg.image];
    let pixels =
        b.g.add_input("pixel_values", TensorType::new(DType::F32, shape));
    let labels =
        b.g.add_input("labels", TensorType::new(DType::I64, [cfg.batch]));
    let mut x = embeddings(&mut b, cfg, pixels)?;
    b.module("encoder.layers", "Sequential");
    for i in 0..cfg.layers {
        x = block(&mut b, cfg, x, &format!("encoder.layers.encoder_layer_{i}"))?;
    }
    x = b.layer_norm(x, "encoder.ln", cfg.hidden, LN_EPS)?;
    let first = Op::Slice {
        axis: 1,
        start: 0,
        end: 1,
        step: 1,
    };
    x = b.op(root, "class_row", first, &[x])?;
    x = b.op(root, "class_flat", reshape(&[cfg.batch, cfg.hidden]), &[x])?;
    b.module("heads", "Sequential");
    let logits = b.linear_out_in(
        x,
        "heads.head",
        "Linear",
        cfg.hidden,
        cfg.classes,
        Init::Zeros,
        Init::Zeros,
    )?;
    let ce = Op::CrossEntropy {
        ignore_index: Some(-100),
    };
    let loss = b.op(root, "loss", ce, &[logits, labels])?;
    b.g.outputs = vec![loss];
    Ok(ZooModel {
        name: name.to_string(),
        graph: b.g,
        loss,
        tokens_per_sample: 1,
    })
}

/// The encoder's input `[batch, patches + 1, hidden]`: the patches embedded
/// by `conv_proj`, after the class token, plus the position embedding.
fn embeddings(b: &mut Builder, cfg: &VitConfig, pixels: ValueId) -> Result<ValueId, IrError> {
    let root = ModuleId::ROOT;
    let (batch, h, n) = (cfg.batch, cfg.hidden, cfg.patches());
    let window = Window2d {
        stride: [cfg.patch; 2],
        ..Window2d::of_kernel([cfg.patch; 2])
    };
    let std = (1.0 / (3 * cfg.patch * cfg.patch) as f64).sqrt();
    let x = b.conv2d(
        pixels,
        "conv_proj",
        (3, h),
        window,
        Init::Normal { std },
        Some(Init::Zeros),
    )?;
    let x = b.op(root, "patches_flat", reshape(&[batch, h, n]), &[x])?;
    let x = b.op(
        root,
        "patches_first",
        Op::Transpose {
            perm: vec![0, 2, 1],
        },
        &[x],
    )?;
    let token = b.param(root, "class_token", &[1, 1, h], Init::Zeros);
    let expand = Op::Expand {
        shape: vec![batch, 1, h],
    };
    let token = b.op(root, "class_token_expand", expand, &[token])?;
    let x = b.op(root, "prepend_class", Op::Concat { axis: 1 }, &[token, x])?;
    let enc = b.module("encoder", "Encoder");
    let pos = b.param(
        enc,
        "pos_embedding",
        &[1, n + 1, h],
        Init::Normal { std: POS_STD },
    );
    b.op(enc, "add_pos", binary(BinaryFn::Add), &[x, pos])
}

/// torchvision's `EncoderBlock`: `x + self_attention(ln_1(x))`, then
/// `x + mlp(ln_2(x))`.
fn block(b: &mut Builder, cfg: &VitConfig, x: ValueId, path: &str) -> Result<ValueId, IrError> {
    let m = b.module(path, "EncoderBlock");
    let y = b.layer_norm(x, &format!("{path}.ln_1"), cfg.hidden, LN_EPS)?;
    let y = attention(b, cfg, y, &format!("{path}.self_attention"))?;
    let x = b.op(m, "residual_attn", binary(BinaryFn::Add), &[x, y])?;
    let y = b.layer_norm(x, &format!("{path}.ln_2"), cfg.hidden, LN_EPS)?;
    let y = mlp(b, cfg, y, &format!("{path}.mlp"))?;
    b.op(m, "residual_mlp", binary(BinaryFn::Add), &[x, y])
}

/// Xavier-uniform over a `[fan_out, fan_in]` weight.
fn xavier(fan_in: usize, fan_out: usize) -> Init {
    let bound = (6.0 / (fan_in + fan_out) as f64).sqrt();
    Init::Uniform {
        low: -bound,
        high: bound,
    }
}

/// `nn.MultiheadAttention` self-attention over `x: [batch, seq, hidden]`.
fn attention(b: &mut Builder, cfg: &VitConfig, x: ValueId, path: &str) -> Result<ValueId, IrError> {
    let m = b.module(path, "MultiheadAttention");
    let h = cfg.hidden;
    let seq = cfg.patches() + 1;
    let w = b.param(m, "in_proj_weight", &[3 * h, h], xavier(h, 3 * h));
    let bias = b.param(m, "in_proj_bias", &[3 * h], Init::Zeros);
    let qkv = b.op(m, "in_proj", matmul(true), &[x, w])?;
    let qkv = b.op(m, "in_proj_bias_add", binary(BinaryFn::Add), &[qkv, bias])?;
    let mut split = Vec::with_capacity(3);
    for (i, leaf) in ["q", "k", "v"].into_iter().enumerate() {
        let slice = Op::Slice {
            axis: 2,
            start: i * h,
            end: (i + 1) * h,
            step: 1,
        };
        let part = b.op(m, &format!("split_{leaf}"), slice, &[qkv])?;
        let shape = [cfg.batch, seq, cfg.heads, h / cfg.heads];
        let part = b.op(m, &format!("{leaf}_reshape"), reshape(&shape), &[part])?;
        split.push(b.op(m, &format!("{leaf}_transpose"), transpose_heads(), &[part])?);
    }
    let scale = 1.0 / ((h / cfg.heads) as f64).sqrt();
    let attn = Op::Attention {
        causal: false,
        scale,
    };
    let y = b.op(m, "attention", attn, &split)?;
    let y = b.op(m, "merge_heads", transpose_heads(), &[y])?;
    let y = b.op(
        m,
        "merge_heads_reshape",
        reshape(&[cfg.batch, seq, h]),
        &[y],
    )?;
    let bound = 1.0 / (h as f64).sqrt();
    b.linear_out_in(
        y,
        &format!("{path}.out_proj"),
        "NonDynamicallyQuantizableLinear",
        h,
        h,
        Init::Uniform {
            low: -bound,
            high: bound,
        },
        Init::Zeros,
    )
}

/// torchvision's `MLPBlock`: `mlp.3(gelu(mlp.0(x)))` (its Sequential's
/// indices: 1 is the GELU, 2 and 4 the dropouts).
fn mlp(b: &mut Builder, cfg: &VitConfig, x: ValueId, path: &str) -> Result<ValueId, IrError> {
    let m = b.module(path, "MLPBlock");
    let (h, inner) = (cfg.hidden, cfg.mlp);
    let bias = Init::Normal { std: MLP_BIAS_STD };
    let y = b.linear_out_in(
        x,
        &format!("{path}.0"),
        "Linear",
        h,
        inner,
        xavier(h, inner),
        bias.clone(),
    )?;
    let y = b.op(
        m,
        "gelu",
        Op::Unary {
            f: UnaryFn::GeluErf,
        },
        &[y],
    )?;
    b.linear_out_in(
        y,
        &format!("{path}.3"),
        "Linear",
        inner,
        h,
        xavier(inner, h),
        bias,
    )
}
