//! Tensor parallelism is equivalence too: a model split over T ranks (and
//! sharded by FSDP over the world / T data ranks) trains to the losses and
//! final parameters of one unsharded rank on the same global batch.
//!
//! The global batch is 8 samples a step, split over the data ranks; the T
//! members of a tensor group compute on the same samples. A row-parallel
//! product sums its members' partial products in the tensor group, in
//! member order, where one rank sums over the whole reduction axis in one
//! kernel: those runs are compared within tolerances. Runs whose
//! reductions are the same (full_shard and no_shard at the same T and
//! world) agree bit for bit.

use crate::common::{bits, max_loss_rel_diff, max_param_diff, plan_with, train};
use fsdpc_ir::Op;
use fsdpc_plan::{InstrOp, Plan, Strategy};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::{ExecMode, TrainReport};

const STEPS: u64 = 12;
/// Loss tolerance (relative) and parameter tolerance (absolute) against
/// the 1-rank run, as for FSDP alone (`equivalence`): the split changes the
/// order of the row-parallel sums only.
const LOSS_RTOL: f32 = 1e-6;
const PARAM_ATOL: f32 = 2e-5;
/// Parameter tolerance for the GPT-2 exports: the key projection's bias
/// gets a gradient that is zero in exact arithmetic (softmax ignores a
/// constant added to every score of a row), so what it gets is rounding
/// noise, which AdamW scales to steps of the learning rate's size, and any
/// other summation order (the vocabulary-parallel loss's) moves it. After
/// 12 steps at T = 2 the key bias differs by 1.4e-5, the query and value
/// biases by 4e-8, and the rest of the model follows.
const EXPORT_PARAM_ATOL: f32 = 5e-5;

fn gpt(batch: u32) -> String {
    format!("gpt:layers=2,hidden=32,heads=4,seq=8,vocab=64,batch={batch}")
}

fn llama(batch: u32) -> String {
    format!("llama:layers=2,hidden=32,heads=8,kv_heads=4,ffn=48,vocab=64,seq=8,batch={batch}")
}

fn cfg(t: u32, strategy: Strategy, f: Option<u32>) -> FsdpConfig {
    let mut c = FsdpConfig {
        shard_factor: f,
        ..FsdpConfig::default()
    };
    c.strategy = strategy;
    c.tensor_parallel = t;
    c
}

fn run(spec: &dyn Fn(u32) -> String, world: u32, c: &FsdpConfig) -> (Plan, TrainReport) {
    let data_ranks = world / c.tensor_parallel;
    let plan = plan_with(&spec(8 / data_ranks), world, c);
    let r = train(&plan, STEPS, ExecMode::Arena);
    (plan, r)
}

fn tensor_sums(plan: &Plan) -> usize {
    plan.instructions
        .iter()
        .filter(|i| matches!(i.op, InstrOp::TensorAllReduce { .. }))
        .count()
}

fn chunk_moves(plan: &Plan) -> usize {
    plan.instructions
        .iter()
        .filter(|i| matches!(i.op, InstrOp::TensorChunks { .. }))
        .count()
}

/// The largest relative difference of two runs' gradient norms, step by
/// step.
fn max_norm_rel_diff(a: &TrainReport, b: &TrainReport) -> f32 {
    a.grad_norms
        .iter()
        .zip(&b.grad_norms)
        .map(|(x, y)| (x - y).abs() / x.abs().max(1e-6))
        .fold(0f32, f32::max)
}

/// Checks that run `r` of `plan` trained like the one-rank `reference`
/// within the tolerances, and measured no more than its plan.
fn like_one_rank(what: &str, reference: &TrainReport, plan: &Plan, r: &TrainReport) {
    let loss = max_loss_rel_diff(reference, r);
    let (abs, _) = max_param_diff(reference, r);
    eprintln!("{what}: max loss rel diff {loss:e}, max param abs diff {abs:e}");
    assert!(loss <= LOSS_RTOL, "{what}: loss {loss:e}");
    assert!(abs <= PARAM_ATOL, "{what}: params {abs:e}");
    assert!(
        r.measured_peak_bytes.unwrap_or(0) <= plan.memory.rank_bytes,
        "{what}: measured {:?} over planned {}",
        r.measured_peak_bytes,
        plan.memory.rank_bytes
    );
}

