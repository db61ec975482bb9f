//! CPU offload's memory, measured independently (as `tests/it/memory.rs` does
//! without offload): this binary installs the counting allocator, which
//! attributes every heap byte to the rank whose threads allocated it. An
//! offloaded rank holds two arenas, device and host; its measured peak
//! must not exceed the plan's `memory.rank_bytes` (device arena + host
//! arena + the matrix library's heap) and must come within 2% of it.

use fsdpc_ir::Optimizer;
use fsdpc_plan::Strategy;
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::{ExecMode, TrainOptions};

const GPT: &str = "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=4096,batch=4";

/// Trains an offloaded plan and checks measured <= planned <= measured + 2%.
fn check(world: u32, strategy: Strategy, shard_factor: Option<u32>) {
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy,
            cpu_offload: true,
            ..fsdpc_plan::Settings::default()
        },
        shard_factor,
        ..FsdpConfig::default()
    };
    let plan = crate::common::host_plan(GPT, world, &cfg, &Optimizer::adamw(1e-3));
    let opts = TrainOptions {
        steps: 2,
        seed: 3,
        mode: ExecMode::Arena,
        ..TrainOptions::default()
    };
    let r = fsdpc_runtime::train(&plan, &opts, &mut |_| {}).expect("training runs");
    let m = &plan.memory;
    let planned = m.rank_bytes;
    let measured = r
        .measured_peak_bytes
        .expect("the counting allocator is installed in this test binary");
    let what = format!(
        "world {world} {strategy:?} F {shard_factor:?} offloaded: measured {measured}, planned {planned} \
         (device arena {}, host arena {}, heap {})",
        m.arena_bytes, m.host_arena_bytes, m.heap_bytes
    );
    eprintln!("{what}");
    assert!(m.host_arena_bytes > 0, "{what}");
    assert_eq!(planned, m.arena_bytes + m.host_arena_bytes + m.heap_bytes);
    assert_eq!(r.planned_peak_bytes, planned, "{what}");
    assert!(
        measured <= planned,
        "a rank allocated more than planned: {what}"
    );
    assert!(
        (planned - measured) as f64 <= 0.02 * planned as f64,
        "the plan overstates the rank's memory by more than 2%: {what}"
    );
}

#[test]
fn gpt_full_shard_world_2_offloaded() {
    check(2, Strategy::FullShard, None);
}

#[test]
fn gpt_full_shard_world_4_offloaded() {
    check(4, Strategy::FullShard, None);
}

#[test]
fn gpt_hybrid_2x2_offloaded() {
    check(4, Strategy::HybridShard, Some(2));
}
