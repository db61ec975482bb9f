//! Summaries of a plan for people (`fsdpc inspect`): a serialisable
//! `Summary` and a text rendering with human units.

use fsdpc_plan::*;
use serde::Serialize;
use std::fmt::Write;

/// What `fsdpc inspect` shows, as data.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    pub model: String,
    pub params: u64,
    pub preset: String,
    pub world: u32,
    pub ranks_per_node: u32,
    /// The target the plan was made for (`threads`, `mpi`, `cuda`).
    pub target: String,
    pub strategy: String,
    pub shard_factor: u32,
    /// What non-root units do with gathered parameters after forward.
    pub reshard_after_forward: ReshardAfterForward,
    /// Units with their own `reshard_after_forward` (module path, setting).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unit_reshard: Vec<(String, ReshardAfterForward)>,
    pub forward_prefetch: bool,
    pub prefetch_depth: u32,
    /// How `fsdpc compile --auto` chose the configuration (absent: the
    /// user chose it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto: Option<AutoRecord>,
    /// Micro-batches per optimizer step.
    pub grad_accum: u32,
    /// Whether gradients are reduced once per step (`no_sync`).
    pub no_sync: bool,
    pub wrap: WrapPolicy,
    pub backward_prefetch: BackwardPrefetch,
    pub limit_all_gathers: u32,
    pub activation_checkpointing: CheckpointPolicy,
    /// Module paths of the units that recompute their forward in backward.
    pub checkpointed_units: Vec<String>,
    /// The total gradient norm gradients are clipped to (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm: Option<f64>,
    /// The mixed-precision policy (absent: everything f32).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub precision: Option<PrecisionSummary>,
    /// The `--freeze` patterns (empty: every parameter trainable).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub freeze: Vec<String>,
    /// Where parameters read by several units live.
    pub shared_params: SharedParams,
    /// Bytes per rank that frozen parameters would have taken as gradient
    /// shards (full_shard) and optimizer state, and that the plan does not
    /// allocate.
    #[serde(skip_serializing_if = "is_zero")]
    pub frozen_saved_bytes: u64,
    pub peak_bytes_per_rank: u64,
    /// Instruction index of the peak.
    pub peak_at: u32,
    pub arena_bytes: u64,
    pub capacity_bytes: u64,
    /// Live bytes at the peak, by buffer kind.
    pub breakdown: Vec<(BufferKind, u64)>,
    /// What the matrix-product library allocates at most outside the arena.
    pub heap_bytes: u64,
    /// Arena plus that heap: the most a rank holds during a step.
    pub rank_bytes: u64,
    /// Shards and optimizer state in host memory (`cpu_offload`).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cpu_offload: bool,
    /// With `cpu_offload`, the module paths of the offloaded units when not
    /// every unit is (`root` for the root unit; empty: every unit).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub offloaded_units: Vec<String>,
    /// With `cpu_offload`, what the offloaded units keep on the host.
    #[serde(skip_serializing_if = "OffloadWhat::is_params")]
    pub offload_what: OffloadWhat,
    /// How parameter all-gathers travel (`wire`; absent: native).
    #[serde(skip_serializing_if = "Wire::is_native")]
    pub allgather_wire: Wire,
    /// How gradient reduce-scatters travel (absent: native).
    #[serde(skip_serializing_if = "Wire::is_native")]
    pub reduce_scatter_wire: Wire,
    /// The collective rewrites: the rules allowed and those that fired.
    pub rewrites: fsdpc_plan::RewriteReport,
    /// Peak of host memory per rank (`cpu_offload`; 0 without).
    #[serde(skip_serializing_if = "is_zero")]
    pub host_peak_bytes: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub host_arena_bytes: u64,
    /// Host bytes by buffer kind (all host buffers are persistent).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub host_breakdown: Vec<(BufferKind, u64)>,
    /// Bytes copied host -> device and device -> host per rank and step.
    #[serde(skip_serializing_if = "is_zero")]
    pub copied_to_device_bytes: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub copied_to_host_bytes: u64,
    /// The host <-> device bandwidth the estimates charge copies at.
    pub host_bw: f64,
    pub units: Vec<UnitSummary>,
    pub comm_bytes_per_step: u64,
    /// Collectives by operation and group: count and bytes sent per rank
    /// per step, inside a node or across nodes.
    pub traffic: Vec<crate::cost::Traffic>,
    /// Bytes a rank sends per step in groups that span nodes.
    pub inter_node_bytes: u64,
    pub all_gathers: usize,
    pub reduce_scatters: usize,
    pub all_reduces: usize,
    pub instructions: usize,
    pub instructions_per_stream: Vec<(Stream, usize)>,
    pub buffers: usize,
    pub events: u32,
    pub flops_per_rank_step: f64,
    pub step_time_s: f64,
    pub exposed_comm_s: f64,
    pub tflops_per_rank: f64,
    pub mfu: f64,
}

