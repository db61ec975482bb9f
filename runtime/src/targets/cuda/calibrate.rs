//! The measurements of `fsdpc calibrate --target cuda` on this machine's
//! GPUs, with the cuda target's own kernels, cuBLAS calls and NCCL
//! communicators (what is measured and how it becomes a cluster file:
//! `calibrate::gpu`). Every time is the median of repetitions between two
//! CUDA events on the work's stream, after warm-up, on operands of
//! pseudo-random values (a product of zeros runs faster than one of
//! data); the collectives' is the slowest GPU's.

use super::device::{device_count, Device, DeviceAlloc};
use super::error::CudaError;
use super::exec::BLAS_WORKSPACE;
use super::nccl::{self, NcclComm};
use super::single::{time_node, timed_runs};
use crate::calibrate::gpu::{
    skinny_shapes, AttentionTime, CollectiveTime, GpuMeasurements, KernelTime, ProductTime,
    ATTENTION, COLLECTIVE_BYTES, FAMILIES, KERNEL_ELEMENTS, LAYOUTS, PRODUCTS, ROW, TINY_ELEMENTS,
    VOCAB,
};
use crate::calibrate::harness::median;
use crate::tensor::HostTensor;
use fsdpc_ir::{BinaryFn, DType, ModuleId, Node, Op, Phase, TensorType, UnaryFn};
use fsdpc_plan::cluster::{CollectiveKind, SKINNY_BASE_DIM, SKINNY_DIM};

/// The name of GPU 0 (an error naming what is missing when there is no
/// driver or GPU).
pub fn device_name() -> Result<String, CudaError> {
    Ok(Device::open(0)?.name)
}

/// Measures this machine's GPUs (the products, attention and kernels on
/// GPU 0; the collectives over every GPU when there are two or more),
/// saying what it measures through `progress`.
pub fn measure(progress: &mut dyn FnMut(&str)) -> Result<GpuMeasurements, CudaError> {
    let gpus = device_count()?;
    progress("opening GPU 0 and loading the kernels");
    let dev = Device::open(0)?;
    let (free, total) = dev.mem_info()?;
    let mut m = GpuMeasurements {
        device: dev.name.clone(),
        gpus,
        total_bytes: total as u64,
        context_bytes: (total - free) as u64,
        ..GpuMeasurements::default()
    };
    m.cublas_handle_bytes = cublas_handle_bytes(&dev)?;
    progress("the per-kernel overhead");
    let tiny = [TINY_ELEMENTS];
    m.overhead_s = median(&time(
        &dev,
        Op::Binary { f: BinaryFn::Add },
        &[rand(DType::Bf16, &tiny, 1), rand(DType::Bf16, &tiny, 2)],
        (10, 200),
    )?);
    progress("matrix products");
    for &shape in &PRODUCTS {
        for &trans in &LAYOUTS {
            m.products.push(product(&dev, shape, trans)?);
        }
    }
    for w in [SKINNY_BASE_DIM, SKINNY_DIM] {
        for (_, shape) in skinny_shapes(w) {
            m.skinny.push(product(&dev, shape, (false, false))?);
        }
    }
    progress("attention");
    for &case in &ATTENTION {
        m.attention.push(attention(&dev, case)?);
    }
    progress("memory-bound kernels");
    for family in FAMILIES {
        for dt in [DType::F32, DType::Bf16] {
            if let Some(k) = kernel(&dev, family, dt)? {
                m.kernels.push(k);
            }
        }
    }
    drop(dev);
    if gpus > 1 {
        progress("collectives over the local GPUs");
        let (times, comm) = collectives(gpus)?;
        m.collectives = times;
        m.nccl_comm_bytes = Some(comm);
    }
    Ok(m)
}

/// What a cuBLAS handle takes beyond the workspace it is given: the use
/// after making one, less the use before and the workspace's allocation
/// (rounded to the driver's 2 MiB granule).
fn cublas_handle_bytes(dev: &Device) -> Result<u64, CudaError> {
    let before = dev.used_bytes()?;
    let ws = DeviceAlloc::new(&dev.ctx, BLAS_WORKSPACE as usize)?;
    let stream = dev.ctx.new_stream()?;
    let blas = super::blas::Blas::new(&stream, (ws.ptr, BLAS_WORKSPACE as usize))?;
    let after = dev.used_bytes()?;
    drop(blas);
    Ok(after.saturating_sub(before + BLAS_WORKSPACE.next_multiple_of(2 << 20)))
}

fn node(op: Op, ins: &[&TensorType]) -> Result<Node, CudaError> {
    let outputs = fsdpc_ir::ops::infer(&op, ins).map_err(|reason| CudaError::Kernel {
        node: "calibrate".into(),
        op: op.name(),
        reason,
    })?;
    Ok(Node {
        op,
        name: "calibrate".into(),
        module: ModuleId::ROOT,
        phase: Phase::Forward,
        outputs,
    })
}

