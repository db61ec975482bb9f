//! A graph node's kernel as device work, decided once before the first
//! step: `lower` turns an op and its operands' device addresses into
//! `Action`s (kernel launches, cuBLAS products, copies, fills) and the
//! private scratch it needs. Every kernel computes in f32 whatever the float
//! dtype of its operands (bf16/f16 are read and written rounded), so no
//! promotion copies are made. Shapes are checked here; values the kernels
//! check (indices, labels) are reported through the stream's error word.
//!
//! This file holds the types (`Operand`, `Action`, `Lowered`), the helpers
//! every family shares, and the dispatch: one arm per op, in the order of
//! `cpu/kernels/mod.rs`, each calling its family's file, which mirror
//! `cpu/kernels/`: `source`, `unary`, `elementwise`, `cast`, `dropout`,
//! `norm`, `softmax`, `loss`, `reduce`, `gather`, `vocab`, `shape`, `conv`,
//! `pool`. Matrix products
//! and attention are lowered by the sibling modules `blas` and `attention`.

mod cast;
mod conv;
mod dropout;
mod elementwise;
mod gather;
mod loss;
mod norm;
mod pool;
mod reduce;
mod shape;
mod softmax;
mod source;
mod unary;
mod vocab;

use super::blas::Gemm;
use super::device::{blocks_for, Arg, Launch, Ptr, THREADS};
use fsdpc_ir::{DType, Op, TensorType};

pub use dropout::{dropout_base, issued as dropout_issued};

/// One operand: its device address and type.
#[derive(Copy, Clone, Debug)]
pub struct Operand<'a> {
    /// Device address.
    pub ptr: u64,
    /// Its type.
    pub ty: &'a TensorType,
}

impl Operand<'_> {
    fn dims(&self) -> &[usize] {
        &self.ty.shape.0
    }
    /// Its element count.
    pub fn numel(&self) -> u64 {
        self.ty.numel()
    }
    fn dt(&self) -> Arg {
        Arg::I32(dt_code(self.ty.dtype))
    }
    fn p(&self) -> Arg {
        Arg::Ptr(Ptr::Abs(self.ptr))
    }
}

/// Device work of one instruction.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// A kernel.
    Launch(Launch),
    /// The dropout kernel, whose mask depends on the step: argument
    /// `base_arg` is set to the mask base of (`seed`, step) when issued.
    Dropout {
        /// The launch.
        launch: Launch,
        /// Index of its `base` argument.
        base_arg: usize,
        /// Indices of its `p` and `scale` arguments: 0 and 1 in evaluation,
        /// which keeps every element unscaled.
        p_scale_args: (usize, usize),
        /// The mask seed (op seed mixed with the run seed).
        seed: u64,
    },
    /// A matrix product.
    Gemm(Gemm),
    /// `bytes` zero bytes at `ptr`.
    Zero {
        /// Device address (`Ptr::Scratch` allowed).
        ptr: Ptr,
        /// Bytes.
        bytes: u64,
    },
    /// Device-to-device copy.
    Copy {
        /// Source address.
        src: u64,
        /// Destination address.
        dst: u64,
        /// Bytes.
        bytes: u64,
    },
    /// Host bytes (a constant) copied to `dst`.
    Upload {
        /// Destination address.
        dst: u64,
        /// The bytes.
        bytes: Vec<u8>,
    },
}

/// What `lower` produces.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Lowered {
    /// The work, in order.
    pub actions: Vec<Action>,
    /// Bytes of the stream's private scratch it uses (from offset 0).
    pub scratch: u64,
}

type R<T> = Result<T, String>;

/// The kernels' code for `dt` (`DT_*` of `kernels/common.cuh`).
pub fn dt_code(dt: DType) -> i32 {
    match dt {
        DType::F32 => 0,
        DType::Bf16 => 1,
        DType::F16 => 2,
        DType::I64 => 3,
        DType::I32 => 4,
        DType::Bool => 5,
    }
}

fn n_arg(n: u64) -> Arg {
    Arg::I64(n as i64)
}

