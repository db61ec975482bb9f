//! The zoo's T5 end to end: `--wrap blocks` makes one unit per encoder and
//! decoder block (plus the root), a tiny T5 learns the synthetic task on CPU
//! ranks, and full_shard over 2 ranks trains it as one unsharded rank does,
//! within the tolerances of `tests/it/equivalence.rs`.

use crate::common::{max_loss_rel_diff, max_param_diff, plan, train};
use fsdpc_plan::{Strategy, WrapPolicy};
use fsdpc_runtime::ExecMode;

/// `tests/it/equivalence.rs`'s bounds against the 1-rank run: losses within
/// 1e-6 relative, parameters within 2e-5 absolute.
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;

/// A tiny T5 (2 blocks a stack) with a global batch of 4.
fn tiny(batch: u32, act: &str) -> String {
    format!("t5:layers=2,hidden=32,ff=64,heads=2,kv=16,vocab=64,seq=8,batch={batch},act={act}")
}

#[test]
fn wrap_blocks_finds_every_encoder_and_decoder_block() {
    for layers in [1, 3] {
        let spec = format!("t5:layers={layers},hidden=16,ff=32,heads=2,vocab=64,seq=8");
        let p = plan(&spec, 2, Strategy::FullShard, WrapPolicy::Blocks);
        let mut paths: Vec<&str> = p.units.iter().map(|u| u.module.as_str()).collect();
        assert_eq!(paths.len(), 2 * layers + 1, "{paths:?}");
        assert_eq!(paths.remove(0), "", "unit 0 is the root");
        for stack in ["encoder", "decoder"] {
            for i in 0..layers {
                let want = format!("{stack}.block.{i}");
                assert!(paths.contains(&want.as_str()), "{want} not in {paths:?}");
            }
        }
        assert!(p.units[1..].iter().all(|u| u.kind == "T5Block"));
    }
}

#[test]
fn tiny_t5_learns_and_full_shard_equals_one_rank() {
    for act in ["relu", "gated-gelu"] {
        let steps = 30;
        let one = train(
            &plan(&tiny(4, act), 1, Strategy::NoShard, WrapPolicy::Blocks),
            steps,
            ExecMode::Arena,
        );
        let l = &one.losses;
        assert!(l.iter().all(|x| x.is_finite()), "{act}: {l:?}");
        let early = l[..3].iter().sum::<f32>() / 3.0;
        let late = l[l.len() - 3..].iter().sum::<f32>() / 3.0;
        assert!(late < 0.7 * early, "{act}: loss {early} -> {late}");
        let two = train(
            &plan(&tiny(2, act), 2, Strategy::FullShard, WrapPolicy::Blocks),
            steps,
            ExecMode::Arena,
        );
        let rel = max_loss_rel_diff(&one, &two);
        let (abs, _) = max_param_diff(&one, &two);
        eprintln!(
            "t5 {act}: loss {early} -> {late}; F=2 vs 1 rank: loss rel {rel:e}, param abs {abs:e}"
        );
        assert!(rel <= LOSS_RTOL, "{act}: losses differ by {rel:e}");
        assert!(abs <= PARAM_ATOL, "{act}: parameters differ by {abs:e}");
    }
}

#[test]
fn a_decoder_shorter_than_the_encoder_learns() {
    // Labels are the next tokens of the first 4 of the 8 encoder positions.
    let spec = "t5:layers=1,hidden=32,ff=64,heads=2,vocab=64,seq=8,dec_seq=4,batch=4";
    let r = train(
        &plan(spec, 2, Strategy::FullShard, WrapPolicy::Blocks),
        30,
        ExecMode::Arena,
    );
    let l = &r.losses;
    let early = l[..3].iter().sum::<f32>() / 3.0;
    let late = l[l.len() - 3..].iter().sum::<f32>() / 3.0;
    assert!(late < 0.7 * early, "loss {early} -> {late}");
}
