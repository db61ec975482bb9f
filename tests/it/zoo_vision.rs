//! The zoo's ResNet and ViT end to end: wrapping by torchvision's block
//! classes makes one unit per block; tiny models train on CPU ranks, and
//! full_shard over 2 ranks trains them as one unsharded rank does within
//! the tolerances of `tests/it/equivalence.rs` (a ResNet in training mode
//! normalises each rank's images alone, so its one rank runs the two
//! ranks' micro-batches with `grad_accum` 2; a frozen one and the ViT run
//! the global batch at once); the full-size presets and a
//! 9-billion-parameter ViT plan for a GPU cluster.

use crate::common::{compile_on, compile_with, max_loss_rel_diff, max_param_diff, plan, train};
use fsdpc_frontends::LoadOptions;
use fsdpc_ir::Optimizer;
use fsdpc_plan::{Plan, Strategy, WrapPolicy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::ExecMode;

/// `tests/it/equivalence.rs`'s bounds against the 1-rank run: losses within
/// 1e-6 relative, parameters within 2e-5 absolute.
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;

/// Training steps of the 1-rank / 2-rank comparison: the ViT's head starts
/// at zero, so its first step moves the head alone and the later ones the
/// whole model.
const STEPS: u64 = 3;

/// The comparison's optimizer: plain SGD, whose update is the gradient
/// scaled, so the parameters differ as the gradients do. (AdamW divides by
/// the gradient's magnitude, so where a gradient is nearly zero, as the
/// ViT's body's is after a step from its zero head, it magnifies the
/// rounding of the two sums.)
fn sgd() -> Optimizer {
    Optimizer::Sgd {
        lr: 0.01,
        momentum: 0.0,
        weight_decay: 0.0,
    }
}

/// Tiny models at a micro-batch of `batch`, and their block class.
fn tiny(batch: u32) -> [(String, &'static str); 4] {
    [
        (
            format!("resnet:depth=18,image=32,classes=10,width=8,bn=frozen,batch={batch}"),
            "BasicBlock",
        ),
        (
            format!("resnet:depth=18,image=32,classes=10,width=8,batch={batch}"),
            "BasicBlock",
        ),
        (
            format!("resnet:depth=50,image=32,classes=10,width=4,batch={batch}"),
            "Bottleneck",
        ),
        (
            format!(
                "vit:layers=2,hidden=32,heads=4,mlp=64,patch=4,image=16,classes=10,batch={batch}"
            ),
            "EncoderBlock",
        ),
    ]
}

fn kind(k: &str) -> WrapPolicy {
    WrapPolicy::Kind {
        kind: k.to_string(),
    }
}

/// `spec` planned with `sgd()` for `world` ranks of `cpu-local`, wrapped
/// by `block`, `accum` micro-batches a step.
fn sgd_plan(spec: &str, world: u32, strategy: Strategy, block: &str, accum: u32) -> Plan {
    let cluster = fsdpc_planner::preset("cpu-local", world, world).expect("preset");
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            wrap: kind(block),
            grad_accum: accum,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let opts = LoadOptions {
        optimizer: sgd(),
        ..LoadOptions::default()
    };
    let p = compile_with(spec, &cluster, &cfg, &opts).expect("plan compiles");
    p.validate().unwrap_or_else(|v| panic!("{spec}: {v:?}"));
    p
}

#[test]
fn wrapping_by_block_class_makes_one_unit_per_block() {
    for ((spec, block), blocks) in tiny(2).into_iter().zip([8, 8, 16, 2]) {
        let p = plan(&spec, 2, Strategy::FullShard, kind(block));
        assert_eq!(p.units.len(), blocks + 1, "{spec}: the blocks and the root");
        assert_eq!(p.units[0].module, "", "{spec}: unit 0 is the root");
        assert!(p.units[1..].iter().all(|u| u.kind == block), "{spec}");
    }
    // ResNet's blocks are numbered children, so `--wrap blocks` finds them.
    let (spec, _) = &tiny(2)[1];
    let p = plan(spec, 2, Strategy::FullShard, WrapPolicy::Blocks);
    let paths: Vec<&str> = p.units[1..].iter().map(|u| u.module.as_str()).collect();
    assert_eq!(paths.len(), 8, "{paths:?}");
    assert!(paths.contains(&"layer1.0") && paths.contains(&"layer4.1"));
    // The ViT's blocks are `encoder_layer_0`, `encoder_layer_1`: a named
    // sequence `--wrap blocks` finds too.
    let (spec, _) = &tiny(2)[3];
    let p = plan(spec, 2, Strategy::FullShard, WrapPolicy::Blocks);
    let paths: Vec<&str> = p.units[1..].iter().map(|u| u.module.as_str()).collect();
    assert_eq!(
        paths,
        [
            "encoder.layers.encoder_layer_0",
            "encoder.layers.encoder_layer_1"
        ]
    );
}

#[test]
fn tiny_vision_models_train_sharded_as_on_one_rank() {
    for ((global, block), (two_spec, _)) in tiny(4).into_iter().zip(tiny(2)) {
        // Batch statistics per rank: the same micro-batches on one rank.
        let per_rank = two_spec.starts_with("resnet") && !two_spec.contains("bn=frozen");
        let (one_spec, accum) = if per_rank {
            (two_spec.clone(), 2)
        } else {
            (global, 1)
        };
        let one = train(
            &sgd_plan(&one_spec, 1, Strategy::NoShard, block, accum),
            STEPS,
            ExecMode::Arena,
        );
        let l = &one.losses;
        assert!(l.iter().all(|x| x.is_finite()), "{one_spec}: {l:?}");
        let two = train(
            &sgd_plan(&two_spec, 2, Strategy::FullShard, block, 1),
            STEPS,
            ExecMode::Arena,
        );
        let rel = max_loss_rel_diff(&one, &two);
        let (abs, _) = max_param_diff(&one, &two);
        eprintln!(
            "{one_spec} x {accum}: losses {l:?}; F=2 vs 1 rank: loss rel {rel:e}, param abs {abs:e}"
        );
        assert!(rel <= LOSS_RTOL, "{one_spec}: losses differ by {rel:e}");
        assert!(
            abs <= PARAM_ATOL,
            "{one_spec}: parameters differ by {abs:e}"
        );
        assert!(l[0] != l[STEPS as usize - 1], "{one_spec}: training moves");
    }
}

#[test]
fn full_size_vision_models_plan_for_a_gpu_cluster() {
    for (spec, block, world, blocks) in [
        ("resnet50", "Bottleneck", 8, 16),
        ("vit-h-14", "EncoderBlock", 8, 32),
        (
            "vit:layers=80,hidden=3072,heads=24,mlp=12288,patch=14,image=224,classes=1000",
            "EncoderBlock",
            64,
            80,
        ),
    ] {
        let cfg = FsdpConfig {
            settings: fsdpc_plan::Settings {
                wrap: kind(block),
                ..fsdpc_plan::Settings::default()
            },
            ..FsdpConfig::default()
        };
        let p = compile_on(spec, "h100-80g-ib", world, 8, &cfg)
            .unwrap_or_else(|e| panic!("{spec}: {e}"));
        p.validate().unwrap_or_else(|v| panic!("{spec}: {v:?}"));
        assert_eq!(p.units.len(), blocks + 1, "{spec}");
        eprintln!(
            "{spec} on {world} H100s: peak {:.2} GiB a rank",
            p.memory.peak_bytes as f64 / (1u64 << 30) as f64
        );
    }
}