/// A grid-stride launch over `n` elements (a grid of 0 blocks, dropped by
/// `lower`, when there are none).
fn ew(kernel: &'static str, n: u64, args: Vec<Arg>) -> Action {
    Action::Launch(Launch {
        kernel,
        grid: (if n == 0 { 0 } else { blocks_for(n) }, 1, 1),
        block: THREADS,
        smem: 0,
        args,
    })
}

/// One block per row (at most 65 535 blocks; each then loops).
fn rows_launch(kernel: &'static str, rows: u64, args: Vec<Arg>) -> Action {
    Action::Launch(Launch {
        kernel,
        grid: (rows.min(65_535) as u32, 1, 1),
        block: THREADS,
        smem: 0,
        args,
    })
}

fn ins<'a, const N: usize>(xs: &[Operand<'a>]) -> R<[Operand<'a>; N]> {
    <[Operand; N]>::try_from(xs).map_err(|_| format!("expected {N} inputs, got {}", xs.len()))
}

fn out1<'a>(ys: &[Operand<'a>]) -> R<Operand<'a>> {
    match ys {
        [y] => Ok(*y),
        _ => Err(format!("expected one output, got {}", ys.len())),
    }
}

fn float(x: &Operand) -> R<()> {
    if x.ty.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("needs a floating-point operand, got {}", x.ty))
    }
}

/// `xs` and `ys` of the types `op`'s shape rule gives (the checks of the
/// ops whose kernels read their sizes from the operands' shapes).
fn inferred(op: &Op, xs: &[Operand], ys: &[Operand]) -> R<()> {
    let tys: Vec<&TensorType> = xs.iter().map(|x| x.ty).collect();
    let want = fsdpc_ir::ops::infer(op, &tys)?;
    let got: Vec<&TensorType> = ys.iter().map(|y| y.ty).collect();
    if want.iter().ne(got.iter().copied()) {
        let show = |v: &mut dyn Iterator<Item = &TensorType>| {
            v.map(|t| t.to_string()).collect::<Vec<_>>().join(", ")
        };
        return Err(format!(
            "outputs [{}] are not the [{}] the op gives",
            show(&mut got.iter().copied()),
            show(&mut want.iter())
        ));
    }
    Ok(())
}

/// `(outer, len, inner)` of `dims` around `axis`.
fn split_axis(dims: &[usize], axis: usize) -> R<(u64, u64, u64)> {
    if axis >= dims.len() {
        return Err(format!("axis {axis} out of range for {dims:?}"));
    }
    let p = |s: &[usize]| s.iter().map(|&x| x as u64).product::<u64>();
    Ok((p(&dims[..axis]), dims[axis] as u64, p(&dims[axis + 1..])))
}

/// The kernel work of `op` on `xs` into `ys`; `ws` is the instruction's
/// workspace (address, bytes) from the plan; `sample_offset` is this
/// rank's first sample of the kernel's micro-batch (dropout).
pub fn lower(
    op: &Op,
    xs: &[Operand],
    ys: &[Operand],
    ws: Option<(u64, u64)>,
    sample_offset: u64,
    run_seed: u64,
) -> R<Lowered> {
    let mut l = Lowered::default();
    lower_into(op, xs, ys, ws, sample_offset, run_seed, &mut l)?;
    // A launch over nothing (grid 0, see `ew`) is no work.
    l.actions.retain(|a| match a {
        Action::Launch(x) | Action::Dropout { launch: x, .. } => x.grid.0 > 0,
        _ => true,
    });
    Ok(l)
}

