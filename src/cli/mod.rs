//! The `fsdpc` command line: `compile`, `inspect`, `train`, `trace`,
//! `simulate`, `cluster`, `calibrate`, `compare`, `report`, `export`, one
//! file each (`cluster` lives beside `simulate`).
//!
//! Each subcommand is a thin layer: parse flags into the library's config
//! structs, call the pipeline, print. Errors become one readable line and a
//! non-zero exit code, never a backtrace.

mod calibrate;
pub use calibrate::utc;
mod compare;
pub(crate) mod compile;
pub mod embed;
mod error;
mod export;
mod given;
mod inspect;
mod json_kind;
mod model;
mod report;
mod save;
mod simulate;
mod trace;
mod train;

pub use error::CliError;
pub use model::ModelFlags;

use clap::{Args, Parser, Subcommand};
use std::io::Write;
use std::path::Path;

#[derive(Debug, Parser)]
#[command(
    name = "fsdpc",
    version,
    about = "Ahead-of-time compiler for fully sharded data parallel training"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

// One `Command` is parsed per process: the size of its variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Compile a model into an FSDP plan (JSON).
    Compile(compile::CompileArgs),
    /// Summarise a plan: units, shard sizes, communication, peak memory.
    Inspect(inspect::InspectArgs),
    /// Train a model (compiling it first) or execute a plan on CPU thread ranks.
    Train(train::TrainArgs),
    /// Write the simulated step as a Perfetto/Chrome trace.
    Trace(trace::TraceArgs),
    /// Simulate a plan's step, on its own cluster or another (--cluster).
    Simulate(simulate::SimulateArgs),
    /// Write a cluster preset as a cluster file (JSON) to edit.
    Cluster(simulate::ClusterArgs),
    /// Measure this machine (matrix products, memory, collectives) and
    /// write a cluster file.
    Calibrate(calibrate::CalibrateArgs),
    /// Compare a predicted trace (`trace`) with a measured one (`train --trace`).
    Compare(compare::CompareArgs),
    /// Write a plan's self-contained HTML report: memory over the step,
    /// the stream timeline, units, collectives, predicted vs measured.
    Report(report::ReportArgs),
    /// Write the full parameters of a checkpoint (safetensors, or back into ONNX).
    Export(export::ExportArgs),
}

