//! Everything but the products that a kernel costs: the per-kernel fixed
//! overhead (the backend's kernel dispatch, `Backend::run`, on tiny
//! inputs); memory-bound kernels (element-wise, GELU and its gradient,
//! layer norm and its gradient, softmax and its gradient, cross-entropy and
//! its gradient, reshape, transpose, slice and its gradient, sum-to, gather
//! and its gradient, the AdamW update) through the same dispatch on
//! kernel-sized tensors, in f32 and bf16, rotating over several buffer
//! sets so the inputs are not hot in the core's caches: bytes read plus
//! written per second, less the overhead, by kernel family (the cost
//! model's `cost::kernel_family`); the promotion of half operands
//! (`cast:bf16`); attention and its gradient (FLOP/s, `kernel_flops`); the
//! AdamW update at 128K, 1M and 8M elements, which gives how that rate
//! falls as a kernel's bytes outgrow the caches (`bandwidth_by_size`:
//! measured, since a VM's sysfs reports the host's last-level cache, not
//! the guest's share); the runtime's synthetic data source writing float
//! features and token ids (`load_input`, `load_input_int`: what
//! `LoadInput` costs); and a 64 MiB copy (`mem_bw`).

use super::harness::{fail, fill_of, lockstep, median, rotation_sets, Aligned, Body};
use super::CalibrateError;
use super::Calibration;
use crate::{
    Backend, CpuBackend, CpuConfig, KernelCtx, OptimizerArgs, TensorMut, TensorRef, Workspace,
};
use fsdpc_ir::{DType, ModuleId, Node, Op, Optimizer, Phase, TensorType, Window2d};
use fsdpc_plan::cluster::PROMOTION_FAMILY;
use std::collections::BTreeMap;
use std::fmt::Write;

/// What the kernels give the cluster file.
pub(super) struct Kernels {
    /// Seconds of a kernel's dispatch (`kernel_overhead_s`).
    pub overhead: f64,
    /// Bytes per second by family (`kernel_bw`).
    pub bandwidth: BTreeMap<String, f64>,
    /// FLOP/s by family (`kernel_flops`).
    pub flops: BTreeMap<String, f64>,
    /// Bandwidth against bytes, relative to the smallest
    /// (`bandwidth_by_size`).
    pub by_size: Vec<(f64, f64)>,
    /// A copy's bytes read and written per second (`mem_bw`).
    pub mem_bw: f64,
}

/// Elements of the AdamW updates timed: the first is the optimizer
/// family's bandwidth (a working set that fits a core's caches), the
/// others how bandwidth falls beyond them (`bandwidth_by_size`).
const OPTIMIZER_SIZES: [usize; 3] = [1 << 17, 1 << 20, 1 << 23];

/// The attention shape calibrated: batch, heads, sequence, head size.
const ATTENTION: [usize; 4] = [4, 4, 128, 32];

/// Progress steps of `measure`.
pub(super) fn steps() -> usize {
    let cases =
        |dtype| kernel_cases(1024, 256, dtype).len() + attention_cases(ATTENTION, dtype).len();
    // The overhead, the cast and the copy are one step each.
    3 + cases(DType::F32) + cases(DType::Bf16) + OPTIMIZER_SIZES.len() + DATA_CASES.len()
}

