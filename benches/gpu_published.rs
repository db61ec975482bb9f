//! Predictions against published GPU training runs: each row plans and
//! simulates a run whose model, GPUs, parallelism, batch, sequence,
//! precision and recomputation its authors state, and prints the
//! predicted tokens/s per GPU and MFU beside the published ones, with the
//! error and the source. Nothing here is fitted to these runs: the
//! clusters are the presets (or a preset with the figures the source
//! states, such as the GPUs' memory), and the rows are the check.
//!
//! Each row models what its source states about the system that ran it
//! (FSDP2 in torchtitan): an eager run is priced as PyTorch eager's
//! kernels (`Kernels::PytorchEager`), a compiled one as fsdpc's; GPUs whose
//! peak the source only bounds are simulated at both bounds. The rest is
//! fsdpc's own schedule on the preset's rates (measured products,
//! attention and memory bandwidth on Hopper, published ones on the A100;
//! datasheet links). A row whose plan cannot run what the source ran is
//! printed and not scored, saying why.
//!
//! Run: `cargo bench --bench gpu_published`

#[allow(dead_code)] // each bench uses part of it
mod common;

use fsdpc_ir::DType;
use fsdpc_plan::cluster::Kernels;
use fsdpc_plan::{CheckpointPolicy, Cluster, Strategy};
use fsdpc_planner::presets::Attention;
use fsdpc_planner::simulate::estimate_on;
use fsdpc_planner::FsdpConfig;

/// torchtitan's Llama 3 and Llama 2 runs on 64 A100-80GB with FSDP2
/// (`docs/performance.md` of pytorch/torchtitan).
const TITAN_A100: &str = "torchtitan docs/performance.md (64 A100-80GB, FSDP2)";
/// torchtitan's Llama 3.1 runs on H100 (Grand Teton: 96 GB HBM2e at 2.4
/// TB/s, 500 W; `benchmarks/llama3_h100_202412_torchtitan.md`).
const TITAN_H100: &str =
    "torchtitan benchmarks/llama3_h100_202412_torchtitan.md (Grand Teton H100)";

/// torchtitan's Llama 3.1 405B run on 128 H100 with FSDP2 and tensor
/// parallelism (`docs/performance.md` of pytorch/torchtitan, its "Llama
/// 3.1 performance numbers").
const TITAN_405B: &str = "torchtitan docs/performance.md (128 H100, FSDP2 16 x TP 8)";

/// How a row recomputes, as its source names it.
#[derive(Copy, Clone)]
enum Ac {
    /// No activation checkpointing.
    No,
    /// torchtitan's "full": every block.
    Full,
    /// torchtitan's "selective layer": every second block (its
    /// `selective_ac_option = "2"`).
    Layer,
    /// torchtitan's "selective op": keeps attention's and every other
    /// matrix product's outputs and recomputes the rest (`ops`).
    Op,
}

impl Ac {
    fn name(self) -> &'static str {
        match self {
            Ac::No => "no AC",
            Ac::Full => "full AC",
            Ac::Layer => "selective layer AC",
            Ac::Op => "selective op AC",
        }
    }

    fn policy(self) -> CheckpointPolicy {
        match self {
            Ac::No => CheckpointPolicy::None,
            Ac::Op => CheckpointPolicy::Ops,
            Ac::Full => CheckpointPolicy::Units,
            Ac::Layer => CheckpointPolicy::Every(2),
        }
    }
}

struct Row {
    model: &'static str,
    gpus: u32,
    batch: u32,
    seq: u32,
    ac: Ac,
    /// Published tokens/s per GPU.
    tps: f64,
    /// Published MFU, where the source gives one.
    mfu: Option<f64>,
    /// Whether the published run compiled the model (`torch.compile`,
    /// which fuses the element-wise kernels eager PyTorch runs one by
    /// one); the rows without it ran eager.
    compiled: bool,
    /// Published memory per GPU in GiB, where the source gives it
    /// (torchtitan's reading of its caching allocator's reserved peak).
    memory_gib: Option<f64>,
    source: &'static str,
    /// The cluster: a preset, or how the source's GPUs differ from it.
    cluster: fn(u32) -> Cluster,
    /// The tensor-parallel degree (1: FSDP alone).
    tp: u32,
    /// Whether the source bounds its GPUs' peak between two datasheet
    /// figures (`PEAK_BOUNDS`) rather than naming one.
    peak_bounded: bool,
    /// The attention kernel the run's PyTorch dispatched to, where its
    /// version says (`Preset` where it does not).
    attention: Attention,
}

