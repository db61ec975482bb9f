//! The model zoo: forward graphs (with their loss) built from a short spec such
//! as `gpt2`, `gpt2:batch=4,seq=256` or `mlp:layers=3,in=64,hidden=256,classes=10`.
//! Nothing here materialises a parameter: `Init` is only a description, so
//! `gpt3-175b` builds in milliseconds.

mod builder;
pub mod gpt;
pub mod mlp;
mod spec;

use crate::error::FrontendError;
use fsdpc_ir::{Graph, ValueId};
use gpt::GptConfig;
use mlp::MlpConfig;
use spec::Spec;

/// A model built by the zoo.
#[derive(Clone, Debug)]
pub struct ZooModel {
    /// The model's name (the preset, or the spec as written).
    pub name: String,
    /// The forward graph, including the loss.
    pub graph: Graph,
    /// The scalar loss (also `graph.outputs[0]`).
    pub loss: ValueId,
    /// Tokens in one sample (the sequence length; 1 for non-sequence models),
    /// for throughput figures.
    pub tokens_per_sample: u64,
}

/// A model family's config.
#[derive(Clone, Debug, PartialEq)]
pub enum ZooConfig {
    /// A GPT-2-style decoder.
    Gpt(GptConfig),
    /// An MLP classifier.
    Mlp(MlpConfig),
}

impl ZooConfig {
    /// Parameter elements of the model this config builds.
    pub fn param_count(&self) -> u64 {
        match self {
            ZooConfig::Gpt(c) => c.param_count(),
            ZooConfig::Mlp(c) => c.param_count(),
        }
    }
}

/// Every preset: its name and config (batch 1 unless noted).
pub fn presets() -> Vec<(&'static str, ZooConfig)> {
    let gpt = |l, h, a, s, v| ZooConfig::Gpt(GptConfig::preset(l, h, a, s, v));
    vec![
        ("gpt-mini", gpt(2, 128, 4, 128, 1024)),
        ("gpt2", gpt(12, 768, 12, 1024, 50257)),
        ("gpt2-medium", gpt(24, 1024, 16, 1024, 50257)),
        ("gpt2-large", gpt(36, 1280, 20, 1024, 50257)),
        ("gpt2-xl", gpt(48, 1600, 25, 1024, 50257)),
        ("gpt3-175b", gpt(96, 12288, 96, 2048, 50257)),
        (
            "mlp-mini",
            // A small classifier for demos: batch 16 so one step sees a batch.
            ZooConfig::Mlp(MlpConfig {
                layers: 2,
                input: 32,
                hidden: 64,
                classes: 10,
                batch: 16,
            }),
        ),
    ]
}

/// The names of every preset.
pub fn preset_names() -> Vec<String> {
    presets().into_iter().map(|(n, _)| n.to_string()).collect()
}

/// The config `spec` describes: a preset (`gpt2`), a preset with overrides
/// (`gpt2:batch=4,seq=256`) or a family spec (`gpt:...`, `mlp:...`).
pub fn parse(spec: &str) -> Result<ZooConfig, FrontendError> {
    let mut s = Spec::parse(spec)?;
    match s.family {
        "gpt" => Ok(ZooConfig::Gpt(GptConfig::from_spec(&mut s, None)?)),
        "mlp" => Ok(ZooConfig::Mlp(MlpConfig::from_spec(&mut s, None)?)),
        name => match presets().into_iter().find(|(n, _)| *n == name) {
            Some((_, ZooConfig::Gpt(base))) => {
                Ok(ZooConfig::Gpt(GptConfig::from_spec(&mut s, Some(&base))?))
            }
            Some((_, ZooConfig::Mlp(base))) => {
                Ok(ZooConfig::Mlp(MlpConfig::from_spec(&mut s, Some(&base))?))
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
    let name = spec.trim();
    match parse(spec)? {
        ZooConfig::Gpt(c) => gpt::build(name, &c),
        ZooConfig::Mlp(c) => mlp::build(name, &c),
    }
}