/// Times every kernel family on every rank at once and adds their table.
pub(super) fn measure(cal: &mut Calibration) -> Result<Kernels, CalibrateError> {
    // Per-kernel overhead: tiny kernels, many calls.
    cal.message("kernel overhead");
    let mut tiny = Vec::new();
    for case in kernel_cases(1, 8, DType::F32) {
        tiny.push(kernel_time(cal.ranks, &case, 1, 200, 10)?.0);
    }
    let overhead = median(&tiny);
    let _ = writeln!(
        cal.table,
        "kernel overhead (Backend::run on 1 x 8 tensors, median over {} kernels): {:.2} us",
        tiny.len(),
        overhead * 1e6
    );
    cal.inc();

    let _ = writeln!(
        cal.table,
        "memory-bound kernels on 1024 x 256 tensors (4 buffer sets), bytes read + written:"
    );
    let mut kernel_bw = BTreeMap::new();
    for case in kernel_cases(1024, 256, DType::F32)
        .iter()
        .chain(&kernel_cases(1024, 256, DType::Bf16))
    {
        cal.message(format!("kernel {}", case.family));
        let (t, bytes, _) = kernel_time(cal.ranks, case, 4, 4, 8)?;
        let bw = bytes / (t - overhead).max(t * 0.05).max(1e-12);
        let _ = writeln!(
            cal.table,
            "  {:<22} {:>8.1} us {:>8.2} GB/s",
            case.family,
            t * 1e6,
            bw / 1e9
        );
        kernel_bw.insert(case.family.clone(), bw);
        cal.inc();
    }
    // What a kernel that computes in f32 pays to promote a half-precision
    // operand (`PROMOTION_FAMILY`; the matrix products' cost model adds it
    // per half element): a bf16 tensor widened to f32 and an f32 tensor
    // narrowed to bf16, the bytes of both over the time of both.
    cal.message("kernel cast:bf16");
    let (mut cast_s, mut cast_bytes) = (0.0, 0.0);
    for (to, from) in [(DType::F32, DType::Bf16), (DType::Bf16, DType::F32)] {
        let case = KernelCase {
            family: PROMOTION_FAMILY.to_string(),
            op: Op::Cast { to },
            inputs: vec![TensorType::new(from, vec![1024, 256])],
        };
        let (t, bytes, _) = kernel_time(cal.ranks, &case, 4, 4, 8)?;
        cast_s += (t - overhead).max(t * 0.05);
        cast_bytes += bytes;
    }
    let cast_bw = cast_bytes / cast_s.max(1e-12);
    let _ = writeln!(
        cal.table,
        "  {:<22} {:>8.1} us {:>8.2} GB/s   (bf16 -> f32 and f32 -> bf16)",
        PROMOTION_FAMILY,
        cast_s * 1e6,
        cast_bw / 1e9
    );
    kernel_bw.insert(PROMOTION_FAMILY.to_string(), cast_bw);
    cal.inc();
    let mut kernel_flops = BTreeMap::new();
    for case in attention_cases(ATTENTION, DType::F32)
        .iter()
        .chain(&attention_cases(ATTENTION, DType::Bf16))
    {
        cal.message(format!("kernel {}", case.family));
        let (t, _, flops) = kernel_time(cal.ranks, case, 2, 2, 5)?;
        let rate = flops / (t - overhead).max(t * 0.05).max(1e-12);
        let _ = writeln!(
            cal.table,
            "  {:<22} {:>8.1} us {:>8.2} GFLOP/s",
            case.family,
            t * 1e6,
            rate / 1e9
        );
        kernel_flops.insert(case.family.clone(), rate);
        cal.inc();
    }
    // The AdamW update at growing sizes: its bandwidth at the first is the
    // optimizer family's, the others' over it how every memory-bound kernel
    // slows once its bytes outgrow the caches (`bandwidth_by_size`).
    let mut by_size: Vec<(f64, f64)> = Vec::new();
    for n in OPTIMIZER_SIZES {
        cal.message(format!("optimizer step, {n} elements"));
        let (t, bytes) = optimizer_time(cal.ranks, n, rotation_sets(16 * n))?;
        let bw = bytes / (t - overhead).max(t * 0.05).max(1e-12);
        let _ = writeln!(
            cal.table,
            "  {:<22} {:>8.1} us {:>8.2} GB/s",
            format!("optimizer (AdamW {}K)", n >> 10),
            t * 1e6,
            bw / 1e9
        );
        let first = *kernel_bw.entry("optimizer".to_string()).or_insert(bw);
        // Non-increasing: a larger working set is never faster.
        let prev = by_size.last().map_or(1.0, |p| p.1);
        by_size.push((bytes, (bw / first).clamp(1e-6, prev)));
        cal.inc();
    }
    for (family, spec, input) in DATA_CASES {
        cal.message(format!("data: {input}"));
        let graph = (cal.model)(spec).map_err(|e| fail(&format!("model {spec}"), e))?;
        let (t, bytes) = data_time(cal.ranks, &graph, spec, input)?;
        let bw = bytes / (t - overhead).max(t * 0.05).max(1e-12);
        let _ = writeln!(
            cal.table,
            "  {:<22} {:>8.1} us {:>8.2} GB/s",
            format!("{family} ({input})"),
            t * 1e6,
            bw / 1e9
        );
        kernel_bw.insert(family.to_string(), bw);
        cal.inc();
    }
    cal.message("memory copy");
    let mem = copy_rate(cal.ranks)?;
    let _ = writeln!(
        cal.table,
        "memory: {:.2} GB/s (64 MiB copy, read + write)",
        mem / 1e9
    );
    cal.inc();

    Ok(Kernels {
        overhead,
        bandwidth: kernel_bw,
        flops: kernel_flops,
        by_size,
        mem_bw: mem,
    })
}