/// The A100-80GB preset (RoCE between nodes: torchtitan does not say
/// what its A100 cluster's network is).
fn a100(world: u32) -> Cluster {
    fsdpc_planner::preset("a100-80g-roce", world, world.min(8)).expect("preset")
}

/// The H100 preset with Grand Teton's GPUs as the source states them: 96
/// GB of HBM2e at 2.4 TB/s (the preset's measured HBM fraction kept), at
/// the default 500 W power limit, their peak "between SXM and NVL" which
/// the source does not know: the rows are simulated at both datasheet
/// peaks (`PEAK_BOUNDS`), and predicted at the middle. The 405B page's
/// GPUs are the same ("HBM2e based lower TDP SXM H100 (95GB)", peak
/// "between SXM and NVL").
fn grand_teton(world: u32) -> Cluster {
    let mut c = fsdpc_planner::preset("h100-80g-ib", world, world.min(8)).expect("preset");
    c.memory_bytes = 96 << 30;
    c.hardware.mem_bw *= 2.4e12 / H100_SXM_HBM;
    c
}

/// The H100 SXM's datasheet HBM3 bandwidth, bytes/s.
const H100_SXM_HBM: f64 = 3.35e12;

/// Datasheet dense bf16 peaks, TFLOP/s: the H100 NVL (400 W) and the
/// H100 SXM (700 W), which bound Grand Teton's 500 W GPUs as torchtitan
/// states them.
const PEAK_BOUNDS: (f64, f64) = (835.0, 989.0);

/// `c` with its products and attention at `peak` TFLOP/s instead of the
/// SXM's 989 (the measured rates scaled as the peak is: the same fraction
/// of it).
fn at_peak(c: &Cluster, peak: f64) -> Cluster {
    let mut c = c.clone();
    let r = peak / PEAK_BOUNDS.1;
    c.hardware.peak_flops_bf16 *= r;
    for rate in c.hardware.kernel_flops.values_mut() {
        *rate *= r;
    }
    c
}

fn rows() -> Vec<Row> {
    let a = |model, batch, seq, ac, tps, mfu| Row {
        model,
        gpus: 64,
        batch,
        seq,
        ac,
        tps,
        mfu: Some(mfu),
        compiled: false,
        memory_gib: None,
        source: TITAN_A100,
        cluster: a100,
        tp: 1,
        peak_bounded: false,
        // PyTorch's only fused attention on sm80 (the preset's figures).
        attention: Attention::FlashAttention2,
    };
    let h = |gpus, compiled, tps, memory| Row {
        model: "llama3.1-8b",
        gpus,
        batch: 2,
        seq: 8192,
        ac: Ac::Op,
        tps,
        mfu: None,
        compiled,
        memory_gib: Some(memory),
        source: TITAN_H100,
        cluster: grand_teton,
        tp: 1,
        peak_bounded: true,
        // Its torch (1963fc8, 2024-12-23) had cuDNN attention opt-in
        // (pytorch/pytorch#138522): SDPA ran FlashAttention-2.
        attention: Attention::FlashAttention2,
    };
    vec![
        a("llama3-8b", 1, 8192, Ac::Layer, 2904.0, 0.568),
        a("llama3-8b", 1, 8192, Ac::Op, 2973.0, 0.582),
        a("llama3-70b", 1, 8192, Ac::Full, 331.0, 0.517),
        a("llama2-13b", 2, 4096, Ac::No, 2162.0, 0.611),
        a("llama2-13b", 2, 4096, Ac::Layer, 1914.0, 0.541),
        a("llama2-13b", 2, 4096, Ac::Op, 1904.0, 0.538),
        a("llama2-70b", 1, 4096, Ac::Op, 355.0, 0.508),
        a("llama2-70b", 2, 4096, Ac::Full, 353.0, 0.505),
        // Tables 1 and 3: "FSDP" and "FSDP + torch.compile" (the Float8
        // rows compute in fp8, which these plans do not).
        h(8, false, 5762.0, 82.4),
        h(8, true, 6667.0, 77.0),
        h(128, false, 5605.0, 67.0),
        h(128, true, 6514.0, 62.0),
        // The 2-D run: FSDP 16 x TP 8 (`tensor_parallel_degree = 8` in
        // its `train_configs/llama3_405b.toml`, sequence 8192, eager),
        // MFU against the SXM's peak (the page's footnote).
        Row {
            model: "llama3.1-405b",
            gpus: 128,
            batch: 2,
            seq: 8192,
            ac: Ac::Full,
            tps: 109.0,
            mfu: Some(0.290),
            compiled: false,
            memory_gib: None,
            source: TITAN_405B,
            cluster: grand_teton,
            tp: 8,
            peak_bounded: true,
            // The page (torchtitan #554, 2024-08-22) names no torch
            // version, and PyTorch's choice on H100 changed more than once
            // that year: cuDNN first (pytorch/pytorch#125343, reverted in
            // June, landed again for 2.5), opt-in from 2.5.1 (#138522).
            attention: Attention::Preset,
        },
    ]
}