/// The table: one arm per op (sources, elementwise ops, dropout, matrix
/// products here; the rest in `lower_structured` and `lower_shape`).
fn lower_into(
    op: &Op,
    xs: &[Operand],
    ys: &[Operand],
    ws: Option<(u64, u64)>,
    sample_offset: u64,
    run_seed: u64,
    l: &mut Lowered,
) -> R<()> {
    let a = &mut l.actions;
    match op {
        Op::Input { name } => return Err(format!("input `{name}` is fed by the data source")),
        Op::Param { .. } => return Err("a parameter lives in its flat parameter".into()),
        Op::Constant { value } => source::constant(value, ys, a)?,
        Op::Unary { f } => unary::unary(*f, xs, ys, a)?,
        Op::UnaryGrad { f } => unary::unary_grad(*f, xs, ys, a)?,
        Op::Binary { f } => elementwise::binary(*f, xs, ys, a)?,
        Op::Compare { f } => elementwise::compare(*f, xs, ys, a)?,
        Op::Logical { f } => elementwise::logical(*f, xs, ys, a)?,
        Op::Not => elementwise::not(xs, ys, a)?,
        Op::Where => elementwise::where_(xs, ys, a)?,
        Op::Cast { .. } | Op::TpCopy => cast::cast(xs, ys, a)?,
        &Op::Dropout {
            p,
            seed,
            whole_sample,
        } => {
            let at = dropout::At {
                sample_offset,
                whole_sample,
            };
            dropout::dropout(p, seed, xs, ys, at, run_seed, a)?
        }
        Op::MatMul { trans_a, trans_b } => {
            let ([x, z], y) = (ins::<2>(xs)?, out1(ys)?);
            for g in super::blas::plan_matmul(&x, &z, &y, *trans_a, *trans_b)? {
                a.push(Action::Gemm(g));
            }
        }
        _ => return lower_structured(op, xs, ys, ws, l),
    }
    Ok(())
}

fn same_count(x: &Operand, y: &Operand) -> R<()> {
    if x.numel() != y.numel() {
        return Err(format!("{} and {} differ in element count", x.ty, y.ty));
    }
    Ok(())
}

fn bool_out(y: &Operand) -> R<()> {
    if y.ty.dtype != DType::Bool {
        return Err(format!("writes bool, the output is {}", y.ty));
    }
    Ok(())
}

fn same_dtype(x: &Operand, y: &Operand) -> R<i32> {
    if x.ty.dtype != y.ty.dtype {
        return Err(format!("input {} and output {} dtypes differ", x.ty, y.ty));
    }
    Ok(x.ty.dtype.size() as i32)
}

/// Normalisation, softmax, attention, losses, reductions, convolution and
/// pooling.
fn lower_structured(
    op: &Op,
    xs: &[Operand],
    ys: &[Operand],
    ws: Option<(u64, u64)>,
    l: &mut Lowered,
) -> R<()> {
    match op {
        Op::LayerNorm { eps } => norm::layer_norm(*eps, xs, ys, l)?,
        Op::RmsNorm { eps } => norm::rms_norm(*eps, xs, ys, l)?,
        Op::LayerNormGrad { eps, .. } => norm::norm_grad(*eps, false, xs, ys, l)?,
        Op::RmsNormGrad { eps } => norm::norm_grad(*eps, true, xs, ys, l)?,
        Op::Softmax { axis } | Op::LogSoftmax { axis } => softmax::forward(op, *axis, xs, ys, l)?,
        Op::SoftmaxGrad { axis } | Op::LogSoftmaxGrad { axis } => {
            softmax::backward(op, *axis, xs, ys, l)?
        }
        Op::Attention { causal, scale } => {
            let ([q, k, v], o) = (ins::<3>(xs)?, out1(ys)?);
            super::attention::forward(&q, &k, &v, &o, *causal, *scale, l)?;
        }
        Op::AttentionGrad { causal, scale } => {
            let [q, k, v, dy] = ins::<4>(xs)?;
            let [dq, dk, dv] = <[Operand; 3]>::try_from(ys)
                .map_err(|_| format!("attention_grad writes 3 outputs, got {}", ys.len()))?;
            super::attention::backward([&q, &k, &v, &dy], [&dq, &dk, &dv], *causal, *scale, l)?;
        }
        Op::CrossEntropy { ignore_index } => loss::forward(*ignore_index, xs, ys, l)?,
        Op::CrossEntropyGrad { ignore_index } => loss::backward(*ignore_index, xs, ys, l)?,
        Op::TpLogitStats {
            ignore_index,
            parts,
            vocab,
        } => {
            let v = vocab::Split::new(*parts, *vocab);
            vocab::stats(*ignore_index, v, xs, ys, &mut l.actions)?
        }
        Op::TpLogitStatsGrad {
            ignore_index,
            parts,
            vocab,
        } => {
            let v = vocab::Split::new(*parts, *vocab);
            vocab::stats_grad(*ignore_index, v, xs, ys, &mut l.actions)?
        }
        Op::Reduce { f, axes, .. } => reduce::reduce_axes(*f, axes, xs, ys, l)?,
        Op::ReduceMaxGrad { axes, .. } => reduce::reduce_max_grad(axes, xs, ys, l)?,
        Op::SumTo { .. } => reduce::sum_to(xs, ys, l)?,
        Op::Conv { .. } => conv::conv(op, xs, ys, ws, l)?,
        Op::ConvGradInput { .. } => conv::grad_input(op, xs, ys, ws, l)?,
        Op::ConvGradWeight { .. } => conv::grad_weight(op, xs, ys, ws, l)?,
        Op::MaxPool { window } => pool::forward(op, window, None, xs, ys, l)?,
        Op::AvgPool {
            window,
            count_include_pad,
        } => pool::forward(op, window, Some(*count_include_pad), xs, ys, l)?,
        Op::MaxPoolGrad { window } => pool::max_grad(op, window, xs, ys, l)?,
        Op::AvgPoolGrad {
            window,
            count_include_pad,
            ..
        } => pool::avg_grad(op, window, *count_include_pad, xs, ys, l)?,
        _ => lower_shape(op, xs, ys, ws, l)?,
    }
    Ok(())
}