/// One unit's line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct UnitSummary {
    pub id: UnitId,
    pub module: String,
    pub kind: String,
    /// Number of original parameters in the unit.
    pub params: usize,
    pub flat_numel: u64,
    pub padded_numel: u64,
    pub shard_numel: u64,
    /// Elements of frozen parameters (not padded).
    #[serde(skip_serializing_if = "is_zero")]
    pub frozen_numel: u64,
    /// Elements of each rank's gradient shard and of each optimizer-state
    /// slot (the trainable part of its shard).
    pub trainable_shard_numel: u64,
}

fn is_zero(x: &u64) -> bool {
    *x == 0
}

/// Bytes per rank of gradient shards and optimizer state that frozen
/// parameters do not take: each unit's frozen part of the shard, times one
/// gradient shard (when sharded) plus the optimizer's state slots, in f32.
fn frozen_saved_bytes(plan: &Plan) -> u64 {
    let slots = plan.training.optimizer.state_slots() as u64;
    let grads = u64::from(plan.config.shard_factor > 1);
    plan.units
        .iter()
        .map(|u| (u.shard_numel - u.trainable_shard_numel()) * 4 * (slots + grads))
        .sum()
}

/// A mixed-precision policy as `inspect` shows it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PrecisionSummary {
    pub param_dtype: fsdpc_ir::DType,
    pub reduce_dtype: fsdpc_ir::DType,
    pub buffer_dtype: fsdpc_ir::DType,
    /// The fp16 dynamic loss scaler (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<LossScaler>,
}

/// The module paths of the offloaded units when `cpu_offload` offloads
/// only some (empty when it offloads every unit or none).
fn partial_offload(plan: &Plan) -> Vec<String> {
    let on: Vec<String> = plan
        .units
        .iter()
        .filter(|u| plan.unit_offload(u.id).is_some())
        .map(|u| {
            if u.module.is_empty() {
                "root".to_string()
            } else {
                u.module.clone()
            }
        })
        .collect();
    if on.len() == plan.units.len() {
        Vec::new()
    } else {
        on
    }
}

fn precision_summary(plan: &Plan) -> Option<PrecisionSummary> {
    let c = &plan.config;
    let f32 = fsdpc_ir::DType::F32;
    if (c.param_dtype, c.reduce_dtype, c.buffer_dtype) == (f32, f32, f32) {
        return None;
    }
    Some(PrecisionSummary {
        param_dtype: c.param_dtype,
        reduce_dtype: c.reduce_dtype,
        buffer_dtype: c.buffer_dtype,
        loss_scaler: c.loss_scaler.clone(),
    })
}

