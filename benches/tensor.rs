//! Two-dimensional meshes at scale, from the memory plan and the cost
//! model (nominal presets, nothing measured): Llama-3-70B on 64 H100
//! (8 nodes) and GPT-3 175B on 512 A100 (64 nodes), as FSDP alone, FSDP
//! hybrid and T = 2, 4, 8 tensor-parallel ranks inside a node with FSDP
//! across, each with and without sequence parallelism. bf16 parameters and
//! reduction, every block recomputed. The per-rank batch is T sequences,
//! so the global batch is the same in every row; tokens per second per
//! rank compare the rows. Then what `--auto --mixed-precision bf16`
//! chooses for each (every degree with the other dimensions) and how long
//! its search takes.
//!
//! Run: `cargo bench --bench tensor`

#[allow(dead_code)] // each bench uses part of it
mod common;

use fsdpc_ir::DType;
use fsdpc_plan::Strategy;
use fsdpc_planner::FsdpConfig;

fn config(strategy: Strategy, t: u32, sequence: bool) -> FsdpConfig {
    let mut c = common::bf16_recomputed();
    c.settings.strategy = strategy;
    c.settings.tensor_parallel = t;
    c.settings.sequence_parallel = sequence;
    c
}

fn table(model: &str, preset: &str, world: u32) {
    println!("\n{model}, world {world} (8 per node, {preset}), bf16, every block recomputed; per rank and step (peak: the arena's live peak and what a GPU rank holds outside it)");
    println!(
        "  {:<30} {:>9} {:>10} {:>10} {:>11} {:>13} {:>13} {:>10}",
        "mesh", "step", "tokens/s", "peak", "fits", "tensor bytes", "across nodes", "exposed"
    );
    let rows: Vec<(String, FsdpConfig)> = [
        (
            "FSDP full_shard".to_string(),
            config(Strategy::FullShard, 1, true),
        ),
        (
            "FSDP hybrid_shard".to_string(),
            config(Strategy::HybridShard, 1, true),
        ),
    ]
    .into_iter()
    .chain([2, 4, 8].into_iter().flat_map(|t| {
        [false, true].map(|sp| {
            (
                format!("T={t} + FSDP{}", if sp { " + SP" } else { "" }),
                config(Strategy::FullShard, t, sp),
            )
        })
    }))
    .collect();
    for (name, cfg) in rows {
        let t = cfg.tensor_parallel;
        match common::compile(&format!("{model}:batch={t}"), preset, world, 8, &cfg) {
            Ok(p) => {
                let e = &p.estimates;
                let traffic = fsdpc_planner::cost::traffic(&p, &p.cluster);
                let tensor: u64 = traffic
                    .iter()
                    .filter(|x| x.group == fsdpc_plan::Group::Tensor)
                    .map(|x| x.bytes_sent)
                    .sum();
                let across: u64 = traffic.iter().map(|x| x.across_bytes).sum();
                let tokens = p.model.tokens_per_rank_step as f64 / (f64::from(t) * e.step_time_s);
                println!(
                    "  {:<30} {:>7.2} s {:>10.0} {:>6.1} GiB {:>11} {:>9.2} GiB {:>9.2} GiB {:>8.2} s",
                    name,
                    e.step_time_s,
                    tokens,
                    common::gib(p.memory.device_peak_bytes()),
                    if p.memory.device_peak_bytes() <= p.cluster.memory_bytes {
                        "yes"
                    } else {
                        "no"
                    },
                    common::gib(tensor),
                    common::gib(across),
                    e.exposed_comm_s,
                );
            }
            Err(e) => println!("  {name:<30} does not plan: {e}"),
        }
    }
}

/// `--auto --mixed-precision bf16`: every degree searched with the other
/// dimensions; the chosen mesh and the search's time, model loading
/// included.
fn auto(model: &str, preset: &str, world: u32) {
    use fsdpc_planner::auto::{search_mesh, tensor_degrees, Fixed};
    let started = std::time::Instant::now();
    let m = fsdpc_frontends::load(model, &fsdpc_frontends::LoadOptions::default())
        .expect("the model loads");
    let info = fsdpc_plan::ModelInfo {
        name: m.name.clone(),
        params: m.program.graph.param_numel(),
        tokens_per_rank_step: m.tokens_per_rank_step(),
    };
    let cluster = fsdpc_planner::preset(preset, world, 8).expect("preset");
    let base = FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: DType::Bf16,
            reduce_dtype: DType::Bf16,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let fixed = Fixed {
        precision: true,
        ..Fixed::default()
    };
    let degrees = tensor_degrees(&cluster, None);
    match search_mesh(
        &m.program, &info, &cluster, &base, &fixed, false, 0.005, &degrees,
    ) {
        Ok(choice) => {
            println!(
                "\n--auto --mixed-precision bf16, {model} on {world} ranks of {preset}: {:.2} s (load included)",
                started.elapsed().as_secs_f64()
            );
            for row in &choice.rows {
                match &row.outcome {
                    Ok(b) => println!(
                        "  T={:<2} {:<72} step {:>8.3} s {:>8.1} tokens/s per rank, peak {:>6.1} GiB{}",
                        row.degree,
                        b.config,
                        b.step_time_s,
                        b.tokens_per_s_per_rank,
                        common::gib(b.peak_bytes),
                        if row.degree == choice.degree {
                            "  chosen"
                        } else {
                            ""
                        }
                    ),
                    Err(e) => println!("  T={:<2} {e}", row.degree),
                }
            }
        }
        Err(e) => println!(
            "\n--auto, {model} on {world} ranks: {:.2} s: {e}",
            started.elapsed().as_secs_f64()
        ),
    }
}

fn main() {
    common::figures(
        "tensor",
        "two-dimensional meshes at scale",
        "Llama-3-70B on 64 H100 (`h100-80g-ib`) and GPT-3 175B on 512 A100 (`a100-80g-roce`), 8 ranks per node, from the memory plan and the cost model (nominal presets; nothing here is measured): FSDP alone, FSDP hybrid, and T = 2, 4, 8 with FSDP across, without and with sequence parallelism; bf16, every block recomputed, the per-rank batch T sequences so that the global batch is the same in every row. Then `--auto --mixed-precision bf16`'s choice, every degree searched with the other dimensions, and its time.",
    );
    table("llama3-70b", "h100-80g-ib", 64);
    table("gpt3-175b", "a100-80g-roce", 512);
    auto("llama3-70b", "h100-80g-ib", 64);
    auto("gpt3-175b", "a100-80g-roce", 512);
}
