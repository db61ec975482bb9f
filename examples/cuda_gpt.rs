//! The GPU benchmark (feature `cuda`): trains a GPT on one GPU and prints
//! the figures: step time, TFLOP/s and MFU against the dense bf16
//! peak of the GPU the driver names, the fraction of the unshard stream's
//! time that overlapped compute (CUDA events around every instruction of
//! the last step), and the planned arena beside the device memory
//! `cuMemGetInfo` shows used beyond the context.
//!
//! `cargo run --release -p fsdpc-runtime --features cuda --example cuda_gpt
//! -- [--layers 24] [--hidden 2048] [--heads 16] [--seq 2048] [--batch 8]
//! [--vocab 50257] [--steps 6] [--dtype bf16|f32] [--nccl]`

use fsdpc_ir::{build_training_program, DType, Optimizer};
use fsdpc_plan::ModelInfo;
use fsdpc_planner::{compile, count_params, FsdpConfig};
use fsdpc_runtime::targets::cuda::{train_cuda, CudaConfig, NcclMode};
use fsdpc_runtime::TrainOptions;
use std::time::Instant;

/// Dense bf16 tensor-core peak (FLOP/s) of the GPUs we know by name.
fn bf16_peak(name: &str) -> Option<f64> {
    let n = name.to_ascii_uppercase();
    let tf = if n.contains("H100") && n.contains("PCIE") {
        756.0
    } else if n.contains("H100") || n.contains("H200") || n.contains("GH200") {
        989.4
    } else if n.contains("B200") {
        2250.0
    } else if n.contains("A100") {
        312.0
    } else if n.contains("L40S") {
        362.0
    } else if n.contains("A10G") {
        70.0
    } else {
        return None;
    };
    Some(tf * 1e12)
}

fn arg<T: std::str::FromStr>(args: &[String], flag: &str, default: T) -> T {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let layers: usize = arg(&args, "--layers", 24);
    let hidden: usize = arg(&args, "--hidden", 2048);
    let heads: usize = arg(&args, "--heads", 16);
    let seq: usize = arg(&args, "--seq", 2048);
    let batch: usize = arg(&args, "--batch", 8);
    let vocab: usize = arg(&args, "--vocab", 50257);
    let steps: u64 = arg(&args, "--steps", 6);
    let dtype = match arg(&args, "--dtype", "bf16".to_string()).as_str() {
        "f32" => DType::F32,
        _ => DType::Bf16,
    };
    let nccl = if args.iter().any(|a| a == "--nccl") {
        NcclMode::Always
    } else {
        NcclMode::Auto
    };
    let spec = format!(
        "gpt:layers={layers},hidden={hidden},heads={heads},seq={seq},vocab={vocab},batch={batch}"
    );
    let t0 = Instant::now();
    let m = fsdpc_frontends::zoo::build(&spec)?;
    let prog = build_training_program(m.graph, m.loss, Optimizer::adamw(1e-4))?;
    let model = ModelInfo {
        name: m.name.clone(),
        params: count_params(&prog),
        tokens_per_rank_step: m.tokens_per_sample * batch as u64,
    };
    let cluster = fsdpc_planner::preset("h200-141g-ib", 1, 1)?;
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: dtype,
            reduce_dtype: dtype,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let plan = compile(prog, model, &cluster, &cfg)?;
    println!(
        "{spec} {dtype}: {} parameters, planned in {:.1} s; arena {:.2} GiB, {:.3e} FLOP per step",
        plan.model.params,
        t0.elapsed().as_secs_f64(),
        plan.memory.arena_bytes as f64 / (1u64 << 30) as f64,
        plan.estimates.flops_per_rank_step
    );
    let opts = TrainOptions {
        steps,
        seed: 1,
        ..TrainOptions::default()
    };
    let cfg = CudaConfig {
        nccl,
        timed_steps: 1,
        ..CudaConfig::default()
    };
    let r = train_cuda(&plan, &opts, None, &cfg, &mut |s| {
        println!(
            "step {} loss {:.4} step_time {:.1} ms",
            s.step,
            s.loss,
            s.step_time.as_secs_f64() * 1e3
        );
    })?;
    let r = *r.device.ok_or("a cuda run reports its device")?;
    // Steady state: the untimed steps after the first two (warm-up: module
    // load, cuBLAS heuristics); the last step is timed per instruction.
    let times: Vec<f64> = r
        .step_times
        .iter()
        .take(r.step_times.len().saturating_sub(1))
        .skip(2)
        .map(|d| d.as_secs_f64())
        .collect();
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let Some(&median) = sorted.get(sorted.len() / 2) else {
        println!("too few steps for a steady-state figure (need --steps 4 or more)");
        return Ok(());
    };
    let flops = plan.estimates.flops_per_rank_step;
    let tflops = flops / median / 1e12;
    println!("device: {}", r.name);
    println!(
        "step: median {:.1} ms over {} steps; {:.0} tokens/s; {:.1} TFLOP/s",
        median * 1e3,
        times.len(),
        plan.model.tokens_per_rank_step as f64 / median,
        tflops
    );
    match bf16_peak(&r.name) {
        Some(p) => println!(
            "MFU: {:.1}% of the {:.0} TFLOP/s dense bf16 peak",
            100.0 * flops / median / p,
            p / 1e12
        ),
        None => println!("MFU: no known bf16 peak for `{}`", r.name),
    }
    if let Some(o) = &r.overlap {
        println!(
            "overlap (last step, timed): step {:.1} ms, compute busy {:.1} ms, unshard busy {:.1} ms, both {:.1} ms: {:.1}% of the unshard stream's time under compute",
            o.step_ms,
            o.compute_ms,
            o.unshard_ms,
            o.both_ms,
            if o.unshard_ms > 0.0 { 100.0 * o.both_ms / o.unshard_ms } else { 0.0 }
        );
    }
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let m = &r.memory;
    println!(
        "memory: planned arena {:.2} GiB; allocation {:.2} GiB; device used beyond the context {:.2} GiB after set-up, {:.2} GiB after the steps (context and other: {:.2} GiB, device {:.1} GiB)",
        gib(m.planned_arena),
        gib(m.allocated),
        gib(m.setup_used),
        gib(m.end_used),
        gib(m.baseline_used),
        gib(m.total)
    );
    Ok(())
}
