//! `fsdpc simulate PLAN [--cluster X] [--json]`: the plan's step on its own
//! cluster or on another one (same world and ranks per node, other speeds);
//! `fsdpc cluster PRESET [-o FILE]`: a preset as a cluster file to edit.

use super::compile::plan_cluster;
use super::inspect::load_plan;
use super::{print_out, CliError};
use clap::Args;
use fsdpc_plan::cluster::Kernels;
use fsdpc_plan::readable::human_bytes;
use fsdpc_planner::presets::Attention;
use fsdpc_planner::simulate::{run as simulate, Simulation};
use std::fmt::Write;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct SimulateArgs {
    /// A plan written by `fsdpc compile`.
    pub plan: PathBuf,
    /// Simulate on this cluster (a preset or a cluster file) instead of
    /// the one the plan was compiled for; the plan's world and ranks per
    /// node are kept.
    #[arg(long, value_name = "FILE|PRESET")]
    pub cluster: Option<String>,
    /// Price the operators as these kernels run them: `fsdpc` (its
    /// runtimes') or `pytorch-eager` (PyTorch eager's views and composite
    /// kernels, to predict a PyTorch run of the same model); default: the
    /// cluster's `kernels`, fsdpc's unless it names another.
    #[arg(long, value_enum, value_name = "KERNELS")]
    pub kernels: Option<KernelsArg>,
    /// Print the figures as JSON.
    #[arg(long)]
    pub json: bool,
}

/// `--kernels`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum KernelsArg {
    Fsdpc,
    PytorchEager,
}

impl From<KernelsArg> for Kernels {
    fn from(k: KernelsArg) -> Kernels {
        match k {
            KernelsArg::Fsdpc => Kernels::Fsdpc,
            KernelsArg::PytorchEager => Kernels::PytorchEager,
        }
    }
}

pub fn run(a: SimulateArgs) -> Result<(), CliError> {
    let plan = load_plan(&a.plan)?;
    let (sim, text) = simulated(&plan, a.cluster.as_deref(), a.kernels.map(Kernels::from))?;
    if a.json {
        let text = serde_json::to_string_pretty(&sim)
            .map_err(|e| CliError::Usage(format!("cannot print the simulation: {e}")))?;
        return print_out(&format!("{text}\n"));
    }
    print_out(&text)
}

/// `plan`'s step simulated on `cluster` (the plan's own by default), its
/// operators priced as `kernels` run them when given, and the text
/// `simulate` prints of it.
pub(crate) fn simulated(
    plan: &fsdpc_plan::Plan,
    cluster: Option<&str>,
    kernels: Option<Kernels>,
) -> Result<(Simulation, String), CliError> {
    let mut cluster = plan_cluster(plan, cluster)?;
    if let Some(k) = kernels {
        cluster.kernels = k;
    }
    let sim = simulate(plan, &cluster);
    let text = render(&sim, cluster.memory_bytes, plan.memory.rank_bytes);
    Ok((sim, text))
}

/// The simulation as text; `rank_bytes` is the plan's peak per rank (the
/// figure `compile` and `train` print), beside the arena's live peak the
/// capacity is checked against.
fn render(s: &Simulation, capacity: u64, rank_bytes: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "simulated on {} (world {}{}): step {:.6} s, exposed communication {:.6} s",
        s.cluster,
        s.world,
        if s.kernels == "fsdpc" {
            String::new()
        } else {
            format!(", {} kernels", s.kernels)
        },
        s.step_time_s,
        s.exposed_comm_s
    );
    let _ = writeln!(
        out,
        "{:.3} TFLOP/s per rank, MFU {:.1}%, {} sent per rank and step",
        s.tflops_per_rank,
        s.mfu * 100.0,
        human_bytes(s.comm_bytes_per_step)
    );
    let _ = writeln!(
        out,
        "{}",
        fsdpc_report::inspect::flops_line(
            s.model_flops_per_rank_step,
            s.executed_flops_per_rank_step,
            s.mfu,
            s.hfu
        )
    );
    let fits = if s.peak_bytes_per_rank + s.outside_arena_bytes <= capacity {
        "fits"
    } else {
        "DOES NOT FIT"
    };
    let outside = if s.outside_arena_bytes > 0 {
        format!(
            ", {} outside the arena on a GPU",
            human_bytes(s.outside_arena_bytes)
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "peak per rank {} (arena live peak {}{outside}, capacity {}: {fits})",
        human_bytes(rank_bytes),
        human_bytes(s.peak_bytes_per_rank),
        human_bytes(capacity)
    );
    let busy: Vec<String> = s
        .busy
        .iter()
        .map(|(st, f)| format!("{st:?} {:.1}%", f * 100.0).to_lowercase())
        .collect();
    let _ = writeln!(out, "busy: {}", busy.join(", "));
    out
}

#[derive(Debug, Args)]
pub struct ClusterArgs {
    /// A preset: a100-80g-roce, h100-80g-ib, h200-141g-ib, a100-40g-efa,
    /// l40s-48g-eth, a10-24g-eth or cpu-local.
    pub preset: String,
    /// Ranks per node (default: 8 for GPU presets, 2 for cpu-local).
    #[arg(long)]
    pub ranks_per_node: Option<u32>,
    /// Price fused attention as this kernel runs it: `preset` (the
    /// preset's own figures) or `flash-attention-2` (published rates: what
    /// PyTorch's attention runs on A100s, and on Hopper up to 2.4 and from
    /// 2.5.1 until cuDNN attention became its default again, by 2.11).
    #[arg(long, value_enum, value_name = "KERNEL", default_value = "preset")]
    pub attention: AttentionArg,
    /// Where to write the cluster file (default: stdout).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

/// `fsdpc cluster --attention`.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum AttentionArg {
    Preset,
    #[value(name = "flash-attention-2")]
    FlashAttention2,
}

impl From<AttentionArg> for Attention {
    fn from(a: AttentionArg) -> Attention {
        match a {
            AttentionArg::Preset => Attention::Preset,
            AttentionArg::FlashAttention2 => Attention::FlashAttention2,
        }
    }
}

/// Writes a preset as a cluster file: a starting point for a user's own
/// measured figures (`--cluster FILE`).
pub fn cluster(a: ClusterArgs) -> Result<(), CliError> {
    let rpn = a
        .ranks_per_node
        .unwrap_or_else(|| fsdpc_planner::presets::default_ranks_per_node(&a.preset, None));
    let mut cluster = fsdpc_planner::presets::described(&a.preset, rpn, rpn)?;
    fsdpc_planner::presets::with_attention(&mut cluster, a.attention.into())?;
    let text = cluster.to_file(false);
    match &a.output {
        None => print_out(&text),
        Some(path) => std::fs::write(path, text).map_err(|source| CliError::Io {
            path: path.display().to_string(),
            source,
        }),
    }
}
