//! A thin layer over `Graph` for the zoo's builders: modules with their kinds,
//! parameters named after their module, and the common layers (Linear,
//! Conv2d, LayerNorm, Dropout) as PyTorch defines them.

use fsdpc_ir::{BinaryFn, DType, Graph, IrError, ModuleId, Op, ParamSpec, TensorType, ValueId};
use fsdpc_ir::{Init, Window2d};

/// Builds one model's forward graph.
pub(crate) struct Builder {
    pub g: Graph,
    /// Next dropout seed: every dropout site gets its own.
    next_seed: u64,
}

impl Builder {
    /// An empty graph named `name` whose root module has class `root_kind`.
    pub fn new(name: &str, root_kind: &str) -> Builder {
        let mut g = Graph::new(name);
        g.set_module_kind(ModuleId::ROOT, root_kind);
        Builder { g, next_seed: 0 }
    }

    /// The module at `path` with class `kind` (created or re-classed).
    pub fn module(&mut self, path: &str, kind: &str) -> ModuleId {
        let id = self.g.module(path, kind);
        self.g.set_module_kind(id, kind);
        id
    }

    /// `{path of m}.{leaf}` (or `leaf` at the root).
    pub fn name_in(&self, m: ModuleId, leaf: &str) -> String {
        join(&self.g.module_info(m).path, leaf)
    }

    /// A trainable f32 parameter `{module path}.{leaf}` and its `Param` node.
    pub fn param(&mut self, m: ModuleId, leaf: &str, shape: &[usize], init: Init) -> ValueId {
        let spec = ParamSpec {
            name: self.name_in(m, leaf),
            ty: TensorType::new(DType::F32, shape.to_vec()),
            init,
            requires_grad: true,
            tied_to: None,
            tp: None,
        };
        self.g.add_param(spec, m)
    }

    /// A node computing `op` in module `m`, named `{module path}.{leaf}`.
    pub fn op(
        &mut self,
        m: ModuleId,
        leaf: &str,
        op: Op,
        inputs: &[ValueId],
    ) -> Result<ValueId, IrError> {
        let name = self.name_in(m, leaf);
        self.g.add1(op, inputs, name, m)
    }

    /// `x @ weight + bias` in a new `Linear` module at `path`, with weight
    /// `[fan_in, fan_out]` (the layout `x @ W` reads) drawn from Normal(0, std)
    /// and a zero bias.
    pub fn linear(
        &mut self,
        x: ValueId,
        path: &str,
        fan_in: usize,
        fan_out: usize,
        std: f64,
    ) -> Result<ValueId, IrError> {
        let m = self.module(path, "Linear");
        let w = self.param(m, "weight", &[fan_in, fan_out], Init::Normal { std });
        let b = self.param(m, "bias", &[fan_out], Init::Zeros);
        let y = self.op(m, "matmul", matmul(false), &[x, w])?;
        self.op(m, "add_bias", binary(BinaryFn::Add), &[y, b])
    }

    /// `x @ weight^T + bias` in a new module of class `kind` at `path`, in
    /// PyTorch's layout: weight `[fan_out, fan_in]` drawn from `weight`, bias
    /// `[fan_out]` from `bias`.
    #[allow(clippy::too_many_arguments)]
    pub fn linear_out_in(
        &mut self,
        x: ValueId,
        path: &str,
        kind: &str,
        fan_in: usize,
        fan_out: usize,
        weight: Init,
        bias: Init,
    ) -> Result<ValueId, IrError> {
        let m = self.module(path, kind);
        let w = self.param(m, "weight", &[fan_out, fan_in], weight);
        let b = self.param(m, "bias", &[fan_out], bias);
        let y = self.op(m, "matmul", matmul(true), &[x, w])?;
        self.op(m, "add_bias", binary(BinaryFn::Add), &[y, b])
    }

    /// PyTorch's `Conv2d` (one group) over `x: [n, in_ch, h, w]` in a new
    /// module at `path`: weight `[out_ch, in_ch, kh, kw]` drawn from
    /// `weight`, and a bias `[out_ch]` drawn from `bias` when given.
    pub fn conv2d(
        &mut self,
        x: ValueId,
        path: &str,
        (in_ch, out_ch): (usize, usize),
        window: Window2d,
        weight: Init,
        bias: Option<Init>,
    ) -> Result<ValueId, IrError> {
        let m = self.module(path, "Conv2d");
        let [kh, kw] = window.kernel;
        let w = self.param(m, "weight", &[out_ch, in_ch, kh, kw], weight);
        let mut inputs = vec![x, w];
        if let Some(init) = bias {
            inputs.push(self.param(m, "bias", &[out_ch], init));
        }
        self.op(m, "conv", Op::Conv { window, groups: 1 }, &inputs)
    }

