//! A multi-layer perceptron classifier: `layers` blocks of Linear + ReLU
//! (`layers.{i}`, kind `MLPBlock`) and a Linear `head` to the class logits,
//! trained with cross-entropy. Weights use Kaiming-normal initialisation
//! (He et al. 2015): std sqrt(2 / fan_in) before a ReLU, sqrt(1 / fan_in) for
//! the head.

use super::builder::Builder;
use super::spec::{required, Spec};
use super::ZooModel;
use crate::error::FrontendError;
use fsdpc_ir::{DType, ModuleId, Op, TensorType, UnaryFn};

/// Sizes of an MLP classifier.
#[derive(Clone, Debug, PartialEq)]
pub struct MlpConfig {
    /// Hidden blocks (Linear + ReLU) before the head.
    pub layers: usize,
    /// Input features.
    pub input: usize,
    /// Width of every hidden block.
    pub hidden: usize,
    /// Output classes.
    pub classes: usize,
    /// Samples per step on one rank.
    pub batch: usize,
}

/// The keys an `mlp` spec accepts.
pub(crate) const KEYS: &[&str] = &["layers", "in", "hidden", "classes", "batch"];

impl MlpConfig {
    /// The config `spec` describes, starting from `base` (a preset) if given.
    pub(crate) fn from_spec(
        spec: &mut Spec<'_>,
        base: Option<&MlpConfig>,
    ) -> Result<MlpConfig, FrontendError> {
        let need = "layers, in, hidden and classes";
        let layers = spec.size("layers")?;
        let input = spec.size("in")?;
        let hidden = spec.size("hidden")?;
        let classes = spec.size("classes")?;
        let batch = spec.size("batch")?;
        spec.finish(KEYS)?;
        Ok(MlpConfig {
            layers: required(spec, "layers", layers, base.map(|b| b.layers), need)?,
            input: required(spec, "in", input, base.map(|b| b.input), need)?,
            hidden: required(spec, "hidden", hidden, base.map(|b| b.hidden), need)?,
            classes: required(spec, "classes", classes, base.map(|b| b.classes), need)?,
            batch: batch.or(base.map(|b| b.batch)).unwrap_or(1),
        })
    }

    /// Parameter elements of the model.
    pub fn param_count(&self) -> u64 {
        let (i, h, c, l) = (
            self.input as u64,
            self.hidden as u64,
            self.classes as u64,
            self.layers as u64,
        );
        (i * h + h) + (l - 1) * (h * h + h) + (h * c + c)
    }
}

/// Builds the forward graph (with its loss) of `cfg`, named `name`.
pub(crate) fn build(name: &str, cfg: &MlpConfig) -> Result<ZooModel, FrontendError> {
    let mut b = Builder::new(name, "MLP");
    let mut x =
        b.g.add_input("x", TensorType::new(DType::F32, [cfg.batch, cfg.input]));
    let labels =
        b.g.add_input("labels", TensorType::new(DType::I64, [cfg.batch]));
    b.module("layers", "ModuleList");
    let mut fan_in = cfg.input;
    for i in 0..cfg.layers {
        let path = format!("layers.{i}");
        let m = b.module(&path, "MLPBlock");
        let std = (2.0 / fan_in as f64).sqrt();
        x = b.linear(x, &format!("{path}.fc"), fan_in, cfg.hidden, std)?;
        x = b.op(m, "relu", Op::Unary { f: UnaryFn::Relu }, &[x])?;
        fan_in = cfg.hidden;
    }
    let std = (1.0 / fan_in as f64).sqrt();
    let logits = b.linear(x, "head", fan_in, cfg.classes, std)?;
    let ce = Op::CrossEntropy {
        ignore_index: Some(-100),
    };
    let loss = b.op(ModuleId::ROOT, "loss", ce, &[logits, labels])?;
    b.g.outputs = vec![loss];
    Ok(ZooModel {
        name: name.to_string(),
        graph: b.g,
        loss,
        tokens_per_sample: 1,
    })
}