/// The summary of `plan`.
pub fn summary(plan: &Plan) -> Summary {
    let count = |f: fn(&InstrOp) -> bool| plan.instructions.iter().filter(|i| f(&i.op)).count();
    // The offload stream is listed only when the plan offloads, so other
    // plans read as before.
    let per_stream = Stream::ALL
        .iter()
        .filter(|&&s| s != Stream::Offload || plan.config.cpu_offload)
        .map(|&s| {
            (
                s,
                plan.instructions.iter().filter(|i| i.stream == s).count(),
            )
        })
        .collect();
    let e = &plan.estimates;
    let traffic = crate::cost::traffic(plan, &plan.cluster);
    Summary {
        model: plan.model.name.clone(),
        params: plan.model.params,
        preset: plan.cluster.name.clone(),
        world: plan.cluster.world,
        ranks_per_node: plan.cluster.ranks_per_node,
        target: plan.config.target.clone(),
        strategy: plan.config.strategy.name().to_string(),
        shard_factor: plan.config.shard_factor,
        reshard_after_forward: plan.config.reshard_after_forward,
        unit_reshard: plan
            .units
            .iter()
            .filter_map(|u| u.reshard_after_forward.map(|r| (u.module.clone(), r)))
            .collect(),
        forward_prefetch: plan.config.forward_prefetch,
        prefetch_depth: plan.config.prefetch_depth,
        auto: plan.config.auto.clone(),
        grad_accum: plan.config.grad_accum,
        no_sync: plan.config.no_sync,
        wrap: plan.config.wrap.clone(),
        backward_prefetch: plan.config.backward_prefetch,
        limit_all_gathers: plan.config.limit_all_gathers,
        activation_checkpointing: plan.config.activation_checkpointing.clone(),
        checkpointed_units: plan
            .config
            .checkpointed_units
            .iter()
            .filter_map(|u| plan.units.get(u.0 as usize))
            .map(|u| u.module.clone())
            .collect(),
        clip_grad_norm: plan.config.clip_grad_norm,
        precision: precision_summary(plan),
        freeze: plan.config.freeze.clone(),
        shared_params: plan.config.shared_params,
        frozen_saved_bytes: frozen_saved_bytes(plan),
        peak_bytes_per_rank: plan.memory.peak_bytes,
        peak_at: plan.memory.peak_at,
        arena_bytes: plan.memory.arena_bytes,
        capacity_bytes: plan.cluster.memory_bytes,
        breakdown: plan.memory.breakdown.clone(),
        heap_bytes: plan.memory.heap_bytes,
        rank_bytes: plan.memory.rank_bytes,
        cpu_offload: plan.config.cpu_offload,
        offloaded_units: partial_offload(plan),
        offload_what: plan.config.offload_what,
        allgather_wire: plan.config.allgather_wire,
        reduce_scatter_wire: plan.config.reduce_scatter_wire,
        rewrites: plan.rewrites.clone(),
        host_peak_bytes: plan.memory.host_peak_bytes,
        host_arena_bytes: plan.memory.host_arena_bytes,
        host_breakdown: host_breakdown(plan),
        copied_to_device_bytes: copied_bytes(plan, Location::Device),
        copied_to_host_bytes: copied_bytes(plan, Location::Host),
        host_bw: plan.cluster.hardware.host_bw,
        units: plan.units.iter().map(unit_summary).collect(),
        comm_bytes_per_step: e.comm_bytes_per_step,
        inter_node_bytes: traffic.iter().map(|t| t.across_bytes).sum(),
        traffic,
        all_gathers: count(|op| matches!(op, InstrOp::AllGather { .. })),
        reduce_scatters: count(|op| matches!(op, InstrOp::ReduceScatter { .. })),
        all_reduces: count(|op| {
            matches!(
                op,
                InstrOp::AllReduce { .. }
                    | InstrOp::NormAllReduce { .. }
                    | InstrOp::FoundInfAllReduce { .. }
            )
        }),
        instructions: plan.instructions.len(),
        instructions_per_stream: per_stream,
        buffers: plan.buffers.len(),
        events: plan.events,
        flops_per_rank_step: e.flops_per_rank_step,
        step_time_s: e.step_time_s,
        exposed_comm_s: e.exposed_comm_s,
        tflops_per_rank: e.tflops_per_rank,
        mfu: e.mfu,
    }
}

fn unit_summary(u: &Unit) -> UnitSummary {
    UnitSummary {
        id: u.id,
        module: if u.module.is_empty() {
            "(root)".into()
        } else {
            u.module.clone()
        },
        kind: u.kind.clone(),
        params: u.params.len(),
        flat_numel: u.flat_numel,
        padded_numel: u.padded_numel,
        shard_numel: u.shard_numel,
        frozen_numel: u
            .params
            .iter()
            .filter(|p| !p.requires_grad)
            .map(|p| p.numel)
            .sum(),
        trainable_shard_numel: u.trainable_shard_numel(),
    }
}