/// A kernel to time: its op and input types.
struct KernelCase {
    family: String,
    op: Op,
    inputs: Vec<TensorType>,
}

/// The kernel cases of every family at `rows x cols` in `dtype`.
fn kernel_cases(rows: usize, cols: usize, dtype: DType) -> Vec<KernelCase> {
    let t = |shape: Vec<usize>| TensorType::new(dtype, shape);
    let x = t(vec![rows, cols]);
    let row = t(vec![cols]);
    let suffix = if dtype == DType::F32 { "" } else { ":bf16" };
    let case = |family: &str, op: Op, inputs: Vec<TensorType>| KernelCase {
        family: format!("{family}{suffix}"),
        op,
        inputs,
    };
    let gelu = fsdpc_ir::UnaryFn::GeluTanh;
    let labels = TensorType::new(DType::I64, vec![rows]);
    let half = (cols / 2).max(1);
    // Pooling: ResNet's stem pool (3x3, stride 2, padding 1) over planes
    // of `cols` elements.
    let side = if cols >= 256 { 16 } else { 2 };
    let image = t(vec![rows, 1, side, cols / side]);
    let pool = Window2d {
        stride: [2, 2],
        pads: [1; 4],
        ..Window2d::of_kernel([3, 3])
    };
    let pooled = t(vec![rows, 1, side.div_ceil(2), (cols / side).div_ceil(2)]);
    vec![
        case(
            "binary",
            Op::Binary {
                f: fsdpc_ir::BinaryFn::Add,
            },
            vec![x.clone(), x.clone()],
        ),
        case("unary", Op::Unary { f: gelu }, vec![x.clone()]),
        case(
            "unary_grad",
            Op::UnaryGrad { f: gelu },
            vec![x.clone(), x.clone()],
        ),
        case(
            "layer_norm",
            Op::LayerNorm { eps: 1e-5 },
            vec![x.clone(), row.clone(), row.clone()],
        ),
        case(
            "layer_norm_grad",
            Op::LayerNormGrad {
                eps: 1e-5,
                has_beta: true,
            },
            vec![x.clone(), row, x.clone()],
        ),
        case("softmax", Op::Softmax { axis: 1 }, vec![x.clone()]),
        case(
            "softmax_grad",
            Op::SoftmaxGrad { axis: 1 },
            vec![x.clone(), x.clone()],
        ),
        case(
            "cross_entropy",
            Op::CrossEntropy { ignore_index: None },
            vec![x.clone(), labels.clone()],
        ),
        case(
            "cross_entropy_grad",
            Op::CrossEntropyGrad { ignore_index: None },
            vec![
                x.clone(),
                labels.clone(),
                TensorType::new(DType::F32, Vec::<usize>::new()),
            ],
        ),
        case(
            "transpose",
            Op::Transpose { perm: vec![1, 0] },
            vec![x.clone()],
        ),
        case(
            "reshape",
            Op::Reshape {
                shape: vec![cols, rows],
            },
            vec![x.clone()],
        ),
        case(
            "slice",
            Op::Slice {
                axis: 1,
                start: 0,
                end: half,
                step: 1,
            },
            vec![x.clone()],
        ),
        case(
            "slice_grad",
            Op::SliceGrad {
                axis: 1,
                start: 0,
                end: half,
                step: 1,
                input_shape: vec![rows, cols],
            },
            vec![t(vec![rows, half])],
        ),
        case("sum_to", Op::SumTo { shape: vec![cols] }, vec![x.clone()]),
        case("pool", Op::MaxPool { window: pool }, vec![image.clone()]),
        case(
            "pool_grad",
            Op::MaxPoolGrad { window: pool },
            vec![image, pooled],
        ),
        case(
            "gather",
            Op::Gather { axis: 0 },
            vec![x.clone(), labels.clone()],
        ),
        case(
            "gather_grad",
            Op::GatherGrad {
                axis: 0,
                data_shape: vec![rows, cols],
            },
            vec![labels, x],
        ),
    ]
}

