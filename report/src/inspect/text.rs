//! `fsdpc inspect`'s text: the summary's header (model, cluster, target,
//! strategy and every setting that differs from the default), the units,
//! the memory per rank with its breakdown, the communication per step,
//! the rewrites that fired and the estimates, in human units.

use super::*;
use fsdpc_plan::readable::{human_bytes, human_count};
use std::fmt::Write;

/// The plan as a table a person can read.
pub fn render_text(plan: &Plan) -> String {
    let s = summary(plan);
    let mut out = String::new();
    header(&mut out, &s);
    weights(&mut out, plan);
    units_table(&mut out, &s);
    frozen_table(&mut out, &s);
    memory_table(&mut out, &s);
    estimates(&mut out, &s);
    out
}

/// Where the parameters' initial values come from, when a checkpoint's
/// tensors give some (`Init::File`): how many, from which files.
fn weights(out: &mut String, plan: &Plan) {
    let mut files: Vec<&str> = Vec::new();
    let mut tensors = 0;
    for p in &plan.training.graph.params {
        if let fsdpc_ir::Init::File { path, .. } = &p.init {
            tensors += 1;
            if !files.contains(&path.as_str()) {
                files.push(path);
            }
        }
    }
    if tensors == 0 {
        return;
    }
    let dir = std::path::Path::new(files[0])
        .parent()
        .map_or_else(String::new, |d| format!(" in {}", d.display()));
    let _ = writeln!(
        out,
        "weights   {tensors} of {} parameters from {} safetensors file(s){dir}, each rank reading its own shards",
        plan.training.graph.params.len(),
        files.len()
    );
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
    if let Some(t) = &s.tensor {
        let _ = writeln!(
            out,
            "tensor    T = {} ({} data ranks): {} layers split (column- then row-parallel, or by vocabulary), {} tensor collectives a step",
            t.degree,
            s.world / t.degree.max(1),
            t.split.len(),
            s.tensor_sums
        );
        match &t.sequence {
            Some(q) => {
                let _ = writeln!(
                    out,
                    "          sequence parallel: {} of {} region exits reduce-scatter into row chunks; the norms and residual adds between run on chunks, {} gathered whole for ops that do not",
                    q.scattered,
                    q.scattered + q.whole,
                    q.gathered
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "          sequence parallel off: the activations between regions are whole on every member"
                );
            }
        }
        if let Some(v) = &t.vocabulary_padded {
            let pad = v.padded.saturating_sub(v.vocabulary);
            let _ = writeln!(
                out,
                "          vocabulary {} padded to {} ({} × {}): the last member's part ends in {pad} padding {}, zeros no token reads and the loss leaves out",
                v.vocabulary,
                v.padded,
                t.degree,
                v.padded / u64::from(t.degree.max(1)),
                if pad == 1 { "entry" } else { "entries" },
            );
        }
        for r in &t.split {
            let _ = writeln!(out, "          split       {r}");
        }
        for r in &t.replicated {
            let _ = writeln!(out, "          replicated  {r}");
        }
    }
    optimizer_line(out, &s.optimizer);
    let t = s.tensor.as_ref().map_or(1, |t| t.degree.max(1));
    let groups = s.world / t / s.shard_factor.max(1);
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
            "checkpoint activations ({}) of {} of {} non-root units, each re-running {} in its backward: {}",
            s.activation_checkpointing.name(),
            s.checkpointed_units.len(),
            s.units.len().saturating_sub(1),
            if s.activation_checkpointing == fsdpc_plan::CheckpointPolicy::Ops {
                "its forward but attention and every other matrix product"
            } else {
                "its forward"
            },
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
    if let Some(n) = s.eval_instructions {
        let _ = writeln!(
            out,
            "eval      the first {n} instructions (forward to the loss, no gradients), \
             {:.6} s a batch (`train --eval-data`)",
            s.eval_s
        );
    }
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

/// The one figure a rank holds (`memory.rank_bytes`, "peak per rank", as
/// `compile` and `train` print it), then its parts: each arena's live peak
/// by buffer kind, and the matrix library's heap.
fn memory_table(out: &mut String, s: &Summary) {
    let outside: u64 = s.outside_arena.iter().map(|o| o.bytes).sum();
    let fits = if s.peak_bytes_per_rank + outside <= s.capacity_bytes {
        "fits"
    } else {
        "DOES NOT FIT"
    };
    let (device, parts) = if s.cpu_offload {
        (
            "device arena",
            format!(
                "device arena {} + host arena {} + heap {}",
                human_bytes(s.arena_bytes),
                human_bytes(s.host_arena_bytes),
                human_bytes(s.heap_bytes)
            ),
        )
    } else if s.heap_bytes > 0 {
        (
            "arena",
            format!(
                "arena {} + heap {}",
                human_bytes(s.arena_bytes),
                human_bytes(s.heap_bytes)
            ),
        )
    } else {
        // A GPU plan: its products are cuBLAS calls, with no CPU heap.
        ("arena", format!("arena {}", human_bytes(s.arena_bytes)))
    };
    let _ = writeln!(
        out,
        "\npeak per rank {}: {parts}",
        human_bytes(s.rank_bytes)
    );
    let capacity = if outside > 0 {
        format!(
            "capacity {}, less {} outside the arena",
            human_bytes(s.capacity_bytes),
            human_bytes(outside)
        )
    } else {
        format!("capacity {}", human_bytes(s.capacity_bytes))
    };
    let _ = writeln!(
        out,
        "{device} {}: live peak {} at instruction {} ({capacity}: {fits})",
        human_bytes(s.arena_bytes),
        human_bytes(s.peak_bytes_per_rank),
        s.peak_at,
    );
    kinds(out, &s.breakdown);
    if outside > 0 {
        let _ = writeln!(
            out,
            "outside the arena on a GPU (cuda target) {}:",
            human_bytes(outside)
        );
        for o in &s.outside_arena {
            let _ = writeln!(
                out,
                "  {:<68} {:>12}  ({})",
                o.what,
                human_bytes(o.bytes),
                o.source
            );
        }
    }
    if s.cpu_offload {
        let _ = writeln!(
            out,
            "host arena {}: live peak {}",
            human_bytes(s.host_arena_bytes),
            human_bytes(s.host_peak_bytes),
        );
        kinds(out, &s.host_breakdown);
    }
    if s.heap_bytes == 0 {
        return;
    }
    let _ = writeln!(
        out,
        "heap {} (matmul packing, outside the arena{})",
        human_bytes(s.heap_bytes),
        if s.cpu_offload { "s" } else { "" }
    );
}

fn kinds(out: &mut String, breakdown: &[(BufferKind, u64)]) {
    for (kind, bytes) in breakdown {
        let _ = writeln!(
            out,
            "  {:<16} {:>12}",
            format!("{kind:?}"),
            human_bytes(*bytes)
        );
    }
}

/// `optimizer adamw, lr 0.001 (cosine, ...), weight decay 0.1 on 26 of 50
/// parameters (...)`.
fn optimizer_line(out: &mut String, o: &OptimizerSummary) {
    let decay = if o.weight_decay == 0.0 {
        "no weight decay".to_string()
    } else {
        format!(
            "weight decay {} on {} of {} parameters ({} of {} elements; {})",
            o.weight_decay,
            o.decayed_params,
            o.trainable_params,
            human_count(o.decayed_numel),
            human_count(o.trainable_numel),
            if o.decay_all {
                "every one: --weight-decay-all"
            } else {
                "not norms, biases, embeddings"
            }
        )
    };
    let _ = writeln!(
        out,
        "optimizer {}, lr {} ({}), {decay}",
        o.kind,
        o.lr,
        o.lr_schedule.describe()
    );
}

fn estimates(out: &mut String, s: &Summary) {
    let _ = writeln!(
        out,
        "\ncommunication per rank and step: {} ({} all-gathers, {} reduce-scatters, {} all-reduces{})",
        human_bytes(s.comm_bytes_per_step),
        s.all_gathers,
        s.reduce_scatters,
        s.all_reduces,
        match s.tensor_sums {
            0 => String::new(),
            n => format!(", {n} tensor sums"),
        }
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
    for d in &s.by_dimension {
        let _ = writeln!(
            out,
            "  {:<6} dimension: {} per rank and step, {} of it across nodes",
            d.dimension,
            human_bytes(d.bytes_sent),
            human_bytes(d.across_bytes)
        );
    }
    let _ = writeln!(
        out,
        "estimates: step {:.6} s, exposed communication {:.6} s, {:.3} TFLOP/s per rank, MFU {:.1}%",
        s.step_time_s,
        s.exposed_comm_s,
        s.tflops_per_rank,
        s.mfu * 100.0
    );
    let _ = writeln!(
        out,
        "{}",
        flops_line(
            s.model_flops_per_rank_step,
            s.flops_per_rank_step,
            s.mfu,
            s.hfu
        )
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

/// The FLOPs line of `inspect` and `simulate`: model FLOPs (MFU's, no
/// recomputation) and executed FLOPs (HFU's, recomputation counted) per
/// rank and step.
pub fn flops_line(model: f64, executed: f64, mfu: f64, hfu: f64) -> String {
    format!(
        "FLOPs per rank and step: model {:.4e} (MFU {:.1}%), executed {:.4e}, recomputation included (HFU {:.1}%)",
        model,
        mfu * 100.0,
        executed,
        hfu * 100.0
    )
}