/// Bytes in binary units: `512 B`, `1.50 KiB`, `13.50 GiB`.
pub fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut x = b as f64;
    let mut i = 0;
    while x >= 1024.0 && i + 1 < UNITS.len() {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{x:.2} {}", UNITS[i])
    }
}

/// Counts in decimal units: `950`, `12.3 K`, `1.81 B`.
pub fn human_count(n: u64) -> String {
    match n {
        0..1_000 => n.to_string(),
        1_000..1_000_000 => format!("{:.1} K", n as f64 / 1e3),
        1_000_000..1_000_000_000 => format!("{:.2} M", n as f64 / 1e6),
        _ => format!("{:.2} B", n as f64 / 1e9),
    }
}

/// The plan as a table a person can read.
pub fn render_text(plan: &Plan) -> String {
    let s = summary(plan);
    let mut out = String::new();
    header(&mut out, &s);
    units_table(&mut out, &s);
    frozen_table(&mut out, &s);
    memory_table(&mut out, &s);
    estimates(&mut out, &s);
    out
}

/// Host bytes by buffer kind.
fn host_breakdown(plan: &Plan) -> Vec<(BufferKind, u64)> {
    let mut by_kind: std::collections::BTreeMap<BufferKind, u64> = Default::default();
    for b in plan.buffers.iter().filter(|b| b.location == Location::Host) {
        *by_kind.entry(b.kind).or_default() += b.bytes;
    }
    by_kind.into_iter().collect()
}

/// Bytes the plan's copies move into `to` per step.
fn copied_bytes(plan: &Plan, to: Location) -> u64 {
    plan.instructions
        .iter()
        .filter_map(|i| match i.op {
            InstrOp::Copy { dst, .. } => plan.buffers.get(dst.index()),
            _ => None,
        })
        .filter(|b| b.location == to)
        .map(|b| b.bytes)
        .sum()
}

