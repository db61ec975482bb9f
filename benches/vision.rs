//! Vision on CPU thread ranks: the convolution kernels' rate against the
//! matrix library's, and ResNet-18 training against PyTorch FSDP2 on the
//! same machine.
//!
//! 1. Every convolution of ResNet-18 on 32x32 images (batch 32): the
//!    forward, input-gradient and weight-gradient kernels, one thread, in
//!    GFLOP/s (the IR's FLOP rule over the median time) and as a fraction of
//!    the matrix library's rate on a 512 x 512 x 512 product, the peak it
//!    reaches here on one thread.
//! 2. `resnet18:image=32,classes=10` (torchvision's ResNet-18, its batch
//!    normalisation in training mode: each rank's batch statistics, running
//!    statistics updated) trained with AdamW on 2 thread ranks,
//!    one matrix-product thread each, 32 images per rank, full_shard with one
//!    unit per `BasicBlock`: images per second (median step), planned
//!    against measured peak bytes per rank; then the same model with
//!    PyTorch FSDP2 (`fully_shard` per `BasicBlock` and the root, gloo, one
//!    thread per rank; `scripts/bench_fsdp2_vision.py`) when a Python with
//!    torch and torchvision is found (`FSDPC_TORCH_PYTHON`, else
//!    `/work/venv-torch/bin/python`).
//!
//! Run: `cargo bench --bench vision` (FSDPC_BENCH_STEPS timed steps,
//! default 20).

mod common;

use fsdpc_ir::{DType, ModuleId, Node, Op, Phase, TensorType, Window2d};
use fsdpc_plan::WrapPolicy;
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::account::CountingAlloc;
use fsdpc_runtime::{
    Backend, CpuBackend, ExecMode, HostTensor, KernelCtx, TrainOptions, Workspace,
};
use std::time::Instant;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

/// Images per rank per step.
const BATCH: usize = 32;

fn f32t(dims: &[usize]) -> TensorType {
    TensorType::new(DType::F32, dims.to_vec())
}

/// Median seconds of one run of `op` on random operands of `ins`, and
/// its FLOPs by the IR's rule.
fn time_kernel(op: &Op, ins: &[TensorType]) -> (f64, f64) {
    let refs: Vec<&TensorType> = ins.iter().collect();
    let outs = fsdpc_ir::ops::infer(op, &refs).expect("the shapes fit");
    let flops = fsdpc_ir::ops::flops(op, &refs, &outs);
    let node = Node {
        op: op.clone(),
        name: "bench".into(),
        module: ModuleId::ROOT,
        phase: Phase::Forward,
        outputs: outs.clone(),
    };
    let mut seed = 1u32;
    let inputs: Vec<HostTensor> = ins
        .iter()
        .map(|t| {
            let n = t.numel() as usize;
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    (seed >> 8) as f32 / (1u32 << 24) as f32 - 0.5
                })
                .collect();
            HostTensor::from_f32(t.shape.dims(), &v).expect("sizes match")
        })
        .collect();
    let mut out: Vec<HostTensor> = outs.iter().map(|t| HostTensor::zeros(t.clone())).collect();
    let ws = fsdpc_plan::workspace::kernel_workspace(op, &refs, &outs);
    let mut scratch = vec![0u64; (ws as usize).div_ceil(8)];
    let backend = CpuBackend::default();
    let mut run = || {
        let views: Vec<_> = inputs.iter().map(|t| t.view()).collect();
        let mut ov: Vec<_> = out.iter_mut().map(|t| t.view_mut()).collect();
        let mut w = Workspace::new(bytemuck::cast_slice_mut(&mut scratch));
        let t = Instant::now();
        backend
            .run(&node, &views, &mut ov, &KernelCtx::default(), &mut w)
            .expect("the kernel runs");
        t.elapsed().as_secs_f64()
    };
    run();
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < 5 || (start.elapsed().as_secs_f64() < 0.5 && times.len() < 200) {
        times.push(run());
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], flops)
}