/// Each mesh with plain tensor parallelism and with sequence parallelism
/// against one rank, and the two against each other.
fn check_family(name: &str, spec: &dyn Fn(u32) -> String) {
    let (_, reference) = run(spec, 1, &cfg(1, Strategy::NoShard, None));
    for (t, world, strategy) in [
        (2, 2, Strategy::FullShard),
        (4, 4, Strategy::FullShard),
        (2, 4, Strategy::FullShard),
        (2, 4, Strategy::ShardGradOp),
        (4, 8, Strategy::FullShard),
    ] {
        let mut runs = Vec::new();
        for sequence in [false, true] {
            let mut c = cfg(t, strategy, None);
            c.sequence_parallel = sequence;
            let (plan, r) = run(spec, world, &c);
            let record = plan.config.tensor.as_ref().expect("a tensor record");
            assert_eq!(record.degree, t);
            let what = format!("{name} T={t} world {world} {strategy:?} sequence {sequence}");
            if sequence {
                // Every region and the embedding leave through a
                // reduce-scatter into chunks, and nothing is gathered whole
                // but for a product with split weights (the head's input).
                let s = record.sequence.as_ref().expect("a sequence record");
                assert_eq!(
                    (s.scattered, s.whole, s.gathered),
                    (5, 0, 0),
                    "{what}: {record:?}"
                );
                assert!(chunk_moves(&plan) > 0, "{what}");
            } else {
                // Each block's attention and MLP split: two forward and two
                // backward sums each; the embedding's sum forward and the
                // head's input gradient's backward.
                assert_eq!(record.sequence, None);
                assert_eq!(tensor_sums(&plan), 2 * 2 * 2 + 2, "{what}: {record:?}");
                // The vocabulary's: each member's offset, the logit
                // statistics gathered, and their gradient's chunk.
                assert_eq!(chunk_moves(&plan), 3, "{what}");
            }
            like_one_rank(&what, &reference, &plan, &r);
            runs.push((plan, r));
        }
        // Sequence parallelism sums the norms' and biases' gradients over
        // the members' chunks: the two differ only in that order.
        let loss = max_loss_rel_diff(&runs[0].1, &runs[1].1);
        let (abs, _) = max_param_diff(&runs[0].1, &runs[1].1);
        eprintln!(
            "{name} T={t} world {world}: sequence against plain: loss {loss:e}, params {abs:e}"
        );
        assert!(loss <= LOSS_RTOL && abs <= PARAM_ATOL);
        assert!(
            runs[1].0.memory.peak_bytes <= runs[0].0.memory.peak_bytes,
            "{name} T={t}: sequence parallelism holds no more"
        );
    }
}

#[test]
fn a_gpt_split_over_two_and_four_ranks_trains_like_one_rank() {
    check_family("gpt", &gpt);
}

#[test]
fn a_llama_with_grouped_query_attention_split_over_two_and_four_ranks_trains_like_one_rank() {
    check_family("llama", &llama);
}

/// Recomputation, accumulation and offload act on each member's part as
/// on a whole model: T = 2 over 2 data ranks against one rank with the
/// same setting.
#[test]
fn recomputation_accumulation_and_offload_hold_under_tensor_parallelism() {
    type Edit = fn(&mut FsdpConfig);
    let edits: [(&str, Edit); 3] = [
        ("recompute all", |c| {
            c.activation_checkpointing = fsdpc_plan::CheckpointPolicy::Units
        }),
        ("accumulate 2", |c| c.grad_accum = 2),
        ("offload", |c| c.cpu_offload = true),
    ];
    for (name, edit) in edits {
        let mut one = cfg(1, Strategy::FullShard, None);
        edit(&mut one);
        let (_, reference) = run(&gpt, 1, &one);
        let mut split = cfg(2, Strategy::FullShard, None);
        edit(&mut split);
        let (_, r) = run(&gpt, 4, &split);
        let loss = max_loss_rel_diff(&reference, &r);
        let (abs, _) = max_param_diff(&reference, &r);
        eprintln!("gpt T=2 world 4 {name}: max loss rel diff {loss:e}, max param abs diff {abs:e}");
        assert!(loss <= LOSS_RTOL, "{name}: loss {loss:e}");
        assert!(abs <= PARAM_ATOL, "{name}: params {abs:e}");
    }
}

/// Real PyTorch exports (the `transformers` GPT-2 and Llama, nanoGPT, by
/// the dynamo and TorchScript exporters): the split is found in the
/// imported graph (every attention and MLP; Llama's untied head stays
/// whole) and trains like one rank.
#[test]
fn onnx_exports_split_and_train_like_one_rank() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/onnx");
    let opts = fsdpc_frontends::LoadOptions {
        dims: [("batch".to_string(), 2), ("seq".to_string(), 16)].into(),
        ..fsdpc_frontends::LoadOptions::default()
    };
    for name in [
        "gpt2_dynamo_eval",
        "gpt2_torchscript_eval",
        "llama_dynamo_eval_external",
        "nanogpt_dynamo_eval",
    ] {
        let path = format!("{dir}/{name}.onnx");
        let at = |world: u32, t: u32| {
            let cluster = fsdpc_planner::preset("cpu-local", world, world).expect("preset");
            let plan = crate::common::compile_with(
                &path,
                &cluster,
                &cfg(t, Strategy::FullShard, None),
                &opts,
            )
            .unwrap_or_else(|e| panic!("{name} at T = {t}: {e}"));
            (train(&plan, STEPS, ExecMode::Arena), plan)
        };
        let (reference, _) = at(1, 1);
        let (r, plan) = at(2, 2);
        let record = plan.config.tensor.as_ref().expect("a tensor record");
        // Two blocks' attention and MLP, the head and the embedding.
        assert_eq!(record.split.len(), 6, "{name}: {record:?}");
        assert!(record.replicated.is_empty(), "{name}: {record:?}");
        // Sequence parallelism: every region and the embedding leave into
        // chunks, and nothing is gathered whole.
        let q = record.sequence.as_ref().expect("a sequence record");
        assert_eq!(
            (q.scattered, q.whole, q.gathered),
            (5, 0, 0),
            "{name}: {q:?}"
        );
        let loss = max_loss_rel_diff(&reference, &r);
        let (abs, _) = max_param_diff(&reference, &r);
        eprintln!("{name} T=2: max loss rel diff {loss:e}, max param abs diff {abs:e}");
        assert!(loss <= LOSS_RTOL, "{name}: loss {loss:e}");
        assert!(abs <= EXPORT_PARAM_ATOL, "{name}: params {abs:e}");
        // The Llama export's two key/value heads at T = 4: computed whole,
        // each member taking its share through the exporter's batched
        // products.
        if name.starts_with("llama") {
            let (r, plan) = at(4, 4);
            let record = plan.config.tensor.as_ref().expect("a tensor record");
            assert_eq!(record.split.len(), 6, "{record:?}");
            assert_eq!(record.replicated.len(), 4, "{record:?}");
            let loss = max_loss_rel_diff(&reference, &r);
            let (abs, _) = max_param_diff(&reference, &r);
            eprintln!("{name} T=4: max loss rel diff {loss:e}, max param abs diff {abs:e}");
            assert!(loss <= LOSS_RTOL && abs <= PARAM_ATOL, "{name} T=4");
        }
    }
}

