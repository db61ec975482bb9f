//! The scaling study of the FSDP paper (Zhao et al., "PyTorch FSDP:
//! Experiences on Scaling Fully Sharded Data Parallel", VLDB 2023, Section
//! 5), by simulation: each configuration is compiled for the
//! `a100-80g-roce` preset (8 A100 80GB to a node; the paper's cluster has
//! 2 Tb/s RoCE) and its step simulated with the planner's cost model. No
//! GPU runs; every figure is what the planner predicts.
//!
//! ```sh
//! cargo run --release --example fsdp_paper_study            # 4 models, 8..512 GPUs
//! cargo run --release --example fsdp_paper_study -- --quick # T5-611M, 8..32 GPUs
//! ```
//!
//! What is compared, per model and GPU count (batch per GPU fixed, so the
//! global batch grows with the GPUs, as in the paper):
//! - **FSDP**: full_shard, backward prefetch `pre`, the rate limiter at
//!   PyTorch's 2 in-flight all-gathers, activation checkpointing of every
//!   block, bf16 parameters, gradient reduction and buffers (the paper's
//!   Section 5.4 setup: "full sharding with prefetching and rate limiter",
//!   "activation checkpointing and BF16 mixed precision"; its Section 4.4:
//!   FSDP's mixed precision runs the collectives in the low precision),
//!   AdamW (the paper uses Adam "to incur the costly two optimizer states").
//! - **no prefetch**: the same with backward prefetch off (Figure 6b).
//! - **no limiter**: the same with no bound on in-flight all-gathers
//!   (Figure 6c). The simulation has no caching allocator, so it shows
//!   the memory the limiter saves and the overlap it costs, not the
//!   defragmentation stalls behind the paper's speedups.
//! - **hybrid**: hybrid_shard, sharded within a node of 8, replicated
//!   across nodes (only above 8 GPUs; at 8 it is full_shard).
//! - **DDP**: no_shard (whole parameters, gradients and optimizer state on
//!   every GPU; all-reduce of gradients), and whether it fits in 80 GB.
//!
//! Models, from public definitions only:
//! - T5-611M and T5-2.28B: no published T5 configuration has these sizes;
//!   the nearest published ones stand in, Hugging Face `t5-large`
//!   (737.7M) and `t5-3b` (2.85B). T5-11B is Hugging Face `t5-11b`
//!   (11.3B), the paper's model. Sequence 512 in and out (the paper gives
//!   512 for T5-11B), batch 8 per GPU for all three (the paper runs
//!   T5-11B at 8 and 16; it gives no batch for the smaller two), and
//!   T5-11B at 16 as well.
//! - GPT-175B: the paper's minGPT (96 layers, width 12288, 96 heads,
//!   block size 2048, vocabulary 50000), batch 1 and 2 per GPU (the
//!   paper's).

use fsdpc::frontends::{self, LoadOptions, LoadedModel};
use fsdpc::ir::DType;
use fsdpc::plan::{BackwardPrefetch, CheckpointPolicy, ModelInfo, Strategy};
use fsdpc::planner::{self, simulate, FsdpConfig};
use std::error::Error;
use std::fmt::Write;

/// The cluster preset of the study.
pub const CLUSTER: &str = "a100-80g-roce";
/// GPUs to a node.
const PER_NODE: u32 = 8;

/// One model of the study at one batch size.
pub struct Model {
    /// The paper's name.
    pub paper: &'static str,
    /// Samples per GPU (also in `spec`).
    pub batch: u32,
    /// The zoo spec that stands in for it.
    pub spec: &'static str,
}

