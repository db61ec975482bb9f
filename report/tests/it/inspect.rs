//! `fsdpc inspect`'s text of small plans: what it names of recomputation,
//! frozen parameters and a tiny MLP. Review a changed .snap like code
//! before accepting it.
use crate::common::*;
use fsdpc_plan::*;
use fsdpc_planner::*;
use fsdpc_report::inspect;

/// Four blocks (for `every:2`).
const GPT4: &str = "gpt:layers=4,hidden=64,heads=4,seq=16,vocab=128,batch=2";
/// Two blocks; the tied embedding lives in the root unit.
const GPT: &str = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,batch=2";

fn cfg(policy: CheckpointPolicy) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            activation_checkpointing: policy,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

#[test]
fn render_text_of_tiny_mlp() {
    let p = plan(TINY_MLP, 2, &FsdpConfig::default()).unwrap();
    insta::assert_snapshot!(inspect::render_text(&p));
}

#[test]
fn inspect_shows_checkpointing() {
    let ckpt = plan(TINY_GPT, 2, &cfg(CheckpointPolicy::Units)).unwrap();
    assert!(inspect::render_text(&ckpt).contains("checkpoint activations"));
    assert_eq!(
        inspect::summary(&ckpt).activation_checkpointing,
        CheckpointPolicy::Units
    );
    let plain = plan(TINY_GPT, 2, &cfg(CheckpointPolicy::None)).unwrap();
    assert!(!inspect::render_text(&plain).contains("checkpoint activations"));
}

/// `inspect` of the 4-block GPT at world 2 with `every:2`: names the policy
/// and the two units it checkpoints.
#[test]
fn inspect_of_every_2() {
    let every2 = CheckpointPolicy::parse("every:2").unwrap();
    let p = plan(GPT4, 2, &cfg(every2)).unwrap();
    insta::assert_snapshot!(inspect::render_text(&p));
}

/// Block 0 entirely; block 1's attention (block 1 mixes); the position
/// embedding (the root mixes).
#[test]
fn inspect_shows_trainable_and_frozen_elements() {
    let frozen = FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy: Strategy::FullShard,
            freeze: vec![
                "transformer.h.0.*".into(),
                "transformer.h.1.attn.*".into(),
                "*.wpe.weight".into(),
            ],
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let p = plan(GPT, 4, &frozen).expect("plan");
    insta::assert_snapshot!(inspect::render_text(&p));
}
