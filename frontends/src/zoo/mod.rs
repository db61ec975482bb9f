//! The model zoo: forward graphs (with their loss) built from a short spec such
//! as `gpt2`, `gpt2:batch=4,seq=256`, `mlp:layers=3,in=64,hidden=256,classes=10`,
//! `resnet50` or `vit:layers=2,hidden=32,heads=4,mlp=64,patch=4,image=16`.
//! Nothing here materialises a parameter: `Init` is only a description, so
//! `gpt3-175b` builds in milliseconds.

mod builder;
pub mod gpt;
pub mod llama;
pub mod mlp;
pub mod resnet;
pub mod rope;
pub(crate) mod spec;
pub mod t5;
pub mod vit;

use crate::error::FrontendError;
use fsdpc_ir::{Graph, ValueId};
use gpt::GptConfig;
use llama::{Arch, LlamaConfig};
use mlp::MlpConfig;
use resnet::ResNetConfig;
use spec::Spec;
use t5::{T5Act, T5Config};
use vit::VitConfig;

/// A model built by the zoo.
#[derive(Clone, Debug)]
pub struct ZooModel {
    /// The model's name (the preset, or the spec as written).
    pub name: String,
    /// The forward graph, including the loss.
    pub graph: Graph,
    /// The scalar loss (also `graph.outputs[0]`).
    pub loss: ValueId,
    /// Tokens in one sample (the sequence length; 1 for non-sequence models
    /// and the vision models, whose figures are then images/s), for
    /// throughput figures.
    pub tokens_per_sample: u64,
}

/// A model family's config.
#[derive(Clone, Debug, PartialEq)]
pub enum ZooConfig {
    /// A GPT-2-style decoder.
    Gpt(GptConfig),
    /// A Llama-family decoder (Llama, Qwen2/3, Mistral, Phi-3).
    Llama(LlamaConfig),
    /// An MLP classifier.
    Mlp(MlpConfig),
    /// A T5 encoder-decoder.
    T5(T5Config),
    /// A torchvision ResNet classifier.
    ResNet(ResNetConfig),
    /// A torchvision Vision Transformer classifier.
    Vit(VitConfig),
}

impl ZooConfig {
    /// Parameter elements of the model this config builds.
    pub fn param_count(&self) -> u64 {
        match self {
            ZooConfig::Gpt(c) => c.param_count(),
            ZooConfig::Llama(c) => c.param_count(),
            ZooConfig::Mlp(c) => c.param_count(),
            ZooConfig::T5(c) => c.param_count(),
            ZooConfig::ResNet(c) => c.param_count(),
            ZooConfig::Vit(c) => c.param_count(),
        }
    }
}