/// The convolutions of ResNet-18 on 32x32 images: name, input, weight,
/// window.
fn resnet18_convolutions() -> Vec<(String, [usize; 4], [usize; 4], Window2d)> {
    let w = |k: usize, s: usize, p: usize| Window2d {
        stride: [s; 2],
        pads: [p; 4],
        ..Window2d::of_kernel([k; 2])
    };
    let mut v = vec![(
        "stem 7x7/2 3->64".to_string(),
        [BATCH, 3, 32, 32],
        [64, 3, 7, 7],
        w(7, 2, 3),
    )];
    // After the stem and its max pool: 8x8. Stage i halves the side.
    let mut side = 8;
    let mut c = 64;
    for (stage, o) in [64usize, 128, 256, 512].into_iter().enumerate() {
        let s = if stage == 0 { 1 } else { 2 };
        v.push((
            format!("layer{}.0.conv1 3x3/{s} {c}->{o}", stage + 1),
            [BATCH, c, side, side],
            [o, c, 3, 3],
            w(3, s, 1),
        ));
        if s == 2 {
            v.push((
                format!("layer{}.0.downsample 1x1/2 {c}->{o}", stage + 1),
                [BATCH, c, side, side],
                [o, c, 1, 1],
                w(1, 2, 0),
            ));
        }
        side /= s;
        v.push((
            format!("layer{}.conv2 3x3/1 {o}->{o}", stage + 1),
            [BATCH, o, side, side],
            [o, o, 3, 3],
            w(3, 1, 1),
        ));
        c = o;
    }
    v
}

fn kernels() {
    let (t, f) = time_kernel(
        &Op::MatMul {
            trans_a: false,
            trans_b: false,
        },
        &[f32t(&[512, 512]), f32t(&[512, 512])],
    );
    let peak = f / t / 1e9;
    println!("## Convolution kernels, one thread\n");
    println!(
        "Matrix library (gemm) on a 512 x 512 x 512 product: {peak:.1} GFLOP/s, the peak below.\n"
    );
    println!("| convolution (batch {BATCH}) | output | forward GFLOP/s | input grad GFLOP/s | weight grad GFLOP/s | of peak (fwd / dx / dw) |");
    println!("|---|---|---|---|---|---|");
    for (name, x, wt, window) in resnet18_convolutions() {
        let conv = Op::Conv { window, groups: 1 };
        let y = fsdpc_ir::ops::infer(&conv, &[&f32t(&x), &f32t(&wt)]).expect("fits")[0].clone();
        let gi = Op::ConvGradInput {
            window,
            groups: 1,
            input_hw: [x[2], x[3]],
        };
        let gw = Op::ConvGradWeight { window, groups: 1 };
        let rates: Vec<f64> = [
            time_kernel(&conv, &[f32t(&x), f32t(&wt)]),
            time_kernel(&gi, &[f32t(&wt), y.clone()]),
            time_kernel(&gw, &[f32t(&x), y.clone()]),
        ]
        .into_iter()
        .map(|(t, f)| f / t / 1e9)
        .collect();
        println!(
            "| {name} | {:?} | {:.1} | {:.1} | {:.1} | {:.0}% / {:.0}% / {:.0}% |",
            y.shape.dims(),
            rates[0],
            rates[1],
            rates[2],
            100.0 * rates[0] / peak,
            100.0 * rates[1] / peak,
            100.0 * rates[2] / peak
        );
    }
}