/// The paper's four language models (see the module header).
pub fn models() -> Vec<Model> {
    vec![
        Model {
            paper: "T5-611M",
            batch: 8,
            spec: "t5-large:batch=8",
        },
        Model {
            paper: "T5-2.28B",
            batch: 8,
            spec: "t5-3b:batch=8",
        },
        Model {
            paper: "T5-11B",
            batch: 8,
            spec: "t5-11b:batch=8",
        },
        Model {
            paper: "T5-11B",
            batch: 16,
            spec: "t5-11b:batch=16",
        },
        Model {
            paper: "GPT-175B",
            batch: 1,
            spec: "gpt3-175b:vocab=50000,batch=1",
        },
        Model {
            paper: "GPT-175B",
            batch: 2,
            spec: "gpt3-175b:vocab=50000,batch=2",
        },
    ]
}

/// The GPU counts of the full study.
pub const WORLDS: [u32; 7] = [8, 16, 32, 64, 128, 256, 512];

/// One simulated configuration.
#[derive(Clone, Copy, Debug)]
pub struct Point {
    /// Predicted TFLOP/s per GPU (model FLOPs, recomputation excluded).
    pub tflops: f64,
    /// Predicted step time in seconds.
    pub step_s: f64,
    /// Planned peak memory per GPU in bytes.
    pub peak: u64,
    /// Whether the peak fits the GPU.
    pub fits: bool,
}

/// The study's configuration for `strategy` with the variations of a row.
fn config(strategy: Strategy, prefetch: BackwardPrefetch, limit: u32) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc::plan::Settings {
            strategy,
            backward_prefetch: prefetch,
            limit_all_gathers: limit,
            activation_checkpointing: CheckpointPolicy::Units,
            param_dtype: DType::Bf16,
            reduce_dtype: DType::Bf16,
            buffer_dtype: DType::Bf16,
            ..fsdpc::plan::Settings::default()
        }, // A configuration that does not fit is reported, not refused.
        check_fits: false,
        ..FsdpConfig::default()
    }
}

/// Compiles `model` for `world` GPUs with `cfg` and simulates one step.
fn point(model: &LoadedModel, world: u32, cfg: &FsdpConfig) -> Result<Point, Box<dyn Error>> {
    let cluster = planner::preset(CLUSTER, world, PER_NODE)?;
    let info = ModelInfo {
        name: model.name.clone(),
        params: model.program.graph.param_numel(),
        tokens_per_rank_step: model.tokens_per_rank_step(),
    };
    let plan = planner::compile(model.program.clone(), info, &cluster, cfg)?;
    let e = simulate::estimate_on(&plan, &cluster);
    Ok(Point {
        tflops: e.tflops_per_rank,
        step_s: e.step_time_s,
        peak: e.peak_bytes_per_rank,
        fits: e.peak_bytes_per_rank <= plan.cluster.memory_bytes,
    })
}

/// One row: a model at one GPU count under every variation.
pub struct Row {
    pub paper: &'static str,
    pub batch: u32,
    pub world: u32,
    pub fsdp: Point,
    pub no_prefetch: Point,
    pub no_limiter: Point,
    /// `None` at one node, where hybrid is full sharding.
    pub hybrid: Option<Point>,
    pub ddp: Point,
}

/// Simulates every model at every GPU count.
pub fn study(models: &[Model], worlds: &[u32]) -> Result<Vec<Row>, Box<dyn Error>> {
    let mut rows = Vec::new();
    for m in models {
        let loaded = frontends::load(m.spec, &LoadOptions::default())?;
        for &world in worlds {
            let fs = |p, l| config(Strategy::FullShard, p, l);
            let pre = BackwardPrefetch::Pre;
            let hybrid = if world > PER_NODE {
                Some(point(
                    &loaded,
                    world,
                    &config(Strategy::HybridShard, pre, 2),
                )?)
            } else {
                None
            };
            rows.push(Row {
                paper: m.paper,
                batch: m.batch,
                world,
                fsdp: point(&loaded, world, &fs(pre, 2))?,
                no_prefetch: point(&loaded, world, &fs(BackwardPrefetch::None, 2))?,
                no_limiter: point(&loaded, world, &fs(pre, u32::MAX))?,
                hybrid,
                ddp: point(&loaded, world, &config(Strategy::NoShard, pre, 2))?,
            });
        }
    }
    Ok(rows)
}