/// Every preset: its name and config (batch 1 unless noted).
///
/// The T5 presets are Hugging Face's published configurations (`t5-small`
/// ... `t5-11b`: v1.0, ReLU, tied head; `t5-v1_1-*` from
/// `google/t5-v1_1-*`: gated GELU, untied head), at sequence 512 in and
/// out. The FSDP paper (Zhao et al., VLDB 2023) names T5-611M, T5-2.28B and
/// T5-11B; no published T5 configuration has 611M or 2.28B parameters. The
/// nearest are `t5-large` (737,668,096: 126.7M, 20.7% more than 611M) and
/// `t5-3b` (2,851,598,336: 0.57B, 25.1% more than 2.28B); `t5-11b`
/// (11,307,321,344) is the paper's Hugging Face T5-11B.
///
/// The ResNet and ViT presets are at 224x224 images, 1000 classes. `resnet18`
/// ... `resnet152` and `vit-b-16` ... `vit-h-14` are torchvision's models
/// with its parameter counts (`resnet50` 25,557,032; `vit-h-14`
/// 632,045,800). The larger ViTs are published shapes built as torchvision
/// builds a ViT (a class token and a 1000-class head), so their counts are
/// this formula's, beside the papers' rounded figures (whose models pool
/// without a class token): ViT-g/14 and ViT-G/14 of Zhai et al., "Scaling
/// Vision Transformers" (2022, Table 2): `vit-g-14` (width 1408, depth 40,
/// MLP 6144, 16 heads) has 1,012,611,432 (paper: 1011M) and `vit-bigg-14`
/// (width 1664, depth 48, MLP 8192, 16 heads; OpenCLIP's name for ViT-G/14)
/// 1,844,440,680 (paper: 1843M); PaLI's ViT-e (Chen et al. 2022: width
/// 1792, depth 56, MLP 15360, 16 heads, patch 14), `vit-e-14`, has
/// 3,807,214,312 (paper: 3.9B, 3% more than this shape's encoder holds;
/// the paper does not break its figure down).
pub fn presets() -> Vec<(&'static str, ZooConfig)> {
    let gpt = |l, h, a, s, v| ZooConfig::Gpt(GptConfig::preset(l, h, a, s, v));
    let t5 = |l, h, f, a, kv, act| ZooConfig::T5(T5Config::preset(l, h, f, a, kv, act));
    let resnet = |d| ZooConfig::ResNet(ResNetConfig::preset(d));
    let vit = |l, h, a, m, p| ZooConfig::Vit(VitConfig::preset(l, h, a, m, p));
    [
        ("gpt-mini", gpt(2, 128, 4, 128, 1024)),
        ("gpt2", gpt(12, 768, 12, 1024, 50257)),
        ("gpt2-medium", gpt(24, 1024, 16, 1024, 50257)),
        ("gpt2-large", gpt(36, 1280, 20, 1024, 50257)),
        ("gpt2-xl", gpt(48, 1600, 25, 1024, 50257)),
        ("gpt3-175b", gpt(96, 12288, 96, 2048, 50257)),
        (
            "t5-mini",
            // A small T5 for demos: vocabulary 1024, sequence 64 in and out.
            ZooConfig::T5(T5Config {
                vocab: 1024,
                seq: 64,
                dec_seq: 64,
                ..T5Config::preset(2, 128, 256, 4, 32, T5Act::Relu)
            }),
        ),
        ("t5-small", t5(6, 512, 2048, 8, 64, T5Act::Relu)),
        ("t5-base", t5(12, 768, 3072, 12, 64, T5Act::Relu)),
        ("t5-large", t5(24, 1024, 4096, 16, 64, T5Act::Relu)),
        ("t5-3b", t5(24, 1024, 16384, 32, 128, T5Act::Relu)),
        ("t5-11b", t5(24, 1024, 65536, 128, 128, T5Act::Relu)),
        (
            "t5-v1_1-large",
            t5(24, 1024, 2816, 16, 64, T5Act::GatedGelu),
        ),
        ("t5-v1_1-xl", t5(24, 2048, 5120, 32, 64, T5Act::GatedGelu)),
        ("t5-v1_1-xxl", t5(24, 4096, 10240, 64, 64, T5Act::GatedGelu)),
    ]
    .into_iter()
    .chain(
        llama::presets()
            .into_iter()
            .map(|(n, c)| (n, ZooConfig::Llama(c))),
    )
    .chain([(
        "mlp-mini",
        // A small classifier for demos: batch 16 so one step sees a batch.
        ZooConfig::Mlp(MlpConfig {
            layers: 2,
            input: 32,
            hidden: 64,
            classes: 10,
            batch: 16,
        }),
    )])
    .chain([
        ("resnet18", resnet(18)),
        ("resnet34", resnet(34)),
        ("resnet50", resnet(50)),
        ("resnet101", resnet(101)),
        ("resnet152", resnet(152)),
        ("vit-b-16", vit(12, 768, 12, 3072, 16)),
        ("vit-b-32", vit(12, 768, 12, 3072, 32)),
        ("vit-l-16", vit(24, 1024, 16, 4096, 16)),
        ("vit-l-32", vit(24, 1024, 16, 4096, 32)),
        ("vit-h-14", vit(32, 1280, 16, 5120, 14)),
        ("vit-g-14", vit(40, 1408, 16, 6144, 14)),
        ("vit-bigg-14", vit(48, 1664, 16, 8192, 14)),
        ("vit-e-14", vit(56, 1792, 16, 15360, 14)),
    ])
    .collect()
}