/// Seconds of each timed run of `op` on `inputs` (its workspace as a plan
/// would give it).
fn time(
    dev: &Device,
    op: Op,
    inputs: &[HostTensor],
    runs: (usize, usize),
) -> Result<Vec<f64>, CudaError> {
    let tys: Vec<&TensorType> = inputs.iter().map(|t| &t.ty).collect();
    let n = node(op, &tys)?;
    let ws = fsdpc_plan::workspace::kernel_workspace(&n.op, &tys, &n.outputs);
    time_node(dev, &n, inputs, ws, runs)
}

/// A tensor of `dt` and `shape` of pseudo-random values: floats in
/// [-1, 1), integers in [0, VOCAB).
fn rand(dt: DType, shape: &[usize], seed: u64) -> HostTensor {
    let mut t = HostTensor::zeros(TensorType::new(dt, shape.to_vec()));
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let unit = |r: u64| (r >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
    let bytes = t.bytes_mut();
    match dt {
        DType::F32 => bytes
            .chunks_exact_mut(4)
            .for_each(|c| c.copy_from_slice(&unit(next()).to_le_bytes())),
        DType::Bf16 => bytes
            .chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&half::bf16::from_f32(unit(next())).to_le_bytes())),
        DType::F16 => bytes
            .chunks_exact_mut(2)
            .for_each(|c| c.copy_from_slice(&half::f16::from_f32(unit(next())).to_le_bytes())),
        DType::I64 => bytes
            .chunks_exact_mut(8)
            .for_each(|c| c.copy_from_slice(&((next() % VOCAB as u64) as i64).to_le_bytes())),
        _ => {}
    }
    t
}

/// A bf16 product of `shape` (m, k, n) with operands stored transposed as
/// `trans` says.
fn product(
    dev: &Device,
    (m, k, n): (usize, usize, usize),
    trans: (bool, bool),
) -> Result<ProductTime, CudaError> {
    let a = if trans.0 { [k, m] } else { [m, k] };
    let b = if trans.1 { [n, k] } else { [k, n] };
    let op = Op::MatMul {
        trans_a: trans.0,
        trans_b: trans.1,
    };
    let t = time(
        dev,
        op,
        &[rand(DType::Bf16, &a, 3), rand(DType::Bf16, &b, 4)],
        (2, 7),
    )?;
    Ok(ProductTime {
        shape: (m, k, n),
        trans,
        seconds: median(&t),
    })
}

/// Causal attention of `case` (sequence, head size, heads, batch) in bf16,
/// forward and backward.
fn attention(
    dev: &Device,
    (s, d, heads, b): (usize, usize, usize, usize),
) -> Result<AttentionTime, CudaError> {
    let shape = [b, heads, s, d];
    let scale = 1.0 / (d as f64).sqrt();
    let qkv: Vec<HostTensor> = (0..4).map(|i| rand(DType::Bf16, &shape, 10 + i)).collect();
    let fwd = Op::Attention {
        causal: true,
        scale,
    };
    let tys: Vec<&TensorType> = qkv.iter().map(|t| &t.ty).collect();
    let flops = fsdpc_ir::ops::flops(&fwd, &tys[..3], &[qkv[0].ty.clone()]);
    let forward_s = median(&time(dev, fwd, &qkv[..3], (1, 3))?);
    let bwd = Op::AttentionGrad {
        causal: true,
        scale,
    };
    let backward_s = median(&time(dev, bwd, &qkv, (1, 3))?);
    Ok(AttentionTime {
        case: (s, d, heads, b),
        forward_flops: flops,
        backward_flops: 2.5 * flops,
        forward_s,
        backward_s,
    })
}

