//! Flags shared by `compile` and `train` that say how an imported (ONNX)
//! model is read: values of its symbolic dimensions, the loss to train it
//! with when its output is not a scalar loss, and whether initializers the
//! exporter merged are untied.

use super::CliError;
use clap::Args;
use fsdpc_frontends::onnx::merged_initializers;
use fsdpc_frontends::{LoadOptions, LossKind, LossSpec};
use fsdpc_ir::{Graph, Optimizer};
use std::collections::HashMap;

/// How an ONNX model is imported.
#[derive(Debug, Clone, Default, Args)]
pub struct ModelFlags {
    /// Binds a symbolic dimension of an ONNX model's inputs
    /// (`--dim batch_size=8 --dim sequence_length=128`); repeatable.
    #[arg(long = "dim", value_name = "NAME=SIZE")]
    pub dims: Vec<String>,
    /// The loss of an ONNX model whose output is not a scalar loss:
    /// `cross_entropy` (logits [..., classes] against integer labels) or `mse`
    /// (mean squared error against a float target of the output's shape).
    #[arg(long, value_name = "KIND")]
    pub loss: Option<String>,
    /// The model output the loss reads (default: the first output).
    #[arg(long, visible_alias = "loss-output", value_name = "OUTPUT")]
    pub logits: Option<String>,
    /// The input holding the labels (cross_entropy) or target (mse): a model
    /// input, or a new input of that name (default: a new `labels`/`target`).
    #[arg(long, visible_alias = "loss-target", value_name = "INPUT")]
    pub labels: Option<String>,
    /// Gives each module its own copy of an initializer the ONNX exporter
    /// merged (one all-ones tensor for every LayerNorm weight of a freshly
    /// initialised model), instead of training it as one tied parameter.
    #[arg(long)]
    pub untie_merged_initializers: bool,
}

impl ModelFlags {
    /// The frontend's options: these flags and `optimizer`.
    pub fn load_options(&self, optimizer: Optimizer) -> Result<LoadOptions, CliError> {
        Ok(LoadOptions {
            optimizer,
            dims: self.parse_dims()?,
            loss: self.loss_spec()?,
            untie_merged_initializers: self.untie_merged_initializers,
            ..LoadOptions::default()
        })
    }

    /// Warns on stderr about each initializer of `graph` the exporter merged
    /// (none are left once untied).
    pub fn warn_merged(&self, graph: &Graph) {
        for m in merged_initializers(graph) {
            eprintln!("warning: {m}");
        }
    }

    fn parse_dims(&self) -> Result<HashMap<String, usize>, CliError> {
        let mut out = HashMap::new();
        for d in &self.dims {
            let bad = || CliError::Usage(format!("--dim `{d}`: expected NAME=SIZE, e.g. batch=8"));
            let (name, size) = d.split_once('=').ok_or_else(bad)?;
            let size: usize = size.trim().parse().map_err(|_| bad())?;
            if name.trim().is_empty() || size == 0 {
                return Err(bad());
            }
            if out.insert(name.trim().to_string(), size).is_some() {
                return Err(CliError::Usage(format!(
                    "--dim {name} is given more than once"
                )));
            }
        }
        Ok(out)
    }

    fn loss_spec(&self) -> Result<Option<LossSpec>, CliError> {
        let Some(kind) = &self.loss else {
            if self.logits.is_some() || self.labels.is_some() {
                return Err(CliError::Usage(
                    "--logits and --labels need --loss (cross_entropy or mse)".into(),
                ));
            }
            return Ok(None);
        };
        let kind = LossKind::parse(kind).ok_or_else(|| {
            CliError::Usage(format!(
                "unknown loss `{kind}` (expected {})",
                LossKind::NAMES.join(" or ")
            ))
        })?;
        Ok(Some(LossSpec {
            kind,
            output: self.logits.clone(),
            target: self.labels.clone(),
        }))
    }
}
