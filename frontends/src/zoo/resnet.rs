//! ResNet (He et al. 2016) exactly as torchvision's `resnet18` ...
//! `resnet152` define it: a 7x7/2 stem convolution, normalisation, ReLU and
//! a 3x3/2 max pool; four stages of `BasicBlock`s (depths 18 and 34) or
//! `Bottleneck`s (50, 101, 152; expansion 4, stride on the 3x3 convolution
//! as torchvision's "v1.5"), each stage after the first halving the
//! resolution; a downsample (1x1 convolution with the block's stride and a
//! normalisation) wherever a block changes its input's shape; global average
//! pooling; and a `fc` Linear to the class logits, trained with
//! cross-entropy against integer `labels`. Module paths, parameter names
//! and module classes are torchvision's (`layer2.0.downsample.0.weight`,
//! `BasicBlock`, `Bottleneck`, `Conv2d`, `BatchNorm2d`, `Linear`), so
//! `--wrap kind:Bottleneck` or `--wrap blocks` make one unit per block.
//!
//! Normalisation (`bn=`): `train` (the default) is `BatchNorm2d` in
//! training mode, as torchvision trains it: each rank's micro-batch
//! normalised with its own statistics over images and positions, the
//! running mean (Zeros) and variance (Ones) module buffers updated every
//! forward with momentum 0.1, the variance unbiased; `frozen` is the
//! inference-mode normalisation torchvision's detection models use
//! (`torchvision.ops.FrozenBatchNorm2d`): `y = x * scale + (bias -
//! running_mean * scale)` with `scale = weight / sqrt(running_var + eps)`,
//! the running mean (0) and variance (1) constants of the graph. eps 1e-5
//! in both; `weight` (Ones) and `bias` (Zeros) are trainable parameters.
//! So the trainable parameters are torchvision's `model.parameters()`,
//! with its counts (`resnet50`: 25,557,032).
//!
//! Initialisation as torchvision: convolution weights Kaiming-normal in
//! fan-out mode (std sqrt(2 / (out_channels * kh * kw))), `fc` PyTorch's
//! Linear default (weight and bias Uniform(-1/sqrt(fan_in), 1/sqrt(fan_in))).
//!
//! `width` is the channels of the stem and the first stage (torchvision's
//! 64); stage s has `width * 2^s` planes (times 4 out of a `Bottleneck`).
//! Any other width scales the whole network (it is not torchvision's
//! `width_per_group` of the wide ResNets); small widths make test models.

use super::builder::{binary, reshape, Builder};
use super::spec::{required, Spec};
use super::ZooModel;
use crate::error::FrontendError;
use fsdpc_ir::{
    BinaryFn, DType, Init, IrError, ModuleId, Op, ReduceFn, TensorData, TensorType, UnaryFn,
    ValueId, Window2d,
};

/// Epsilon of torchvision's `BatchNorm2d` and `FrozenBatchNorm2d`.
const BN_EPS: f64 = 1e-5;
/// PyTorch's `BatchNorm2d` momentum: the batch statistic's share of the
/// running one's update.
const BN_MOMENTUM: f64 = 0.1;

/// The depths torchvision defines, and each one's blocks per stage.
const DEPTHS: &[(&str, [usize; 4])] = &[
    ("18", [2, 2, 2, 2]),
    ("34", [3, 4, 6, 3]),
    ("50", [3, 4, 6, 3]),
    ("101", [3, 4, 23, 3]),
    ("152", [3, 8, 36, 3]),
];

/// Sizes of a ResNet classifier.
#[derive(Clone, Debug, PartialEq)]
pub struct ResNetConfig {
    /// 18, 34 (`BasicBlock`s), 50, 101 or 152 (`Bottleneck`s).
    pub depth: usize,
    /// Output classes.
    pub classes: usize,
    /// Height and width of the input images.
    pub image: usize,
    /// Images per step on one rank.
    pub batch: usize,
    /// Channels of the stem and the first stage (torchvision: 64).
    pub width: usize,
    /// How every `BatchNorm2d` normalises.
    pub norm: Norm,
}

/// How a ResNet's `BatchNorm2d`s normalise (`bn=`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Norm {
    /// Training mode: batch statistics, running statistics module buffers.
    Train,
    /// `FrozenBatchNorm2d`: the running statistics constants.
    Frozen,
}