/// full_shard and no_shard at the same T and world sum in the same order.
#[test]
fn full_shard_and_no_shard_under_tensor_parallelism_agree_bit_for_bit() {
    let (_, a) = run(&gpt, 4, &cfg(2, Strategy::FullShard, None));
    let (_, b) = run(&gpt, 4, &cfg(2, Strategy::NoShard, None));
    assert!(bits(&a) == bits(&b), "full_shard and no_shard differ");
}

/// The regions found, the head and embedding split by vocabulary, and
/// what stayed whole with why: a vocabulary too small to split over T.
#[test]
fn the_plan_lists_what_split_and_what_stayed_replicated() {
    let blocks = [
        "model.layers.0.self_attn.q_proj",
        "model.layers.0.mlp.gate_proj",
        "model.layers.1.self_attn.q_proj",
        "model.layers.1.mlp.gate_proj",
    ];
    let plan = plan_with(&llama(8), 2, &cfg(2, Strategy::FullShard, None));
    let record = plan.config.tensor.as_ref().expect("a tensor record");
    let mut split = blocks.to_vec();
    split.extend(["lm_head", "model.embed_tokens"]);
    assert_eq!(record.split, split);
    assert!(record.replicated.is_empty(), "{record:?}");
    assert_eq!(record.vocabulary_padded, None);
    // Split parameters are a member's part; the others whole.
    let params = &plan.training.graph.params;
    let shape = |name: &str| {
        let p = params.iter().find(|p| p.name == name).expect(name);
        (p.ty.shape.0.clone(), p.tp.is_some())
    };
    assert_eq!(
        shape("model.layers.0.self_attn.q_proj.weight"),
        (vec![16, 32], true)
    );
    assert_eq!(shape("lm_head.weight"), (vec![32, 32], true));
    assert_eq!(shape("model.embed_tokens.weight"), (vec![32, 32], true));
    assert_eq!(
        shape("model.layers.0.input_layernorm.weight"),
        (vec![32], false)
    );
    // A vocabulary of 5 over 4 members would be padded to parts of 2, the
    // last holding none of it: the head and the embedding stay whole,
    // each with why, and the blocks still split.
    let tiny = "llama:layers=2,hidden=32,heads=8,kv_heads=4,ffn=48,vocab=5,seq=8,batch=8";
    let plan = plan_with(tiny, 4, &cfg(4, Strategy::FullShard, None));
    let record = plan.config.tensor.as_ref().expect("a tensor record");
    assert_eq!(record.split, blocks);
    assert_eq!(record.vocabulary_whole, Some(5));
    assert_eq!(record.vocabulary_padded, None);
    assert_eq!(record.replicated.len(), 2, "{record:?}");
    assert!(
        record.replicated[0].starts_with("lm_head: its vocabulary of 5 does not split"),
        "{record:?}"
    );
    assert!(
        record.replicated[1].starts_with("model.embed_tokens: its vocabulary of 5"),
        "{record:?}"
    );
    let (reference, r) = (
        train(
            &plan_with(tiny, 1, &cfg(1, Strategy::NoShard, None)),
            STEPS,
            ExecMode::Arena,
        ),
        train(&plan, STEPS, ExecMode::Arena),
    );
    assert!(max_loss_rel_diff(&reference, &r) <= LOSS_RTOL);
}

