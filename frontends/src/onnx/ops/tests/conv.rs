//! Convolution, pooling and batch normalisation converters: attributes to
//! windows (`auto_pad` included), 1-D ops as one-row images, and the
//! errors for what is not supported.

use super::{a_i, a_ints, a_s, T};
use fsdpc_ir::{DType, Op, Window2d};

fn window(t: &T, name: &str) -> Window2d {
    match t.op(name) {
        Op::Conv { window, .. } | Op::MaxPool { window } | Op::AvgPool { window, .. } => window,
        other => panic!("{name} is {other:?}"),
    }
}

#[test]
fn auto_pad_puts_the_odd_padding_after_or_before() {
    let mut t = T::new(17);
    t.input("x", DType::F32, &[1, 2, 7, 7])
        .input("w", DType::F32, &[4, 2, 4, 4])
        .ok(
            "Conv",
            &["x", "w"],
            &["upper"],
            vec![a_s("auto_pad", "SAME_UPPER"), a_ints("strides", &[2, 2])],
        )
        .ok(
            "Conv",
            &["x", "w"],
            &["lower"],
            vec![a_s("auto_pad", "SAME_LOWER"), a_ints("strides", &[2, 2])],
        );
    // ceil(7 / 2) = 4 outputs need 3 * 2 + 4 - 7 = 3 padded positions.
    assert_eq!(t.ir("upper"), "conv f32[1, 4, 4, 4]");
    assert_eq!(window(&t, "upper").pads, [1, 1, 2, 2]);
    assert_eq!(window(&t, "lower").pads, [2, 2, 1, 1]);
}

#[test]
fn grouped_convolution_and_pooling_attributes() {
    let mut t = T::new(19);
    t.input("x", DType::F32, &[2, 4, 9, 9])
        .input("w", DType::F32, &[8, 2, 3, 3])
        .input("b", DType::F32, &[8])
        .ok(
            "Conv",
            &["x", "w", "b"],
            &["y"],
            vec![
                a_i("group", 2),
                a_ints("pads", &[1, 0, 1, 2]),
                a_ints("dilations", &[2, 1]),
            ],
        )
        .ok(
            "MaxPool",
            &["x"],
            &["m"],
            vec![
                a_ints("kernel_shape", &[3, 3]),
                a_ints("strides", &[2, 2]),
                a_i("ceil_mode", 1),
            ],
        )
        .ok(
            "AveragePool",
            &["x"],
            &["a"],
            vec![
                a_ints("kernel_shape", &[2, 2]),
                a_ints("pads", &[1, 1, 1, 1]),
                a_i("count_include_pad", 1),
            ],
        )
        .ok("GlobalAveragePool", &["x"], &["g"], vec![]);
    // Height: 9 + 2 - 5 + 1 = 7; width: 9 + 2 - 3 + 1 = 9.
    assert_eq!(t.ir("y"), "conv f32[2, 8, 7, 9]");
    assert_eq!(
        t.op("y"),
        Op::Conv {
            window: Window2d {
                dilation: [2, 1],
                pads: [1, 0, 1, 2],
                ..Window2d::of_kernel([3, 3])
            },
            groups: 2
        }
    );
    assert_eq!(t.ir("m"), "max_pool f32[2, 4, 4, 4]");
    assert!(window(&t, "m").ceil_mode);
    assert_eq!(
        t.op("a"),
        Op::AvgPool {
            window: Window2d {
                pads: [1; 4],
                ..Window2d::of_kernel([2, 2])
            },
            count_include_pad: true
        }
    );
    assert_eq!(t.ir("g"), "reduce.mean f32[2, 4, 1, 1]");
}

#[test]
fn one_dimensional_ops_run_as_one_row_images() {
    let mut t = T::new(17);
    t.input("x", DType::F32, &[2, 3, 10])
        .input("w", DType::F32, &[6, 1, 4])
        .ok(
            "Conv",
            &["x", "w"],
            &["y"],
            vec![a_i("group", 3), a_ints("pads", &[3, 0])],
        )
        .ok(
            "MaxPool",
            &["y"],
            &["m"],
            vec![a_ints("kernel_shape", &[2]), a_ints("strides", &[2])],
        );
    assert_eq!(t.ir("y"), "reshape f32[2, 6, 10]");
    assert_eq!(t.ir("m"), "reshape f32[2, 6, 5]");
}