/// The keys a `resnet` spec accepts.
pub(crate) const KEYS: &[&str] = &["depth", "classes", "image", "batch", "width", "bn"];

/// One residual block: where it is and what it maps.
struct BlockPlan {
    path: String,
    in_ch: usize,
    planes: usize,
    stride: usize,
    norm: Norm,
}

impl ResNetConfig {
    /// torchvision's `resnet{depth}`: 1000 classes, 224x224 images, batch 1.
    pub(crate) fn preset(depth: usize) -> ResNetConfig {
        ResNetConfig {
            depth,
            classes: 1000,
            image: 224,
            batch: 1,
            width: 64,
            norm: Norm::Train,
        }
    }

    /// The config `spec` describes, starting from `base` (a preset) if given.
    pub(crate) fn from_spec(
        spec: &mut Spec<'_>,
        base: Option<&ResNetConfig>,
    ) -> Result<ResNetConfig, FrontendError> {
        let names: Vec<&'static str> = DEPTHS.iter().map(|(d, _)| *d).collect();
        let depth = spec
            .choice("depth", &names)?
            .map(|d| d.parse().expect("a listed depth"));
        let classes = spec.size("classes")?;
        let image = spec.size("image")?;
        let batch = spec.size("batch")?;
        let width = spec.size("width")?;
        let norm = spec.choice("bn", &["train", "frozen"])?.map(|v| match v {
            "frozen" => Norm::Frozen,
            _ => Norm::Train,
        });
        spec.finish(KEYS)?;
        let need = "depth (18, 34, 50, 101 or 152)";
        Ok(ResNetConfig {
            depth: required(spec, "depth", depth, base.map(|b| b.depth), need)?,
            classes: classes.or(base.map(|b| b.classes)).unwrap_or(1000),
            image: image.or(base.map(|b| b.image)).unwrap_or(224),
            batch: batch.or(base.map(|b| b.batch)).unwrap_or(1),
            width: width.or(base.map(|b| b.width)).unwrap_or(64),
            norm: norm.or(base.map(|b| b.norm)).unwrap_or(Norm::Train),
        })
    }

    /// Blocks per stage.
    fn stages(&self) -> [usize; 4] {
        let depth = self.depth.to_string();
        DEPTHS
            .iter()
            .find(|(d, _)| *d == depth)
            .map(|(_, s)| *s)
            .expect("a config holds a listed depth")
    }

    /// Whether the blocks are `Bottleneck`s (depth 50 and up).
    fn bottleneck(&self) -> bool {
        self.depth >= 50
    }

    /// Output channels per input plane of a block (torchvision's `expansion`).
    fn expansion(&self) -> usize {
        if self.bottleneck() {
            4
        } else {
            1
        }
    }

    /// Every residual block in order, as torchvision's `_make_layer` makes them.
    fn blocks(&self) -> Vec<BlockPlan> {
        let mut out = Vec::new();
        let mut in_ch = self.width;
        for (s, &n) in self.stages().iter().enumerate() {
            let planes = self.width << s;
            for i in 0..n {
                out.push(BlockPlan {
                    path: format!("layer{}.{i}", s + 1),
                    in_ch,
                    planes,
                    stride: if s > 0 && i == 0 { 2 } else { 1 },
                    norm: self.norm,
                });
                in_ch = planes * self.expansion();
            }
        }
        out
    }

    /// Parameter elements of the model.
    pub fn param_count(&self) -> u64 {
        let conv = |i: usize, o: usize, k: usize| (i * o * k * k) as u64;
        let bn = |c: usize| 2 * c as u64;
        let e = self.expansion();
        let mut n = conv(3, self.width, 7) + bn(self.width);
        for blk in self.blocks() {
            let (i, p) = (blk.in_ch, blk.planes);
            n += if self.bottleneck() {
                conv(i, p, 1) + bn(p) + conv(p, p, 3) + bn(p) + conv(p, e * p, 1) + bn(e * p)
            } else {
                conv(i, p, 3) + bn(p) + conv(p, p, 3) + bn(p)
            };
            if blk.stride != 1 || i != e * p {
                n += conv(i, e * p, 1) + bn(e * p);
            }
        }
        let features = (8 * self.width * e) as u64;
        n + features * self.classes as u64 + self.classes as u64
    }
}

