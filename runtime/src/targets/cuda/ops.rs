//! A graph node's kernel as device work, decided once before the first
//! step: `lower` turns an op and its operands' device addresses into
//! `Action`s (kernel launches, cuBLAS products, copies, fills) and the
//! private scratch it needs. One arm per op, in the order of
//! `cpu/kernels/mod.rs`; every kernel computes in f32 whatever the float
//! dtype of its operands (bf16/f16 are read and written rounded), so no
//! promotion copies are made. Shapes are checked here; values the kernels
//! check (indices, labels) are reported through the stream's error word.

use super::blas::Gemm;
use super::device::{blocks_for, Arg, Launch, Ptr, THREADS};
use super::geometry::{self, broadcast, broadcast_strides, geo, reduction, strides};
use fsdpc_ir::{BinaryFn, CompareFn, DType, LogicalFn, Op, ReduceFn, TensorType, UnaryFn};

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
        Op::Constant { value } => {
            let y = out1(ys)?;
            if value.ty != *y.ty || value.bytes.len() as u64 != y.ty.bytes() {
                return Err(format!(
                    "constant {} does not match the output {}",
                    value.ty, y.ty
                ));
            }
            a.push(Action::Upload {
                dst: y.ptr,
                bytes: value.bytes.clone(),
            });
        }
        Op::Unary { f } => {
            let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
            same_count(&x, &y)?;
            let code = Arg::I32(unary_code(*f));
            let kernel = if x.ty.dtype.is_float() {
                "unary_f"
            } else if matches!(
                f,
                UnaryFn::Neg | UnaryFn::Abs | UnaryFn::Square | UnaryFn::Relu
            ) {
                "unary_i"
            } else {
                return Err(format!("unary.{f:?} is not defined on {}", x.ty.dtype));
            };
            let n = y.numel();
            a.push(ew(
                kernel,
                n,
                vec![x.p(), x.dt(), y.p(), y.dt(), n_arg(n), code],
            ));
        }
        Op::UnaryGrad { f } => {
            let ([x, dy], dx) = (ins::<2>(xs)?, out1(ys)?);
            same_count(&x, &dx)?;
            same_count(&dy, &dx)?;
            let n = dx.numel();
            a.push(ew(
                "unary_grad",
                n,
                vec![
                    x.p(),
                    x.dt(),
                    dy.p(),
                    dy.dt(),
                    dx.p(),
                    dx.dt(),
                    n_arg(n),
                    Arg::I32(unary_code(*f)),
                ],
            ));
        }
        Op::Binary { f } => {
            let ([x, z], y) = (ins::<2>(xs)?, out1(ys)?);
            let g = broadcast(y.dims(), &[x.dims(), z.dims()])?;
            let n = y.numel();
            let ints = !x.ty.dtype.is_float() && !z.ty.dtype.is_float();
            let mut args = vec![
                x.p(),
                x.dt(),
                z.p(),
                z.dt(),
                y.p(),
                y.dt(),
                n_arg(n),
                Arg::I32(binary_code(*f)),
                Arg::Geo(g),
            ];
            if ints {
                args.push(Arg::Ptr(Ptr::Err));
                a.push(ew("binary_i", n, args));
            } else if x.ty.dtype.is_float() && z.ty.dtype.is_float() {
                a.push(ew("binary_f", n, args));
            } else {
                return Err(format!(
                    "binary.{f:?} on {} and {} is not supported",
                    x.ty.dtype, z.ty.dtype
                ));
            }
        }
        Op::Compare { f } => {
            let ([x, z], y) = (ins::<2>(xs)?, out1(ys)?);
            bool_out(&y)?;
            let g = broadcast(y.dims(), &[x.dims(), z.dims()])?;
            let n = y.numel();
            a.push(ew(
                "compare",
                n,
                vec![
                    x.p(),
                    x.dt(),
                    z.p(),
                    z.dt(),
                    y.p(),
                    n_arg(n),
                    Arg::I32(compare_code(*f)),
                    Arg::Geo(g),
                ],
            ));
        }
        Op::Logical { f } => {
            let ([x, z], y) = (ins::<2>(xs)?, out1(ys)?);
            let g = broadcast(y.dims(), &[x.dims(), z.dims()])?;
            let n = y.numel();
            let code = match f {
                LogicalFn::And => 0,
                LogicalFn::Or => 1,
                LogicalFn::Xor => 2,
            };
            a.push(ew(
                "logical",
                n,
                vec![x.p(), z.p(), y.p(), n_arg(n), Arg::I32(code), Arg::Geo(g)],
            ));
        }
        Op::Not => {
            let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
            same_count(&x, &y)?;
            let n = y.numel();
            a.push(ew("logical_not", n, vec![x.p(), y.p(), n_arg(n)]));
        }
        Op::Where => {
            let ([c, x, z], y) = (ins::<3>(xs)?, out1(ys)?);
            if c.ty.dtype != DType::Bool || x.ty.dtype != y.ty.dtype || z.ty.dtype != y.ty.dtype {
                return Err(format!("where({}, {}, {}) into {}", c.ty, x.ty, z.ty, y.ty));
            }
            let g = broadcast(y.dims(), &[c.dims(), x.dims(), z.dims()])?;
            let n = y.numel();
            let es = Arg::I32(y.ty.dtype.size() as i32);
            a.push(ew(
                "where_",
                n,
                vec![c.p(), x.p(), z.p(), y.p(), es, n_arg(n), Arg::Geo(g)],
            ));
        }
        Op::Cast { .. } => {
            let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
            same_count(&x, &y)?;
            let n = y.numel();
            a.push(ew("cast", n, vec![x.p(), x.dt(), y.p(), y.dt(), n_arg(n)]));
        }
        Op::Dropout { p, seed } => {
            let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
            same_count(&x, &y)?;
            if !(0.0..1.0).contains(p) {
                return Err(format!("dropout probability {p} is not in [0, 1)"));
            }
            let n = y.numel();
            let per_sample = match x.dims().first() {
                Some(&b) if b > 0 => n / b as u64,
                _ => n,
            };
            let scale = (1.0 / (1.0 - p)) as f32;
            let args = vec![
                x.p(),
                x.dt(),
                y.p(),
                y.dt(),
                n_arg(n),
                Arg::U64(0),
                Arg::U64(sample_offset * per_sample),
                Arg::F64(*p),
                Arg::F32(scale),
            ];
            let Action::Launch(launch) = ew("dropout", n, args) else {
                unreachable!("ew makes a launch")
            };
            a.push(Action::Dropout {
                launch,
                base_arg: 5,
                seed: seed ^ crate::rng::mix(run_seed),
            });
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

/// Rows and the last axis of a normalised tensor, checking the parameters.
fn norm_rows(x: &Operand, params: &[&Operand]) -> R<(u64, u64)> {
    let d = x.dims().last().copied().unwrap_or(1) as u64;
    if d == 0 {
        return Err(format!(
            "cannot normalise over an empty last axis ({})",
            x.ty
        ));
    }
    for p in params {
        if p.numel() != d {
            return Err(format!(
                "parameter {} does not match the last axis of {}",
                p.ty, x.ty
            ));
        }
    }
    if d > i32::MAX as u64 {
        return Err(format!("last axis of {} too long", x.ty));
    }
    Ok((x.numel() / d, d))
}

/// Row chunks of the parameter-gradient partials.
const NORM_CHUNKS: u64 = 64;

/// The backward of layer norm (`rms`: RMS norm): dx per row, then the
/// parameter gradients from f32 partials over row chunks.
fn norm_grad(eps: f64, rms: bool, xs: &[Operand], ys: &[Operand], l: &mut Lowered) -> R<()> {
    let [x, g, dy] = ins::<3>(xs)?;
    let (rows, d) = norm_rows(&x, &[&g])?;
    same_count(&x, &dy)?;
    let (dx, dg, db) = match (rms, ys) {
        (true, [dx, dg]) => (*dx, *dg, None),
        (false, [dx, dg]) => (*dx, *dg, None),
        (false, [dx, dg, db]) => (*dx, *dg, Some(*db)),
        _ => return Err(format!("norm gradient: {} outputs", ys.len())),
    };
    let chunks = NORM_CHUNKS.min(rows).max(1);
    let stats = 0u64;
    let part = stats + (8 * rows).div_ceil(256) * 256;
    l.scratch = part + 4 * 2 * chunks * d;
    let s = |off: u64| Arg::Ptr(Ptr::Scratch(off));
    l.actions.push(rows_launch(
        "norm_bwd_dx",
        rows,
        vec![
            x.p(),
            x.dt(),
            g.p(),
            g.dt(),
            dy.p(),
            dy.dt(),
            dx.p(),
            dx.dt(),
            n_arg(rows),
            Arg::I32(d as i32),
            Arg::F32(eps as f32),
            Arg::I32(rms as i32),
            s(stats),
        ],
    ));
    l.actions.push(Action::Launch(Launch {
        kernel: "norm_bwd_params_partial",
        grid: (d.div_ceil(THREADS as u64) as u32, chunks as u32, 1),
        block: THREADS,
        smem: 0,
        args: vec![
            x.p(),
            x.dt(),
            dy.p(),
            dy.dt(),
            n_arg(rows),
            Arg::I32(d as i32),
            s(stats),
            s(part),
            Arg::I32(db.is_some() as i32),
        ],
    }));
    let (dbp, dbt) = db.map_or((Arg::Ptr(Ptr::Abs(0)), Arg::I32(0)), |b| (b.p(), b.dt()));
    l.actions.push(Action::Launch(Launch {
        kernel: "norm_bwd_params_finish",
        grid: (blocks_for(d), 1, 1),
        block: THREADS,
        smem: 0,
        args: vec![
            s(part),
            Arg::I32(chunks as i32),
            Arg::I32(d as i32),
            dg.p(),
            dg.dt(),
            dbp,
            dbt,
        ],
    }));
    Ok(())
}

/// Normalisation, softmax, attention, losses, reductions.
fn lower_structured(
    op: &Op,
    xs: &[Operand],
    ys: &[Operand],
    ws: Option<(u64, u64)>,
    l: &mut Lowered,
) -> R<()> {
    match op {
        Op::LayerNorm { eps } => {
            let y = out1(ys)?;
            let (x, g, b) = match xs {
                [x, g] => (*x, *g, None),
                [x, g, b] => (*x, *g, Some(*b)),
                _ => return Err("layer_norm takes (x, gamma[, beta])".into()),
            };
            let (rows, d) = match &b {
                Some(b) => norm_rows(&x, &[&g, b])?,
                None => norm_rows(&x, &[&g])?,
            };
            same_count(&x, &y)?;
            let (bp, bt) = b.map_or((Arg::Ptr(Ptr::Abs(0)), Arg::I32(0)), |b| (b.p(), b.dt()));
            l.actions.push(rows_launch(
                "ln_fwd",
                rows,
                vec![
                    x.p(),
                    x.dt(),
                    g.p(),
                    g.dt(),
                    bp,
                    bt,
                    y.p(),
                    y.dt(),
                    n_arg(rows),
                    Arg::I32(d as i32),
                    Arg::F32(*eps as f32),
                ],
            ));
        }
        Op::RmsNorm { eps } => {
            let ([x, g], y) = (ins::<2>(xs)?, out1(ys)?);
            let (rows, d) = norm_rows(&x, &[&g])?;
            same_count(&x, &y)?;
            l.actions.push(rows_launch(
                "rms_fwd",
                rows,
                vec![
                    x.p(),
                    x.dt(),
                    g.p(),
                    g.dt(),
                    y.p(),
                    y.dt(),
                    n_arg(rows),
                    Arg::I32(d as i32),
                    Arg::F32(*eps as f32),
                ],
            ));
        }
        Op::LayerNormGrad { eps, .. } => norm_grad(*eps, false, xs, ys, l)?,
        Op::RmsNormGrad { eps } => norm_grad(*eps, true, xs, ys, l)?,
        Op::Softmax { axis } | Op::LogSoftmax { axis } => {
            let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
            same_count(&x, &y)?;
            let (outer, len, inner) = split_axis(x.dims(), *axis)?;
            let log = matches!(op, Op::LogSoftmax { .. }) as i32;
            l.actions.push(rows_launch(
                "softmax_fwd",
                outer * inner,
                vec![
                    x.p(),
                    x.dt(),
                    y.p(),
                    y.dt(),
                    n_arg(outer),
                    n_arg(len),
                    n_arg(inner),
                    Arg::I32(log),
                ],
            ));
        }
        Op::SoftmaxGrad { axis } | Op::LogSoftmaxGrad { axis } => {
            let ([y, dy], dx) = (ins::<2>(xs)?, out1(ys)?);
            same_count(&y, &dx)?;
            same_count(&dy, &dx)?;
            let (outer, len, inner) = split_axis(y.dims(), *axis)?;
            let log = matches!(op, Op::LogSoftmaxGrad { .. }) as i32;
            l.actions.push(rows_launch(
                "softmax_bwd",
                outer * inner,
                vec![
                    y.p(),
                    y.dt(),
                    dy.p(),
                    dy.dt(),
                    dx.p(),
                    dx.dt(),
                    n_arg(outer),
                    n_arg(len),
                    n_arg(inner),
                    Arg::I32(log),
                ],
            ));
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
        Op::CrossEntropy { ignore_index } => {
            let ([logits, labels], y) = (ins::<2>(xs)?, out1(ys)?);
            if y.ty.dtype != DType::F32 || y.numel() != 1 {
                return Err(format!(
                    "cross_entropy writes an f32 scalar, the output is {}",
                    y.ty
                ));
            }
            cross_entropy(&logits, &labels, *ignore_index, Target::Loss(y.ptr), l)?;
        }
        Op::CrossEntropyGrad { ignore_index } => {
            let ([logits, labels, dloss], dx) = (ins::<3>(xs)?, out1(ys)?);
            same_count(&logits, &dx)?;
            if dloss.ty.dtype != DType::F32 || dloss.numel() == 0 {
                return Err(format!(
                    "cross_entropy_grad: dloss must be f32, got {}",
                    dloss.ty
                ));
            }
            cross_entropy(
                &logits,
                &labels,
                *ignore_index,
                Target::Grad {
                    dloss: dloss.ptr,
                    dx,
                },
                l,
            )?;
        }
        Op::Reduce { f, axes, .. } => {
            let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
            float(&x)?;
            let mut kept = x.dims().to_vec();
            if axes.is_empty() {
                kept.iter_mut().for_each(|d| *d = 1);
            }
            for &ax in axes {
                *kept
                    .get_mut(ax)
                    .ok_or_else(|| format!("reduce axis {ax} out of range for {}", x.ty))? = 1;
            }
            if y.numel() != kept.iter().map(|&d| d as u64).product::<u64>() {
                return Err(format!("reduce output {} does not match {}", y.ty, x.ty));
            }
            let g = reduction(x.dims(), &kept)?;
            let code = match f {
                ReduceFn::Sum => 0,
                ReduceFn::Mean => 1,
                ReduceFn::Max => 2,
            };
            reduce(&x, &y, code, g, l);
        }
        Op::ReduceMaxGrad { axes, .. } => {
            let ([x, y, dy], dx) = (ins::<3>(xs)?, out1(ys)?);
            same_count(&x, &dx)?;
            let mut kept = x.dims().to_vec();
            if axes.is_empty() {
                kept.iter_mut().for_each(|d| *d = 1);
            }
            for &ax in axes {
                *kept
                    .get_mut(ax)
                    .ok_or_else(|| format!("axis {ax} out of range for {}", x.ty))? = 1;
            }
            let g = reduction(x.dims(), &kept)?;
            let n = y.numel();
            if dy.numel() != n {
                return Err(format!(
                    "reduce_max_grad: dy {} does not match y {}",
                    dy.ty, y.ty
                ));
            }
            l.actions.push(ew(
                "reduce_max_grad",
                n,
                vec![
                    x.p(),
                    x.dt(),
                    y.p(),
                    y.dt(),
                    dy.p(),
                    dy.dt(),
                    dx.p(),
                    dx.dt(),
                    n_arg(n),
                    Arg::RGeo(g),
                ],
            ));
        }
        Op::SumTo { .. } => {
            let ([dy], dx) = (ins::<1>(xs)?, out1(ys)?);
            let g = reduction(dy.dims(), dx.dims())?;
            reduce(&dy, &dx, 0, g, l);
        }
        _ => lower_shape(op, xs, ys, ws, l)?,
    }
    Ok(())
}

/// Reduced elements per output above which a reduction is split into
/// chunks (one thread per output would walk them alone).
const LONG_REDUCTION: i64 = 4096;
/// Chunks of a long reduction.
const REDUCE_CHUNKS: i64 = 64;

/// `y = reduce(x)` with `f` (0 sum, 1 mean, 2 max) over `g`: one thread
/// per output, or for a long reduction chunk partials in scratch combined
/// in chunk order (the sum's association then differs from the CPU's
/// row-major one).
fn reduce(x: &Operand, y: &Operand, f: i32, g: geometry::RGeo, l: &mut Lowered) {
    let n = y.numel();
    if g.count < LONG_REDUCTION {
        l.actions.push(ew(
            "reduce_to",
            n,
            vec![
                x.p(),
                x.dt(),
                y.p(),
                y.dt(),
                n_arg(n),
                Arg::I32(f),
                Arg::RGeo(g),
            ],
        ));
        return;
    }
    let chunks = REDUCE_CHUNKS.min(g.count / 256).max(2) as u64;
    l.scratch = 4 * chunks * n;
    let part = Arg::Ptr(Ptr::Scratch(0));
    l.actions.push(Action::Launch(Launch {
        kernel: "reduce_partial",
        grid: (
            if n == 0 { 0 } else { blocks_for(n).min(65_535) },
            chunks as u32,
            1,
        ),
        block: THREADS,
        smem: 0,
        args: vec![x.p(), x.dt(), part, n_arg(n), Arg::I32(f), Arg::RGeo(g)],
    }));
    l.actions.push(ew(
        "reduce_finish",
        n,
        vec![
            part,
            Arg::I32(chunks as i32),
            y.p(),
            y.dt(),
            n_arg(n),
            Arg::I32(f),
            Arg::I64(g.count),
        ],
    ));
}

/// What a cross-entropy lowering computes.
enum Target<'a> {
    /// The mean loss into this f32 scalar.
    Loss(u64),
    /// The logits' gradient.
    Grad { dloss: u64, dx: Operand<'a> },
}

fn cross_entropy(
    logits: &Operand,
    labels: &Operand,
    ignore: Option<i64>,
    target: Target,
    l: &mut Lowered,
) -> R<()> {
    float(logits)?;
    if labels.ty.dtype.is_float() || labels.ty.dtype == DType::Bool {
        return Err(format!(
            "cross_entropy labels must be integers, got {}",
            labels.ty
        ));
    }
    let c = logits.dims().last().copied().unwrap_or(0) as u64;
    if c == 0 || logits.numel() / c != labels.numel() {
        return Err(format!(
            "cross_entropy: logits {} and labels {} do not match",
            logits.ty, labels.ty
        ));
    }
    let rows = labels.numel();
    let (rl, valid) = (0u64, (8 * rows).div_ceil(256) * 256);
    let count = valid + (4 * rows).div_ceil(256) * 256;
    l.scratch = count + 256;
    let s = |off: u64| Arg::Ptr(Ptr::Scratch(off));
    let null = Arg::Ptr(Ptr::Abs(0));
    let (hi, ig) = (
        Arg::I32(ignore.is_some() as i32),
        Arg::I64(ignore.unwrap_or(0)),
    );
    let finish = |loss: Arg| {
        Action::Launch(Launch {
            kernel: "ce_finish",
            grid: (1, 1, 1),
            block: 1024,
            smem: 0,
            args: vec![s(rl), s(valid), n_arg(rows), loss, s(count)],
        })
    };
    match target {
        Target::Loss(y) => {
            l.actions.push(rows_launch(
                "ce_rows",
                rows,
                vec![
                    logits.p(),
                    logits.dt(),
                    labels.p(),
                    labels.dt(),
                    n_arg(rows),
                    n_arg(c),
                    hi,
                    ig,
                    s(rl),
                    s(valid),
                    Arg::Ptr(Ptr::Err),
                ],
            ));
            l.actions.push(finish(Arg::Ptr(Ptr::Abs(y))));
        }
        Target::Grad { dloss, dx } => {
            l.actions.push(ew(
                "ce_valid",
                rows,
                vec![
                    labels.p(),
                    labels.dt(),
                    n_arg(rows),
                    n_arg(c),
                    hi,
                    ig,
                    s(valid),
                    Arg::Ptr(Ptr::Err),
                ],
            ));
            // Count only: no row losses.
            let Action::Launch(mut f) = finish(null) else {
                unreachable!("finish makes a launch")
            };
            f.args[0] = null;
            l.actions.push(Action::Launch(f));
            l.actions.push(rows_launch(
                "ce_bwd",
                rows,
                vec![
                    logits.p(),
                    logits.dt(),
                    labels.p(),
                    labels.dt(),
                    Arg::Ptr(Ptr::Abs(dloss)),
                    s(count),
                    dx.p(),
                    dx.dt(),
                    n_arg(rows),
                    n_arg(c),
                    hi,
                    ig,
                    Arg::Ptr(Ptr::Err),
                ],
            ));
        }
    }
    Ok(())
}

fn same_dtype(x: &Operand, y: &Operand) -> R<i32> {
    if x.ty.dtype != y.ty.dtype {
        return Err(format!("input {} and output {} dtypes differ", x.ty, y.ty));
    }
    Ok(x.ty.dtype.size() as i32)
}

/// A strided view of a buffer: its address, the first element and each
/// dimension's element stride.
struct View {
    ptr: u64,
    base: u64,
    st: Vec<usize>,
}

/// `dst[view] = src[view]` over `dims`, elements of `es` bytes.
fn strided(src: View, dst: View, dims: &[usize], es: i32) -> R<Action> {
    let n: u64 = dims.iter().map(|&d| d as u64).product();
    let g = geo(dims, &[src.st, dst.st])?;
    Ok(ew(
        "strided_copy",
        n,
        vec![
            Arg::Ptr(Ptr::Abs(src.ptr)),
            Arg::I64(src.base as i64),
            Arg::Ptr(Ptr::Abs(dst.ptr)),
            Arg::I64(dst.base as i64),
            Arg::I32(es),
            n_arg(n),
            Arg::Geo(g),
        ],
    ))
}

/// A view from element 0 with `st`.
fn view(ptr: u64, st: Vec<usize>) -> View {
    View { ptr, base: 0, st }
}

/// Slice geometry of `full` (base element, strides, sliced dims).
fn slice_geometry(
    full: &[usize],
    axis: usize,
    start: usize,
    end: usize,
    step: usize,
) -> R<(u64, Vec<usize>, Vec<usize>)> {
    split_axis(full, axis)?;
    if step == 0 {
        return Err("slice step must be >= 1".into());
    }
    let end = end.min(full[axis]);
    let n = if start >= end {
        0
    } else {
        (end - start).div_ceil(step)
    };
    let mut st = strides(full);
    let base = if n > 0 { (start * st[axis]) as u64 } else { 0 };
    st[axis] *= step;
    let mut dims = full.to_vec();
    dims[axis] = n;
    Ok((base, st, dims))
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
        Op::Gather { axis } => {
            let ([data, idx], y) = (ins::<2>(xs)?, out1(ys)?);
            let es = same_dtype(&data, &y)?;
            int_indices(&idx)?;
            let (outer, n, inner) = split_axis(data.dims(), *axis)?;
            if y.numel() != outer * idx.numel() * inner {
                return Err(format!(
                    "gather: output {} does not match data {} and indices {}",
                    y.ty, data.ty, idx.ty
                ));
            }
            let total = y.numel();
            a.push(ew(
                "gather_fwd",
                total,
                vec![
                    data.p(),
                    idx.p(),
                    idx.dt(),
                    y.p(),
                    Arg::I32(es),
                    n_arg(outer),
                    n_arg(n),
                    n_arg(inner),
                    n_arg(idx.numel()),
                    Arg::Ptr(Ptr::Err),
                ],
            ));
        }
        Op::GatherGrad { axis, .. } => {
            let ([idx, dy], dx) = (ins::<2>(xs)?, out1(ys)?);
            int_indices(&idx)?;
            float(&dx)?;
            let (outer, n, inner) = split_axis(dx.dims(), *axis)?;
            if dy.numel() != outer * idx.numel() * inner {
                return Err(format!(
                    "gather_grad: dy {} does not match indices {}",
                    dy.ty, idx.ty
                ));
            }
            // An f32 gradient is its own accumulator; a half one adds into
            // f32 workspace (the plan's promoted-output share) and is cast.
            let acc = if dx.ty.dtype == DType::F32 {
                dx.ptr
            } else {
                match ws {
                    Some((p, bytes)) if bytes >= 4 * dx.numel() => p,
                    _ => {
                        return Err(format!(
                            "gather_grad into {} needs {} bytes of f32 workspace, the plan gave {}",
                            dx.ty,
                            4 * dx.numel(),
                            ws.map_or(0, |w| w.1)
                        ))
                    }
                }
            };
            let total = dy.numel();
            a.push(Action::Zero {
                ptr: Ptr::Abs(acc),
                bytes: 4 * dx.numel(),
            });
            a.push(ew(
                "gather_bwd",
                total,
                vec![
                    idx.p(),
                    idx.dt(),
                    dy.p(),
                    dy.dt(),
                    Arg::Ptr(Ptr::Abs(acc)),
                    n_arg(outer),
                    n_arg(n),
                    n_arg(inner),
                    n_arg(idx.numel()),
                    Arg::Ptr(Ptr::Err),
                ],
            ));
            if acc != dx.ptr {
                let m = dx.numel();
                a.push(ew(
                    "cast",
                    m,
                    vec![
                        Arg::Ptr(Ptr::Abs(acc)),
                        Arg::I32(0),
                        dx.p(),
                        dx.dt(),
                        n_arg(m),
                    ],
                ));
            }
        }
        Op::Reshape { .. } => {
            let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
            same_dtype(&x, &y)?;
            if x.ty.bytes() != y.ty.bytes() {
                return Err(format!(
                    "reshape from {} to {} changes the element count",
                    x.ty, y.ty
                ));
            }
            a.push(Action::Copy {
                src: x.ptr,
                dst: y.ptr,
                bytes: y.ty.bytes(),
            });
        }
        Op::Transpose { perm } => {
            let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
            let es = same_dtype(&x, &y)?;
            let dims = x.dims();
            let mut seen = vec![false; dims.len()];
            if perm.len() != dims.len()
                || perm
                    .iter()
                    .any(|&p| p >= dims.len() || std::mem::replace(&mut seen[p], true))
            {
                return Err(format!(
                    "transpose: {perm:?} is not a permutation of the axes of {}",
                    x.ty
                ));
            }
            let st = strides(dims);
            let out: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
            if out != y.dims() {
                return Err(format!("transpose output {} does not match {perm:?}", y.ty));
            }
            let sst = perm.iter().map(|&p| st[p]).collect();
            a.push(strided(
                view(x.ptr, sst),
                view(y.ptr, strides(&out)),
                &out,
                es,
            )?);
        }
        &Op::Slice {
            axis,
            start,
            end,
            step,
        } => {
            let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
            let es = same_dtype(&x, &y)?;
            let (base, st, dims) = slice_geometry(x.dims(), axis, start, end, step)?;
            if dims != y.dims() {
                return Err(format!("slice output {} does not match {dims:?}", y.ty));
            }
            a.push(strided(
                View {
                    ptr: x.ptr,
                    base,
                    st,
                },
                view(y.ptr, strides(&dims)),
                &dims,
                es,
            )?);
        }
        &Op::SliceGrad {
            axis,
            start,
            end,
            step,
            ..
        } => {
            let ([dy], dx) = (ins::<1>(xs)?, out1(ys)?);
            let es = same_dtype(&dy, &dx)?;
            let (base, st, dims) = slice_geometry(dx.dims(), axis, start, end, step)?;
            if dims != dy.dims() {
                return Err(format!(
                    "slice_grad: dy {} does not match the slice {dims:?}",
                    dy.ty
                ));
            }
            a.push(Action::Zero {
                ptr: Ptr::Abs(dx.ptr),
                bytes: dx.ty.bytes(),
            });
            a.push(strided(
                view(dy.ptr, strides(&dims)),
                View {
                    ptr: dx.ptr,
                    base,
                    st,
                },
                &dims,
                es,
            )?);
        }
        Op::Concat { axis } => {
            let y = out1(ys)?;
            let (_, total, inner) = split_axis(y.dims(), *axis)?;
            let yst = strides(y.dims());
            let mut at = 0u64;
            for x in xs {
                let es = same_dtype(x, &y)?;
                let (o, len, i) = split_axis(x.dims(), *axis)?;
                let (yo, _, yi) = split_axis(y.dims(), *axis)?;
                if o != yo || i != yi {
                    return Err(format!(
                        "concat: input {} does not match output {} off axis {axis}",
                        x.ty, y.ty
                    ));
                }
                a.push(strided(
                    view(x.ptr, strides(x.dims())),
                    View {
                        ptr: y.ptr,
                        base: at * inner,
                        st: yst.clone(),
                    },
                    x.dims(),
                    es,
                )?);
                at += len;
            }
            if at != total {
                return Err(format!(
                    "concat: inputs add up to {at} along axis {axis}, output has {total}"
                ));
            }
        }
        Op::Expand { .. } => {
            let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
            let es = same_dtype(&x, &y)?;
            let sst = broadcast_strides(x.dims(), y.dims())?;
            a.push(strided(
                view(x.ptr, sst),
                view(y.ptr, strides(y.dims())),
                y.dims(),
                es,
            )?);
        }
        Op::Pad { pads, value } => {
            let ([x], y) = (ins::<1>(xs)?, out1(ys)?);
            let es = same_dtype(&x, &y)?;
            if pads.len() != x.dims().len() {
                return Err(format!("pad: {} pads for {}", pads.len(), x.ty));
            }
            let want: Vec<usize> = x
                .dims()
                .iter()
                .zip(pads)
                .map(|(&d, &(b, e))| d + b + e)
                .collect();
            if want != y.dims() {
                return Err(format!("pad output {} does not match {want:?}", y.ty));
            }
            let yst = strides(y.dims());
            let base: u64 = pads
                .iter()
                .zip(&yst)
                .map(|(&(b, _), &s)| (b * s) as u64)
                .sum();
            let n = y.numel();
            a.push(ew(
                "fill",
                n,
                vec![y.p(), y.dt(), n_arg(n), Arg::F64(*value)],
            ));
            a.push(strided(
                view(x.ptr, strides(x.dims())),
                View {
                    ptr: y.ptr,
                    base,
                    st: yst,
                },
                x.dims(),
                es,
            )?);
        }
        other => return Err(format!("no cuda kernel for `{}`", other.name())),
    }
    Ok(())
}

fn int_indices(idx: &Operand) -> R<()> {
    if matches!(idx.ty.dtype, DType::I64 | DType::I32) {
        Ok(())
    } else {
        Err(format!("indices must be i64 or i32, got {}", idx.ty))
    }
}

fn unary_code(f: UnaryFn) -> i32 {
    match f {
        UnaryFn::Neg => 0,
        UnaryFn::Exp => 1,
        UnaryFn::Log => 2,
        UnaryFn::Sqrt => 3,
        UnaryFn::Rsqrt => 4,
        UnaryFn::Reciprocal => 5,
        UnaryFn::Tanh => 6,
        UnaryFn::Relu => 7,
        UnaryFn::Sigmoid => 8,
        UnaryFn::Erf => 9,
        UnaryFn::Abs => 10,
        UnaryFn::GeluTanh => 11,
        UnaryFn::GeluErf => 12,
        UnaryFn::Silu => 13,
        UnaryFn::Square => 14,
        UnaryFn::IsNan => 15,
    }
}

fn binary_code(f: BinaryFn) -> i32 {
    match f {
        BinaryFn::Add => 0,
        BinaryFn::Sub => 1,
        BinaryFn::Mul => 2,
        BinaryFn::Div => 3,
        BinaryFn::Pow => 4,
        BinaryFn::Max => 5,
        BinaryFn::Min => 6,
    }
}

fn compare_code(f: CompareFn) -> i32 {
    match f {
        CompareFn::Equal => 0,
        CompareFn::Less => 1,
        CompareFn::LessOrEqual => 2,
        CompareFn::Greater => 3,
        CompareFn::GreaterOrEqual => 4,
    }
}

/// The dropout mask base of `fsdpc_ir::init::hash` for (mask seed, step):
/// `mix64(mix64(seed ^ GOLDEN) ^ mix64(step ^ DROPOUT_DOMAIN))`, so that
/// element e's hash is `mix64(base + (e + 1) * GOLDEN)`.
pub fn dropout_base(seed: u64, step: u64) -> u64 {
    use fsdpc_ir::init::mix64;
    const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
    const DROPOUT_DOMAIN: u64 = 0xD50F_D50F_D50F_D50F;
    mix64(mix64(seed ^ GOLDEN) ^ mix64(step ^ DROPOUT_DOMAIN))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dropout kernel's decision, evaluated on the host.
    fn kernel_keeps(base: u64, e: u64, p: f64) -> bool {
        const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;
        let h = fsdpc_ir::init::mix64(base.wrapping_add((e + 1).wrapping_mul(GOLDEN)));
        fsdpc_ir::init::unit_open(h) >= p
    }

    #[test]
    fn the_dropout_base_reproduces_the_cpu_mask() {
        for (seed, step) in [(0u64, 0u64), (5, 3), (u64::MAX, 1 << 40)] {
            let base = dropout_base(seed, step);
            for e in (0..5000u64).chain([1 << 33, u64::MAX - 1]) {
                let want = crate::irinit::dropout_keep(seed, step, e, 0.3);
                assert_eq!(
                    kernel_keeps(base, e, 0.3),
                    want,
                    "seed {seed} step {step} e {e}"
                );
            }
        }
    }

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