#[test]
fn unsupported_and_inconsistent_nodes_say_what_is_wrong() {
    let mut t = T::new(17);
    t.input("x3", DType::F32, &[1, 2, 4, 4, 4])
        .input("w3", DType::F32, &[2, 2, 3, 3, 3])
        .input("x", DType::F32, &[1, 4, 4, 4])
        .input("w", DType::F32, &[8, 3, 3, 3])
        .input("big", DType::F32, &[8, 4, 7, 7]);
    let e = t.run("Conv", &["x3", "w3"], &["y"], vec![]).unwrap_err();
    assert!(
        e.contains("3-D Conv") && e.contains("not supported yet"),
        "{e}"
    );
    let e = t.run("Conv", &["x", "w"], &["y"], vec![]).unwrap_err();
    assert!(e.contains("4 input channels per group"), "{e}");
    let e = t
        .run(
            "Conv",
            &["x", "big"],
            &["y"],
            vec![a_ints("pads", &[1, 1, 1, 1])],
        )
        .unwrap_err();
    assert!(
        e.contains("spans 7 along height") && e.contains("padded input has 6"),
        "{e}"
    );
    let e = t
        .run("Conv", &["x", "w"], &["y"], vec![a_s("auto_pad", "SAME")])
        .unwrap_err();
    assert!(e.contains("auto_pad `SAME`"), "{e}");
    let e = t
        .run(
            "MaxPool",
            &["x"],
            &["y", "i"],
            vec![a_ints("kernel_shape", &[2, 2])],
        )
        .unwrap_err();
    assert!(e.contains("Indices"), "{e}");
    let e = t.run("AveragePool", &["x"], &["y"], vec![]).unwrap_err();
    assert!(e.contains("kernel_shape"), "{e}");
}

#[test]
fn batch_norm_is_an_affine_map_in_inference_mode_and_trains_on_buffers() {
    let mut t = T::new(15);
    t.input("x", DType::F32, &[2, 3, 4, 4]);
    for p in ["s", "b", "m", "v"] {
        t.input(p, DType::F32, &[3]);
    }
    t.ok(
        "BatchNormalization",
        &["x", "s", "b", "m", "v"],
        &["y"],
        vec![],
    );
    assert_eq!(t.ir("y"), "binary.add f32[2, 3, 4, 4]");
    // Training mode: running statistics that are not initializers cannot
    // be module buffers.
    let e = t
        .run(
            "BatchNormalization",
            &["x", "s", "b", "m", "v"],
            &["y", "rm", "rv"],
            vec![a_i("training_mode", 1)],
        )
        .unwrap_err();
    assert!(
        e.contains("training mode needs its input_mean (input 3, `m`) to be an initializer"),
        "{e}"
    );
    // Initializers (constants here) become two module buffers, each with
    // one writer.
    let mut t = T::new(15);
    t.input("x", DType::F32, &[2, 3, 4, 4]);
    for p in ["s", "b"] {
        t.input(p, DType::F32, &[3]);
    }
    t.konst(
        "m",
        crate::onnx::tensor::HostTensor::floats(DType::F32, vec![3], vec![0.0; 3]),
    );
    t.konst(
        "v",
        crate::onnx::tensor::HostTensor::floats(DType::F32, vec![3], vec![1.0; 3]),
    );
    t.ok(
        "BatchNormalization",
        &["x", "s", "b", "m", "v"],
        &["y", "rm", "rv"],
        vec![a_i("training_mode", 1)],
    );
    assert_eq!(t.ir("y"), "binary.add f32[2, 3, 4, 4]");
    let g = &t.imp.g;
    let names: Vec<&str> = g.buffers.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["m", "v"]);
    assert_eq!(g.buffer_writes().len(), 2);
    // Before opset 14 the running-statistics outputs mean training.
    let mut t = T::new(9);
    t.input("x", DType::F32, &[2, 3, 4, 4]);
    for p in ["s", "b", "m", "v"] {
        t.input(p, DType::F32, &[3]);
    }
    let e = t
        .run(
            "BatchNormalization",
            &["x", "s", "b", "m", "v"],
            &["y", "rm"],
            vec![],
        )
        .unwrap_err();
    assert!(e.contains("training mode needs its input_mean"), "{e}");
    t.input("bad", DType::F32, &[4]);
    let e = t
        .run(
            "BatchNormalization",
            &["x", "bad", "b", "m", "v"],
            &["y"],
            vec![],
        )
        .unwrap_err();
    assert!(e.contains("scale (input 1) must have shape [3]"), "{e}");
}