/// A vocabulary T does not divide (63, as GPT-2's 50,257) is split,
/// padded to the smallest multiple of T: each member holds `ceil(63 / T)`
/// rows of the embedding and the head, the last member's last ones padding
/// no token reads and no logit counts. At T = 2 and 4 alone, and T = 2
/// with F = 2, with and without sequence parallelism, the Llama (embedding
/// and head apart) and the GPT (tied) train to one rank's losses and whole
/// parameters, and measure no more than planned.
#[test]
fn a_vocabulary_t_does_not_divide_is_padded_and_trains_like_one_rank() {
    let llama = |b: u32| {
        format!("llama:layers=2,hidden=32,heads=8,kv_heads=4,ffn=48,vocab=63,seq=8,batch={b}")
    };
    let gpt = |b: u32| format!("gpt:layers=2,hidden=32,heads=4,seq=8,vocab=63,batch={b}");
    // A family: its name, its spec by batch, its layers split by vocabulary.
    type Family<'a> = (&'a str, &'a dyn Fn(u32) -> String, &'a [&'a str]);
    let families: [Family; 2] = [
        ("llama", &llama, &["lm_head", "model.embed_tokens"]),
        ("gpt", &gpt, &["lm_head", "transformer.wte"]),
    ];
    for (name, spec, vocabulary) in families {
        let (_, reference) = run(spec, 1, &cfg(1, Strategy::NoShard, None));
        for (t, world, f) in [(2, 2, None), (4, 4, None), (2, 4, Some(2))] {
            for sequence in [false, true] {
                let mut c = cfg(t, Strategy::FullShard, f);
                c.sequence_parallel = sequence;
                let (plan, r) = run(spec, world, &c);
                let what = format!("{name} vocab 63 T={t} world {world} sequence {sequence}");
                let record = plan.config.tensor.as_ref().expect("a tensor record");
                let padded = 63u64.div_ceil(u64::from(t)) * u64::from(t);
                assert_eq!(
                    record.vocabulary_padded,
                    Some(fsdpc_plan::VocabularyPadding {
                        vocabulary: 63,
                        padded
                    }),
                    "{what}"
                );
                assert_eq!(record.vocabulary_whole, None, "{what}");
                assert!(record.replicated.is_empty(), "{what}: {record:?}");
                for layer in vocabulary {
                    assert!(
                        record.split.iter().any(|s| s == layer),
                        "{what}: {record:?}"
                    );
                }
                let padded_params = plan.training.graph.params.iter().filter_map(|p| {
                    let tp = p.tp.as_ref().filter(|tp| tp.segments == [63])?;
                    Some((p, tp))
                });
                let mut tables = 0;
                for (p, tp) in padded_params {
                    tables += 1;
                    assert!(tp.padded(), "{what}: {}", p.name);
                    let local = p.ty.shape.0[tp.axis] as u64;
                    assert_eq!(local, padded / u64::from(t), "{what}: {}", p.name);
                    assert!(p.whole().ty.shape.0.contains(&63), "{what}: {}", p.name);
                }
                // The Llama's embedding and head; the GPT's one tied table.
                let untied = vocabulary.len() - usize::from(name == "gpt");
                assert_eq!(tables, untied, "{what}");
                like_one_rank(&what, &reference, &plan, &r);
            }
        }
    }
}

/// With a padded vocabulary the gradient norm is one rank's: the padding's
/// gradient is zero, so clipping sees only the whole model's elements and
/// trains like one rank.
#[test]
fn clipping_with_a_padded_vocabulary_uses_the_whole_models_norm() {
    let gpt = |b: u32| format!("gpt:layers=2,hidden=32,heads=4,seq=8,vocab=63,batch={b}");
    let clip = |t| {
        let mut c = cfg(t, Strategy::FullShard, None);
        c.clip_grad_norm = Some(0.2);
        c
    };
    let (_, reference) = run(&gpt, 1, &clip(1));
    for (t, world) in [(2, 2), (4, 4)] {
        let (plan, r) = run(&gpt, world, &clip(t));
        assert!(plan
            .config
            .tensor
            .as_ref()
            .is_some_and(|t| t.vocabulary_padded.is_some()));
        let norm = max_norm_rel_diff(&reference, &r);
        eprintln!("padded vocabulary T={t}: grad norm rel {norm:e}");
        assert_eq!(r.grad_norms.len(), STEPS as usize);
        assert!(norm <= LOSS_RTOL, "T={t}: norm {norm:e}");
        like_one_rank(&format!("clip padded T={t}"), &reference, &plan, &r);
    }
}

/// A plan whose split parameter's part does not have the shape its
/// slice gives (a vocabulary of 63 over T = 2 is parts of 32, padding
/// included) is refused by the verifier, naming the parameter, before a
/// runtime would read it.
#[test]
fn a_part_of_the_wrong_shape_is_refused() {
    let odd = "gpt:layers=2,hidden=32,heads=4,seq=8,vocab=63,batch=8";
    let mut plan = plan_with(odd, 2, &cfg(2, Strategy::FullShard, None));
    let p = std::sync::Arc::make_mut(&mut plan.training)
        .graph
        .params
        .iter_mut()
        .find(|p| p.name == "transformer.wte.weight")
        .expect("the embedding");
    assert_eq!(p.ty.shape.0, [32, 32]);
    p.ty.shape.0[0] = 31;
    let errs = plan.validate().expect_err("a part of 31 rows is refused");
    let text: Vec<String> = errs.iter().map(|e| e.to_string()).collect();
    assert!(
        text.iter().any(|e| e.contains("parameter `transformer.wte.weight`: a part of shape [31, 32] is not 2 chunks of [63] on axis 0 (each 32)")),
        "{text:?}"
    );
}

fn compile_err(spec: &str, world: u32, c: &FsdpConfig) -> String {
    match crate::common::compile_on(spec, "cpu-local", world, world, c) {
        Ok(_) => panic!("{spec} at T = {} compiled", c.tensor_parallel),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_degree_that_does_not_divide_the_heads_or_the_world_is_refused() {
    let e = compile_err(
        "gpt:layers=1,hidden=24,heads=3,seq=8,vocab=64,batch=4",
        2,
        &cfg(2, Strategy::FullShard, None),
    );
    assert!(e.contains("does not split over T = 2"), "{e}");
    let e = compile_err(&gpt(4), 4, &cfg(0, Strategy::FullShard, None));
    assert!(e.contains("must be at least 1"), "{e}");
    let e = compile_err(&gpt(4), 4, &cfg(3, Strategy::FullShard, None));
    assert!(
        e.contains("tensor_parallel") && e.contains("must divide the world of 4"),
        "{e}"
    );
}

/// A model with no layer tensor parallelism can split (a scaling with a
/// loss, no product with a weight) is refused with one error saying so
/// and why, not planned replicated on every member.
#[test]
fn a_model_with_no_splittable_layer_is_refused() {
    use fsdpc_ir::{BinaryFn, DType, Graph, Init, ParamSpec, TensorType};
    let mut g = Graph::new("scale");
    let m = g.module("scale", "Scale");
    let x = g.add_input("x", TensorType::new(DType::F32, [4, 8]));
    let w = g.add_param(
        ParamSpec {
            name: "scale.weight".into(),
            ty: TensorType::new(DType::F32, [8]),
            init: Init::Normal { std: 0.02 },
            requires_grad: true,
            tied_to: None,
            tp: None,
        },
        m,
    );
    let y = g.binary(BinaryFn::Mul, x, w, "scaled", m).expect("mul");
    let sq = g.binary(BinaryFn::Mul, y, y, "squared", m).expect("square");
    let loss = g.mean(sq, &[0, 1], false, "loss", m).expect("mean");
    g.outputs = vec![loss];
    let optimizer = fsdpc_ir::Optimizer::adamw(1e-3);
    let program = fsdpc_ir::autodiff::build_training_program(g, loss, optimizer).expect("program");
    let info = fsdpc_plan::ModelInfo {
        name: "scale".into(),
        tokens_per_rank_step: 4,
        params: 8,
    };
    let cluster = fsdpc_planner::preset("cpu-local", 2, 2).expect("preset");
    let e = fsdpc_planner::compile(program, info, &cluster, &cfg(2, Strategy::FullShard, None))
        .expect_err("nothing splits")
        .to_string();
    assert!(
        e.contains("tensor parallelism over 2 ranks: no layer of the model splits")
            && e.contains("no matrix product with a weight"),
        "{e}"
    );
}

/// A tensor group inside a node costs nothing across nodes; one that spans
/// nodes is accepted (it was asked for) and its cost across nodes stated,
/// and `inspect` splits the step's bytes by mesh dimension.
#[test]
fn a_tensor_group_across_nodes_states_its_cost() {
    let c = cfg(4, Strategy::FullShard, None);
    let inside = crate::common::compile_on(&gpt(4), "cpu-local", 8, 4, &c).expect("compiles");
    assert_eq!(
        fsdpc_planner::cost::tensor_across_nodes(&inside, &inside.cluster),
        None
    );
    let across = crate::common::compile_on(&gpt(4), "cpu-local", 8, 2, &c).expect("compiles");
    let (bytes, secs) = fsdpc_planner::cost::tensor_across_nodes(&across, &across.cluster)
        .expect("T = 4 spans nodes of 2 ranks");
    assert!(bytes > 0 && secs > 0.0, "{bytes} {secs}");
    let s = fsdpc_report::inspect::summary(&across);
    let dims: Vec<_> = s.by_dimension.iter().map(|d| d.dimension).collect();
    assert_eq!(dims, ["tensor", "data"]);
    assert_eq!(s.by_dimension[0].across_bytes, bytes);
    assert_eq!(
        s.by_dimension.iter().map(|d| d.bytes_sent).sum::<u64>(),
        s.traffic.iter().map(|t| t.bytes_sent).sum::<u64>()
    );
    assert!(fsdpc_report::inspect::summary(&plan_with(
        &gpt(8),
        2,
        &cfg(1, Strategy::FullShard, None)
    ))
    .by_dimension
    .is_empty());
}

/// Gradient clipping: the norm counts every element of the whole model
/// once (split parameters over the tensor group, replicated ones at tensor
/// position 0 only), so it is one rank's norm, and clipping trains like one
/// rank: T = 2 alone, with F = 2, and with no_shard over the data ranks.
#[test]
fn clipping_under_tensor_parallelism_uses_the_whole_models_norm() {
    const CLIP: f64 = 0.2;
    let clip = |t, strategy| {
        let mut c = cfg(t, strategy, None);
        c.clip_grad_norm = Some(CLIP);
        c
    };
    let (_, reference) = run(&gpt, 1, &clip(1, Strategy::NoShard));
    let active = reference
        .grad_norms
        .iter()
        .filter(|&&n| f64::from(n) > CLIP)
        .count();
    assert!(
        active * 2 > STEPS as usize,
        "clipping active on most steps: {:?}",
        reference.grad_norms
    );
    for (world, strategy) in [
        (2, Strategy::FullShard),
        (4, Strategy::FullShard),
        (4, Strategy::NoShard),
    ] {
        let (plan, r) = run(&gpt, world, &clip(2, strategy));
        let groups: Vec<_> = plan
            .instructions
            .iter()
            .filter_map(|i| match i.op {
                InstrOp::NormAllReduce { group, .. } => Some(group),
                _ => None,
            })
            .collect();
        assert!(groups.ends_with(&[fsdpc_plan::Group::Tensor]), "{groups:?}");
        let norm = max_norm_rel_diff(&reference, &r);
        let loss = max_loss_rel_diff(&reference, &r);
        let (abs, _) = max_param_diff(&reference, &r);
        eprintln!(
            "clip T=2 world {world} {strategy:?}: norm rel {norm:e}, loss rel {loss:e}, params {abs:e}"
        );
        assert_eq!(r.grad_norms.len(), STEPS as usize);
        assert!(
            norm <= LOSS_RTOL,
            "world {world} {strategy:?}: norm {norm:e}"
        );
        assert!(
            loss <= LOSS_RTOL,
            "world {world} {strategy:?}: loss {loss:e}"
        );
        assert!(
            abs <= PARAM_ATOL,
            "world {world} {strategy:?}: params {abs:e}"
        );
    }
}

/// The fp16 loss scaler: the found-inf flag is summed over the tensor group
/// too, so the members skip together; with a scale at which nothing
/// overflows, T = 2 over 2 data ranks trains like one fp16 rank within
/// fp16 rounding (the bounds of `precision.rs`), and with a scale at which
/// everything overflows every rank skips every step.
#[test]
fn the_fp16_loss_scaler_holds_under_tensor_parallelism() {
    let fp16 = |t, scale: f64| {
        let mut c = cfg(t, Strategy::FullShard, None);
        c.param_dtype = fsdpc_ir::DType::F16;
        c.reduce_dtype = fsdpc_ir::DType::F16;
        c.buffer_dtype = fsdpc_ir::DType::F16;
        c.init_loss_scale = Some(scale);
        c
    };
    let (_, one) = run(&gpt, 1, &fp16(1, 1024.0));
    let (plan, r) = run(&gpt, 4, &fp16(2, 1024.0));
    assert!(plan.instructions.iter().any(|i| matches!(
        i.op,
        InstrOp::FoundInfAllReduce {
            group: fsdpc_plan::Group::Tensor,
            ..
        }
    )));
    assert!(one.skipped_steps.is_empty() && r.skipped_steps.is_empty());
    let loss = max_loss_rel_diff(&one, &r);
    let (abs, _) = max_param_diff(&one, &r);
    eprintln!("fp16 T=2 world 4: loss rel {loss:e}, params {abs:e}");
    // precision.rs: fp16 losses within 1e-4; AdamW moves an element whose
    // tiny gradient flips sign by a full lr, so parameters are bounded by
    // 2 x steps x lr.
    assert!(loss <= 1e-4, "loss {loss:e}");
    assert!(abs <= 2.0 * STEPS as f32 * 1e-3, "params {abs:e}");
    let (_, all) = run(&gpt, 4, &fp16(2, 1e30));
    assert_eq!(all.skipped_steps, (0..STEPS).collect::<Vec<_>>());
}

/// Chunks lie on the first axis not of size 1: the batch when T divides
/// it, the sequence for one sample; a shape with neither leaves the regions
/// whole (all-reduced), listed in the record. Each trains like one rank.
#[test]
fn sequence_chunks_follow_the_shape() {
    // At batch 2 and T = 4 no axis divides by 4: the sums are chunked as
    // rows of their last axis.
    for (batch, t, scattered) in [(1, 2, 5), (1, 4, 5), (2, 4, 5)] {
        let spec = gpt(batch);
        let plan = plan_with(&spec, t, &cfg(t, Strategy::FullShard, None));
        let q = plan.config.tensor.as_ref().and_then(|r| r.sequence.clone());
        let q = q.expect("a sequence record");
        // Four regions and the embedding.
        assert_eq!(
            (q.scattered, q.whole),
            (scattered, 5 - scattered),
            "batch {batch} T={t}"
        );
        let one = plan_with(&spec, 1, &cfg(1, Strategy::NoShard, None));
        let reference = train(&one, STEPS, ExecMode::Arena);
        let r = train(&plan, STEPS, ExecMode::Arena);
        let loss = max_loss_rel_diff(&reference, &r);
        let (abs, _) = max_param_diff(&reference, &r);
        eprintln!("batch {batch} T={t}: loss {loss:e}, params {abs:e}");
        assert!(
            loss <= LOSS_RTOL && abs <= PARAM_ATOL,
            "batch {batch} T={t}"
        );
    }
}

/// Dropout on sequence-parallel chunks: each member draws the whole
/// tensor's mask for its own rows (the chunk's offset in the whole is a
/// constant split over the group), so nothing is gathered for it and the
/// members together drop exactly what one rank drops. Chunks on the batch
/// (several samples a member) and on the sequence (one sample), in 2-D
/// meshes too; each against one rank and against plain tensor
/// parallelism, whose dropout reads the whole activation.
#[test]
fn sequence_parallel_dropout_draws_the_whole_tensors_mask() {
    let spec = |b: u32| format!("{},dropout=0.1", gpt(b));
    let (_, reference) = run(&spec, 1, &cfg(1, Strategy::NoShard, None));
    let one_sample = |world: u32, c: &FsdpConfig| {
        let plan = plan_with(&spec(1), world, c);
        let r = train(&plan, STEPS, ExecMode::Arena);
        (plan, r)
    };
    let (_, reference_one) = one_sample(1, &cfg(1, Strategy::NoShard, None));
    for (t, world, batch_one) in [
        (2, 2, false),
        (4, 4, false),
        (2, 4, false),
        (4, 8, false),
        (2, 2, true),
        (4, 4, true),
    ] {
        let mut runs = Vec::new();
        for sequence in [false, true] {
            let mut c = cfg(t, Strategy::FullShard, None);
            c.sequence_parallel = sequence;
            let ((plan, r), reference) = if batch_one {
                (one_sample(world, &c), &reference_one)
            } else {
                (run(&spec, world, &c), &reference)
            };
            let what =
                format!("dropout T={t} world {world} one sample {batch_one} sequence {sequence}");
            if sequence {
                let record = plan.config.tensor.as_ref().expect("a tensor record");
                let q = record.sequence.as_ref().expect("a sequence record");
                assert_eq!((q.scattered, q.gathered), (5, 0), "{what}: {q:?}");
                // Every dropout of the residual stream reads a chunk and
                // its place in the whole, forward and backward.
                let g = &plan.training.graph;
                let placed = g
                    .node_ids()
                    .filter(|&n| {
                        matches!(
                            g.node(n).op,
                            Op::Dropout {
                                whole_sample: Some(_),
                                ..
                            }
                        )
                    })
                    .count();
                assert_eq!(placed, 2 * (1 + 2 * 2), "{what}");
            }
            like_one_rank(&what, reference, &plan, &r);
            runs.push(r);
        }
        let loss = max_loss_rel_diff(&runs[0], &runs[1]);
        let (abs, _) = max_param_diff(&runs[0], &runs[1]);
        eprintln!(
            "dropout T={t} world {world}: sequence against plain: loss {loss:e}, params {abs:e}"
        );
        assert!(
            loss <= LOSS_RTOL && abs <= PARAM_ATOL,
            "T={t} world {world}"
        );
    }
}

/// Grouped-query attention with fewer key/value heads than T: the key and
/// value projections are computed whole on every member, each member
/// takes its query heads' share of them, and their gradients are summed
/// over the group. Listed as such, and trains like one rank, with and
/// without sequence parallelism, in a 2-D mesh too.
#[test]
fn key_value_heads_fewer_than_t_are_computed_whole_and_shared() {
    let spec = |b: u32| {
        format!("llama:layers=2,hidden=32,heads=8,kv_heads=2,ffn=48,vocab=64,seq=8,batch={b}")
    };
    let (_, reference) = run(&spec, 1, &cfg(1, Strategy::NoShard, None));
    for (t, world, sequence) in [(4, 4, false), (4, 4, true), (8, 8, true), (4, 8, true)] {
        let mut c = cfg(t, Strategy::FullShard, None);
        c.sequence_parallel = sequence;
        let (plan, r) = run(&spec, world, &c);
        let record = plan.config.tensor.as_ref().expect("a tensor record");
        let what = format!("T={t} world {world} sequence {sequence}");
        // Attention and MLP of both blocks, the head and the embedding.
        assert_eq!(record.split.len(), 6, "{what}: {record:?}");
        let whole: Vec<&String> = record
            .replicated
            .iter()
            .filter(|w| w.contains("computed whole on every member"))
            .collect();
        assert_eq!(whole.len(), 4, "{what}: {record:?}");
        assert!(
            whole[0].starts_with("model.layers.0.self_attn.k_proj"),
            "{what}: {record:?}"
        );
        let k = plan
            .training
            .graph
            .params
            .iter()
            .find(|p| p.name == "model.layers.0.self_attn.k_proj.weight")
            .expect("k_proj");
        assert!(k.tp.is_none(), "{what}");
        // Their gradients are summed before the repeat to the query heads
        // (after the rotary embedding for the keys, at the projection for
        // the values): a data rank's samples x 8 positions x 2 heads x 4,
        // not the 8 heads they are repeated to.
        let g = &plan.training.graph;
        let sums: Vec<u64> = g
            .node_ids()
            .filter(|&n| g.node(n).name.contains("tp_select") && g.node(n).op == Op::TpCopy)
            .map(|n| g.node(n).outputs[0].numel())
            .collect();
        let samples = u64::from(8 / (world / t));
        assert_eq!(sums, [samples * 8 * 2 * 4; 4], "{what}");
        like_one_rank(&what, &reference, &plan, &r);
    }
}

/// Key/value heads that T does not divide though there are more of them
/// (3 over T = 2, 6 query heads): computed whole the same way, and trains
/// like one rank.
#[test]
fn key_value_heads_t_does_not_divide_are_computed_whole_and_shared() {
    let spec = |b: u32| {
        format!("llama:layers=2,hidden=48,heads=6,kv_heads=3,ffn=48,vocab=64,seq=8,batch={b}")
    };
    let (_, reference) = run(&spec, 1, &cfg(1, Strategy::NoShard, None));
    for (world, sequence) in [(2, false), (2, true), (4, true)] {
        let mut c = cfg(2, Strategy::FullShard, None);
        c.sequence_parallel = sequence;
        let (plan, r) = run(&spec, world, &c);
        let record = plan.config.tensor.as_ref().expect("a tensor record");
        let what = format!("kv 3 T=2 world {world} sequence {sequence}");
        assert_eq!(record.split.len(), 6, "{what}: {record:?}");
        let whole = record
            .replicated
            .iter()
            .filter(|w| w.contains("computed whole on every member"))
            .count();
        assert_eq!(whole, 4, "{what}: {record:?}");
        like_one_rank(&what, &reference, &plan, &r);
    }
}

/// LoRA adapters on split projections: the up-projection of an adapter
/// added to a column-parallel product splits with it (its input entering
/// whole), the down-projection of one on a row-parallel product splits
/// by rows, and nothing stays replicated. Trains like one rank (only the
/// adapters train), with and without sequence parallelism and with F = 2.
#[test]
fn lora_adapters_split_with_their_projections() {
    let gpt = |b: u32| format!("gpt:layers=2,hidden=32,heads=4,seq=8,vocab=64,lora=4,batch={b}");
    let llama = |b: u32| {
        format!(
            "llama:layers=2,hidden=32,heads=8,kv_heads=4,ffn=48,vocab=64,seq=8,lora=4,batch={b}"
        )
    };
    let specs: [(&str, &dyn Fn(u32) -> String); 2] = [("gpt", &gpt), ("llama", &llama)];
    for (name, spec) in specs {
        let (_, reference) = run(spec, 1, &cfg(1, Strategy::NoShard, None));
        for (t, world, sequence) in [(2, 2, false), (2, 2, true), (2, 4, true)] {
            let mut c = cfg(t, Strategy::FullShard, None);
            c.sequence_parallel = sequence;
            let (plan, r) = run(spec, world, &c);
            let record = plan.config.tensor.as_ref().expect("a tensor record");
            let what = format!("{name} lora T={t} world {world} sequence {sequence}");
            assert_eq!(record.split.len(), 6, "{what}: {record:?}");
            assert!(record.replicated.is_empty(), "{what}: {record:?}");
            let b = plan
                .training
                .graph
                .params
                .iter()
                .find(|p| p.name.ends_with("lora_B") && p.tp.is_some());
            assert!(b.is_some(), "{what}: an adapter's up weight is split");
            like_one_rank(&what, &reference, &plan, &r);
        }
    }
}

/// Sequence parallelism cuts a region's sum on its first axis longer than
/// 1, or else on its rows (every axis but the last): at batch 1 and a
/// sequence of 6, T = 4 divides neither, so every exit stays an all-reduce
/// and `compile` says so in one line; at batch 2 the 12 rows chunk and
/// nothing is said.
#[test]
fn compile_warns_when_sequence_parallelism_chunks_nothing() {
    use crate::common::cli::fsdpc;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("p.json");
    let run = |batch: u32| {
        let model = format!(
            "llama:layers=2,hidden=64,heads=4,kv_heads=2,ffn=96,vocab=512,seq=6,batch={batch}"
        );
        let o = fsdpc(&[
            "compile",
            &model,
            "--world",
            "8",
            "--cluster",
            "h100-80g-ib",
            "--tensor-parallel",
            "4",
            "-o",
            out.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stderr).into_owned()
    };
    let err = run(1);
    let warning: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("sequence parallelism"))
        .collect();
    assert_eq!(warning.len(), 1, "{err}");
    assert!(
        warning[0]
            .starts_with("warning: sequence parallelism left 5 of 5 region exits as all-reduces")
            && warning[0].contains("--tensor-parallel 4"),
        "{err}"
    );
    let err = run(2);
    assert!(!err.contains("sequence parallelism"), "{err}");
}

/// A Llama at local batch 2 over T = 4 (torchtitan's local batch 2 with
/// TP 8, in small): no axis divides by 4, so every region leaves into
/// chunks of rows; it trains like one rank and holds less than plain
/// tensor parallelism.
#[test]
fn rows_chunk_when_no_axis_divides_and_train_like_one_rank() {
    let spec = llama(2);
    let one = plan_with(&spec, 1, &cfg(1, Strategy::NoShard, None));
    let reference = train(&one, STEPS, ExecMode::Arena);
    let mut plain = cfg(4, Strategy::FullShard, None);
    plain.sequence_parallel = false;
    let plain = plan_with(&spec, 4, &plain);
    let plan = plan_with(&spec, 4, &cfg(4, Strategy::FullShard, None));
    let q = plan.config.tensor.as_ref().and_then(|r| r.sequence.clone());
    assert_eq!(
        q.map(|q| (q.scattered, q.whole, q.gathered)),
        Some((5, 0, 0))
    );
    let r = train(&plan, STEPS, ExecMode::Arena);
    like_one_rank("llama batch 2 T=4 rows", &reference, &plan, &r);
    assert!(plan.memory.peak_bytes < plain.memory.peak_bytes);
}
