//! Data sources: world-size invariance, label shift, file corpora.

use crate::support::plan::plan;
use fsdpc_ir::{DType, Optimizer, TensorType};
use fsdpc_plan::Strategy;
use fsdpc_runtime::data::open;
use fsdpc_runtime::{train, Batch, DataSpec, ExecMode, HostTensor, TrainOptions};

/// `name` for `b` samples starting at `first`, from the graph of `spec`.
fn fill(spec: &str, data: &DataSpec, name: &str, first: u64, step: u64) -> Vec<i64> {
    let p = plan(spec, 1, Strategy::FullShard, Optimizer::adamw(1e-3));
    let src = open(data, &p.training.graph, 5).unwrap();
    let ty = p
        .training
        .graph
        .node_ids()
        .find_map(|n| match &p.training.graph.node(n).op {
            fsdpc_ir::Op::Input { name: m } if m == name => {
                Some(p.training.graph.node(n).outputs[0].clone())
            }
            _ => None,
        });
    let mut t = HostTensor::zeros(ty.unwrap_or_else(|| TensorType::new(DType::I64, vec![0])));
    src.fill(
        name,
        Batch {
            step,
            first_sample: first,
        },
        t.view_mut(),
    )
    .unwrap();
    t.to_i64()
}

#[test]
fn four_ranks_of_8_see_the_batch_of_one_rank_of_32() {
    let big = "gpt:layers=1,hidden=16,heads=2,seq=8,vocab=64,batch=32";
    let small = "gpt:layers=1,hidden=16,heads=2,seq=8,vocab=64,batch=8";
    for name in ["ids", "labels"] {
        let whole = fill(big, &DataSpec::Synthetic, name, 0, 3);
        let parts: Vec<i64> = (0..4)
            .flat_map(|r| fill(small, &DataSpec::Synthetic, name, r * 8, 3))
            .collect();
        assert_eq!(whole, parts, "{name}");
    }
}

#[test]
fn labels_are_ids_shifted_by_one() {
    let spec = "gpt:layers=1,hidden=16,heads=2,seq=8,vocab=64,batch=4";
    let dir = std::env::temp_dir().join(format!("fsdpc-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let text = dir.join("t.txt");
    std::fs::write(
        &text,
        "the quick brown fox jumps over the lazy dog ".repeat(20),
    )
    .unwrap();
    let bin = dir.join("t.bin");
    let toks: Vec<u8> = (0..500u16).flat_map(|t| (t % 61).to_le_bytes()).collect();
    std::fs::write(&bin, toks).unwrap();
    let tiny_vocab_ok = "gpt:layers=1,hidden=16,heads=2,seq=8,vocab=256,batch=4";
    for (spec, data) in [
        (spec, DataSpec::Synthetic),
        (tiny_vocab_ok, DataSpec::TextFile(text)),
        (spec, DataSpec::TokenBin(bin)),
    ] {
        let (ids, labels) = (
            fill(spec, &data, "ids", 4, 1),
            fill(spec, &data, "labels", 4, 1),
        );
        for s in 0..4 {
            assert_eq!(
                ids[s * 8 + 1..s * 8 + 8],
                labels[s * 8..s * 8 + 7],
                "{data:?}"
            );
        }
        assert_ne!(
            fill(spec, &data, "ids", 4, 2),
            ids,
            "{data:?}: steps differ"
        );
    }
}

#[test]
fn shorter_labels_are_the_next_tokens_of_the_first_positions() {
    // The zoo's T5 with 3 decoder positions for 8 encoder tokens.
    let spec = "t5:layers=1,hidden=16,ff=32,heads=2,vocab=64,seq=8,dec_seq=3,batch=4";
    let (ids, labels) = (
        fill(spec, &DataSpec::Synthetic, "ids", 4, 1),
        fill(spec, &DataSpec::Synthetic, "labels", 4, 1),
    );
    assert_eq!((ids.len(), labels.len()), (32, 12));
    for s in 0..4 {
        assert_eq!(ids[s * 8 + 1..s * 8 + 4], labels[s * 3..s * 3 + 3]);
    }
    // Longer labels than ids have no window to come from.
    let long = "t5:layers=1,hidden=16,ff=32,heads=2,vocab=64,seq=4,dec_seq=6,batch=1";
    let p = plan(long, 1, Strategy::FullShard, Optimizer::adamw(1e-3));
    let err = open(&DataSpec::Synthetic, &p.training.graph, 5)
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("shorter"), "{err}");
}

#[test]
fn mlp_mixture_task_is_learnable() {
    let p = plan(
        "mlp:layers=2,in=16,hidden=32,classes=4,batch=32",
        2,
        Strategy::FullShard,
        Optimizer::adamw(1e-2),
    );
    let opts = TrainOptions {
        steps: 150,
        seed: 3,
        mode: ExecMode::Arena,
        ..TrainOptions::default()
    };
    let r = train(&p, &opts, &mut |_| {}).unwrap();
    let head: f32 = r.losses[..10].iter().sum::<f32>() / 10.0;
    let tail: f32 = r.losses[140..].iter().sum::<f32>() / 10.0;
    eprintln!("mlp loss {head} -> {tail}");
    assert!(tail < head * 0.5, "{head} -> {tail}");
}