fn gib(b: u64) -> f64 {
    b as f64 / (1u64 << 30) as f64
}

/// `tflops (+x%)` against `base`.
fn delta(p: &Point, base: &Point) -> String {
    let d = if base.tflops > 0.0 {
        (p.tflops / base.tflops - 1.0) * 100.0
    } else {
        0.0
    };
    format!("{:.1} ({d:+.1}%)", p.tflops)
}

/// `tflops, peak GiB` or `OOM (peak GiB)`.
fn with_peak(p: &Point) -> String {
    if p.fits {
        format!("{:.1}, {:.1} GiB", p.tflops, gib(p.peak))
    } else {
        format!("OOM ({:.0} GiB)", gib(p.peak))
    }
}

/// The study's table (Markdown) and where DDP stops fitting.
pub fn render(models: &[Model], rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Simulated on {CLUSTER} ({PER_NODE} GPUs a node), bf16, activation checkpointing, AdamW. \
         TFLOP/s per GPU (model FLOPs); peak = planned memory per GPU; OOM = over 80 GB."
    );
    for m in models {
        let _ = writeln!(s, "- {} at batch {}: `{}`", m.paper, m.batch, m.spec);
    }
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "| model | batch/GPU | GPUs | FSDP TFLOP/s | step s | peak GiB | no prefetch | no limiter | hybrid | DDP |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let fsdp = if r.fsdp.fits {
            format!("{:.1}", r.fsdp.tflops)
        } else {
            "OOM".to_string()
        };
        let hybrid = match &r.hybrid {
            None => "= FSDP".to_string(),
            Some(h) if !h.fits => format!("OOM ({:.0} GiB)", gib(h.peak)),
            Some(h) => format!("{}, {:.1} GiB", delta(h, &r.fsdp), gib(h.peak)),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.3} | {:.1} | {} | {}, {:.1} GiB | {} | {} |",
            r.paper,
            r.batch,
            r.world,
            fsdp,
            r.fsdp.step_s,
            gib(r.fsdp.peak),
            delta(&r.no_prefetch, &r.fsdp),
            delta(&r.no_limiter, &r.fsdp),
            gib(r.no_limiter.peak),
            hybrid,
            with_peak(&r.ddp),
        );
    }
    let _ = writeln!(s);
    for m in models {
        let mine: Vec<&Row> = rows
            .iter()
            .filter(|r| r.paper == m.paper && r.batch == m.batch)
            .collect();
        let line = match mine.iter().find(|r| !r.ddp.fits) {
            None => "DDP fits at every GPU count".to_string(),
            Some(r) if mine.iter().all(|r| !r.ddp.fits) => format!(
                "DDP fits nowhere (peak {:.0} GiB per GPU at {} GPUs)",
                gib(r.ddp.peak),
                r.world
            ),
            Some(r) => format!("DDP stops fitting at {} GPUs", r.world),
        };
        let _ = writeln!(s, "- {} at batch {}: {line}", m.paper, m.batch);
    }
    s
}

/// The study for `--quick` (T5-611M, 8..32 GPUs) or in full.
pub fn run(quick: bool) -> Result<String, Box<dyn Error>> {
    let mut models = models();
    let worlds: &[u32] = if quick {
        models.truncate(1);
        &WORLDS[..3]
    } else {
        &WORLDS
    };
    let rows = study(&models, worlds)?;
    Ok(render(&models, &rows))
}

fn main() -> Result<(), Box<dyn Error>> {
    let quick = std::env::args().skip(1).any(|a| a == "--quick");
    let start = std::time::Instant::now();
    print!("{}", run(quick)?);
    eprintln!("({:.1} s)", start.elapsed().as_secs_f64());
    Ok(())
}
