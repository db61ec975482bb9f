//! The CPU kernels, one file per op family, and `run`: the one table that
//! maps every `Op` to its kernel.
//!
//! f32 is the compute type. Arithmetic ops given bf16/f16 operands run on
//! promoted f32 copies (`promoted`), a slow path kept for mixed-precision
//! plans; data-movement ops (`Op::moves_data`) copy elements of any dtype.

pub mod attention;
pub mod cast;
pub mod conv;
pub mod dropout;
pub mod elementwise;
pub mod fastmath;
pub mod gather;
pub mod layout;
pub mod loss;
pub mod matmul;
pub mod norm;
pub mod pool;
pub mod reduce;
pub mod shape;
pub mod simd;
pub mod softmax;
pub mod source;
pub mod unary;
pub mod vocab;

use crate::backend::{KernelCtx, Workspace};
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};
use fsdpc_ir::{DType, Op, TensorType};
use gemm::Parallelism;
use shape::SliceSpec;
use smallvec::SmallVec;
use softmax::Kind;

/// Settings every kernel may read.
#[derive(Copy, Clone, Debug)]
pub struct Cfg {
    /// How gemm parallelises a product.
    pub par: Parallelism,
}

/// The inputs, checked for count.
fn ins<'a, 'b, const N: usize>(xs: &'b [TensorRef<'a>]) -> KResult<[&'b TensorRef<'a>; N]> {
    if xs.len() != N {
        crate::kbail!("expected {N} inputs, got {}", xs.len());
    }
    Ok(std::array::from_fn(|i| &xs[i]))
}

/// The single output.
fn out1<'a, 'b>(ys: &'b mut [TensorMut<'a>]) -> KResult<&'b mut TensorMut<'a>> {
    match ys {
        [y] => Ok(y),
        _ => crate::kbail!("expected one output, got {}", ys.len()),
    }
}

/// Runs `op` on `xs` into `ys`.
pub fn run(
    cfg: &Cfg,
    op: &Op,
    xs: &[TensorRef],
    ys: &mut [TensorMut],
    ctx: &KernelCtx,
    ws: &mut Workspace,
) -> KResult<()> {
    let half = |d: DType| matches!(d, DType::Bf16 | DType::F16);
    if !op.moves_data()
        && (xs.iter().any(|x| half(x.dtype())) || ys.iter().any(|y| half(y.dtype())))
    {
        return promoted(cfg, op, xs, ys, ctx, ws);
    }
    dispatch(cfg, op, xs, ys, ctx, ws)
}

/// Runs an arithmetic op on f32 copies of its half-precision operands,
/// carved from the workspace (the planner's rule: their f32 bytes, each
/// rounded up to 8, then the op's own scratch); other operands are used as
/// they are.
fn promoted(
    cfg: &Cfg,
    op: &Op,
    xs: &[TensorRef],
    ys: &mut [TensorMut],
    ctx: &KernelCtx,
    ws: &mut Workspace,
) -> KResult<()> {
    let half = |d: DType| matches!(d, DType::Bf16 | DType::F16);
    let widen = |t: &TensorType| TensorType {
        dtype: DType::F32,
        shape: t.shape.clone(),
    };
    let mut wide_x: SmallVec<[(TensorType, &mut [u8]); 4]> = SmallVec::new();
    for x in xs.iter().filter(|x| half(x.dtype())) {
        wide_x.push((widen(x.ty), ws.carve(x.numel() * 4)?));
    }
    let mut wide_y: SmallVec<[(TensorType, &mut [u8]); 4]> = SmallVec::new();
    for y in ys.iter().filter(|y| half(y.dtype())) {
        wide_y.push((widen(y.ty), ws.carve(y.numel() * 4)?));
    }
    let mut wx = wide_x.iter_mut();
    let mut xv: SmallVec<[TensorRef; 4]> = SmallVec::new();
    for x in xs {
        if half(x.dtype()) {
            let Some((ty, bytes)) = wx.next() else {
                crate::kbail!("promoted: operand count changed");
            };
            let mut w = TensorMut::new(ty, bytes)?;
            cast::cast(x, &mut w)?;
        }
    }
    let mut wx = wide_x.iter();
    for x in xs {
        if half(x.dtype()) {
            let Some((ty, bytes)) = wx.next() else {
                crate::kbail!("promoted: operand count changed");
            };
            xv.push(TensorRef::new(ty, bytes)?);
        } else {
            xv.push(TensorRef {
                ty: x.ty,
                bytes: x.bytes,
            });
        }
    }
    {
        let mut wy = wide_y.iter_mut();
        let mut yv: SmallVec<[TensorMut; 4]> = SmallVec::new();
        for y in ys.iter_mut() {
            if half(y.dtype()) {
                let Some((ty, bytes)) = wy.next() else {
                    crate::kbail!("promoted: operand count changed");
                };
                yv.push(TensorMut::new(ty, bytes)?);
            } else {
                yv.push(TensorMut {
                    ty: y.ty,
                    bytes: &mut *y.bytes,
                });
            }
        }
        dispatch(cfg, op, &xv, &mut yv, ctx, ws)?;
    }
    let mut wy = wide_y.iter();
    for y in ys.iter_mut().filter(|y| half(y.dtype())) {
        let Some((ty, bytes)) = wy.next() else {
            crate::kbail!("promoted: operand count changed");
        };
        cast::cast(&TensorRef::new(ty, bytes)?, y)?;
    }
    Ok(())
}

