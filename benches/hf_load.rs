//! Hugging Face models. Planning: time, resident memory and per-rank peak
//! of `fsdpc compile hf:examples/hf/llama3.1-405b` at world 512 and
//! `hf:examples/hf/llama3-70b` at world 64 (f32 and bf16, with and without
//! activation checkpointing, wrap blocks, on `a100-80g-roce`), each in a
//! process of its own. Loading a checkpoint rank by rank: a 0.5 B-parameter Llama
//! written as four bf16 safetensors shards with an index (what
//! `save_pretrained` writes), planned with `hf:DIR` at world F; one process
//! per measured rank then does what a rank does at start, filling its
//! shard of every unit's flat parameter from the mapped files
//! (`fsdpc_runtime::init::fill_shard`), and reports the time and how much
//! its peak resident memory grew, beside the plan's shard of parameters
//! for that rank (the `ShardParams` of the plan's memory breakdown, f32
//! master shards). The files were just written, so they are read from the
//! page cache: the times are of a warm cache.
//!
//! Run: `cargo bench --bench hf_load`

mod common;

use fsdpc_plan::{BufferKind, Plan};
use fsdpc_planner::FsdpConfig;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The model: 8 layers of a 2048-wide Llama with grouped-query attention,
/// a 32,000-token vocabulary, untied head.
const SPEC: &str = "llama:layers=8,hidden=2048,heads=16,kv_heads=4,ffn=5632,vocab=32000,seq=512";
const SHARDS: usize = 4;

fn vm(key: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(key)).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// Writes the model's config.json and its weights, bf16, in `SHARDS` files
/// and an index, into `dir`.
fn write_checkpoint(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let cfg = fsdpc_frontends::zoo::parse(SPEC).unwrap();
    let json = fsdpc_frontends::hf::config::hf_config(&cfg).unwrap();
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    let m = fsdpc_frontends::zoo::build(SPEC).unwrap();
    let params = &m.graph.params;
    let per = params.len().div_ceil(SHARDS);
    let mut map = BTreeMap::new();
    let mut x = 0x2545F4914F6CDD1Du64;
    for (i, chunk) in params.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{SHARDS:05}.safetensors", i + 1);
        let data: Vec<Vec<u8>> = chunk
            .iter()
            .map(|p| {
                (0..p.ty.numel())
                    .flat_map(|_| {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let v = ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.04;
                        half::bf16::from_f32(v).to_le_bytes()
                    })
                    .collect()
            })
            .collect();
        let views: Vec<(&str, TensorView<'_>)> = chunk
            .iter()
            .zip(&data)
            .map(|(p, d)| {
                let v = TensorView::new(Dtype::BF16, p.ty.shape.dims().to_vec(), d).unwrap();
                (p.name.as_str(), v)
            })
            .collect();
        safetensors::serialize_to_file(views, None, &dir.join(&file)).unwrap();
        for p in chunk {
            map.insert(p.name.clone(), file.clone());
        }
    }
    let index = serde_json::json!({ "metadata": {}, "weight_map": map });
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
}

fn plan(dir: &Path, world: u32) -> Plan {
    let cfg = FsdpConfig {
        check_fits: false,
        ..FsdpConfig::default()
    };
    let mut settings = cfg.settings.clone();
    settings.wrap = fsdpc_plan::WrapPolicy::Blocks;
    let cfg = FsdpConfig { settings, ..cfg };
    common::compile(
        &format!("hf:{}", dir.display()),
        "a100-80g-roce",
        world,
        world.min(8),
        &cfg,
    )
    .unwrap()
}

/// In a child process: fill rank `pos`'s shards and print
/// `seconds rss_growth_bytes`.
fn child(dir: &Path, world: u32, pos: u64) {
    let plan = plan(dir, world);
    let params = &plan.training.graph.params;
    let before = vm("VmRSS:");
    let t = Instant::now();
    let mut shards = Vec::new();
    for u in &plan.units {
        let mut buf = vec![0f32; u.shard_numel as usize];
        fsdpc_runtime::init::fill_shard(u, params, (pos, 0), 0, &mut buf).unwrap();
        shards.push(buf);
    }
    let secs = t.elapsed().as_secs_f64();
    let grown = vm("VmHWM:").saturating_sub(before);
    println!("{secs} {grown}");
    std::hint::black_box(shards);
}