fn train(steps: u64) {
    let spec = format!("resnet18:image=32,classes=10,batch={BATCH}");
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            wrap: WrapPolicy::Kind {
                kind: "BasicBlock".into(),
            },
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let mut cluster = fsdpc_planner::preset("cpu-local", 2, 2).expect("preset");
    cluster.hardware.cpu_gemm = fsdpc_runtime::cpu::gemm_blocking();
    let plan = common::compile_for(&spec, &cluster, &cfg).expect("plan");
    let opts = TrainOptions {
        steps: steps + 3,
        seed: 1,
        mode: ExecMode::Arena,
        threads_per_rank: 1,
        ..TrainOptions::default()
    };
    let mut step_s = Vec::new();
    let report = fsdpc_runtime::train(&plan, &opts, &mut |r| {
        if r.step >= 3 {
            step_s.push(r.step_time.as_secs_f64());
        }
    })
    .expect("training runs");
    step_s.sort_by(f64::total_cmp);
    let median = step_s[step_s.len() / 2];
    println!("\n## ResNet-18, 32x32 images, 2 thread ranks\n");
    println!("| trainer | images/s | median step | batch per rank | planned peak per rank | measured peak per rank | first / last loss |");
    println!("|---|---|---|---|---|---|---|");
    let measured = report.measured_peak_bytes.unwrap_or(0);
    println!(
        "| fsdpc (`{spec}`, full_shard, unit per BasicBlock) | {:.1} | {:.3} s | {BATCH} | {:.2} MiB | {:.2} MiB | {:.4} / {:.4} |",
        2.0 * BATCH as f64 / median,
        median,
        common::mib(plan.memory.rank_bytes),
        common::mib(measured),
        report.losses.first().copied().unwrap_or(f32::NAN),
        report.losses.last().copied().unwrap_or(f32::NAN),
    );
    let python = std::env::var("FSDPC_TORCH_PYTHON")
        .unwrap_or_else(|_| "/work/venv-torch/bin/python".into());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench_fsdp2_vision.py");
    let out = std::process::Command::new(&python)
        .args([
            script,
            "--ranks",
            "2",
            "--batch",
            &BATCH.to_string(),
            "--steps",
            &steps.to_string(),
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => {
            let text = String::from_utf8_lossy(&o.stdout);
            let line = text.lines().last().unwrap_or("{}");
            let v: serde_json::Value = serde_json::from_str(line).expect("the script prints JSON");
            let losses = v["losses"].as_array().cloned().unwrap_or_default();
            println!(
                "| PyTorch {} FSDP2 (gloo, fully_shard per BasicBlock) | {:.1} | {:.3} s | {BATCH} | — | — | {:.4} / {:.4} |",
                v["torch"].as_str().unwrap_or("?"),
                v["images_per_s"].as_f64().unwrap_or(f64::NAN),
                v["step_s_median"].as_f64().unwrap_or(f64::NAN),
                losses.first().and_then(|l| l.as_f64()).unwrap_or(f64::NAN),
                losses.last().and_then(|l| l.as_f64()).unwrap_or(f64::NAN),
            );
        }
        Ok(o) => println!(
            "\nPyTorch FSDP2 row skipped: `{python} {script}` failed: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        ),
        Err(e) => println!("\nPyTorch FSDP2 row skipped: cannot run `{python}`: {e}"),
    }
    println!("\nBoth trainers draw a fresh batch of random images and labels every step, outside the timed part, and start from different random weights: their losses show they train the same kind of problem, not that they agree (tests/it/vision.rs and tests/it/batch_norm.rs check fsdpc's losses against ONNX Runtime and PyTorch on exports).");
}

fn main() {
    common::figures(
        "vision",
        "vision on CPU thread ranks",
        "The convolution kernels of ResNet-18 (32x32 images, batch 32, one thread) in GFLOP/s against the matrix library's rate on a 512^3 product; ResNet-18 on 32x32 images trained on 2 CPU thread ranks (one thread each, 32 images per rank, AdamW), fsdpc against PyTorch FSDP2 on the same machine, with fsdpc's planned and measured peak per rank.",
    );
    let steps: u64 = std::env::var("FSDPC_BENCH_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    kernels();
    train(steps);
}
