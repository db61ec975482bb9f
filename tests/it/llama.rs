//! The zoo's Llama family end to end: `--wrap blocks` makes one unit per
//! decoder layer (plus the root), every variant (grouped-query Llama, Qwen2's
//! QKV bias, Qwen3's q/k norms and wide heads, Mistral's sliding window
//! shorter than the sequence, Phi-3's fused projections, LoRA adapters)
//! learns the synthetic task on CPU ranks, and full_shard over 2 and 4
//! ranks trains it as one unsharded rank does, within the tolerances of
//! `tests/it/equivalence.rs`.

use crate::common::{max_loss_rel_diff, max_param_diff, plan, train};
use fsdpc_plan::{Strategy, WrapPolicy};
use fsdpc_runtime::ExecMode;

/// `tests/it/equivalence.rs`'s bounds against the 1-rank run: losses within
/// 1e-6 relative, parameters within 2e-5 absolute.
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;

/// Tiny configurations of every variant, global batch 4.
const VARIANTS: &[(&str, &str)] = &[
    (
        "llama",
        "llama:layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=8",
    ),
    (
        "qwen2",
        "qwen2:layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=8,tie=true",
    ),
    (
        "qwen3",
        "qwen3:layers=2,hidden=32,heads=4,kv_heads=2,head_dim=16,ffn=48,vocab=64,seq=8",
    ),
    (
        "mistral",
        "mistral:layers=2,hidden=32,heads=4,kv_heads=1,ffn=48,vocab=64,seq=8,window=3",
    ),
    (
        "phi3",
        "phi3:layers=2,hidden=32,heads=4,ffn=48,vocab=64,seq=8",
    ),
    (
        "llama3.1+lora",
        "llama:layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=8,lora=4,\
         rope=llama3,rope_factor=8,rope_low=1,rope_high=4,rope_orig=4,theta=500000",
    ),
];

#[test]
fn wrap_blocks_makes_one_unit_per_decoder_layer() {
    let p = plan(
        "llama:layers=3,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=8",
        2,
        Strategy::FullShard,
        WrapPolicy::Blocks,
    );
    let paths: Vec<&str> = p.units.iter().map(|u| u.module.as_str()).collect();
    assert_eq!(
        paths,
        ["", "model.layers.0", "model.layers.1", "model.layers.2"]
    );
    assert!(p.units[1..].iter().all(|u| u.kind == "LlamaDecoderLayer"));
}

#[test]
fn every_variant_learns_and_full_shard_equals_one_rank() {
    let steps = 40;
    for (name, spec) in VARIANTS {
        let one = train(
            &plan(
                &format!("{spec},batch=4"),
                1,
                Strategy::NoShard,
                WrapPolicy::Blocks,
            ),
            steps,
            ExecMode::Arena,
        );
        let l = &one.losses;
        assert!(l.iter().all(|x| x.is_finite()), "{name}: {l:?}");
        let early = l[..3].iter().sum::<f32>() / 3.0;
        let late = l[l.len() - 3..].iter().sum::<f32>() / 3.0;
        // Adapters alone (B starting at zero) learn more slowly.
        let bound = if name.contains("lora") { 0.99 } else { 0.75 };
        assert!(late < bound * early, "{name}: loss {early} -> {late}");
        for world in [2u32, 4] {
            let spec = format!("{spec},batch={}", 4 / world);
            let f = train(
                &plan(&spec, world, Strategy::FullShard, WrapPolicy::Blocks),
                steps,
                ExecMode::Arena,
            );
            let rel = max_loss_rel_diff(&one, &f);
            let (abs, _) = max_param_diff(&one, &f);
            eprintln!(
                "{name}: loss {early} -> {late}; F={world} vs 1 rank: loss rel {rel:e}, param abs {abs:e}"
            );
            assert!(
                rel <= LOSS_RTOL,
                "{name} F={world}: losses differ by {rel:e}"
            );
            assert!(
                abs <= PARAM_ATOL,
                "{name} F={world}: parameters differ by {abs:e}"
            );
        }
    }
}

/// The fine-tuning case of a practitioners' guide: Qwen 7B (`qwen2.5-7b`),
/// LoRA rank 64, fp16, activation checkpointing and full_shard on one node
/// of eight A10 24 GB. It fits, with what the adapters alone train.
#[test]
fn qwen_7b_lora_fits_eight_a10s() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("plan.json");
    let args = [
        "compile",
        "qwen2.5-7b:seq=2048,lora=64",
        "--world",
        "8",
        "--cluster",
        "a10-24g-eth",
        "--wrap",
        "blocks",
        "--mixed-precision",
        "fp16",
        "--activation-checkpointing",
        "-o",
        crate::common::cli::s(&out),
    ];
    crate::common::cli::ok(&args);
    let p = fsdpc_plan::Plan::from_json(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(p.cluster.memory_bytes, 24 << 30);
    assert!(p.memory.peak_bytes < 24 << 30, "{}", p.memory.peak_bytes);
    let trainable: u64 = p
        .training
        .graph
        .params
        .iter()
        .filter(|q| q.requires_grad)
        .map(|q| q.ty.numel())
        .sum();
    // 28 layers of adapters on q and o (3584 -> 3584), k and v (3584 -> 512).
    assert_eq!(trainable, 28 * 64 * ((3584 + 3584) * 2 + 2 * (3584 + 512)));
}

/// Under bf16 mixed precision (the rotary tables and the window mask cast
/// to bf16 as `transformers` casts them to the activations' dtype) and
/// with activation checkpointing, full_shard at F=2 trains like one rank of
/// the same policy: bf16 within `tests/it/precision.rs`'s loss bound,
/// checkpointing bit for bit.
#[test]
fn bf16_and_checkpointing_train_like_one_rank() {
    use fsdpc_ir::DType;
    use fsdpc_plan::{CheckpointPolicy, Settings};
    use fsdpc_planner::FsdpConfig;
    let spec = "mistral:layers=2,hidden=32,heads=4,kv_heads=2,ffn=48,vocab=64,seq=8,window=3";
    let cfg = |strategy, bf16: bool, recompute: bool| FsdpConfig {
        settings: Settings {
            strategy,
            wrap: WrapPolicy::Blocks,
            param_dtype: if bf16 { DType::Bf16 } else { DType::F32 },
            reduce_dtype: if bf16 { DType::Bf16 } else { DType::F32 },
            buffer_dtype: if bf16 { DType::Bf16 } else { DType::F32 },
            activation_checkpointing: if recompute {
                CheckpointPolicy::Units
            } else {
                CheckpointPolicy::default()
            },
            ..Settings::default()
        },
        ..FsdpConfig::default()
    };
    let run = |world: u32, bf16, recompute| {
        let strategy = if world == 1 {
            Strategy::NoShard
        } else {
            Strategy::FullShard
        };
        let spec = format!("{spec},batch={}", 4 / world);
        train(
            &crate::common::plan_with(&spec, world, &cfg(strategy, bf16, recompute)),
            10,
            ExecMode::Arena,
        )
    };
    let one = run(1, true, false);
    let two = run(2, true, false);
    let rel = max_loss_rel_diff(&one, &two);
    eprintln!("bf16 mistral F=2 vs 1: loss rel {rel:e}");
    assert!(rel <= 1e-3, "bf16: losses differ by {rel:e}");
    assert!(one.losses.iter().all(|l| l.is_finite()));
    let plain = run(2, false, false);
    let recomputed = run(2, false, true);
    assert_eq!(
        crate::common::bits(&plain),
        crate::common::bits(&recomputed),
        "checkpointing changes nothing"
    );
}