/// The table: one arm per op.
fn dispatch(
    cfg: &Cfg,
    op: &Op,
    xs: &[TensorRef],
    ys: &mut [TensorMut],
    ctx: &KernelCtx,
    ws: &mut Workspace,
) -> KResult<()> {
    match op {
        Op::Input { name } => {
            crate::kbail!("input `{name}` is fed by the data source, not a kernel")
        }
        Op::Param { param } => crate::kbail!(
            "parameter {} lives in its flat parameter, not a kernel",
            param.0
        ),
        Op::Constant { value } => source::constant(value, out1(ys)?),
        Op::Unary { f } => unary::unary(*f, ins::<1>(xs)?[0], out1(ys)?),
        Op::UnaryGrad { f } => {
            let [x, dy] = ins(xs)?;
            unary::unary_grad(*f, x, dy, out1(ys)?)
        }
        Op::Binary { f } => {
            let [a, b] = ins(xs)?;
            elementwise::binary(*f, a, b, out1(ys)?)
        }
        Op::Compare { f } => {
            let [a, b] = ins(xs)?;
            elementwise::compare(*f, a, b, out1(ys)?)
        }
        Op::Logical { f } => {
            let [a, b] = ins(xs)?;
            elementwise::logical(*f, a, b, out1(ys)?)
        }
        Op::Not => elementwise::not(ins::<1>(xs)?[0], out1(ys)?),
        Op::Where => {
            let [c, a, b] = ins(xs)?;
            elementwise::where_(c, a, b, out1(ys)?)
        }
        Op::Cast { .. } | Op::TpCopy => cast::cast(ins::<1>(xs)?[0], out1(ys)?),
        &Op::Dropout {
            p,
            seed,
            whole_sample,
        } => {
            let (x, offset) = match (whole_sample, xs) {
                (None, [x]) => (x, None),
                (Some(_), [x, offset]) => (x, Some(offset)),
                _ => crate::kbail!("dropout: {} inputs", xs.len()),
            };
            let place = dropout::Place {
                whole_sample,
                offset,
            };
            dropout::dropout(p, seed, place, ctx, x, out1(ys)?)
        }
        Op::MatMul { trans_a, trans_b } => {
            let [a, b] = ins(xs)?;
            matmul::matmul(cfg.par, *trans_a, *trans_b, a, b, out1(ys)?)
        }
        _ => dispatch_structured(cfg, op, xs, ys, ws),
    }
}