/// In a child process: compile `model` at `world` and print `seconds
/// peak_rss_bytes peak_per_rank_bytes` (the plan's arena and heap).
fn plan_child(model: &str, world: u32, bf16: bool, recompute: bool) {
    let t = Instant::now();
    let mut cfg = FsdpConfig {
        check_fits: false,
        ..FsdpConfig::default()
    };
    cfg.settings.wrap = fsdpc_plan::WrapPolicy::Blocks;
    if bf16 {
        let d = fsdpc_ir::DType::Bf16;
        cfg.settings.param_dtype = d;
        cfg.settings.reduce_dtype = d;
        cfg.settings.buffer_dtype = d;
    }
    if recompute {
        cfg.settings.activation_checkpointing = fsdpc_plan::CheckpointPolicy::Units;
    }
    let p = common::compile(model, "a100-80g-roce", world, 8, &cfg).unwrap();
    let secs = t.elapsed().as_secs_f64();
    println!("{secs} {} {}", vm("VmHWM:"), p.memory.rank_bytes);
}

/// Runs this bench again with `args` and returns the numbers it prints.
fn child_numbers(args: &[&str]) -> Vec<f64> {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect()
}

fn planning() {
    let examples = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/hf");
    println!("model                        world  precision  recompute  plan (s)  RSS (MiB)  peak per rank (GiB)");
    for (name, world) in [("llama3.1-405b", 512u32), ("llama3-70b", 64)] {
        let model = format!("hf:{}", examples.join(name).display());
        for bf16 in [false, true] {
            for recompute in [false, true] {
                let v = child_numbers(&[
                    "--plan-child",
                    &model,
                    &world.to_string(),
                    &bf16.to_string(),
                    &recompute.to_string(),
                ]);
                println!(
                    "hf:examples/hf/{name:<13} {world:>6}  {:>9}  {:>9}  {:>8.2}  {:>9.0}  {:>19.2}",
                    if bf16 { "bf16" } else { "f32" },
                    if recompute { "yes" } else { "no" },
                    v[0],
                    v[1] / (1u64 << 20) as f64,
                    v[2] / (1u64 << 30) as f64
                );
            }
        }
    }
    println!();
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--plan-child") {
        let flag = |j: usize| args[i + j] == "true";
        plan_child(&args[i + 1], args[i + 2].parse().unwrap(), flag(3), flag(4));
        return;
    }
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hf-load-llama");
    if let Some(i) = args.iter().position(|a| a == "--child") {
        child(
            &dir,
            args[i + 1].parse().unwrap(),
            args[i + 2].parse().unwrap(),
        );
        return;
    }
    common::figures(
        "hf_load",
        "Hugging Face models: planning and loading",
        "Planning `hf:` configs of Llama 3.1 405B and Llama 3 70B (no weights: no parameter \
         memory), each compile in its own process; then the peak resident memory each rank adds \
         while loading its shards of a sharded bf16 safetensors checkpoint (0.49 B parameters, \
         0.98 GB on disk, 4 files and an index), beside the plan's f32 parameter shard for that \
         rank.",
    );
    planning();
    let t = Instant::now();
    write_checkpoint(&dir);
    let on_disk: u64 = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len())
        .sum();
    println!(
        "model {SPEC}: {:.2} GB on disk (bf16, {SHARDS} shards), written in {:.1} s",
        on_disk as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    println!();
    println!("world  rank  load (s)  RSS growth (MiB)  planned shard (MiB)  growth / planned");
    for world in [1u32, 4, 8] {
        let p = plan(&dir, world);
        let planned = p
            .memory
            .breakdown
            .iter()
            .filter(|(k, _)| *k == BufferKind::ShardParams)
            .map(|(_, b)| b)
            .sum::<u64>();
        let mut ranks = vec![0, u64::from(world) - 1];
        ranks.dedup();
        for pos in ranks {
            let v = child_numbers(&["--child", &world.to_string(), &pos.to_string()]);
            let (secs, grown) = (v[0], v[1] as u64);
            println!(
                "{world:>5}  {pos:>4}  {secs:>8.3}  {:>16.1}  {:>19.1}  {:>16.3}",
                common::mib(grown),
                common::mib(planned),
                grown as f64 / planned as f64
            );
        }
    }
}