fn header(out: &mut String, s: &Summary) {
    let _ = writeln!(
        out,
        "model     {} ({} parameters)",
        s.model,
        human_count(s.params)
    );
    let _ = writeln!(
        out,
        "cluster   {} x {} ranks per node = world {} ({})",
        s.world / s.ranks_per_node.max(1),
        s.ranks_per_node,
        s.world,
        s.preset
    );
    let _ = writeln!(out, "target    {}", s.target);
    let _ = writeln!(
        out,
        "strategy  {} (F = {}), wrap {}, backward prefetch {}, limit_all_gathers {}",
        s.strategy,
        s.shard_factor,
        wrap_text(&s.wrap),
        format!("{:?}", s.backward_prefetch).to_lowercase(),
        s.limit_all_gathers
    );
    let groups = s.world / s.shard_factor.max(1);
    if groups > 1 && s.shard_factor > 1 {
        let _ = writeln!(
            out,
            "hybrid    {groups} replica groups of F = {} ranks: gradient shards all-reduced across the groups",
            s.shard_factor
        );
    }
    // Shown only when not the defaults, so other plans read as before.
    let reshard = match s.reshard_after_forward {
        ReshardAfterForward::Full => None,
        ReshardAfterForward::Keep if s.shard_factor > 1 => {
            Some("gathered parameters kept from forward to backward".to_string())
        }
        ReshardAfterForward::Keep => None,
        ReshardAfterForward::To(n) => Some(format!(
            "each rank keeps a 1/{n} slice after forward; backward gathers over {n} ranks"
        )),
    };
    if let Some(r) = reshard {
        let _ = writeln!(out, "reshard   after forward: {r}");
    }
    if let Some(a) = &s.auto {
        let _ = writeln!(
            out,
            "chosen    by fsdpc compile --auto: the fastest of {} candidates that fits ({} compiled, {} screened without compiling, {} pruned by the memory bound, {} by a time bound); searched {}",
            a.candidates,
            a.compiled,
            a.screened,
            a.pruned_by_memory,
            a.pruned_by_time,
            if a.searched.is_empty() {
                "nothing (every dimension given)".to_string()
            } else {
                a.searched
                    .iter()
                    .map(|s| s.split(':').next().unwrap_or(s))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    }
    if !s.unit_reshard.is_empty() {
        let own: Vec<String> = s
            .unit_reshard
            .iter()
            .map(|(m, r)| format!("{m}={}", r.name()))
            .collect();
        let _ = writeln!(
            out,
            "reshard   after forward, units' own settings: {}",
            own.join(", ")
        );
    }
    if s.grad_accum > 1 {
        let how = if s.no_sync {
            "unsharded gradients accumulated across them and reduced once per step (no_sync): fewer bytes reduced, every unit's flat gradient held until the last micro-batch"
        } else {
            "gradients reduced every micro-batch and added into the gradient shard: K times the bytes reduced, one flat gradient at a time"
        };
        let _ = writeln!(
            out,
            "accumulate {} micro-batches per optimizer step, {how}",
            s.grad_accum
        );
    }
    if !s.forward_prefetch || s.prefetch_depth != 1 {
        let _ = writeln!(
            out,
            "prefetch  forward {}, depth {}",
            if s.forward_prefetch {
                "on"
            } else {
                "off (at first use)"
            },
            s.prefetch_depth
        );
    }
    // Shown only when on, so tables of plans without it read as before.
    if !s.checkpointed_units.is_empty() {
        let _ = writeln!(
            out,
            "checkpoint activations ({}) of {} of {} non-root units, each re-running its forward in its backward: {}",
            s.activation_checkpointing.name(),
            s.checkpointed_units.len(),
            s.units.len().saturating_sub(1),
            s.checkpointed_units.join(", ")
        );
    }
    if s.shared_params == SharedParams::Owner {
        let _ = writeln!(
            out,
            "shared parameters owned by the unit of their module, gathered again where another unit reads them (--shared-params owner)"
        );
    }
    if let Some(x) = s.clip_grad_norm {
        let how = if s.shard_factor > 1 {
            "the squared norms of the gradient shards summed by one 4-byte all-reduce"
        } else {
            "each rank holds the whole reduced gradient, no collective"
        };
        let _ = writeln!(
            out,
            "clip gradients to total L2 norm {x} before each optimizer step ({how})"
        );
    }
    if let Some(p) = &s.precision {
        precision_lines(out, p);
    }
    if !(s.allgather_wire.is_native() && s.reduce_scatter_wire.is_native()) {
        let describe = |w: &Wire| match w {
            Wire::Native => "native".to_string(),
            Wire::Fp8E4m3 { .. } => "fp8 e4m3 (one scale per unit, from the group's amax)".into(),
            Wire::Int8Block { block } => format!("int8 (blocks of {block}, an f32 scale each)"),
        };
        let _ = writeln!(
            out,
            "wire      all-gathers {}, reduce-scatters {}; payloads in Wire scratch buffers",
            describe(&s.allgather_wire),
            describe(&s.reduce_scatter_wire)
        );
    }
    rewrite_lines(out, &s.rewrites);
    if s.cpu_offload {
        let which = if s.offloaded_units.is_empty() {
            String::new()
        } else {
            format!(
                "{} of {} units ({}): ",
                s.offloaded_units.len(),
                s.units.len(),
                s.offloaded_units.join(", ")
            )
        };
        let what = match s.offload_what {
            OffloadWhat::Params => format!(
                "shards and optimizer state in host memory, optimizer on the host; per step {} in before the all-gathers, {} out after the reductions",
                human_bytes(s.copied_to_device_bytes),
                human_bytes(s.copied_to_host_bytes),
            ),
            OffloadWhat::Optimizer => format!(
                "optimizer state in host memory, staged to the device for each optimizer step; per step {} in, {} out",
                human_bytes(s.copied_to_device_bytes),
                human_bytes(s.copied_to_host_bytes),
            ),
        };
        let _ = writeln!(
            out,
            "offload   {which}{what} (offload stream, {:.1} GB/s)",
            s.host_bw / 1e9
        );
    }
    let streams: Vec<String> = s
        .instructions_per_stream
        .iter()
        .map(|(st, n)| format!("{st:?} {n}").to_lowercase())
        .collect();
    let _ = writeln!(
        out,
        "schedule  {} instructions ({}), {} buffers, {} events",
        s.instructions,
        streams.join(", "),
        s.buffers,
        s.events
    );
}

/// The policy: what is computed, communicated and kept in which dtype.
fn precision_lines(out: &mut String, p: &PrecisionSummary) {
    let _ = writeln!(
        out,
        "precision parameters gathered and computed in {} ({} bytes per element on the wire and in memory), \
         gradients reduced in {}, constants in {}; f32 master shards, gradient shards and optimizer state; \
         the loss in f32",
        p.param_dtype,
        p.param_dtype.size(),
        p.reduce_dtype,
        p.buffer_dtype
    );
    if let Some(l) = &p.loss_scaler {
        let _ = writeln!(
            out,
            "loss scaler dynamic: backward seeded with the scale (initially {}), gradients unscaled before \
             clipping and the optimizer; an inf/NaN on any rank (one flag, all-reduced) skips the step and \
             multiplies the scale by {}; {} good steps in a row multiply it by {}",
            l.init_scale, l.backoff_factor, l.growth_interval, l.growth_factor
        );
    }
}

fn wrap_text(w: &WrapPolicy) -> String {
    match w {
        WrapPolicy::Blocks => "blocks".into(),
        WrapPolicy::Kind { kind } => format!("kind:{kind}"),
        WrapPolicy::Size { min_numel } => format!("size:{min_numel}"),
        WrapPolicy::Paths { paths } => format!("paths:{}", paths.join(",")),
    }
}

fn units_table(out: &mut String, s: &Summary) {
    let _ = writeln!(out, "\nunits");
    let _ = writeln!(
        out,
        "  {:>4}  {:<28} {:<18} {:>6} {:>12} {:>12} {:>12}",
        "id", "module", "kind", "params", "elements", "padded", "shard/rank"
    );
    for u in &s.units {
        let _ = writeln!(
            out,
            "  {:>4}  {:<28} {:<18} {:>6} {:>12} {:>12} {:>12}",
            u.id.0,
            u.module,
            u.kind,
            u.params,
            human_count(u.flat_numel),
            human_count(u.padded_numel),
            human_bytes(u.shard_numel * 4)
        );
    }
}

/// Trainable and frozen elements per unit; shown only when some parameter
/// is frozen, so tables of other plans read as before.
fn frozen_table(out: &mut String, s: &Summary) {
    let frozen: u64 = s.units.iter().map(|u| u.frozen_numel).sum();
    if frozen == 0 && s.freeze.is_empty() {
        return;
    }
    let total: u64 = s.units.iter().map(|u| u.flat_numel).sum();
    // Frozen by `--freeze`, or by the model itself (a LoRA zoo spec).
    let how = if s.freeze.is_empty() {
        "requires_grad false in the model".to_string()
    } else {
        format!("--freeze {}", s.freeze.join(","))
    };
    let _ = writeln!(
        out,
        "
frozen parameters ({how}): {} of {} elements; no gradient, reduce-scatter or optimizer state for them, {} per rank not allocated",
        human_count(frozen),
        human_count(total),
        human_bytes(s.frozen_saved_bytes)
    );
    let _ = writeln!(
        out,
        "  {:>4}  {:<28} {:>12} {:>12} {:>16}",
        "id", "module", "trainable", "frozen", "grad shard/rank"
    );
    for u in &s.units {
        let _ = writeln!(
            out,
            "  {:>4}  {:<28} {:>12} {:>12} {:>16}",
            u.id.0,
            u.module,
            human_count(u.flat_numel - u.frozen_numel),
            human_count(u.frozen_numel),
            human_bytes(u.trainable_shard_numel * 4)
        );
    }
}

fn memory_table(out: &mut String, s: &Summary) {
    let fits = if s.peak_bytes_per_rank <= s.capacity_bytes {
        "fits"
    } else {
        "DOES NOT FIT"
    };
    let _ = writeln!(
        out,
        "\n{}memory per rank: peak {} at instruction {} (arena {}, capacity {}: {})",
        if s.cpu_offload { "device " } else { "" },
        human_bytes(s.peak_bytes_per_rank),
        s.peak_at,
        human_bytes(s.arena_bytes),
        human_bytes(s.capacity_bytes),
        fits
    );
    for (kind, bytes) in &s.breakdown {
        let _ = writeln!(
            out,
            "  {:<16} {:>12}",
            format!("{kind:?}"),
            human_bytes(*bytes)
        );
    }
    let _ = writeln!(
        out,
        "  {:<16} {:>12}  (matmul packing, outside the arena)",
        "Heap",
        human_bytes(s.heap_bytes),
    );
    if !s.cpu_offload {
        let _ = writeln!(
            out,
            "rank holds at most {} (arena + heap)",
            human_bytes(s.rank_bytes)
        );
        return;
    }
    let _ = writeln!(
        out,
        "host memory per rank: peak {} (host arena {})",
        human_bytes(s.host_peak_bytes),
        human_bytes(s.host_arena_bytes)
    );
    for (kind, bytes) in &s.host_breakdown {
        let _ = writeln!(
            out,
            "  {:<16} {:>12}",
            format!("{kind:?}"),
            human_bytes(*bytes)
        );
    }
    let _ = writeln!(
        out,
        "rank holds at most {} (device arena + host arena + heap)",
        human_bytes(s.rank_bytes)
    );
}

fn estimates(out: &mut String, s: &Summary) {
    let _ = writeln!(
        out,
        "\ncommunication per rank and step: {} ({} all-gathers, {} reduce-scatters, {} all-reduces)",
        human_bytes(s.comm_bytes_per_step),
        s.all_gathers,
        s.reduce_scatters,
        s.all_reduces
    );
    for t in &s.traffic {
        let _ = writeln!(
            out,
            "  {:<15} {:<10} {:>4} ranks {:<10} x{:<5} {:>12}{}",
            t.op,
            format!("{:?}", t.group).to_lowercase(),
            t.ranks,
            if t.inter_node {
                "inter-node"
            } else {
                "intra-node"
            },
            t.count,
            human_bytes(t.bytes_sent),
            if t.hierarchical > 0 {
                format!(
                    " ({} hierarchical, {} across nodes)",
                    t.hierarchical,
                    human_bytes(t.across_bytes)
                )
            } else {
                String::new()
            }
        );
    }
    let _ = writeln!(
        out,
        "  across nodes: {} per rank and step",
        human_bytes(s.inter_node_bytes)
    );
    let _ = writeln!(
        out,
        "estimates: step {:.6} s, exposed communication {:.6} s, {:.3} TFLOP/s per rank, MFU {:.1}%",
        s.step_time_s,
        s.exposed_comm_s,
        s.tflops_per_rank,
        s.mfu * 100.0
    );
}

/// The `rewrites` line: each rule that fired, on how many collectives, and
/// the time the cost model says it saves per step (each collective alone).
fn rewrite_lines(out: &mut String, r: &fsdpc_plan::RewriteReport) {
    if r.enabled.is_empty() {
        let _ = writeln!(out, "rewrites  none (--rewrites none)");
        return;
    }
    if r.fired.is_empty() {
        let _ = writeln!(
            out,
            "rewrites  none fired ({} allowed; the original forms are the cheapest here)",
            r.enabled.len()
        );
        return;
    }
    let fired: Vec<String> = r
        .fired
        .iter()
        .map(|f| format!("{} x{} (-{})", f.rule, f.count, fmt_secs(f.saved_s)))
        .collect();
    let _ = writeln!(out, "rewrites  {}", fired.join(", "));
    if r.limited > 0 {
        let _ = writeln!(
            out,
            "          {} collective(s) stopped at a runner limit (the best form found was kept)",
            r.limited
        );
    }
}

/// Seconds in the unit that reads best: s, ms or us.
fn fmt_secs(t: f64) -> String {
    if t >= 1.0 {
        format!("{t:.2} s")
    } else if t >= 1e-3 {
        format!("{:.2} ms", t * 1e3)
    } else {
        format!("{:.1} us", t * 1e6)
    }
}