/// Data movement and the gather family.
fn lower_shape(
    op: &Op,
    xs: &[Operand],
    ys: &[Operand],
    ws: Option<(u64, u64)>,
    l: &mut Lowered,
) -> R<()> {
    let a = &mut l.actions;
    match op {
        Op::Gather { axis } => gather::gather(*axis, xs, ys, a)?,
        Op::GatherGrad { axis, .. } => gather::gather_grad(*axis, xs, ys, ws, a)?,
        Op::TpLookup { parts, vocab } => {
            vocab::lookup(vocab::Split::new(*parts, *vocab), xs, ys, a)?
        }
        Op::TpLookupGrad { parts, vocab, .. } => {
            vocab::lookup_grad(vocab::Split::new(*parts, *vocab), xs, ys, ws, a)?
        }
        Op::Reshape { .. } => shape::reshape(xs, ys, a)?,
        Op::Transpose { perm } => shape::transpose(perm, xs, ys, a)?,
        &Op::Slice {
            axis,
            start,
            end,
            step,
        } => shape::slice(axis, start, end, step, xs, ys, a)?,
        &Op::SliceGrad {
            axis,
            start,
            end,
            step,
            ..
        } => shape::slice_grad(axis, start, end, step, xs, ys, a)?,
        Op::Concat { axis } => shape::concat(*axis, xs, ys, a)?,
        Op::Expand { .. } => shape::expand(xs, ys, a)?,
        Op::Pad { pads, value } => shape::pad(pads, *value, xs, ys, a)?,
        other => return Err(format!("no cuda kernel for `{}`", other.name())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fsdpc_ir::BinaryFn;

    #[test]
    fn a_shape_mismatch_is_an_error_naming_both_types() {
        let (a, b) = (
            TensorType::new(DType::F32, vec![2, 3]),
            TensorType::new(DType::F32, vec![4, 3]),
        );
        let y = TensorType::new(DType::F32, vec![2, 3]);
        let xs = [Operand { ptr: 0, ty: &a }, Operand { ptr: 0, ty: &b }];
        let ys = [Operand { ptr: 0, ty: &y }];
        let e = lower(&Op::Binary { f: BinaryFn::Add }, &xs, &ys, None, 0, 0).unwrap_err();
        assert!(e.contains("[4, 3]") && e.contains("broadcast"), "{e}");
        let e = lower(
            &Op::MatMul {
                trans_a: false,
                trans_b: false,
            },
            &xs,
            &ys,
            None,
            0,
            0,
        )
        .unwrap_err();
        assert!(e.contains("inner dimensions"), "{e}");
    }
}