/// Builds the forward graph (with its loss) of `cfg`, named `name`.
pub(crate) fn build(name: &str, cfg: &ResNetConfig) -> Result<ZooModel, FrontendError> {
    let mut b = Builder::new(name, "ResNet");
    let root = ModuleId::ROOT;
    let shape = [cfg.batch, 3, cfg.image, cfg.image];
    let pixels =
        b.g.add_input("pixel_values", TensorType::new(DType::F32, shape));
    let labels =
        b.g.add_input("labels", TensorType::new(DType::I64, [cfg.batch]));
    let mut x = conv(&mut b, pixels, "conv1", (3, cfg.width), 7, 2)?;
    x = batch_norm(&mut b, x, "bn1", cfg.width, cfg.norm)?;
    x = relu(&mut b, root, "relu", x)?;
    let pool = Window2d {
        stride: [2, 2],
        pads: [1; 4],
        ..Window2d::of_kernel([3, 3])
    };
    x = b.op(root, "maxpool", Op::MaxPool { window: pool }, &[x])?;
    for s in 1..=4 {
        b.module(&format!("layer{s}"), "Sequential");
    }
    for blk in cfg.blocks() {
        x = if cfg.bottleneck() {
            bottleneck(&mut b, x, &blk)?
        } else {
            basic_block(&mut b, x, &blk)?
        };
    }
    let mean = Op::Reduce {
        f: ReduceFn::Mean,
        axes: vec![2, 3],
        keepdims: false,
    };
    x = b.op(root, "avgpool", mean, &[x])?;
    let features = 8 * cfg.width * cfg.expansion();
    let bound = 1.0 / (features as f64).sqrt();
    let uniform = Init::Uniform {
        low: -bound,
        high: bound,
    };
    let logits = b.linear_out_in(
        x,
        "fc",
        "Linear",
        features,
        cfg.classes,
        uniform.clone(),
        uniform,
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

/// torchvision's `BasicBlock`: `relu(bn2(conv2(relu(bn1(conv1(x))))) + identity)`.
fn basic_block(b: &mut Builder, x: ValueId, blk: &BlockPlan) -> Result<ValueId, IrError> {
    let path = &blk.path;
    let m = b.module(path, "BasicBlock");
    let p = blk.planes;
    let y = conv(
        b,
        x,
        &format!("{path}.conv1"),
        (blk.in_ch, p),
        3,
        blk.stride,
    )?;
    let y = batch_norm(b, y, &format!("{path}.bn1"), p, blk.norm)?;
    let y = relu(b, m, "relu_1", y)?;
    let y = conv(b, y, &format!("{path}.conv2"), (p, p), 3, 1)?;
    let y = batch_norm(b, y, &format!("{path}.bn2"), p, blk.norm)?;
    residual(b, m, x, y, blk, p)
}

/// torchvision's `Bottleneck` (v1.5: the stride on `conv2`): 1x1 to `planes`,
/// 3x3, 1x1 to `4 * planes`, each normalised, then the residual.
fn bottleneck(b: &mut Builder, x: ValueId, blk: &BlockPlan) -> Result<ValueId, IrError> {
    let path = &blk.path;
    let m = b.module(path, "Bottleneck");
    let p = blk.planes;
    let y = conv(b, x, &format!("{path}.conv1"), (blk.in_ch, p), 1, 1)?;
    let y = batch_norm(b, y, &format!("{path}.bn1"), p, blk.norm)?;
    let y = relu(b, m, "relu_1", y)?;
    let y = conv(b, y, &format!("{path}.conv2"), (p, p), 3, blk.stride)?;
    let y = batch_norm(b, y, &format!("{path}.bn2"), p, blk.norm)?;
    let y = relu(b, m, "relu_2", y)?;
    let y = conv(b, y, &format!("{path}.conv3"), (p, 4 * p), 1, 1)?;
    let y = batch_norm(b, y, &format!("{path}.bn3"), 4 * p, blk.norm)?;
    residual(b, m, x, y, blk, 4 * p)
}

/// `relu(y + identity)`, the identity being `x` or, where the block changes
/// the shape (stride or channels), `downsample(x)`: a 1x1 convolution with
/// the block's stride to `out_ch` channels and a normalisation.
fn residual(
    b: &mut Builder,
    m: ModuleId,
    x: ValueId,
    y: ValueId,
    blk: &BlockPlan,
    out_ch: usize,
) -> Result<ValueId, IrError> {
    let identity = if blk.stride != 1 || blk.in_ch != out_ch {
        let path = format!("{}.downsample", blk.path);
        b.module(&path, "Sequential");
        let d = conv(
            b,
            x,
            &format!("{path}.0"),
            (blk.in_ch, out_ch),
            1,
            blk.stride,
        )?;
        batch_norm(b, d, &format!("{path}.1"), out_ch, blk.norm)?
    } else {
        x
    };
    let sum = b.op(m, "add_identity", binary(BinaryFn::Add), &[y, identity])?;
    relu(b, m, "relu_out", sum)
}

/// A `k`x`k` convolution without bias at `path`, with torchvision's padding
/// (`k / 2`, so a stride-1 convolution keeps the size) and initialisation
/// (Kaiming-normal, fan-out mode).
fn conv(
    b: &mut Builder,
    x: ValueId,
    path: &str,
    (in_ch, out_ch): (usize, usize),
    k: usize,
    stride: usize,
) -> Result<ValueId, IrError> {
    let window = Window2d {
        stride: [stride; 2],
        pads: [k / 2; 4],
        ..Window2d::of_kernel([k, k])
    };
    let std = (2.0 / (out_ch * k * k) as f64).sqrt();
    b.conv2d(x, path, (in_ch, out_ch), window, Init::Normal { std }, None)
}

fn relu(b: &mut Builder, m: ModuleId, leaf: &str, x: ValueId) -> Result<ValueId, IrError> {
    b.op(m, leaf, Op::Unary { f: UnaryFn::Relu }, &[x])
}

/// A `BatchNorm2d` of `ch` channels at `path` over `x: [n, ch, h, w]`
/// (see the module header): trainable `weight` and `bias`; running
/// statistics module buffers (`Norm::Train`) or constants (`Frozen`).
fn batch_norm(
    b: &mut Builder,
    x: ValueId,
    path: &str,
    ch: usize,
    norm: Norm,
) -> Result<ValueId, IrError> {
    let m = b.module(path, "BatchNorm2d");
    let weight = b.param(m, "weight", &[ch], Init::Ones);
    let bias = b.param(m, "bias", &[ch], Init::Zeros);
    if norm == Norm::Train {
        return batch_norm_train(b, m, x, ch, (weight, bias));
    }
    let mean = channel_constant(b, m, "running_mean", ch, 0.0)?;
    let var = channel_constant(b, m, "running_var", ch, 1.0)?;
    let eps = Op::Constant {
        value: TensorData::scalar(DType::F32, BN_EPS),
    };
    let eps = b.op(m, "eps", eps, &[])?;
    let var = b.op(m, "var_eps", binary(BinaryFn::Add), &[var, eps])?;
    let inv_std = b.op(m, "rsqrt", Op::Unary { f: UnaryFn::Rsqrt }, &[var])?;
    let scale = b.op(m, "scale", binary(BinaryFn::Mul), &[weight, inv_std])?;
    let shifted = b.op(m, "mean_scale", binary(BinaryFn::Mul), &[mean, scale])?;
    let shift = b.op(m, "shift", binary(BinaryFn::Sub), &[bias, shifted])?;
    let scale = b.op(m, "scale_nchw", reshape(&[ch, 1, 1]), &[scale])?;
    let shift = b.op(m, "shift_nchw", reshape(&[ch, 1, 1]), &[shift])?;
    let y = b.op(m, "mul_scale", binary(BinaryFn::Mul), &[x, scale])?;
    b.op(m, "add_shift", binary(BinaryFn::Add), &[y, shift])
}

/// Training mode: `(x - mean) / sqrt(var + eps) * weight + bias` with the
/// micro-batch's per-channel mean and biased variance, and the running
/// statistics replaced by `0.9 running + 0.1 batch` (the variance's batch
/// value unbiased, `n / (n - 1)` with n values per channel), as
/// `torch.nn.BatchNorm2d` does.
fn batch_norm_train(
    b: &mut Builder,
    m: ModuleId,
    x: ValueId,
    ch: usize,
    (weight, bias): (ValueId, ValueId),
) -> Result<ValueId, IrError> {
    let dims = b.g.value_type(x).shape.dims().to_vec();
    let n: usize = dims
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, d)| d)
        .product();
    if n < 2 {
        return Err(IrError::Invalid(format!(
            "`{}` normalises in training mode over one value per channel (input {dims:?}); \
             PyTorch refuses that too: give a larger batch or image, or `bn=frozen`",
            b.g.module_info(m).path
        )));
    }
    let mean_op = || Op::Reduce {
        f: ReduceFn::Mean,
        axes: vec![0, 2, 3],
        keepdims: true,
    };
    let mean = b.op(m, "batch_mean", mean_op(), &[x])?;
    let d = b.op(m, "centred", binary(BinaryFn::Sub), &[x, mean])?;
    let sq = b.op(m, "centred_sq", binary(BinaryFn::Mul), &[d, d])?;
    let var = b.op(m, "batch_var", mean_op(), &[sq])?;
    let eps = Op::Constant {
        value: TensorData::scalar(DType::F32, BN_EPS),
    };
    let eps = b.op(m, "eps", eps, &[])?;
    let var_eps = b.op(m, "var_eps", binary(BinaryFn::Add), &[var, eps])?;
    let inv_std = b.op(m, "rsqrt", Op::Unary { f: UnaryFn::Rsqrt }, &[var_eps])?;
    let xhat = b.op(m, "normalised", binary(BinaryFn::Mul), &[d, inv_std])?;
    let w = b.op(m, "weight_nchw", reshape(&[ch, 1, 1]), &[weight])?;
    let s = b.op(m, "bias_nchw", reshape(&[ch, 1, 1]), &[bias])?;
    let y = b.op(m, "mul_weight", binary(BinaryFn::Mul), &[xhat, w])?;
    let y = b.op(m, "add_bias", binary(BinaryFn::Add), &[y, s])?;
    let unbias = n as f64 / (n as f64 - 1.0);
    for (leaf, batch, init, factor) in [
        ("running_mean", mean, Init::Zeros, 1.0),
        ("running_var", var, Init::Ones, unbias),
    ] {
        let spec = fsdpc_ir::ModuleBufferSpec {
            name: b.name_in(m, leaf),
            ty: TensorType::new(DType::F32, [ch]),
            init,
        };
        let buffer = fsdpc_ir::ModuleBufferId(b.g.buffers.len() as u32);
        let running = b.g.add_buffer(spec, m);
        let keep = scalar(b, m, &format!("{leaf}_keep"), 1.0 - BN_MOMENTUM)?;
        let take = scalar(b, m, &format!("{leaf}_take"), BN_MOMENTUM * factor)?;
        let batch = b.op(m, &format!("{leaf}_batch"), reshape(&[ch]), &[batch])?;
        let kept = b.op(
            m,
            &format!("{leaf}_kept"),
            binary(BinaryFn::Mul),
            &[running, keep],
        )?;
        let taken = b.op(
            m,
            &format!("{leaf}_taken"),
            binary(BinaryFn::Mul),
            &[batch, take],
        )?;
        let new = b.op(
            m,
            &format!("{leaf}_new"),
            binary(BinaryFn::Add),
            &[kept, taken],
        )?;
        let name = b.name_in(m, &format!("{leaf}_write"));
        b.g.add(Op::WriteBuffer { buffer }, &[new], name, m)?;
    }
    Ok(y)
}

/// The f32 scalar constant `value`.
fn scalar(b: &mut Builder, m: ModuleId, leaf: &str, value: f64) -> Result<ValueId, IrError> {
    let value = TensorData::scalar(DType::F32, value);
    b.op(m, leaf, Op::Constant { value }, &[])
}

/// The f32 constant `[ch]` with every element `value`.
fn channel_constant(
    b: &mut Builder,
    m: ModuleId,
    leaf: &str,
    ch: usize,
    value: f64,
) -> Result<ValueId, IrError> {
    let ty = TensorType::new(DType::F32, [ch]);
    let data = TensorData::from_f64s(ty, &vec![value; ch]).expect("ch f32 values fit [ch]");
    b.op(m, leaf, Op::Constant { value: data }, &[])
}
