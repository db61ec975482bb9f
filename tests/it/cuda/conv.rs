//! Convolution and pooling on the GPU against the CPU backend (skipped
//! without a GPU, as the rest of `cuda`): grouped, strided, dilated and
//! unevenly padded convolutions, depthwise and pointwise ones, with their
//! gradients; max and average pooling in ceil mode with and without the
//! padding counted, ties and NaNs, and their gradients; in f32 and bf16.

use super::{check, check_with, gpu, node, rand, run_node, ty};
use fsdpc_ir::{DType, Op, TensorType, Window2d};
use fsdpc_runtime::{HostTensor, KernelCtx};

fn window(
    kernel: [usize; 2],
    stride: [usize; 2],
    dilation: [usize; 2],
    pads: [usize; 4],
) -> Window2d {
    Window2d {
        kernel,
        stride,
        dilation,
        pads,
        ceil_mode: false,
    }
}

/// The output types of `op` on `ins`.
fn outs(op: &Op, ins: &[HostTensor]) -> Vec<TensorType> {
    let tys: Vec<&TensorType> = ins.iter().map(|t| &t.ty).collect();
    fsdpc_ir::ops::infer(op, &tys).unwrap_or_else(|e| panic!("{}: {e}", op.name()))
}

/// `op` on both backends, the tolerance widened by `scale`.
fn both(dev: &super::Device, op: Op, ins: &[HostTensor], scale: f64) {
    let ys = outs(&op, ins);
    check_with(dev, op, ins, &ys, &KernelCtx::default(), scale);
}

#[test]
fn convolutions_and_their_gradients_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    // (x, w, groups, window, bias)
    let cases = [
        (
            [2, 4, 7, 6],
            [6, 2, 3, 2],
            2,
            window([3, 2], [2, 1], [1, 2], [1, 0, 2, 1]),
            true,
        ),
        // Depthwise.
        (
            [2, 3, 5, 5],
            [3, 1, 3, 3],
            3,
            window([3, 3], [1, 1], [1, 1], [1; 4]),
            false,
        ),
        // Pointwise, plain and grouped: strided-batched products.
        (
            [2, 4, 3, 3],
            [5, 4, 1, 1],
            1,
            Window2d::of_kernel([1, 1]),
            true,
        ),
        (
            [3, 4, 2, 3],
            [6, 2, 1, 1],
            2,
            Window2d::of_kernel([1, 1]),
            false,
        ),
        // 1x1 with a stride: unfolded.
        (
            [2, 3, 5, 4],
            [2, 3, 1, 1],
            1,
            window([1, 1], [2, 2], [1, 1], [0; 4]),
            true,
        ),
        // Large enough for cuBLAS's tiled kernels.
        (
            [4, 16, 20, 20],
            [32, 8, 3, 3],
            2,
            window([3, 3], [1, 1], [1, 1], [1; 4]),
            true,
        ),
    ];
    for dt in [DType::F32, DType::Bf16] {
        for (k, (xs, ws, groups, w, bias)) in cases.iter().enumerate() {
            let s = 10 * k as u64;
            let x = rand(dt, xs, 200 + s, -1.0, 1.0);
            let wt = rand(dt, ws, 201 + s, -1.0, 1.0);
            let fwd = Op::Conv {
                window: *w,
                groups: *groups,
            };
            let mut ins = vec![x.clone(), wt.clone()];
            if *bias {
                ins.push(rand(dt, &[ws[0]], 202 + s, -1.0, 1.0));
            }
            let y = outs(&fwd, &ins).remove(0);
            // Sums of up to 16 * 9 products; the weight gradient's of
            // 4 * 400.
            both(&dev, fwd, &ins, 10.0);
            let dy = rand(dt, &y.shape.0, 203 + s, -1.0, 1.0);
            let gi = Op::ConvGradInput {
                window: *w,
                groups: *groups,
                input_hw: [xs[2], xs[3]],
            };
            both(&dev, gi, &[wt, dy.clone()], 10.0);
            let gw = Op::ConvGradWeight {
                window: *w,
                groups: *groups,
            };
            both(&dev, gw, &[x, dy], 40.0);
        }
    }
}

#[test]
fn pooling_and_its_gradients_match_the_cpu() {
    let Some(dev) = gpu() else { return };
    let ceil = |mut w: Window2d| {
        w.ceil_mode = true;
        w
    };
    let windows = [
        window([3, 3], [2, 2], [1, 1], [1; 4]),
        ceil(window([2, 2], [2, 2], [1, 1], [0; 4])),
        window([2, 3], [1, 2], [2, 1], [1, 0, 0, 1]),
        ceil(window([3, 2], [2, 3], [1, 1], [1, 1, 0, 1])),
    ];
    for dt in [DType::F32, DType::Bf16] {
        for (k, w) in windows.into_iter().enumerate() {
            let x = rand(dt, &[2, 3, 9, 11], 300 + k as u64, -2.0, 2.0);
            let y = outs(&Op::MaxPool { window: w }, &[x.clone()]).remove(0);
            let dy = rand(dt, &y.shape.0, 310 + k as u64, -1.0, 1.0);
            check(&dev, Op::MaxPool { window: w }, &[x.clone()], &[y.clone()]);
            let dx = ty(dt, &[2, 3, 9, 11]);
            check(
                &dev,
                Op::MaxPoolGrad { window: w },
                &[x.clone(), dy.clone()],
                &[dx.clone()],
            );
            for count_include_pad in [false, true] {
                let avg = Op::AvgPool {
                    window: w,
                    count_include_pad,
                };
                check(&dev, avg, &[x.clone()], &[y.clone()]);
                let grad = Op::AvgPoolGrad {
                    window: w,
                    count_include_pad,
                    input_hw: [9, 11],
                };
                check(&dev, grad, &[dy.clone()], &[dx.clone()]);
            }
        }
    }
}

