//! `fsdpc calibrate [--ranks-per-node R] [-o cluster.json]`: measures this
//! machine with the runtime's own code and writes a cluster file.
//!
//! Every figure is measured with R rank threads doing the same thing at the
//! same time (as R ranks of a node do), each figure the median repetition
//! (the slowest rank's time within a repetition; the median, not the
//! fastest, because a training step runs its kernels once each, at their
//! typical speed: with the fastest the 2-rank steps here were predicted
//! 10-25% fast):
//! - matrix products through the CPU backend's `gemm_f32` over shapes like
//!   those of the kernels (rows x inner x columns): the peak FLOP/s and the
//!   achievable-efficiency curve in FLOPs, each repetition on operands
//!   from a rotation spanning 64 MiB (not those the last one left in the
//!   core's caches: a training step's products read tensors other kernels
//!   touched since); skinny products (one dimension
//!   16, the others 512..4096) give the curve for products whose smallest
//!   dimension is small;
//! - the per-kernel fixed overhead: the backend's kernel dispatch
//!   (`Backend::run`) on tiny inputs;
//! - memory-bound kernels (element-wise, GELU and its gradient, layer norm
//!   and its gradient, softmax and its gradient, cross-entropy and its
//!   gradient, reshape, transpose, slice and its gradient, sum-to, gather
//!   and its gradient, the AdamW update) through the same dispatch on
//!   kernel-sized tensors, in f32 and bf16, rotating over several buffer
//!   sets so the inputs are not hot in the core's caches: bytes read plus
//!   written per second, less the overhead, by kernel family (the cost
//!   model's `cost::kernel_family`); the AdamW update at 128K, 1M and 8M
//!   elements gives how that rate falls as a kernel's bytes outgrow the
//!   caches (`bandwidth_by_size`: measured, since a VM's sysfs reports the
//!   host's last-level cache, `cache_bytes`, not the guest's share); a
//!   64 MiB copy gives `mem_bw`;
//! - attention and its gradient through the same dispatch: FLOP/s
//!   (`kernel_flops`);
//! - the runtime's synthetic data source writing float features and token
//!   ids (`load_input`, `load_input_int`: what `LoadInput` costs);
//! - the shared-memory communicator: all-gather, reduce-scatter and
//!   all-reduce over groups of 2..=R rank threads (at least 2) at three
//!   sizes, fitted by least squares to `latency + ring wire bytes / bw`
//!   per kind and size;
//! - contention: every rank runs matrix products on its compute thread
//!   and all-gathers on a communication thread at the same time; then
//!   all-gathers and reduce-scatters on two communication threads beside
//!   the products (backward's prefetch and reduction); then the two
//!   collective threads alone: each one's mean time over its mean time
//!   alone is the slowdown (`Contention`).
//!
//! `measure` is public so benchmarks can calibrate without the CLI.

use super::{print_out, CliError};
use clap::Args;
use fsdpc_ir::{DType, ModuleId, Node, Op, Optimizer, Phase, TensorType};
use fsdpc_planner::cluster::{
    matmul_shape_key, wide_skinny_key, ClusterFile, CollectiveFit, CollectiveKind, Contention,
    PROMOTION_FAMILY, SKINNY_BASE_DIM, SKINNY_DIM,
};
use fsdpc_planner::cost::ring_wire_bytes;
use fsdpc_runtime::comm::{Buf, BufMut, Communicator};
use fsdpc_runtime::cpu::kernels::matmul::{gemm_f32, Mat};
use fsdpc_runtime::{
    Backend, CommConfig, CpuBackend, CpuConfig, KernelCtx, OptimizerArgs, ShmWorld, TensorMut,
    TensorRef, Workspace,
};
use gemm::Parallelism;
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Barrier;
use std::time::Instant;

#[derive(Debug, Args)]
pub struct CalibrateArgs {
    /// Ranks per node the figures are for (they share the cores).
    #[arg(long, default_value_t = 2)]
    pub ranks_per_node: u32,
    /// Where to write the cluster file (default: stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// Per-operation seconds of a rank's collectives (one list per kind) and
/// of its products.
type OpTimes = (Vec<Vec<f64>>, Vec<f64>);

/// What one rank thread repeats.
type Body = Box<dyn FnMut() -> Result<(), String>>;

fn fail(what: &str, e: impl std::fmt::Display) -> CliError {
    CliError::Usage(format!("calibrate: {what}: {e}"))
}

/// Runs `setup(rank)`'s body on `ranks` threads at once, `reps` times, each
/// repetition started together; the time of each repetition is its slowest
/// rank's. Returns the repetitions' times.
fn lockstep<S>(ranks: usize, reps: usize, setup: S) -> Result<Vec<f64>, String>
where
    S: Fn(usize) -> Result<Body, String> + Sync,
{
    let barrier = Barrier::new(ranks);
    let per_rank: Vec<Result<Vec<f64>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let (setup, barrier) = (&setup, &barrier);
                s.spawn(move || {
                    // Every rank reaches every barrier, even after a failure,
                    // so the others are never left waiting.
                    let mut body = setup(rank);
                    let mut times = Vec::with_capacity(reps);
                    let mut err = None;
                    for _ in 0..reps {
                        barrier.wait();
                        let t = Instant::now();
                        if let Ok(b) = &mut body {
                            if let Err(e) = b() {
                                err.get_or_insert(e);
                            }
                        }
                        times.push(t.elapsed().as_secs_f64());
                    }
                    match (body, err) {
                        (Err(e), _) | (_, Some(e)) => Err(e),
                        _ => Ok(times),
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a rank thread panicked".into()))
            })
            .collect()
    });
    let mut out = vec![0f64; reps];
    for r in per_rank {
        for (o, t) in out.iter_mut().zip(r?) {
            *o = o.max(t);
        }
    }
    Ok(out)
}