/// The names of every preset.
pub fn preset_names() -> Vec<String> {
    presets().into_iter().map(|(n, _)| n.to_string()).collect()
}

/// The config `spec` describes: a preset (`gpt2`), a preset with overrides
/// (`gpt2:batch=4,seq=256`) or a family spec (`gpt:...`, `mlp:...`,
/// `t5:...`, `resnet:...`, `vit:...`).
pub fn parse(spec: &str) -> Result<ZooConfig, FrontendError> {
    let mut s = Spec::parse(spec)?;
    match s.family {
        "gpt" => Ok(ZooConfig::Gpt(GptConfig::from_spec(&mut s, None)?)),
        family if Arch::from_model_type(family).is_some() => {
            let arch = Arch::from_model_type(family).expect("checked above");
            Ok(ZooConfig::Llama(LlamaConfig::from_spec(
                &mut s, arch, None,
            )?))
        }
        "mlp" => Ok(ZooConfig::Mlp(MlpConfig::from_spec(&mut s, None)?)),
        "t5" => Ok(ZooConfig::T5(T5Config::from_spec(&mut s, None)?)),
        "resnet" => Ok(ZooConfig::ResNet(ResNetConfig::from_spec(&mut s, None)?)),
        "vit" => Ok(ZooConfig::Vit(VitConfig::from_spec(&mut s, None)?)),
        name => match presets().into_iter().find(|(n, _)| *n == name) {
            Some((_, ZooConfig::Gpt(base))) => {
                Ok(ZooConfig::Gpt(GptConfig::from_spec(&mut s, Some(&base))?))
            }
            Some((_, ZooConfig::Llama(base))) => Ok(ZooConfig::Llama(LlamaConfig::from_spec(
                &mut s,
                base.arch,
                Some(&base),
            )?)),
            Some((_, ZooConfig::Mlp(base))) => {
                Ok(ZooConfig::Mlp(MlpConfig::from_spec(&mut s, Some(&base))?))
            }
            Some((_, ZooConfig::T5(base))) => {
                Ok(ZooConfig::T5(T5Config::from_spec(&mut s, Some(&base))?))
            }
            Some((_, ZooConfig::ResNet(base))) => Ok(ZooConfig::ResNet(ResNetConfig::from_spec(
                &mut s,
                Some(&base),
            )?)),
            Some((_, ZooConfig::Vit(base))) => {
                Ok(ZooConfig::Vit(VitConfig::from_spec(&mut s, Some(&base))?))
            }
            None => Err(FrontendError::UnknownPreset {
                name: name.to_string(),
                known: preset_names(),
            }),
        },
    }
}

/// Builds the model `spec` describes (see [`parse`]).
pub fn build(spec: &str) -> Result<ZooModel, FrontendError> {
    build_config(spec.trim(), &parse(spec)?)
}

/// Builds the model of `config`, named `name`.
pub fn build_config(name: &str, config: &ZooConfig) -> Result<ZooModel, FrontendError> {
    match config.clone() {
        ZooConfig::Gpt(c) => gpt::build(name, &c),
        ZooConfig::Llama(c) => llama::build(name, &c),
        ZooConfig::Mlp(c) => mlp::build(name, &c),
        ZooConfig::T5(c) => t5::build(name, &c),
        ZooConfig::ResNet(c) => resnet::build(name, &c),
        ZooConfig::Vit(c) => vit::build(name, &c),
    }
}