fn main() {
    common::figures(
        "gpu_published",
        "predictions against published GPU runs",
        "Published training runs (model, GPUs, FSDP, batch, sequence, bf16 mixed precision, recomputation as their sources state them), planned and simulated by fsdpc on the GPU presets: predicted tokens/s per GPU and MFU beside the published ones, with the error. Nothing is fitted to these runs. The presets hold products, attention and memory bandwidth as measured on an H200 (Hopper rows) or as published for the A100 (see docs/clusters.md), and links at their datasheet rates. An eager row is priced as PyTorch eager runs its kernels (`--kernels pytorch-eager`), a compiled one as fsdpc's.",
    );
    println!(
        "{:<13} {:>5} {:>6} {:>6} {:<19} {:<7} {:<9} {:>10} {:>10} {:>8} {:>13} {:>10} {:>8} {:>8} {:>9} {:>9} {:>5}  source",
        "model",
        "GPUs",
        "batch",
        "seq",
        "recomputation",
        "system",
        "attention",
        "published",
        "predicted",
        "error",
        "peak bounds",
        "fsdpc krn",
        "MFU pub",
        "MFU pred",
        "mem pub",
        "arena",
        "fits"
    );
    let mut errors = Vec::new();
    let mut unscored = Vec::new();
    for r in rows() {
        let mut stated = (r.cluster)(r.gpus);
        fsdpc_planner::presets::with_attention(&mut stated, r.attention).expect("attention");
        // torch.compile fuses the element-wise kernels as fsdpc's IR
        // does; eager PyTorch runs its own (`fsdpc_planner::cost::eager`).
        stated.kernels = if r.compiled {
            Kernels::Fsdpc
        } else {
            Kernels::PytorchEager
        };
        let (lo, hi) = PEAK_BOUNDS;
        let sxm_peak = stated.hardware.peak_flops_bf16;
        let cluster = if r.peak_bounded {
            at_peak(&stated, (lo + hi) / 2.0)
        } else {
            stated.clone()
        };
        let cfg = FsdpConfig {
            settings: fsdpc_plan::Settings {
                strategy: Strategy::FullShard,
                param_dtype: DType::Bf16,
                reduce_dtype: DType::F32,
                activation_checkpointing: r.ac.policy(),
                tensor_parallel: r.tp,
                ..fsdpc_plan::Settings::default()
            },
            check_fits: false,
            ..FsdpConfig::default()
        };
        let spec = format!("{}:batch={},seq={}", r.model, r.batch, r.seq);
        let p = match common::compile_for(&spec, &cluster, &cfg) {
            Ok(p) => p,
            Err(e) => {
                println!("{:<12} {:>5} does not plan: {e}", r.model, r.gpus);
                continue;
            }
        };
        let e = &p.estimates;
        // The T members of a tensor group compute on the same samples:
        // tokens per GPU as torchtitan counts them (its tokens/s divides
        // by the degrees other than data parallelism).
        let tokens = p.model.tokens_per_rank_step as f64 / f64::from(r.tp);
        let tps = tokens / e.step_time_s;
        let tps_on = |c: &Cluster| tokens / estimate_on(&p, c).step_time_s;
        let bounds = if r.peak_bounded {
            format!(
                "{:.0}-{:.0}",
                tps_on(&at_peak(&stated, lo)),
                tps_on(&at_peak(&stated, hi))
            )
        } else {
            "-".to_string()
        };
        let fused = if r.compiled {
            "-".to_string()
        } else {
            format!(
                "{:.0}",
                tps_on(&Cluster {
                    kernels: Kernels::Fsdpc,
                    ..cluster.clone()
                })
            )
        };
        let err = tps / r.tps - 1.0;
        // torchtitan's tensor parallelism shards the sequence between the
        // regions (its `SequenceParallel` norms); a plan whose regions
        // could not leave into row chunks runs something else, and is
        // printed but not scored.
        let unchunked = p
            .config
            .tensor
            .as_ref()
            .and_then(|t| t.sequence.as_ref())
            .is_some_and(|q| q.scattered == 0);
        if unchunked {
            unscored.push(format!(
                "{} on {} GPUs: fsdpc's sequence parallelism cuts a tensor on its first axis longer than 1, here the batch ({}), which T = {} does not divide, so its regions leave through all-reduces and its norms run on the whole sequence, where torchtitan shards the sequence",
                r.model, r.gpus, r.batch, r.tp
            ));
        } else {
            errors.push(err.abs());
        }
        // MFU against the datasheet peak of the preset (the SXM's for the
        // H100 rows, as torchtitan counts it).
        let mfu = e.model_flops_per_rank_step / e.step_time_s / sxm_peak;
        println!(
            "{:<13} {:>5} {:>6} {:>6} {:<19} {:<7} {:<9} {:>10.0} {:>10.0} {:>+6.1}%{} {:>13} {:>10} {:>8} {:>7.1}% {:>9} {:>9} {:>5}  {}",
            r.model,
            r.gpus,
            r.batch,
            r.seq,
            r.ac.name(),
            if r.compiled { "compile" } else { "eager" },
            match r.attention {
                Attention::Preset => "preset",
                Attention::FlashAttention2 => "FA2",
            },
            r.tps,
            tps,
            err * 100.0,
            if unchunked { "*" } else { " " },
            bounds,
            fused,
            r.mfu.map_or("-".to_string(), |m| format!("{:.1}%", m * 100.0)),
            mfu * 100.0,
            r.memory_gib.map_or("-".to_string(), |m| format!("{m:.1} GiB")),
            format!("{:.1} GiB", common::gib(p.memory.arena_bytes)),
            if p.memory.device_peak_bytes() <= cluster.memory_bytes {
                "yes"
            } else {
                "no"
            },
            r.source
        );
    }
    errors.sort_by(f64::total_cmp);
    if let (Some(median), Some(worst)) = (errors.get(errors.len() / 2), errors.last()) {
        println!(
            "\n{} rows: median |error| {:.1}%, worst {:.1}% (goal: median <= 10%, none over 20%)",
            errors.len(),
            median * 100.0,
            worst * 100.0
        );
    }
    for u in &unscored {
        println!("* not scored: {u}.");
    }
    println!(
        "\nWhat fsdpc's plan does differently in every row: its own schedule on the preset's rates \
         (products and attention as measured or published, collectives inside a Hopper node as XLA measured \
         them, the others at link rate), where torchtitan \
         runs PyTorch with its caching allocator, FlashAttention and fused AdamW. An eager row is priced \
         as PyTorch eager runs the kernels (`fsdpc simulate --kernels pytorch-eager`: shape operators as \
         views, RMSNorm as ATen's composite of 8 kernels forward and 17 backward, cross-entropy as \
         log-softmax and NLL); `fsdpc krn` is the same plan priced as fsdpc's kernels. A compile row \
         has torch.compile fuse the element-wise kernels, priced as fsdpc's. The A100 page names no \
         torch.compile and its configuration's default is `compile = false`, so its rows are eager. \
         The H100 rows are Grand Teton's 500 W HBM2e GPUs, whose peak torchtitan puts between the \
         H100 NVL's and the SXM's (835 and 989 TFLOP/s): `peak bounds` is the prediction at each, \
         `predicted` at the middle. `attention` is the kernel the row's attention is priced as: \
         `FA2` where the run's torch dispatched SDPA to FlashAttention-2 (on the A100 its only \
         fused kernel, the preset's figures; on Hopper torch of late 2024, whose cuDNN attention \
         was opt-in: `fsdpc cluster PRESET --attention flash-attention-2`), `preset` where the source \
         names no torch version (the Hopper preset's measured PyTorch 2.11 default, cuDNN's rate). \
         What is not modelled: the graph is the transformers layout \
         (rotary embedding by halves, grouped heads repeated), not torchtitan's own model code; \
         NCCL runs at link rate across nodes and inside an A100 node. `MFU pub` is torchtitan's count (6 FLOPs per parameter, embedding included, \
         and attention's 12 L H Q T per token with nothing masked); `MFU pred` is fsdpc's model FLOPs \
         (the products the graph computes, causal attention's unmasked half), lower for the same tokens. \
         `mem pub` is torchtitan's reserved peak of its caching allocator; \
         `arena` is the arena fsdpc's plan allocates, the same pool without the memory outside it \
         (context, NCCL, cuBLAS), which the fit check adds."
    );
}