/// Attention forward and backward over `[batch, heads, seq, head_dim]`
/// (causal, as in the GPT blocks), in `dtype`.
fn attention_cases(shape: [usize; 4], dtype: DType) -> Vec<KernelCase> {
    let q = TensorType::new(dtype, shape.to_vec());
    let suffix = if dtype == DType::F32 { "" } else { ":bf16" };
    let scale = 1.0 / (shape[3] as f64).sqrt();
    vec![
        KernelCase {
            family: format!("attention{suffix}"),
            op: Op::Attention {
                causal: true,
                scale,
            },
            inputs: vec![q.clone(), q.clone(), q.clone()],
        },
        KernelCase {
            family: format!("attention_grad{suffix}"),
            op: Op::AttentionGrad {
                causal: true,
                scale,
            },
            inputs: vec![q.clone(), q.clone(), q.clone(), q],
        },
    ]
}

/// Per-call seconds of `case`'s kernel through the CPU backend on every
/// rank at once (`calls` calls per repetition, rotating over `sets` buffer
/// sets), the bytes one call reads and writes, and its FLOPs.
fn kernel_time(
    ranks: usize,
    case: &KernelCase,
    sets: usize,
    calls: usize,
    reps: usize,
) -> Result<(f64, f64, f64), CalibrateError> {
    let in_refs: Vec<&TensorType> = case.inputs.iter().collect();
    let outputs = fsdpc_ir::ops::infer(&case.op, &in_refs)
        .map_err(|e| fail(&format!("kernel {}", case.family), e))?;
    let flops = fsdpc_ir::ops::flops(&case.op, &in_refs, &outputs);
    let bytes: u64 = case.inputs.iter().chain(&outputs).map(|t| t.bytes()).sum();
    let node = Node {
        op: case.op.clone(),
        name: case.family.clone(),
        module: ModuleId::ROOT,
        phase: Phase::Forward,
        outputs: outputs.clone(),
    };
    // Room for widened copies of half operands and the op's scratch.
    let ws_bytes = 4 * 2 * bytes as usize + (1 << 20);
    let times = lockstep(ranks, reps, |_| {
        let (node, inputs, outputs) = (node.clone(), case.inputs.clone(), outputs.clone());
        let mut bufs: Vec<(Vec<Aligned>, Vec<Aligned>)> = (0..sets)
            .map(|_| {
                let ins = inputs
                    .iter()
                    .map(|t| Aligned::new(t.bytes() as usize, &fill_of(t.dtype)))
                    .collect();
                let outs = outputs
                    .iter()
                    .map(|t| Aligned::new(t.bytes() as usize, &[]))
                    .collect();
                (ins, outs)
            })
            .collect();
        let mut ws = Aligned::new(ws_bytes, &[]);
        let backend = CpuBackend::new(CpuConfig::default());
        let ctx = KernelCtx::default();
        let mut set = 0;
        Ok(Box::new(move || {
            for _ in 0..calls {
                let (ins, outs) = &mut bufs[set];
                set = (set + 1) % sets;
                let views: Vec<TensorRef> = inputs
                    .iter()
                    .zip(ins.iter())
                    .map(|(t, b)| TensorRef::new(t, b.bytes()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| e.0)?;
                let mut out_views: Vec<TensorMut> = outputs
                    .iter()
                    .zip(outs.iter_mut())
                    .map(|(t, b)| TensorMut::new(t, b.bytes_mut()))
                    .collect::<Result<_, _>>()
                    .map_err(|e| e.0)?;
                backend
                    .run(
                        &node,
                        &views,
                        &mut out_views,
                        &ctx,
                        &mut Workspace::new(ws.bytes_mut()),
                    )
                    .map_err(|e| e.0)?;
            }
            Ok(())
        }))
    })
    .map_err(|e| fail(&format!("kernel {}", case.family), e))?;
    Ok((median(&times) / calls as f64, bytes as f64, flops))
}

/// Per-call seconds of the AdamW update over `n` elements on every rank at
/// once, and the bytes the cost model counts for it (params x (3 + 2 x 2)).
fn optimizer_time(ranks: usize, n: usize, sets: usize) -> Result<(f64, f64), CalibrateError> {
    let times = lockstep(ranks, 8, |_| {
        let mut bufs: Vec<[Vec<f32>; 4]> = (0..sets)
            .map(|_| {
                [
                    vec![0.5f32; n],
                    vec![0.01f32; n],
                    vec![0f32; n],
                    vec![0f32; n],
                ]
            })
            .collect();
        let backend = CpuBackend::new(CpuConfig::default());
        let opt = Optimizer::adamw(1e-3);
        let mut set = 0;
        Ok(Box::new(move || {
            for _ in 0..sets {
                let [p, g, m, v] = &mut bufs[set];
                set = (set + 1) % sets;
                backend
                    .optimizer_step(OptimizerArgs {
                        optimizer: &opt,
                        step: 0,
                        params: p,
                        grads: g,
                        state: vec![m, v],
                    })
                    .map_err(|e| e.0)?;
            }
            Ok(())
        }))
    })
    .map_err(|e| fail("optimizer step", e))?;
    Ok((median(&times) / sets as f64, (4 * n * 7) as f64))
}

/// The built-in data a calibration times (`load_input` families): a
/// float input of a classifier (the Gaussian-mixture features: one normal
/// draw per element) and the token ids of a language model.
const DATA_CASES: [(&str, &str, &str); 2] = [
    (
        "load_input",
        "mlp:layers=1,in=1024,hidden=16,classes=10,batch=64",
        "x",
    ),
    (
        "load_input_int",
        "gpt:layers=1,hidden=16,heads=1,seq=256,vocab=1024,batch=16",
        "ids",
    ),
];

/// Per-call seconds of the runtime's synthetic data source writing input
/// `input` of `spec`'s model (each rank its own samples, every rank at
/// once), and the bytes it writes.
fn data_time(
    ranks: usize,
    graph: &fsdpc_ir::Graph,
    spec: &str,
    input: &str,
) -> Result<(f64, f64), CalibrateError> {
    let what = || format!("data source for {input} of {spec}");
    let ty = crate::data::analyse(graph)
        .into_iter()
        .find(|d| d.name == input)
        .map(|d| d.ty)
        .ok_or_else(|| fail(&what(), "the model has no such input"))?;
    let source =
        crate::data::open(&crate::DataSpec::Synthetic, graph, 1).map_err(|e| fail(&what(), e))?;
    let bytes = ty.bytes() as usize;
    let b = ty.shape.0.first().copied().unwrap_or(1) as u64;
    let times = lockstep(ranks, 8, |rank| {
        let mut out = Aligned::new(bytes, &[0]);
        let (ty, source, input) = (ty.clone(), source.clone(), input.to_string());
        let mut step = 0;
        Ok(Box::new(move || {
            step += 1;
            let view = TensorMut::new(&ty, out.bytes_mut()).map_err(|e| e.0)?;
            let batch = crate::Batch {
                step,
                first_sample: rank as u64 * b,
            };
            source.fill(&input, batch, view).map_err(|e| e.to_string())
        }) as Body)
    })
    .map_err(|e| fail(&what(), e))?;
    Ok((median(&times), bytes as f64))
}

/// Bytes moved per second by a 64 MiB copy (read plus write) on every rank
/// at once.
fn copy_rate(ranks: usize) -> Result<f64, CalibrateError> {
    let n = 16 << 20;
    let times = lockstep(ranks, 5, |_| {
        let src = vec![1f32; n];
        let mut dst = vec![0f32; n];
        Ok(Box::new(move || {
            dst.copy_from_slice(&src);
            std::hint::black_box(&dst);
            Ok(())
        }))
    })
    .map_err(|e| fail("memory copy", e))?;
    Ok((2 * 4 * n) as f64 / median(&times).max(1e-12))
}