    /// `LayerNorm(dim, eps)` over the last axis in a new module at `path`, with
    /// weight Ones and bias Zeros as PyTorch initialises them.
    pub fn layer_norm(
        &mut self,
        x: ValueId,
        path: &str,
        dim: usize,
        eps: f64,
    ) -> Result<ValueId, IrError> {
        let m = self.module(path, "LayerNorm");
        let gamma = self.param(m, "weight", &[dim], Init::Ones);
        let beta = self.param(m, "bias", &[dim], Init::Zeros);
        self.op(m, "layer_norm", Op::LayerNorm { eps }, &[x, gamma, beta])
    }

    /// Dropout with probability `p` in module `m` (nothing when `p == 0`); every
    /// site gets a distinct seed.
    pub fn dropout(
        &mut self,
        x: ValueId,
        m: ModuleId,
        leaf: &str,
        p: f64,
    ) -> Result<ValueId, IrError> {
        if p == 0.0 {
            return Ok(x);
        }
        let seed = self.next_seed;
        self.next_seed += 1;
        self.op(
            m,
            leaf,
            Op::Dropout {
                p,
                seed,
                whole_sample: None,
            },
            &[x],
        )
    }
}

/// `parent.leaf`, or `leaf` when `parent` is the root.
pub(crate) fn join(parent: &str, leaf: &str) -> String {
    if parent.is_empty() {
        leaf.to_string()
    } else {
        format!("{parent}.{leaf}")
    }
}

/// Leaf names of LoRA adapter parameters (PEFT's).
pub(crate) const LORA_A: &str = "lora_A";
pub(crate) const LORA_B: &str = "lora_B";

/// Makes the LoRA adapters the only trainable parameters of `g`.
pub(crate) fn train_only_lora(g: &mut Graph) {
    for p in &mut g.params {
        p.requires_grad = p.name.ends_with(LORA_A) || p.name.ends_with(LORA_B);
    }
}

/// The causal-LM head and loss: `x: [.., hidden]` flattened to `[rows,
/// hidden]`, logits `x @ w^T` in the `lm_head` module, with `w` the tied
/// embedding or a new `lm_head.weight` `[vocab, hidden]` drawn from
/// Normal(0, std), and the mean cross-entropy against `labels` flattened to
/// `[rows]` (PyTorch's default ignore_index, -100, marks padding labels).
#[allow(clippy::too_many_arguments)]
pub(crate) fn causal_lm_loss(
    b: &mut Builder,
    x: ValueId,
    tied: Option<ValueId>,
    labels: ValueId,
    rows: usize,
    hidden: usize,
    vocab: usize,
    std: f64,
) -> Result<ValueId, IrError> {
    let m = b.module("lm_head", "Linear");
    let w = match tied {
        Some(w) => w,
        None => b.param(m, "weight", &[vocab, hidden], Init::Normal { std }),
    };
    let x = b.op(m, "flatten", reshape(&[rows, hidden]), &[x])?;
    let logits = b.op(m, "matmul", matmul(true), &[x, w])?;
    let labels = b.op(ModuleId::ROOT, "labels_flat", reshape(&[rows]), &[labels])?;
    let ce = Op::CrossEntropy {
        ignore_index: Some(-100),
    };
    b.op(ModuleId::ROOT, "loss", ce, &[logits, labels])
}

/// What ends a causal LM: its head and loss (`causal_lm_loss`), the loss
/// as the graph's output, LoRA's freeze when `lora`, as a `ZooModel`.
pub(crate) struct CausalLm {
    pub tied: Option<ValueId>,
    pub batch: usize,
    pub seq: usize,
    pub hidden: usize,
    pub vocab: usize,
    pub std: f64,
    pub lora: bool,
}

impl Builder {
    /// The model whose last hidden state is `x`, finished as `lm` says.
    pub(crate) fn finish_causal_lm(
        mut self,
        name: &str,
        x: ValueId,
        labels: ValueId,
        lm: CausalLm,
    ) -> Result<super::ZooModel, IrError> {
        let rows = lm.batch * lm.seq;
        let loss = causal_lm_loss(
            &mut self, x, lm.tied, labels, rows, lm.hidden, lm.vocab, lm.std,
        )?;
        self.g.outputs = vec![loss];
        if lm.lora {
            train_only_lora(&mut self.g);
        }
        Ok(super::ZooModel {
            name: name.to_string(),
            graph: self.g,
            loss,
            tokens_per_sample: lm.seq as u64,
        })
    }
}

/// Swaps the sequence and head axes of `[batch, seq, heads, head_dim]`.
pub(crate) fn transpose_heads() -> Op {
    Op::Transpose {
        perm: vec![0, 2, 1, 3],
    }
}

pub(crate) fn reshape(shape: &[usize]) -> Op {
    Op::Reshape {
        shape: shape.to_vec(),
    }
}

/// A binary elementwise op.
pub(crate) fn binary(f: BinaryFn) -> Op {
    Op::Binary { f }
}

/// A matrix product, optionally with the second operand transposed.
pub(crate) fn matmul(trans_b: bool) -> Op {
    Op::MatMul {
        trans_a: false,
        trans_b,
    }
}
