//! The zoo's vision families: the ResNet and ViT presets have torchvision's
//! published parameter counts (in the built graph and in the config's
//! closed form), the larger ViTs the counts their documentation states, a
//! 9-billion-parameter ViT builds from a spec; parameters, modules and
//! shapes carry torchvision's names; the graphs validate and differentiate;
//! and bad specs are refused with a reason.

use fsdpc_frontends::zoo::{self, ZooModel};
use fsdpc_frontends::FrontendError;
use fsdpc_ir::{Graph, Op, Optimizer, Window2d};

/// Builds `spec` and checks that the graph and the config both hold
/// `expect` parameter elements and that the loss is a scalar output.
fn check_params(spec: &str, expect: u64) -> ZooModel {
    let m = zoo::build(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(m.graph.param_numel(), expect, "{spec}: graph");
    let cfg = zoo::parse(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(cfg.param_count(), expect, "{spec}: config");
    assert_eq!(m.graph.outputs, vec![m.loss]);
    assert_eq!(m.graph.value_type(m.loss).shape.rank(), 0, "{spec}");
    assert_eq!(m.tokens_per_sample, 1, "{spec}: figures are per image");
    m
}

/// The shape of parameter `name`.
fn param_shape(g: &Graph, name: &str) -> Vec<usize> {
    let p = g.params.iter().find(|p| p.name == name);
    let p = p.unwrap_or_else(|| panic!("no parameter {name}"));
    p.ty.shape.dims().to_vec()
}

/// Paths of the modules of class `kind`, in order.
fn modules_of(g: &Graph, kind: &str) -> Vec<String> {
    g.modules
        .iter()
        .filter(|m| m.kind == kind)
        .map(|m| m.path.clone())
        .collect()
}

/// The output dims of node `name`.
fn node_dims(g: &Graph, name: &str) -> Vec<usize> {
    let n = g.node_ids().find(|&n| g.node(n).name == name);
    let n = n.unwrap_or_else(|| panic!("no node {name}"));
    g.node(n).outputs[0].shape.dims().to_vec()
}

#[test]
fn resnet_presets_have_torchvisions_parameter_counts() {
    // sum(p.numel() for p in torchvision.models.resnetN().parameters())
    check_params("resnet18", 11_689_512);
    check_params("resnet34", 21_797_672);
    check_params("resnet50", 25_557_032);
    check_params("resnet101", 44_549_160);
    check_params("resnet152", 60_192_808);
}

#[test]
fn vit_presets_have_torchvisions_parameter_counts() {
    check_params("vit-b-16", 86_567_656);
    check_params("vit-b-32", 88_224_232);
    check_params("vit-l-16", 304_326_632);
    check_params("vit-l-32", 306_535_400);
    check_params("vit-h-14", 632_045_800);
}

#[test]
fn larger_vits_have_the_documented_counts() {
    // `zoo::presets`' documentation: the papers' rounded figures are 1011M,
    // 1843M and 3.9B.
    for (spec, count, paper) in [
        ("vit-g-14", 1_012_611_432, 1_011e6),
        ("vit-bigg-14", 1_844_440_680, 1_843e6),
        ("vit-e-14", 3_807_214_312, 3.9e9),
    ] {
        check_params(spec, count);
        let off = (count as f64 - paper).abs() / paper;
        assert!(off < 0.03, "{spec}: {count} is {off} off the paper's");
    }
}

#[test]
fn a_nine_billion_parameter_vit_builds_from_a_spec() {
    let spec = "vit:layers=80,hidden=3072,heads=24,mlp=12288,patch=14,image=224,classes=1000";
    let m = check_params(spec, 9_068_572_648);
    assert_eq!(modules_of(&m.graph, "EncoderBlock").len(), 80);
}

#[test]
fn resnet_carries_torchvisions_names_and_shapes() {
    let m = zoo::build("resnet50").unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    for (name, shape) in [
        ("conv1.weight", vec![64, 3, 7, 7]),
        ("bn1.weight", vec![64]),
        ("bn1.bias", vec![64]),
        ("layer1.0.conv1.weight", vec![64, 64, 1, 1]),
        ("layer1.0.conv3.weight", vec![256, 64, 1, 1]),
        ("layer1.0.downsample.0.weight", vec![256, 64, 1, 1]),
        ("layer2.0.conv2.weight", vec![128, 128, 3, 3]),
        ("layer2.0.downsample.0.weight", vec![512, 256, 1, 1]),
        ("layer2.0.downsample.1.bias", vec![512]),
        ("layer4.2.bn3.weight", vec![2048]),
        ("fc.weight", vec![1000, 2048]),
        ("fc.bias", vec![1000]),
    ] {
        assert_eq!(param_shape(g, name), shape, "{name}");
    }
    // Running statistics are constants, not parameters.
    assert!(g.params.iter().all(|p| !p.name.contains("running")));
    assert_eq!(node_dims(g, "bn1.running_var"), vec![64]);
    assert_eq!(modules_of(g, "Bottleneck").len(), 3 + 4 + 6 + 3);
    assert!(modules_of(g, "BasicBlock").is_empty());
    assert_eq!(modules_of(g, "BatchNorm2d").len(), 1 + 16 * 3 + 4);
    assert_eq!(modules_of(g, "Conv2d").len(), 1 + 16 * 3 + 4);
    assert_eq!(modules_of(g, "Linear"), vec!["fc"]);
    // v1.5: a stage's first block strides on its 3x3 convolution.
    let conv = g
        .node_ids()
        .find(|&n| g.node(n).name == "layer2.0.conv2.conv")
        .map(|n| g.node(n).op.clone());
    let Some(Op::Conv { window, groups: 1 }) = conv else {
        panic!("{conv:?}")
    };
    let want = Window2d {
        stride: [2, 2],
        pads: [1; 4],
        ..Window2d::of_kernel([3, 3])
    };
    assert_eq!(window, want);
    assert_eq!(node_dims(g, "maxpool"), vec![1, 64, 56, 56]);
    assert_eq!(node_dims(g, "layer4.2.relu_out"), vec![1, 2048, 7, 7]);
    assert_eq!(node_dims(g, "avgpool"), vec![1, 2048]);

    let m = zoo::build("resnet18").unwrap_or_else(|e| panic!("{e}"));
    let blocks = modules_of(&m.graph, "BasicBlock");
    assert_eq!(blocks.len(), 8);
    assert_eq!(blocks[2], "layer2.0");
    assert_eq!(
        param_shape(&m.graph, "layer2.0.conv1.weight"),
        [128, 64, 3, 3]
    );
    assert!(m
        .graph
        .params
        .iter()
        .all(|p| !p.name.starts_with("layer1.0.downsample")));
    assert_eq!(param_shape(&m.graph, "fc.weight"), [1000, 512]);
    // Training-mode normalisation by default: torchvision's buffers (its
    // `named_buffers()` less `num_batches_tracked`), each written once.
    let buffers: Vec<&str> = m.graph.buffers.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(buffers.len(), 40, "20 normalisations' means and variances");
    assert!(
        buffers.contains(&"layer2.0.downsample.1.running_var"),
        "{buffers:?}"
    );
    assert_eq!(m.graph.buffer_writes().len(), 40);
    let frozen = zoo::build("resnet18:bn=frozen").unwrap_or_else(|e| panic!("{e}"));
    assert!(frozen.graph.buffers.is_empty());
    assert_eq!(frozen.graph.param_numel(), m.graph.param_numel());
}

#[test]
fn vit_carries_torchvisions_names_and_shapes() {
    let m = zoo::build("vit-b-16").unwrap_or_else(|e| panic!("{e}"));
    let g = &m.graph;
    let block = "encoder.layers.encoder_layer_11";
    for (name, shape) in [
        ("conv_proj.weight".to_string(), vec![768, 3, 16, 16]),
        ("conv_proj.bias".to_string(), vec![768]),
        ("class_token".to_string(), vec![1, 1, 768]),
        ("encoder.pos_embedding".to_string(), vec![1, 197, 768]),
        (format!("{block}.ln_1.weight"), vec![768]),
        (
            format!("{block}.self_attention.in_proj_weight"),
            vec![2304, 768],
        ),
        (format!("{block}.self_attention.in_proj_bias"), vec![2304]),
        (
            format!("{block}.self_attention.out_proj.weight"),
            vec![768, 768],
        ),
        (format!("{block}.ln_2.bias"), vec![768]),
        (format!("{block}.mlp.0.weight"), vec![3072, 768]),
        (format!("{block}.mlp.3.weight"), vec![768, 3072]),
        (format!("{block}.mlp.3.bias"), vec![768]),
        ("encoder.ln.weight".to_string(), vec![768]),
        ("heads.head.weight".to_string(), vec![1000, 768]),
        ("heads.head.bias".to_string(), vec![1000]),
    ] {
        assert_eq!(param_shape(g, &name), shape, "{name}");
    }
    let blocks = modules_of(g, "EncoderBlock");
    assert_eq!(blocks.len(), 12);
    assert_eq!(blocks[0], "encoder.layers.encoder_layer_0");
    assert_eq!(modules_of(g, "MultiheadAttention").len(), 12);
    assert_eq!(node_dims(g, "prepend_class"), vec![1, 197, 768]);
    assert_eq!(node_dims(g, "class_flat"), vec![1, 768]);
    let attention: Vec<Op> = g
        .node_ids()
        .map(|n| g.node(n).op.clone())
        .filter(|op| matches!(op, Op::Attention { .. }))
        .collect();
    assert_eq!(attention.len(), 12);
    let scale = 1.0 / 64f64.sqrt();
    assert!(attention.iter().all(|op| *op
        == Op::Attention {
            causal: false,
            scale
        }));
}

#[test]
fn tiny_vision_graphs_validate_and_differentiate() {
    for spec in [
        "resnet:depth=18,image=32,classes=10,width=8,batch=2",
        "resnet:depth=50,image=32,classes=10,width=4,batch=2",
        "vit:layers=2,hidden=32,heads=4,mlp=64,patch=4,image=16,classes=10,batch=2",
    ] {
        let m = zoo::build(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        fsdpc_ir::validate(&m.graph).unwrap_or_else(|p| panic!("{spec}: {p:?}"));
        let n = m.graph.params.len();
        let p = fsdpc_ir::build_training_program(
            m.graph,
            m.loss,
            Optimizer::Sgd {
                lr: 0.1,
                momentum: 0.0,
                weight_decay: 0.0,
            },
        )
        .unwrap_or_else(|e| panic!("{spec}: {e}"));
        assert_eq!(p.grads.len(), n, "{spec}: every parameter gets a gradient");
    }
}

#[test]
fn preset_overrides_change_images_and_classes() {
    let m = check_params(
        "resnet18:classes=10,image=64,batch=4",
        11_689_512 - 990 * 513,
    );
    let x = m.graph.node_ids().find_map(|n| match &m.graph.node(n).op {
        Op::Input { name } if name == "pixel_values" => Some(m.graph.node(n).outputs[0].clone()),
        _ => None,
    });
    assert_eq!(x.map(|t| t.shape.dims().to_vec()), Some(vec![4, 3, 64, 64]));
    // 384 / 16 = 24: 576 patches and the class token.
    let m = check_params("vit-b-16:image=384", 86_567_656 + (577 - 197) * 768);
    assert_eq!(node_dims(&m.graph, "prepend_class"), vec![1, 577, 768]);
}

/// Asserts that `spec` is rejected as a bad spec whose reason contains `needle`.
fn check_bad_spec(spec: &str, needle: &str) {
    match zoo::build(spec) {
        Err(FrontendError::BadSpec { reason, .. }) => assert!(
            reason.contains(needle),
            "{spec}: reason `{reason}` lacks `{needle}`"
        ),
        other => panic!("{spec}: expected BadSpec, got {other:?}"),
    }
}

#[test]
fn bad_vision_specs_are_rejected_with_a_reason() {
    check_bad_spec(
        "resnet:depth=20",
        "depth must be one of 18, 34, 50, 101, 152",
    );
    check_bad_spec("resnet:classes=10", "missing `depth=`");
    check_bad_spec("resnet18:bn=sync", "bn must be one of train, frozen");
    // One value per channel to normalise: refused, as PyTorch refuses it.
    let e = zoo::build("resnet18:image=32").expect_err("1x1 maps of one image");
    assert!(
        e.to_string()
            .contains("`layer4.0.bn1` normalises in training mode over one value"),
        "{e}"
    );
    zoo::build("resnet18:image=32,bn=frozen").unwrap_or_else(|e| panic!("{e}"));
    check_bad_spec("resnet50:heads=2", "unknown key `heads`");
    check_bad_spec("resnet:depth=18,width=0", "width must be between 1 and");
    check_bad_spec(
        "vit:layers=2,hidden=32,heads=4,mlp=64,patch=5,image=16",
        "patch=5 does not divide image=16",
    );
    check_bad_spec("vit-b-16:patch=15", "patch=15 does not divide image=224");
    check_bad_spec(
        "vit:layers=2,hidden=30,heads=4,mlp=64,patch=4,image=16",
        "hidden=30 is not divisible by heads=4",
    );
    check_bad_spec("vit:layers=2,hidden=32,heads=4,patch=4", "missing `mlp=`");
    check_bad_spec("vit-b-16:depth=12", "unknown key `depth`");
}