/// Ties keep the first maximum, a NaN replaces any value: the gradient
/// goes where the CPU's does.
#[test]
fn max_pooling_routes_ties_and_nans_as_the_cpu() {
    let Some(dev) = gpu() else { return };
    let nan = f32::NAN;
    let v = [
        1.0, 1.0, 0.5, 1.0, nan, 2.0, nan, 2.0, 3.0, 3.0, -1.0, nan, 0.0, 0.0, 0.0, 0.0,
    ];
    let x = HostTensor::from_f32(&[1, 1, 4, 4], &v).unwrap();
    for w in [
        window([2, 2], [1, 1], [1, 1], [0; 4]),
        window([3, 3], [1, 1], [1, 1], [1; 4]),
    ] {
        let y = outs(&Op::MaxPool { window: w }, &[x.clone()]).remove(0);
        let dy = rand(DType::F32, &y.shape.0, 320, -1.0, 1.0);
        check(&dev, Op::MaxPool { window: w }, &[x.clone()], &[y]);
        check(
            &dev,
            Op::MaxPoolGrad { window: w },
            &[x.clone(), dy],
            &[x.ty.clone()],
        );
    }
}

/// The gathered gradients (col2im, pooling's) sum in a fixed order: two
/// runs give the same bits.
#[test]
fn gathered_gradients_are_deterministic() {
    let Some(dev) = gpu() else { return };
    let w = window([3, 3], [1, 1], [1, 1], [1; 4]);
    let (wt, dy) = (
        rand(DType::F32, &[8, 4, 3, 3], 330, -1.0, 1.0),
        rand(DType::F32, &[2, 8, 12, 12], 331, -1.0, 1.0),
    );
    let x = rand(DType::F32, &[2, 8, 12, 12], 332, -1.0, 1.0);
    let cases = [
        (
            Op::ConvGradInput {
                window: w,
                groups: 2,
                input_hw: [12, 12],
            },
            vec![wt, dy.clone()],
        ),
        (Op::MaxPoolGrad { window: w }, vec![x, dy.clone()]),
        (
            Op::AvgPoolGrad {
                window: w,
                count_include_pad: false,
                input_hw: [12, 12],
            },
            vec![dy],
        ),
    ];
    for (op, ins) in cases {
        let n = node(op.clone(), &outs(&op, &ins));
        let tys: Vec<&TensorType> = ins.iter().map(|t| &t.ty).collect();
        let ws = fsdpc_plan::workspace::kernel_workspace(&op, &tys, &n.outputs);
        let run = || run_node(&dev, &n, &ins, &KernelCtx::default(), ws).unwrap();
        let (a, b) = (run(), run());
        assert_eq!(a[0].bytes(), b[0].bytes(), "{}", op.name());
    }
}

/// The training-mode ResNet export (`resnet_torchscript_train`) trains on
/// the GPU as on one CPU rank: its losses, parameters and running
/// statistics (module buffers, written by the step's `WriteBuffer`s).
#[test]
fn training_mode_batch_norm_trains_as_on_the_cpu() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/vision/resnet_torchscript_train.onnx");
    let opts = fsdpc_frontends::LoadOptions {
        dims: [("batch".to_string(), 2)].into(),
        optimizer: fsdpc_ir::Optimizer::Sgd {
            lr: 0.05,
            momentum: 0.0,
            weight_decay: 0.0,
        },
        ..fsdpc_frontends::LoadOptions::default()
    };
    let m = fsdpc_frontends::load(&path.display().to_string(), &opts).expect("imports");
    let info = fsdpc_plan::ModelInfo {
        tokens_per_rank_step: m.tokens_per_rank_step(),
        params: m.program.graph.param_numel(),
        name: m.name,
    };
    let cluster = fsdpc_planner::preset("cpu-local", 1, 1).expect("preset");
    let plan = fsdpc_planner::compile(
        m.program,
        info,
        &cluster,
        &fsdpc_planner::FsdpConfig::default(),
    )
    .expect("plans");
    super::compare_training(&plan, 3, super::NcclMode::Auto, 1e-4, 1e-3);
    let keep = fsdpc_runtime::TrainOptions {
        steps: 3,
        seed: 3,
        keep_params: true,
        ..fsdpc_runtime::TrainOptions::default()
    };
    let Some(g) = super::cuda_train_with(&plan, &keep, super::NcclMode::Auto) else {
        return;
    };
    let c = fsdpc_runtime::train(&plan, &keep, &mut |_| {}).expect("trains on the CPU");
    assert_eq!(g.final_buffers.len(), 12, "running means and variances");
    for ((n, a), (m, b)) in g.final_buffers.iter().zip(&c.final_buffers) {
        assert_eq!(n, m);
        super::close(a, b, 1e-4, n);
    }
}