/// Flags shared by `compile` and `train`: how the model is planned.
#[derive(Debug, Clone, Args)]
pub struct PlanFlags {
    /// Ranks per node (default: 8 for GPU presets, all ranks for cpu-local).
    #[arg(long)]
    pub ranks_per_node: Option<u32>,
    /// Sharding strategy: full_shard (ZeRO-3), shard_grad_op (ZeRO-2),
    /// hybrid_shard, hybrid_shard_zero2 (sharded inside groups of
    /// --shard-factor ranks, default one node; replicated across them) or
    /// no_shard (DDP).
    #[arg(long, default_value = "full_shard")]
    pub strategy: String,
    /// F: the ranks each parameter is sharded over (must divide the world;
    /// default: the world, or one node for the hybrid strategies). With
    /// F < world the groups of F ranks are replicas (hybrid sharding).
    #[arg(long, value_name = "F")]
    pub shard_factor: Option<u32>,
    /// T: split each layer's matrices over T ranks (Megatron-style tensor
    /// parallelism: attention by heads, the MLP's up/gate by columns and
    /// down by rows), the mesh's inner dimension; the strategy shards over
    /// the world / T data ranks. T must divide the world, and normally the
    /// ranks of a node.
    #[arg(long, value_name = "T", default_value_t = 1)]
    pub tensor_parallel: u32,
    /// With --tensor-parallel: hold the activations between the split
    /// layers as row chunks over the tensor group (Megatron-SP: norms,
    /// residual adds and dropout-free elementwise ops on chunks, gathered
    /// before the column-parallel matrices and reduce-scattered after the
    /// row-parallel ones). On by default; off keeps them replicated.
    #[arg(long, value_name = "on|off", default_value = "on", value_parser = ["on", "off"])]
    pub sequence_parallel: String,
    /// What each non-root unit does with its gathered parameters after
    /// forward: true (free them; full_shard's default), false (keep them
    /// until backward; shard_grad_op's default), or N (keep a 1/N slice, N
    /// dividing F, so backward gathers over N ranks, e.g. inside a node:
    /// FSDP2's integer form, ZeRO++ hpZ). Repeat with PATH=VALUE to set one
    /// unit by the module path that defines it
    /// (`--reshard-after-forward transformer.h.11=false`: FSDP2's
    /// per-module setting; one N per plan).
    #[arg(long, value_name = "[PATH=]true|false|N")]
    pub reshard_after_forward: Vec<String>,
    /// Issue each forward all-gather before compute reaches its unit
    /// (true, the default: what PyTorch's CPU run-ahead achieves) or at
    /// first use (false).
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub forward_prefetch: bool,
    /// How many units ahead all-gathers are issued, forward and backward
    /// (the rate limiter still bounds how many are alive).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub prefetch_depth: u32,
    /// Gradient accumulation: K micro-batches (each of the model's batch per
    /// rank) per optimizer step; gradients reduce-scattered every
    /// micro-batch into the gradient shard.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub grad_accum: u32,
    /// With --grad-accum: keep unsharded gradients across the micro-batches
    /// and reduce once per step (PyTorch's `no_sync()`): fewer bytes
    /// communicated, every unit's flat gradient held.
    #[arg(long)]
    pub no_sync: bool,
    /// Wrap policy: blocks | kind:CLASS | size:NUMEL | paths:a,b
    #[arg(long, default_value = "blocks")]
    pub wrap: String,
    /// Backward prefetch: pre | post | none.
    #[arg(long, default_value = "pre")]
    pub backward_prefetch: String,
    /// At most this many units' gathered parameters alive at once.
    #[arg(long, default_value_t = 2)]
    pub limit_all_gathers: u32,
    /// Optimizer: adamw | sgd.
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    /// Learning rate (finite, >= 0).
    #[arg(long, default_value_t = 1e-3, allow_hyphen_values = true)]
    pub lr: f64,
    /// Weight decay, decoupled for AdamW (finite, >= 0).
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub weight_decay: f64,
    /// Apply --weight-decay to every parameter; by default norms, biases
    /// (parameters of rank < 2) and embedding tables are not decayed, as
    /// nanoGPT and Hugging Face's trainer group them.
    #[arg(long)]
    pub weight_decay_all: bool,
    /// Learning-rate schedule: constant (default), or a linear warmup of
    /// --warmup-steps from 0 to --lr, then a cosine or linear decay to
    /// --min-lr at step --lr-decay-steps, held there after (Hugging Face's
    /// schedulers with a floor; nanoGPT's get_lr). Recorded in the plan.
    #[arg(
        long,
        value_name = "constant|cosine|linear",
        default_value = "constant"
    )]
    pub lr_schedule: String,
    /// Steps of linear warmup (with --lr-schedule cosine or linear).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub warmup_steps: u64,
    /// The rate the decay ends at (with --lr-schedule cosine or linear;
    /// from 0 to --lr).
    #[arg(
        long,
        value_name = "LR",
        default_value_t = 0.0,
        allow_hyphen_values = true
    )]
    pub min_lr: f64,
    /// The step at which the decay reaches --min-lr (default with `fsdpc
    /// train MODEL`: --steps; `fsdpc compile` needs it with a decay).
    #[arg(long, value_name = "N")]
    pub lr_decay_steps: Option<u64>,
    /// Activation checkpointing: the selected units re-run their forward in
    /// their backward instead of keeping their activations. Alone: every
    /// non-root unit (all); every:K (every K-th unit from the first);
    /// paths:a,b (units by module path); kind:CLASS; ops (every unit by
    /// operation: attention and every other matrix product kept); none.
    #[arg(
        long,
        value_name = "WHICH",
        num_args = 0..=1,
        default_missing_value = "all"
    )]
    pub activation_checkpointing: Option<String>,
    /// Clip gradients to this total L2 norm over all shards before each
    /// optimizer step (PyTorch's `clip_grad_norm_`; finite, > 0).
    #[arg(long, value_name = "MAX_NORM", allow_hyphen_values = true)]
    pub clip_grad_norm: Option<f64>,
    /// Freeze the parameters whose names match PATTERN (a glob over the
    /// whole name: `*` any run of characters, `?` one; repeatable or
    /// comma-separated, e.g. `transformer.h.0.*,*.wte.weight`): no gradient,
    /// no gradient memory, no reduce-scatter, no optimizer state for them.
    #[arg(long, value_name = "PATTERN")]
    pub freeze: Vec<String>,
    /// Where a parameter read by several units (a tied embedding and output
    /// projection) lives: root (the unit containing all its readers, normally
    /// the root: no extra all-gather, held the whole step) or owner (the unit
    /// of the module defining it, gathered again where another unit reads it).
    #[arg(long, value_name = "RULE", default_value = "root")]
    pub shared_params: String,
    /// Keep parameter and gradient shards and optimizer state in host
    /// memory, copied to the device before each all-gather and back after
    /// each reduce-scatter on a separate copy stream; the optimizer runs on
    /// the host (PyTorch's `CPUOffload(offload_params=True)`; sharded
    /// strategies only). Alone: every unit (all); every:K (every K-th
    /// non-root unit from the first); paths:a,b (units by module path,
    /// `root` for the root unit); kind:CLASS.
    #[arg(
        long,
        value_name = "WHICH",
        num_args = 0..=1,
        default_missing_value = "all"
    )]
    pub cpu_offload: Option<String>,
    /// With --cpu-offload, what the offloaded units keep on the host:
    /// params (shards, gradients and optimizer state, the optimizer on the
    /// host: FSDP1's offload_params=True, DeepSpeed's offload_param) or
    /// optimizer (the optimizer state only, staged to the device for each
    /// step: DeepSpeed's offload_optimizer).
    #[arg(long, value_name = "WHAT")]
    pub offload_what: Option<String>,
    /// How parameter all-gathers travel: native (in the param dtype), fp8
    /// (e4m3 codes with one scale per unit from the group's amax, FSDP2's
    /// float8 all-gather) or int8 (blocks of --wire-block elements, an f32
    /// scale each, ZeRO++ qwZ). Sharded strategies only.
    #[arg(long, value_name = "FORMAT", default_value = "native")]
    pub allgather_wire: String,
    /// How gradient reduce-scatters travel: native or int8 (ZeRO++ qgZ:
    /// each rank's slices quantized blockwise, summed dequantized in rank
    /// order in f32).
    #[arg(long, value_name = "FORMAT", default_value = "native")]
    pub reduce_scatter_wire: String,
    /// The collective rewrite rules the planner may apply (egg, with the
    /// cluster's cost model choosing the form): all, none, or a comma list
    /// of cast-before-gather, hierarchical-all-gather,
    /// hierarchical-reduce-scatter, all-reduce-as-reduce-scatter-all-gather,
    /// bucket-all-gathers (the gathers a stream issues together in one call).
    /// `fsdpc inspect` names the rules that fired.
    #[arg(long, value_name = "RULES", default_value = "all")]
    pub rewrites: String,
    /// Elements per block of the int8 wire formats.
    #[arg(long, value_name = "N", default_value_t = fsdpc_plan::wire::DEFAULT_BLOCK)]
    pub wire_block: u32,
    /// Mixed precision, the common policy: parameters gathered and computed,
    /// gradients reduced and constants held in bf16 or fp16 (f32 master
    /// shards and optimizer state always; fp16 adds a dynamic loss scaler).
    #[arg(long, value_name = "bf16|fp16")]
    pub mixed_precision: Option<String>,
    /// The dtype parameters are gathered and computed in (f32|bf16|fp16);
    /// overrides --mixed-precision.
    #[arg(long, value_name = "DTYPE")]
    pub param_dtype: Option<String>,
    /// The dtype gradients are reduced in (f32 or the param dtype);
    /// overrides --mixed-precision.
    #[arg(long, value_name = "DTYPE")]
    pub reduce_dtype: Option<String>,
    /// The dtype the model's constants (buffers) are cast to; overrides
    /// --mixed-precision.
    #[arg(long, value_name = "DTYPE")]
    pub buffer_dtype: Option<String>,
    /// The fp16 loss scaler's initial scale (default 65536).
    #[arg(long, value_name = "SCALE")]
    pub init_loss_scale: Option<f64>,
    /// Plan even if the peak does not fit the preset's memory.
    #[arg(long)]
    pub no_fit_check: bool,
}

pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Compile(a) => compile::run(a),
        Command::Inspect(a) => inspect::run(a),
        Command::Train(a) => train::run(a),
        Command::Trace(a) => trace::run(a),
        Command::Simulate(a) => simulate::run(a),
        Command::Cluster(a) => simulate::cluster(a),
        Command::Calibrate(a) => calibrate::run(a),
        Command::Compare(a) => compare::run(a),
        Command::Report(a) => report::run(a),
        Command::Export(a) => export::run(a),
    }
}

/// Reads a file, naming it in the error.
pub(crate) fn read_file(path: &Path) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|source| CliError::Io {
        path: path.display().to_string(),
        source,
    })
}

/// Writes `text` to standard output. `println!` would panic when the reader
/// of a pipe has gone; here that is `CliError::BrokenPipe`.
pub(crate) fn print_out(text: &str) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .map_err(CliError::stdout)
}