fn median(times: &[f64]) -> f64 {
    let mut v = times.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// A byte buffer aligned to 8 bytes (what the kernels' typed views need).
struct Aligned {
    raw: Vec<u8>,
    off: usize,
    len: usize,
}

impl Aligned {
    /// `len` bytes holding `fill` repeated.
    fn new(len: usize, fill: &[u8]) -> Aligned {
        let mut raw = vec![0u8; len + 8];
        let off = raw.as_ptr().align_offset(8).min(8);
        if !fill.is_empty() {
            for (i, b) in raw[off..off + len].iter_mut().enumerate() {
                *b = fill[i % fill.len()];
            }
        }
        Aligned { raw, off, len }
    }

    fn bytes(&self) -> &[u8] {
        &self.raw[self.off..self.off + self.len]
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.off..self.off + self.len]
    }
}

/// Bytes of one element holding 0.5 (0 for integers: a valid label).
fn fill_of(dtype: DType) -> Vec<u8> {
    match dtype {
        DType::F32 => 0.5f32.to_le_bytes().to_vec(),
        DType::Bf16 => vec![0x00, 0x3f],
        DType::F16 => vec![0x00, 0x38],
        _ => vec![0u8],
    }
}

/// (FLOPs, FLOP/s per rank) of one product `m x k` by `k x n` on every rank.
fn matmul_rate(ranks: usize, m: usize, k: usize, n: usize) -> Result<(f64, f64), CliError> {
    matmul_rate_of(ranks, (m, k, n), false, false)
}