/// Normalisation, attention, softmax, reductions, losses, shape ops.
fn dispatch_structured(
    cfg: &Cfg,
    op: &Op,
    xs: &[TensorRef],
    ys: &mut [TensorMut],
    ws: &mut Workspace,
) -> KResult<()> {
    match op {
        Op::LayerNorm { eps } => match xs {
            [x, g] => norm::layer_norm(*eps, x, g, None, out1(ys)?),
            [x, g, b] => norm::layer_norm(*eps, x, g, Some(b), out1(ys)?),
            _ => crate::kbail!("layer_norm takes (x, gamma[, beta])"),
        },
        Op::LayerNormGrad { eps, .. } => norm::layer_norm_grad(*eps, ins(xs)?, ys, ws),
        Op::RmsNorm { eps } => {
            let [x, g] = ins(xs)?;
            norm::rms_norm(*eps, x, g, out1(ys)?)
        }
        Op::RmsNormGrad { eps } => norm::rms_norm_grad(*eps, ins(xs)?, ys, ws),
        Op::Softmax { axis } => {
            softmax::forward(Kind::Softmax, *axis, ins::<1>(xs)?[0], out1(ys)?, ws)
        }
        Op::LogSoftmax { axis } => {
            softmax::forward(Kind::LogSoftmax, *axis, ins::<1>(xs)?[0], out1(ys)?, ws)
        }
        Op::SoftmaxGrad { axis } => {
            let [y, dy] = ins(xs)?;
            softmax::backward(Kind::Softmax, *axis, y, dy, out1(ys)?, ws)
        }
        Op::LogSoftmaxGrad { axis } => {
            let [y, dy] = ins(xs)?;
            softmax::backward(Kind::LogSoftmax, *axis, y, dy, out1(ys)?, ws)
        }
        Op::Attention { causal, scale } => {
            attention::forward(cfg.par, *causal, *scale, ins(xs)?, out1(ys)?, ws)
        }
        Op::AttentionGrad { causal, scale } => {
            attention::backward(cfg.par, *causal, *scale, ins(xs)?, ys, ws)
        }
        Op::CrossEntropy { ignore_index } => {
            let [logits, labels] = ins(xs)?;
            loss::forward(*ignore_index, logits, labels, out1(ys)?)
        }
        Op::CrossEntropyGrad { ignore_index } => loss::backward(*ignore_index, ins(xs)?, out1(ys)?),
        Op::TpLogitStats {
            ignore_index,
            parts,
            vocab,
        } => {
            let v = vocab::Split::new(*parts, *vocab);
            vocab::logit_stats(*ignore_index, v, ins(xs)?, out1(ys)?)
        }
        Op::TpLogitStatsGrad {
            ignore_index,
            parts,
            vocab,
        } => {
            let v = vocab::Split::new(*parts, *vocab);
            vocab::logit_stats_grad(*ignore_index, v, ins(xs)?, out1(ys)?)
        }
        Op::Conv { .. } => conv::conv(cfg, op, xs, out1(ys)?, ws),
        Op::ConvGradInput { .. } => conv::conv_grad_input(cfg, op, ins(xs)?, out1(ys)?, ws),
        Op::ConvGradWeight { .. } => conv::conv_grad_weight(cfg, op, ins(xs)?, out1(ys)?, ws),
        Op::MaxPool { window } => pool::max_pool(window, ins::<1>(xs)?[0], out1(ys)?),
        Op::MaxPoolGrad { window } => pool::max_pool_grad(window, ins(xs)?, out1(ys)?),
        Op::AvgPool {
            window,
            count_include_pad,
        } => pool::avg_pool(window, *count_include_pad, ins::<1>(xs)?[0], out1(ys)?),
        Op::AvgPoolGrad {
            window,
            count_include_pad,
            ..
        } => pool::avg_pool_grad(window, *count_include_pad, ins::<1>(xs)?[0], out1(ys)?),
        Op::Reduce { f, axes, .. } => reduce::reduce(*f, axes, ins::<1>(xs)?[0], out1(ys)?),
        Op::ReduceMaxGrad { axes, .. } => reduce::reduce_max_grad(axes, ins(xs)?, out1(ys)?, ws),
        Op::SumTo { .. } => reduce::sum_to(ins::<1>(xs)?[0], out1(ys)?),
        _ => dispatch_shape(op, xs, ys),
    }
}

/// Data-movement ops and the gather family.
fn dispatch_shape(op: &Op, xs: &[TensorRef], ys: &mut [TensorMut]) -> KResult<()> {
    match op {
        Op::Gather { axis } => {
            let [data, idx] = ins(xs)?;
            gather::gather(*axis, data, idx, out1(ys)?)
        }
        Op::GatherGrad { axis, .. } => {
            let [idx, dy] = ins(xs)?;
            gather::gather_grad(*axis, idx, dy, out1(ys)?)
        }
        Op::TpLookup { parts, vocab } => {
            vocab::lookup(vocab::Split::new(*parts, *vocab), ins(xs)?, out1(ys)?)
        }
        Op::TpLookupGrad { parts, vocab, .. } => {
            vocab::lookup_grad(vocab::Split::new(*parts, *vocab), ins(xs)?, out1(ys)?)
        }
        Op::Reshape { .. } => shape::reshape(ins::<1>(xs)?[0], out1(ys)?),
        Op::Transpose { perm } => shape::transpose(perm, ins::<1>(xs)?[0], out1(ys)?),
        &Op::Slice {
            axis,
            start,
            end,
            step,
        } => {
            let s = SliceSpec {
                axis,
                start,
                end,
                step,
            };
            shape::slice(s, ins::<1>(xs)?[0], out1(ys)?)
        }
        &Op::SliceGrad {
            axis,
            start,
            end,
            step,
            ..
        } => {
            let s = SliceSpec {
                axis,
                start,
                end,
                step,
            };
            shape::slice_grad(s, ins::<1>(xs)?[0], out1(ys)?)
        }
        Op::Concat { axis } => shape::concat(*axis, xs, out1(ys)?),
        Op::Expand { .. } => shape::expand(ins::<1>(xs)?[0], out1(ys)?),
        Op::Pad { pads, value } => shape::pad(pads, *value, ins::<1>(xs)?[0], out1(ys)?),
        other => crate::kbail!("no CPU kernel for `{}`", other.name()),
    }
}
