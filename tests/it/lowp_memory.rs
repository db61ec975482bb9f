//! The memory of low-precision collectives (`wire`), measured
//! independently (as `tests/it/memory.rs` does): this binary installs the
//! counting allocator. A quantized collective's payloads live in a planned
//! `Wire` scratch buffer, so a rank's measured peak must not exceed the
//! plan's `memory.rank_bytes` and must come within 2% of it; and the
//! scratch is what the plan says it is (it is counted, not on the side).

use fsdpc_ir::{DType, Optimizer};
use fsdpc_plan::{BufferKind, Plan, Wire};
use fsdpc_planner::FsdpConfig;
use fsdpc_runtime::{ExecMode, TrainOptions};

const GPT: &str = "gpt:layers=2,hidden=256,heads=4,seq=128,vocab=4096,batch=4";

/// Trains two steps with `cfg` and checks measured <= planned <= measured
/// + 2%.
fn check(world: u32, cfg: &FsdpConfig, what: &str) -> Plan {
    let plan = crate::common::host_plan(GPT, world, cfg, &Optimizer::adamw(1e-3));
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
        "{what} world {world}: measured {measured}, planned {planned} (device arena {}, host \
         arena {}, heap {})",
        m.arena_bytes, m.host_arena_bytes, m.heap_bytes
    );
    eprintln!("{what}");
    assert_eq!(r.planned_peak_bytes, planned, "{what}");
    assert!(
        measured <= planned,
        "a rank allocated more than planned: {what}"
    );
    assert!(
        (planned - measured) as f64 <= 0.02 * planned as f64,
        "the plan overstates the rank's memory by more than 2%: {what}"
    );
    plan
}

fn bf16(ag: Wire, rs: Wire) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: DType::Bf16,
            reduce_dtype: DType::Bf16,
            buffer_dtype: DType::Bf16,
            allgather_wire: ag,
            reduce_scatter_wire: rs,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    }
}

#[test]
fn quantized_collectives_use_the_memory_planned() {
    let fp8 = Wire::parse("fp8", 0).expect("fp8");
    let int8 = Wire::Int8Block { block: 128 };
    for (ag, rs, what) in [
        (fp8, int8, "fp8 gathers, int8 reduce-scatters"),
        (int8, Wire::Native, "int8 gathers"),
    ] {
        let plan = check(2, &bf16(ag, rs), what);
        let scratch = plan
            .buffers
            .iter()
            .filter(|b| b.kind == BufferKind::Wire)
            .count();
        assert!(scratch > 0, "{what}: the plan has wire scratch buffers");
    }
}

/// Partial offload (`--cpu-offload paths:...`, `--offload-what
/// optimizer`): two arenas, device and host, of the sizes planned.
#[test]
fn partial_offload_uses_the_memory_planned() {
    use fsdpc_plan::{OffloadUnits, OffloadWhat};
    for (which, what) in [
        ("paths:transformer.h.0", OffloadWhat::Params),
        ("all", OffloadWhat::Optimizer),
    ] {
        let cfg = FsdpConfig {
            settings: fsdpc_plan::Settings {
                cpu_offload: true,
                offload_what: what,
                ..fsdpc_plan::Settings::default()
            },
            offload_units: OffloadUnits::parse(which).expect("selection"),
            ..FsdpConfig::default()
        };
        let plan = check(2, &cfg, &format!("offload {which} {what:?}"));
        assert!(plan.memory.host_arena_bytes > 0);
    }
}