/// `matmul_rate` with `a` and/or `b` stored transposed.
fn matmul_rate_of(
    ranks: usize,
    (m, k, n): (usize, usize, usize),
    trans_a: bool,
    trans_b: bool,
) -> Result<(f64, f64), CliError> {
    let flops = 2.0 * (m * k * n) as f64;
    let reps = ((2e8 / flops) as usize).clamp(3, 200);
    // Operands rotate over sets spanning ROTATION_BYTES: in a training
    // step a product's operands were written or read by other kernels
    // since, not by the same product a moment ago.
    let sets = rotation_sets(4 * (m * k + k * n + m * n)).min(reps);
    let times = lockstep(ranks, reps, |_| {
        let mut ops: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = (0..sets)
            .map(|_| {
                (
                    vec![0.5f32; m * k],
                    vec![0.25f32; k * n],
                    // Written, not zero-allocated: a first write to a
                    // fresh zero page faults, which a plan's arena
                    // does not.
                    vec![1f32; m * n],
                )
            })
            .collect();
        let mut set = 0;
        Ok(Box::new(move || {
            let (a, b, out) = &mut ops[set];
            set = (set + 1) % sets;
            let ma = Mat {
                data: a,
                rows: m,
                cols: k,
                trans: trans_a,
            };
            let mb = Mat {
                data: b,
                rows: k,
                cols: n,
                trans: trans_b,
            };
            gemm_f32(Parallelism::None, out, ma, mb, 1.0, false).map_err(|e| e.0)
        }))
    })
    .map_err(|e| fail("matrix product", e))?;
    Ok((flops, flops / median(&times).max(1e-12)))
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
) -> Result<(f64, f64, f64), CliError> {
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
fn optimizer_time(ranks: usize, n: usize, sets: usize) -> Result<(f64, f64), CliError> {
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
fn data_time(ranks: usize, spec: &str, input: &str) -> Result<(f64, f64), CliError> {
    let what = || format!("data source for {input} of {spec}");
    let m = fsdpc_frontends::load(spec, &fsdpc_frontends::LoadOptions::default())
        .map_err(|e| fail(&what(), e))?;
    let graph = &m.program.graph;
    let ty = fsdpc_runtime::data::analyse(graph)
        .into_iter()
        .find(|d| d.name == input)
        .map(|d| d.ty)
        .ok_or_else(|| fail(&what(), "the model has no such input"))?;
    let source = fsdpc_runtime::data::open(&fsdpc_runtime::DataSpec::Synthetic, graph, 1)
        .map_err(|e| fail(&what(), e))?;
    let bytes = ty.bytes() as usize;
    let b = ty.shape.0.first().copied().unwrap_or(1) as u64;
    let times = lockstep(ranks, 8, |rank| {
        let mut out = Aligned::new(bytes, &[0]);
        let (ty, source, input) = (ty.clone(), source.clone(), input.to_string());
        let mut step = 0;
        Ok(Box::new(move || {
            step += 1;
            let view = TensorMut::new(&ty, out.bytes_mut()).map_err(|e| e.0)?;
            let batch = fsdpc_runtime::Batch {
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
fn copy_rate(ranks: usize) -> Result<f64, CliError> {
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

/// One collective of `op` on a buffer of `bytes` (full size), the body of
/// rank `rank` of a group of `n` on `world`.
fn collective_body(
    world: &std::sync::Arc<ShmWorld>,
    op: CollectiveKind,
    n: usize,
    rank: usize,
    bytes: usize,
) -> Result<Body, String> {
    let ranks: Vec<usize> = (0..n).collect();
    let c = world
        .communicator(&ranks, "calibrate", rank)
        .map_err(|e| e.to_string())?;
    let elems = (bytes / 4 / n).max(1);
    let send = vec![
        0u8;
        4 * elems
            * if op == CollectiveKind::AllGather {
                1
            } else {
                n
            }
    ];
    let mut recv = vec![
        0u8;
        4 * elems
            * if op == CollectiveKind::ReduceScatter {
                1
            } else {
                n
            }
    ];
    Ok(Box::new(move || {
        let dtype = DType::F32;
        match op {
            CollectiveKind::AllGather => c.all_gather(
                Buf {
                    dtype,
                    bytes: &send,
                },
                BufMut {
                    dtype,
                    bytes: &mut recv,
                },
            ),
            CollectiveKind::ReduceScatter => c.reduce_scatter(
                Buf {
                    dtype,
                    bytes: &send,
                },
                BufMut {
                    dtype,
                    bytes: &mut recv,
                },
                1,
            ),
            CollectiveKind::AllReduce => c.all_reduce(
                BufMut {
                    dtype,
                    bytes: &mut recv,
                },
                1,
            ),
        }
        .map_err(|e| e.to_string())
    }))
}

/// Best seconds of one collective over `n` rank threads.
fn collective_time(op: CollectiveKind, n: usize, bytes: usize) -> Result<f64, CliError> {
    let world = ShmWorld::new(n, CommConfig::default());
    let reps = ((32 << 20) / bytes.max(1)).clamp(9, 300);
    let times = lockstep(n, reps, |rank| collective_body(&world, op, n, rank, bytes))
        .map_err(|e| fail(op.name(), e))?;
    Ok(median(&times))
}

/// Least-squares fit of `t = a + x / bw` (a >= 0) to `(x, t)` points.
fn fit_alpha_beta(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let (sx, st) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, t)| (a + x, b + t));
    let (mx, mt) = (sx / n, st / n);
    let (mut sxx, mut sxt) = (0.0, 0.0);
    for (x, t) in points {
        sxx += (x - mx) * (x - mx);
        sxt += (x - mx) * (t - mt);
    }
    let slope = if sxx > 0.0 { sxt / sxx } else { 0.0 };
    if slope <= 0.0 {
        // Flat or noisy: all latency, bandwidth from the largest point.
        let (x, t) = points.last().copied().unwrap_or((1.0, 1.0));
        return (0.0, x / t.max(1e-12));
    }
    let a = mt - slope * mx;
    if a < 0.0 {
        // Through the origin.
        let sxx0: f64 = points.iter().map(|(x, _)| x * x).sum();
        let sxt0: f64 = points.iter().map(|(x, t)| x * t).sum();
        return (0.0, sxx0 / sxt0.max(1e-300));
    }
    (a, 1.0 / slope)
}

/// What the contention measurements give: per rank, mean seconds of an
/// all-gather, a reduce-scatter and a matrix product alone, and, for each
/// mix that runs at once, each one's mean seconds within it.
struct ContentionTimes {
    ag_alone: f64,
    rs_alone: f64,
    gemm_alone: f64,
    /// One all-gather stream beside products: (all-gather, product).
    ag_gemm: (f64, f64),
    /// An all-gather and a reduce-scatter stream beside products:
    /// (all-gather, reduce-scatter, product).
    ag_rs_gemm: (f64, f64, f64),
    /// An all-gather and a reduce-scatter stream, no products.
    ag_rs: (f64, f64),
}

impl ContentionTimes {
    /// The factors, each at least 1: a collective's and a product's beside
    /// one collective, the same beside two, and two collectives' beside
    /// each other.
    fn factors(&self) -> Contention {
        let over = |x: f64, alone: f64| (x / alone.max(1e-12)).max(1.0);
        let (ag, rs, k) = self.ag_rs_gemm;
        Contention {
            comm_slowdown: over(self.ag_gemm.0, self.ag_alone),
            compute_slowdown: over(self.ag_gemm.1, self.gemm_alone),
            two_comm_slowdown: (over(ag, self.ag_alone) + over(rs, self.rs_alone)) / 2.0,
            two_compute_slowdown: over(k, self.gemm_alone),
            comm_pair_slowdown: (over(self.ag_rs.0, self.ag_alone)
                + over(self.ag_rs.1, self.rs_alone))
                / 2.0,
        }
    }
}

/// The 256^3 product the contention measurements run on a compute thread.
fn contention_gemm() -> Body {
    let (m, k, n) = (256, 256, 256);
    let a = vec![0.5f32; m * k];
    let b = vec![0.25f32; k * n];
    let mut out = vec![1f32; m * n];
    Box::new(move || {
        let ma = Mat {
            data: &a,
            rows: m,
            cols: k,
            trans: false,
        };
        let mb = Mat {
            data: &b,
            rows: k,
            cols: n,
            trans: false,
        };
        gemm_f32(Parallelism::None, &mut out, ma, mb, 1.0, false).map_err(|e| e.0)
    })
}

/// Every rank runs `collectives` operations of each kind in `ops` on a
/// communication thread of its own (one shared-memory world per kind, as
/// the runtime's streams have their own communicators) and, with
/// `compute`, products on a compute thread until they are done: the mean
/// seconds of each kind and of the product.
fn run_beside(
    ranks: usize,
    bytes: usize,
    collectives: usize,
    ops: &[CollectiveKind],
    compute: bool,
) -> Result<(Vec<f64>, f64), CliError> {
    let worlds: Vec<_> = ops
        .iter()
        .map(|_| ShmWorld::new(ranks, CommConfig::default()))
        .collect();
    let results: Vec<Result<OpTimes, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..ranks)
            .map(|rank| {
                let worlds = &worlds;
                s.spawn(move || {
                    let stop = AtomicBool::new(false);
                    std::thread::scope(|inner| {
                        let stop = &stop;
                        let gemm = compute.then(|| {
                            inner.spawn(move || {
                                let mut body = contention_gemm();
                                let mut times = Vec::new();
                                while !stop.load(Ordering::Relaxed) {
                                    let t = Instant::now();
                                    body()?;
                                    if !stop.load(Ordering::Relaxed) {
                                        times.push(t.elapsed().as_secs_f64());
                                    }
                                }
                                Ok::<_, String>(times)
                            })
                        });
                        let comms: Vec<_> = ops
                            .iter()
                            .zip(worlds)
                            .map(|(&op, world)| {
                                inner.spawn(move || {
                                    let mut body = collective_body(world, op, ranks, rank, bytes)?;
                                    let mut times = Vec::with_capacity(collectives);
                                    for _ in 0..collectives {
                                        let t = Instant::now();
                                        body()?;
                                        times.push(t.elapsed().as_secs_f64());
                                    }
                                    Ok::<_, String>(times)
                                })
                            })
                            .collect();
                        let comm: Result<Vec<Vec<f64>>, String> = comms
                            .into_iter()
                            .map(|h| {
                                h.join().unwrap_or_else(|_| {
                                    Err("a communication thread panicked".into())
                                })
                            })
                            .collect();
                        stop.store(true, Ordering::Relaxed);
                        let gemm = match gemm {
                            Some(h) => h
                                .join()
                                .unwrap_or_else(|_| Err("a compute thread panicked".into()))?,
                            None => Vec::new(),
                        };
                        Ok((comm?, gemm))
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a rank thread panicked".into()))
            })
            .collect()
    });
    let mut comm = vec![Vec::new(); ops.len()];
    let mut gemm = Vec::new();
    for r in results {
        let (c, k) = r.map_err(|e| fail("contention", e))?;
        for (all, mine) in comm.iter_mut().zip(c) {
            all.extend(mine);
        }
        gemm.extend(k);
    }
    if compute && gemm.is_empty() {
        return Err(fail(
            "contention",
            "no matrix product finished beside the collectives",
        ));
    }
    // Means, not medians: beside the other threads an operation is either
    // untouched or preempted for a scheduler slice, and the slowdown is in
    // the mean (a median of 1.00 hid a 5x slower all-gather in training).
    Ok((comm.iter().map(|t| mean(t)).collect(), mean(&gemm)))
}

/// How collectives of `bytes` and 256^3 products slow each other on
/// `ranks` rank threads: alone, one all-gather stream beside products,
/// an all-gather and a reduce-scatter stream beside products (backward:
/// the next unit's gather and the last one's reduction), and the two
/// collective streams without products.
fn contention(ranks: usize, bytes: usize, collectives: usize) -> Result<ContentionTimes, CliError> {
    use CollectiveKind::{AllGather, ReduceScatter};
    let ag_alone = run_beside(ranks, bytes, collectives, &[AllGather], false)?.0[0];
    let rs_alone = run_beside(ranks, bytes, collectives, &[ReduceScatter], false)?.0[0];
    let gemm_alone = mean(
        &lockstep(ranks, collectives, |_| Ok(contention_gemm()))
            .map_err(|e| fail("contention", e))?,
    );
    let (c, k) = run_beside(ranks, bytes, collectives, &[AllGather], true)?;
    let ag_gemm = (c[0], k);
    let (c, k) = run_beside(ranks, bytes, collectives, &[AllGather, ReduceScatter], true)?;
    let ag_rs_gemm = (c[0], c[1], k);
    let (c, _) = run_beside(
        ranks,
        bytes,
        collectives,
        &[AllGather, ReduceScatter],
        false,
    )?;
    Ok(ContentionTimes {
        ag_alone,
        rs_alone,
        gemm_alone,
        ag_gemm,
        ag_rs_gemm,
        ag_rs: (c[0], c[1]),
    })
}

fn mean(times: &[f64]) -> f64 {
    times.iter().sum::<f64>() / times.len().max(1) as f64
}

/// Bytes of the largest cache of CPU 0 (Linux sysfs), if known.
fn last_level_cache() -> Option<u64> {
    (0..8)
        .filter_map(|i| {
            let text = std::fs::read_to_string(format!(
                "/sys/devices/system/cpu/cpu0/cache/index{i}/size"
            ))
            .ok()?;
            let t = text.trim();
            let (num, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len()));
            let n: u64 = num.parse().ok()?;
            Some(match unit {
                "K" => n << 10,
                "M" => n << 20,
                "G" => n << 30,
                _ => n,
            })
        })
        .max()
}

/// The sizes of the skinny products calibrated (16 x s x s and its
/// permutations).
const SKINNY_SIZES: [usize; 4] = [512, 1024, 2048, 4096];

/// Elements of the AdamW updates timed: the first is the optimizer
/// family's bandwidth (a working set that fits a core's caches), the
/// others how bandwidth falls beyond them (`bandwidth_by_size`).
const OPTIMIZER_SIZES: [usize; 3] = [1 << 17, 1 << 20, 1 << 23];

/// Bytes the buffer sets of one timed operation span together, so each
/// repetition reads operands another has not left in a core's caches (a
/// training step touches each tensor once between other work).
const ROTATION_BYTES: usize = 64 << 20;

/// How many buffer sets of `set_bytes` bytes rotate to span
/// `ROTATION_BYTES` (at least 2, at most 256).
fn rotation_sets(set_bytes: usize) -> usize {
    ROTATION_BYTES.div_ceil(set_bytes.max(1)).clamp(2, 256)
}

/// The attention shape calibrated: batch, heads, sequence, head size.
const ATTENTION: [usize; 4] = [4, 4, 128, 32];

/// Measures this machine for `ranks_per_node` ranks per node and returns
/// the cluster file, and the table of what was measured. `progress`: draw
/// a progress bar on stderr.
pub fn measure(ranks_per_node: u32, progress: bool) -> Result<(ClusterFile, String), CliError> {
    let rpn = ranks_per_node.max(1);
    let ranks = rpn as usize;
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    let shapes = [
        (16, 32, 32),
        (64, 64, 64),
        (128, 128, 128),
        (256, 128, 384),
        (512, 256, 256),
        (1024, 128, 512),
        (1024, 512, 512),
        (1024, 1024, 1024),
    ];
    let group_sizes: Vec<usize> = (2..=ranks.max(2)).collect();
    // Up to 32 MiB: a unit's gather or reduction streams through memory
    // once it outgrows the caches, which the small sizes cannot show.
    let coll_sizes = [4usize << 10, 256 << 10, 4 << 20, 32 << 20];
    let f32_cases = kernel_cases(1024, 256, DType::F32);
    let bf16_cases = kernel_cases(1024, 256, DType::Bf16);
    let total = shapes.len()
        + SKINNY_SIZES.len()
        + 28
        + 1
        + f32_cases.len()
        + bf16_cases.len()
        + 1
        + 4
        + OPTIMIZER_SIZES.len()
        + 1
        + DATA_CASES.len()
        + group_sizes.len() * CollectiveKind::ALL.len() * coll_sizes.len()
        + 1;
    let bar = if progress {
        let bar = ProgressBar::new(total as u64);
        if let Ok(style) = ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]") {
            bar.set_style(style);
        }
        bar
    } else {
        ProgressBar::hidden()
    };
    let mut table = String::new();
    let _ = writeln!(
        table,
        "fsdpc calibrate: {ranks} rank thread(s) at once on {cores} core(s); per rank"
    );
    let _ = writeln!(table, "matrix products (gemm_f32, one thread per rank):");
    let mut points = Vec::new();
    for (m, k, n) in shapes {
        bar.set_message(format!("matrix product {m}x{k}x{n}"));
        let (flops, rate) = matmul_rate(ranks, m, k, n)?;
        let _ = writeln!(
            table,
            "  {m:>5} x {k:>5} x {n:>5}: {:>8.2} GFLOP/s",
            rate / 1e9
        );
        points.push((flops, rate));
        bar.inc(1);
    }
    // Skinny products (a small batch through a wide layer): the smallest
    // dimension 16 as rows, inner size or columns, at each size.
    let _ = writeln!(
        table,
        "skinny matrix products (16 rows, inner or columns; mean of the three):"
    );
    let mut skinny = Vec::new();
    for s in SKINNY_SIZES {
        bar.set_message(format!("skinny matrix products, {s}"));
        let mut rates = Vec::new();
        let mut flops = 0.0;
        for (m, k, n) in [(16, s, s), (s, 16, s), (s, s, 16)] {
            let (f, rate) = matmul_rate(ranks, m, k, n)?;
            flops = f;
            rates.push(rate);
        }
        let rate = rates.iter().sum::<f64>() / rates.len() as f64;
        let _ = writeln!(
            table,
            "  16 x {s:>5} x {s:>5}: {:>8.2} GFLOP/s ({})",
            rate / 1e9,
            rates
                .iter()
                .map(|r| format!("{:.1}", r / 1e9))
                .collect::<Vec<_>>()
                .join(", ")
        );
        skinny.push((flops, rate));
        bar.inc(1);
    }
    // Curves by call shape and operand layout (`matmul_shape_key`): the
    // square shapes above with a smallest dimension over SKINNY_DIM, and
    // the skinny ones with 16 rows, inner size or columns, each with `a`
    // and `b` plain or stored transposed.
    let _ = writeln!(
        table,
        "matrix products by shape and layout (GFLOP/s; a, b plain n or transposed t):"
    );
    let mut matmul_curves: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let square: Vec<(usize, usize, usize)> = shapes
        .iter()
        .copied()
        .filter(|&(m, k, n)| m.min(k).min(n) > SKINNY_DIM)
        .collect();
    let skinny_shapes = |which: usize, d: usize| -> Vec<(usize, usize, usize)> {
        SKINNY_SIZES
            .iter()
            .map(|&s| match which {
                0 => (d, s, s),
                1 => (s, d, s),
                _ => (s, s, d),
            })
            .collect()
    };
    let (base, wide) = (SKINNY_BASE_DIM, SKINNY_DIM);
    for (family, list, width) in [
        ("square", square, None),
        ("rows", skinny_shapes(0, base), None),
        ("inner", skinny_shapes(1, base), None),
        ("cols", skinny_shapes(2, base), None),
        ("rows", skinny_shapes(0, wide), Some(wide)),
        ("inner", skinny_shapes(1, wide), Some(wide)),
        ("cols", skinny_shapes(2, wide), Some(wide)),
    ] {
        for (trans_a, trans_b) in [(false, false), (false, true), (true, false), (true, true)] {
            bar.set_message(format!("matrix products, {family}"));
            let (m0, k0, n0) = list[0];
            let mut key = matmul_shape_key(m0 as u64, k0 as u64, n0 as u64, trans_a, trans_b);
            if width.is_some() {
                key = wide_skinny_key(&key);
            }
            let mut curve: Vec<(f64, f64)> = Vec::new();
            let mut shown = Vec::new();
            for &shape in &list {
                let (flops, rate) = matmul_rate_of(ranks, shape, trans_a, trans_b)?;
                if curve.last().is_none_or(|l| flops > l.0) {
                    curve.push((flops, rate));
                }
                shown.push(format!("{:.1}", rate / 1e9));
            }
            let _ = writeln!(table, "  {key:<12} {}", shown.join(", "));
            matmul_curves.insert(key, curve);
            bar.inc(1);
        }
    }
    // One peak over every product measured; every curve relative to it.
    let peak = points
        .iter()
        .chain(&skinny)
        .chain(matmul_curves.values().flatten())
        .map(|p| p.1)
        .fold(0.0, f64::max);
    let skinny_curve: Vec<(f64, f64)> = skinny
        .iter()
        .map(|&(f, r)| (f, (r / peak).clamp(1e-6, 1.0)))
        .collect();
    let mut curve: Vec<(f64, f64)> = Vec::new();
    for &(flops, rate) in &points {
        // Keep the curve increasing in FLOPs (shapes are in that order).
        if curve.last().is_none_or(|l| flops > l.0) {
            curve.push((flops, (rate / peak).clamp(1e-6, 1.0)));
        }
    }
    for curve in matmul_curves.values_mut() {
        for p in curve.iter_mut() {
            p.1 = (p.1 / peak).clamp(1e-6, 1.0);
        }
    }

    // Per-kernel overhead: tiny kernels, many calls.
    bar.set_message("kernel overhead");
    let mut tiny = Vec::new();
    for case in kernel_cases(1, 8, DType::F32) {
        tiny.push(kernel_time(ranks, &case, 1, 200, 10)?.0);
    }
    let overhead = median(&tiny);
    let _ = writeln!(
        table,
        "kernel overhead (Backend::run on 1 x 8 tensors, median over {} kernels): {:.2} us",
        tiny.len(),
        overhead * 1e6
    );
    bar.inc(1);

    let _ = writeln!(
        table,
        "memory-bound kernels on 1024 x 256 tensors (4 buffer sets), bytes read + written:"
    );
    let mut kernel_bw = BTreeMap::new();
    for case in f32_cases.iter().chain(&bf16_cases) {
        bar.set_message(format!("kernel {}", case.family));
        let (t, bytes, _) = kernel_time(ranks, case, 4, 4, 8)?;
        let bw = bytes / (t - overhead).max(t * 0.05).max(1e-12);
        let _ = writeln!(
            table,
            "  {:<22} {:>8.1} us {:>8.2} GB/s",
            case.family,
            t * 1e6,
            bw / 1e9
        );
        kernel_bw.insert(case.family.clone(), bw);
        bar.inc(1);
    }
    // What a kernel that computes in f32 pays to promote a half-precision
    // operand (`PROMOTION_FAMILY`; the matrix products' cost model adds it
    // per half element): a bf16 tensor widened to f32 and an f32 tensor
    // narrowed to bf16, the bytes of both over the time of both.
    bar.set_message("kernel cast:bf16");
    let (mut cast_s, mut cast_bytes) = (0.0, 0.0);
    for (to, from) in [(DType::F32, DType::Bf16), (DType::Bf16, DType::F32)] {
        let case = KernelCase {
            family: PROMOTION_FAMILY.to_string(),
            op: Op::Cast { to },
            inputs: vec![TensorType::new(from, vec![1024, 256])],
        };
        let (t, bytes, _) = kernel_time(ranks, &case, 4, 4, 8)?;
        cast_s += (t - overhead).max(t * 0.05);
        cast_bytes += bytes;
    }
    let cast_bw = cast_bytes / cast_s.max(1e-12);
    let _ = writeln!(
        table,
        "  {:<22} {:>8.1} us {:>8.2} GB/s   (bf16 -> f32 and f32 -> bf16)",
        PROMOTION_FAMILY,
        cast_s * 1e6,
        cast_bw / 1e9
    );
    kernel_bw.insert(PROMOTION_FAMILY.to_string(), cast_bw);
    bar.inc(1);
    let mut kernel_flops = std::collections::BTreeMap::new();
    for case in attention_cases(ATTENTION, DType::F32)
        .iter()
        .chain(&attention_cases(ATTENTION, DType::Bf16))
    {
        bar.set_message(format!("kernel {}", case.family));
        let (t, _, flops) = kernel_time(ranks, case, 2, 2, 5)?;
        let rate = flops / (t - overhead).max(t * 0.05).max(1e-12);
        let _ = writeln!(
            table,
            "  {:<22} {:>8.1} us {:>8.2} GFLOP/s",
            case.family,
            t * 1e6,
            rate / 1e9
        );
        kernel_flops.insert(case.family.clone(), rate);
        bar.inc(1);
    }
    // The AdamW update at growing sizes: its bandwidth at the first is the
    // optimizer family's, the others' over it how every memory-bound kernel
    // slows once its bytes outgrow the caches (`bandwidth_by_size`).
    let mut by_size: Vec<(f64, f64)> = Vec::new();
    for n in OPTIMIZER_SIZES {
        bar.set_message(format!("optimizer step, {n} elements"));
        let (t, bytes) = optimizer_time(ranks, n, rotation_sets(16 * n))?;
        let bw = bytes / (t - overhead).max(t * 0.05).max(1e-12);
        let _ = writeln!(
            table,
            "  {:<22} {:>8.1} us {:>8.2} GB/s",
            format!("optimizer (AdamW {}K)", n >> 10),
            t * 1e6,
            bw / 1e9
        );
        let first = *kernel_bw.entry("optimizer".to_string()).or_insert(bw);
        // Non-increasing: a larger working set is never faster.
        let prev = by_size.last().map_or(1.0, |p| p.1);
        by_size.push((bytes, (bw / first).clamp(1e-6, prev)));
        bar.inc(1);
    }
    for (family, spec, input) in DATA_CASES {
        bar.set_message(format!("data: {input}"));
        let (t, bytes) = data_time(ranks, spec, input)?;
        let bw = bytes / (t - overhead).max(t * 0.05).max(1e-12);
        let _ = writeln!(
            table,
            "  {:<22} {:>8.1} us {:>8.2} GB/s",
            format!("{family} ({input})"),
            t * 1e6,
            bw / 1e9
        );
        kernel_bw.insert(family.to_string(), bw);
        bar.inc(1);
    }
    bar.set_message("memory copy");
    let mem = copy_rate(ranks)?;
    let _ = writeln!(
        table,
        "memory: {:.2} GB/s (64 MiB copy, read + write)",
        mem / 1e9
    );
    bar.inc(1);

    let _ = writeln!(
        table,
        "collectives (shared memory, f32), fit latency + ring wire bytes / bw (the cost model interpolates the measured points):"
    );
    let mut fits = Vec::new();
    for &n in &group_sizes {
        for op in CollectiveKind::ALL {
            let mut pts = Vec::new();
            for &bytes in &coll_sizes {
                bar.set_message(format!("{} over {n} ranks, {bytes} B", op.name()));
                let t = collective_time(op, n, bytes)?;
                pts.push((ring_wire_bytes(op, n as u32, bytes as f64), t));
                bar.inc(1);
            }
            let (latency_s, bw) = fit_alpha_beta(&pts);
            let _ = writeln!(
                table,
                "  {:<15} {n} ranks: {:>7.1} us + wire / {:>6.2} GB/s   (measured: {})",
                op.name(),
                latency_s * 1e6,
                bw / 1e9,
                pts.iter()
                    .zip(&coll_sizes)
                    .map(|((_, t), b)| format!("{} KiB {:.1} us", b >> 10, t * 1e6))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            fits.push(CollectiveFit {
                op,
                ranks: n as u32,
                latency_s,
                bw,
                points: pts.clone(),
            });
        }
    }

    bar.set_message("contention");
    let cont_ranks = ranks.max(2);
    let times = contention(cont_ranks, 8 << 20, 40)?;
    let factors = times.factors();
    // "alone -> beside" in microseconds.
    let moved = |alone: f64, beside: f64| format!("{:.1} -> {:.1}", alone * 1e6, beside * 1e6);
    let (t, f) = (&times, &factors);
    let _ = writeln!(
        table,
        "contention ({cont_ranks} ranks, 8 MiB collectives, 256^3 products; mean us, alone -> beside):\n  \
         all-gather beside products: {} (x{:.2}), product {} (x{:.2})\n  \
         all-gather and reduce-scatter beside products: {} and {} (x{:.2} each), product {} (x{:.2})\n  \
         all-gather beside reduce-scatter: {} and {} (x{:.2} each)",
        moved(t.ag_alone, t.ag_gemm.0),
        f.comm_slowdown,
        moved(t.gemm_alone, t.ag_gemm.1),
        f.compute_slowdown,
        moved(t.ag_alone, t.ag_rs_gemm.0),
        moved(t.rs_alone, t.ag_rs_gemm.1),
        f.two_comm_slowdown,
        moved(t.gemm_alone, t.ag_rs_gemm.2),
        f.two_compute_slowdown,
        moved(t.ag_alone, t.ag_rs.0),
        moved(t.rs_alone, t.ag_rs.1),
        f.comm_pair_slowdown,
    );
    bar.inc(1);
    bar.finish_and_clear();

    let mut file = ClusterFile::preset("cpu-local", rpn)?;
    let host = std::fs::read_to_string("/etc/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "this machine".into());
    file.name = "calibrated".to_string();
    file.description =
        format!("measured by fsdpc calibrate on {host}: {cores} cores, {rpn} ranks per node");
    let h = &mut file.hardware;
    // Ranks measured at once: the rates are already per rank.
    h.peak_flops_f32 = peak;
    h.peak_flops_bf16 = peak;
    h.matmul_efficiency = curve;
    h.skinny_matmul_efficiency = skinny_curve;
    h.matmul_curves = matmul_curves;
    h.mem_bw = mem;
    h.host_bw = mem;
    h.host_mem_bw = mem;
    h.kernel_overhead_s = overhead;
    if let Some(llc) = last_level_cache() {
        h.cache_bytes = llc as f64 / rpn as f64;
        let _ = writeln!(
            table,
            "last-level cache: {} KiB, {} KiB per rank",
            llc >> 10,
            (llc / u64::from(rpn)) >> 10
        );
    }
    h.kernel_bw = kernel_bw;
    h.bandwidth_by_size = by_size;
    h.kernel_flops = kernel_flops;
    h.cpu_gemm = fsdpc_runtime::cpu::gemm_blocking();
    if let Some(g) = &h.cpu_gemm {
        let _ = writeln!(
            table,
            "gemm blocking (f32): {} lanes, {} x {} micro-kernel, {} KiB packing slab per thread",
            g.simd_lanes,
            g.mr,
            g.nr,
            g.slab_bytes >> 10
        );
    }
    if let Some(ag2) = fits
        .iter()
        .find(|f| f.op == CollectiveKind::AllGather && f.ranks == 2)
    {
        h.intra_bw = ag2.bw;
        h.inter_bw = ag2.bw;
        h.intra_latency_s = ag2.latency_s;
        h.inter_latency_s = ag2.latency_s;
    }
    h.collective_fits = fits;
    h.comm_compute_contention = Some(factors);
    let src = |what: &str| format!("fsdpc calibrate on {host}: {what}");
    for (k, v) in [
        (
            "peak_flops_f32",
            src("best gemm_f32 rate per rank, all ranks running"),
        ),
        (
            "peak_flops_bf16",
            src("the f32 rate: the CPU kernels compute half operands in f32"),
        ),
        (
            "matmul_efficiency",
            src("gemm_f32 rate per shape over the best"),
        ),
        (
            "mem_bw",
            src("64 MiB copy per rank, read + write, all ranks running"),
        ),
        (
            "kernel_overhead_s",
            src("median per-call time of Backend::run on 1 x 8 tensors"),
        ),
        (
            "kernel_bw",
            src("Backend::run per kernel family on 1024 x 256 tensors (f32 and bf16) and the AdamW update on 128K elements (buffer sets rotating over 64 MiB), bytes read + written over the time less the overhead; load_input and load_input_int: the synthetic data source writing a classifier's 64 x 1024 f32 features and a language model's 16 x 256 token ids, bytes written over the time less the overhead; cast:bf16: a bf16 tensor cast to f32 and an f32 one to bf16, their bytes over their time (the promotion of a half-precision matrix product's operands)"),
        ),
        (
            "bandwidth_by_size",
            src("the AdamW update on 128K, 1M and 8M elements (buffer sets rotating over at least 64 MiB), each one's bandwidth over the first's"),
        ),
        (
            "matmul_curves",
            src("gemm_f32 rate per rank by shape (square: the matmul_efficiency shapes over 64 in every dimension; rows, inner, cols: 16 x s x s, s x 16 x s, s x s x 16 for s = 512..4096, and the same 64 wide under KEY@64) and operand layout (nn, nt, tn, tt), over the best"),
        ),
        (
            "skinny_matmul_efficiency",
            src("gemm_f32 rate per rank of 16 x s x s, s x 16 x s and s x s x 16 (mean) for s = 512..4096, over the best"),
        ),
        (
            "kernel_flops",
            src("Backend::run of causal attention and its gradient on [4, 4, 128, 32] (f32 and bf16), FLOPs over the time less the overhead"),
        ),
        (
            "collective_fits",
            src("shared-memory all-gather, reduce-scatter, all-reduce over 2..=R rank threads at 4 KiB, 256 KiB, 4 MiB and 32 MiB: the median times as points (interpolated by the cost model), and their least-squares latency + wire / bw"),
        ),
        (
            "comm_compute_contention",
            src("mean 8 MiB all-gather and 256^3 gemm_f32 per rank, beside each other over alone; two_*: an all-gather and a reduce-scatter stream beside the products (each collective's the mean of the two); comm_pair_slowdown: the two collective streams without products"),
        ),
        (
            "cache_bytes",
            src("the largest cache of cpu0 in /sys/devices/system/cpu, shared by the ranks"),
        ),
        (
            "intra_bw",
            src("the 2-rank all-gather fit's bandwidth"),
        ),
        ("inter_bw", src("as intra_bw: one node")),
        (
            "intra_latency_s",
            src("the 2-rank all-gather fit's latency"),
        ),
        ("inter_latency_s", src("as intra_latency_s: one node")),
        ("host_bw", src("as mem_bw: host and device are one memory")),
        ("host_mem_bw", src("as mem_bw")),
        (
            "cpu_gemm",
            src("the f32 micro-kernel gemm 0.19 dispatches to on this CPU (AVX-512F, FMA or scalar) and the L2 size its cache detection reads"),
        ),
    ] {
        file.sources.insert(k.to_string(), v);
    }
    Ok((file, table))
}

pub fn run(a: CalibrateArgs) -> Result<(), CliError> {
    let (file, table) = measure(a.ranks_per_node, true)?;
    eprint!("{table}");
    let text = serde_json::to_string_pretty(&file)
        .map_err(|e| CliError::Usage(format!("cannot write the cluster file: {e}")))?;
    match &a.output {
        None => print_out(&format!("{text}\n")),
        Some(path) => {
            std::fs::write(path, format!("{text}\n")).map_err(|source| CliError::Io {
                path: path.display().to_string(),
                source,
            })?;
            eprintln!("wrote {}", path.display());
            Ok(())
        }
    }
}