/// The kernel of `family` on `KERNEL_ELEMENTS` elements of `dt` (`None`:
/// the family has no kernel in `dt`: a cast is measured f32 to bf16 only,
/// and keyed `cast`).
fn kernel(dev: &Device, family: &str, dt: DType) -> Result<Option<KernelTime>, CudaError> {
    let n = KERNEL_ELEMENTS;
    let flat = [n];
    let rows = [n / ROW, ROW];
    let logits = [n / VOCAB, VOCAB];
    let x = |shape: &[usize], seed| rand(dt, shape, seed);
    let (op, inputs) = match family {
        "binary" => (
            Op::Binary { f: BinaryFn::Add },
            vec![x(&flat, 1), x(&flat, 2)],
        ),
        "unary" => (
            Op::Unary {
                f: UnaryFn::GeluTanh,
            },
            vec![x(&flat, 1)],
        ),
        "unary_grad" => (
            Op::UnaryGrad {
                f: UnaryFn::GeluTanh,
            },
            vec![x(&flat, 1), x(&flat, 2)],
        ),
        "cast" if dt == DType::Bf16 => (
            Op::Cast { to: DType::Bf16 },
            vec![rand(DType::F32, &flat, 1)],
        ),
        "cast" => return Ok(None),
        "layer_norm" => (
            Op::LayerNorm { eps: 1e-5 },
            vec![x(&rows, 1), x(&[ROW], 2), x(&[ROW], 3)],
        ),
        "layer_norm_grad" => (
            Op::LayerNormGrad {
                eps: 1e-5,
                has_beta: true,
            },
            vec![x(&rows, 1), x(&[ROW], 2), x(&rows, 3)],
        ),
        "softmax" => (Op::Softmax { axis: 1 }, vec![x(&rows, 1)]),
        "softmax_grad" => (Op::SoftmaxGrad { axis: 1 }, vec![x(&rows, 1), x(&rows, 2)]),
        "cross_entropy" => (
            Op::CrossEntropy { ignore_index: None },
            vec![x(&logits, 1), rand(DType::I64, &[n / VOCAB], 2)],
        ),
        "cross_entropy_grad" => (
            Op::CrossEntropyGrad { ignore_index: None },
            vec![
                x(&logits, 1),
                rand(DType::I64, &[n / VOCAB], 2),
                HostTensor::from_f32(&[], &[1.0]).map_err(|e| CudaError::Kernel {
                    node: "calibrate".into(),
                    op: "cross_entropy_grad".into(),
                    reason: e.0,
                })?,
            ],
        ),
        _ => return Ok(None),
    };
    let tys: Vec<&TensorType> = inputs.iter().map(|t| &t.ty).collect();
    let outs = node(op.clone(), &tys)?.outputs;
    let half = tys
        .iter()
        .copied()
        .chain(&outs)
        .any(|t| matches!(t.dtype, DType::Bf16 | DType::F16));
    let bytes: u64 =
        tys.iter().map(|t| t.bytes()).sum::<u64>() + outs.iter().map(|t| t.bytes()).sum::<u64>();
    let seconds = median(&time(dev, op, &inputs, (2, 7))?);
    Ok(Some(KernelTime {
        // The cast under `cast`: `cast:bf16` in a cluster file says its
        // matrix products widen half operands first (`PROMOTION_FAMILY`, a
        // CPU's), and a GPU multiplies them natively.
        family: if half && family != "cast" {
            format!("{family}:bf16")
        } else {
            family.to_string()
        },
        bytes: bytes as f64,
        seconds,
    }))
}

/// Every collective kind at every size over all `gpus` GPUs (one thread
/// each, one communicator), and what the communicator took on GPU 0.
fn collectives(gpus: usize) -> Result<(Vec<CollectiveTime>, u64), CudaError> {
    let id = nccl::unique_id()?;
    let largest = *COLLECTIVE_BYTES.iter().max().unwrap_or(&0);
    let per_gpu: Vec<Result<(Vec<f64>, u64), CudaError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..gpus)
            .map(|g| {
                let id = &id;
                s.spawn(move || -> Result<(Vec<f64>, u64), CudaError> {
                    let dev = Device::open(g)?;
                    dev.ctx.bind_to_thread()?;
                    let before = dev.used_bytes()?;
                    let comm = NcclComm::init(id, gpus, g)?;
                    let comm_bytes = dev.used_bytes()?.saturating_sub(before);
                    // Send: the largest buffer; receive: gpus times it.
                    let send = DeviceAlloc::new(&dev.ctx, largest)?;
                    let recv = DeviceAlloc::new(&dev.ctx, largest * gpus)?;
                    let stream = dev.ctx.new_stream()?;
                    let mut out = Vec::new();
                    for op in CollectiveKind::ALL {
                        for &bytes in &COLLECTIVE_BYTES {
                            let count = bytes / 2;
                            let mut run = || match op {
                                CollectiveKind::AllGather => comm.all_gather(
                                    send.ptr,
                                    recv.ptr,
                                    count / gpus,
                                    DType::Bf16,
                                    &stream,
                                ),
                                CollectiveKind::ReduceScatter => comm.reduce_scatter(
                                    recv.ptr,
                                    send.ptr,
                                    count / gpus,
                                    DType::Bf16,
                                    &stream,
                                ),
                                CollectiveKind::AllReduce => {
                                    comm.all_reduce(recv.ptr, count, DType::Bf16, &stream)
                                }
                            };
                            let t = timed_runs(&dev, &stream, (2, 7), &mut run)?;
                            out.push(median(&t));
                        }
                    }
                    drop(comm);
                    Ok((out, comm_bytes))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(CudaError::NoDevice {
                        reason: "a GPU's calibration thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    let mut slowest: Vec<f64> = Vec::new();
    let mut comm0 = 0;
    for (g, r) in per_gpu.into_iter().enumerate() {
        let (times, comm) = r?;
        if g == 0 {
            comm0 = comm;
        }
        slowest.resize(times.len(), 0.0);
        for (s, t) in slowest.iter_mut().zip(times) {
            *s = s.max(t);
        }
    }
    let mut times = Vec::new();
    let mut it = slowest.into_iter();
    for op in CollectiveKind::ALL {
        for &bytes in &COLLECTIVE_BYTES {
            if let Some(seconds) = it.next() {
                times.push(CollectiveTime {
                    op,
                    ranks: gpus as u32,
                    bytes: bytes / gpus * gpus,
                    seconds,
                });
            }
        }
    }
    Ok((times, comm0))
}
