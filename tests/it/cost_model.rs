//! The calibrated cost model on real plans: how groups lie on nodes and
//! which collective algorithm is chosen, the per-kernel overhead, and
//! stream contention (the event loop agrees with the one-pass simulation
//! when nothing contends, and contention only lengthens the step).

use crate::common;

use fsdpc_plan::cluster::{CollectiveKind, Contention};
use fsdpc_plan::cluster::{PROMOTION_FAMILY, SKINNY_DIM};
use fsdpc_plan::{Cluster, Group, InstrOp, Strategy, Stream};
use fsdpc_planner::cost::{group_layout, matmul_min_dim, traffic};
use fsdpc_planner::simulate::simulate;
use fsdpc_planner::FsdpConfig;

const GPT: &str = "gpt:layers=2,hidden=64,heads=2,seq=32,vocab=256,batch=2";

fn hybrid(shard_factor: u32) -> FsdpConfig {
    FsdpConfig {
        settings: fsdpc_plan::Settings {
            strategy: Strategy::HybridShard,
            ..fsdpc_plan::Settings::default()
        },
        shard_factor: Some(shard_factor),
        ..FsdpConfig::default()
    }
}

#[test]
fn groups_lie_on_nodes_as_the_layout_says() {
    // 16 ranks, 8 per node. Shard groups of 8: one node each; replicas 8
    // apart: one per node.
    let p = common::compile_on(GPT, "a100-80g-roce", 16, 8, &hybrid(8)).expect("plan");
    assert_eq!(group_layout(&p, Group::Shard), (8, 1));
    assert_eq!(group_layout(&p, Group::Replicate), (1, 2));
    // Shard groups of 4: two per node, so a replica group (4 ranks, 4
    // apart) has 2 ranks on each of 2 nodes.
    let p = common::compile_on(GPT, "a100-80g-roce", 16, 8, &hybrid(4)).expect("plan");
    assert_eq!(group_layout(&p, Group::Shard), (4, 1));
    assert_eq!(group_layout(&p, Group::Replicate), (2, 2));
    // full_shard over 16: 8 per node on 2 nodes.
    let p = common::compile_on(GPT, "a100-80g-roce", 16, 8, &FsdpConfig::default()).expect("plan");
    assert_eq!(group_layout(&p, Group::Shard), (8, 2));
    // Across nodes NCCL's one call goes across on 1/8 of the bytes for the
    // gathers and reductions of this plan (the plan's explicit two-level
    // forms do not pay there); inside one node there is only the ring.
    let c = p.cluster.clone();
    let t = traffic(&p, &c);
    assert!(
        t.iter()
            .all(|t| t.inter_node && t.hierarchical == 0 && t.across_bytes < t.bytes_sent / 4),
        "{t:?}"
    );
    // With a flat library the rewrite runs them in two levels.
    let mut flat = fsdpc_planner::preset("a100-80g-roce", 16, 8).unwrap();
    flat.hardware.flat_collectives = true;
    let p2 = common::compile_for(GPT, &flat, &FsdpConfig::default()).unwrap();
    let t = traffic(&p2, &flat);
    assert!(t.iter().all(|t| t.hierarchical > 0), "{t:?}");
    let p = common::compile_on(GPT, "a100-80g-roce", 8, 8, &FsdpConfig::default()).expect("plan");
    let t = traffic(&p, &p.cluster);
    assert!(
        t.iter().all(|t| !t.inter_node && t.hierarchical == 0),
        "{t:?}"
    );
}

fn two_ranks() -> (fsdpc_plan::Plan, Cluster) {
    let p = common::plan_with(GPT, 2, &FsdpConfig::default());
    let c = p.cluster.clone();
    (p, c)
}

#[test]
fn the_event_loop_agrees_with_one_pass_when_nothing_contends() {
    let (p, c) = two_ranks();
    let plain = simulate(&p, &c);
    let mut barely = c.clone();
    // Just above 1: the event loop runs, at (almost) full speed.
    barely.hardware.comm_compute_contention = Some(Contention {
        comm_slowdown: 1.0 + 1e-12,
        compute_slowdown: 1.0,
        ..Contention::default()
    });
    let evented = simulate(&p, &barely);
    assert!(
        (evented.step_time_s - plain.step_time_s).abs() <= 1e-9 * plain.step_time_s,
        "{} vs {}",
        evented.step_time_s,
        plain.step_time_s
    );
    assert!((evented.exposed_comm_s - plain.exposed_comm_s).abs() <= 1e-9 * plain.step_time_s);
    for (i, (a, b)) in evented.end.iter().zip(&plain.end).enumerate() {
        assert!(
            (a - b).abs() <= 1e-9 * plain.step_time_s,
            "instruction {i}: {a} vs {b}"
        );
    }
}

#[test]
fn contention_lengthens_the_step_by_at_most_its_factor() {
    let (p, c) = two_ranks();
    let plain = simulate(&p, &c).step_time_s;
    let mut slow = c.clone();
    slow.hardware.comm_compute_contention = Some(Contention {
        comm_slowdown: 2.0,
        compute_slowdown: 1.5,
        ..Contention::default()
    });
    let contended = simulate(&p, &slow).step_time_s;
    assert!(contended > plain, "{contended} vs {plain}");
    assert!(contended <= 2.0 * plain, "{contended} vs {plain}");
}

#[test]
fn every_kernel_pays_the_overhead() {
    let (p, c) = two_ranks();
    let plain = simulate(&p, &c);
    let mut with = c.clone();
    with.hardware.kernel_overhead_s = 1e-3;
    let slowed = simulate(&p, &with);
    for (i, ins) in p.instructions.iter().enumerate() {
        if matches!(ins.op, InstrOp::Kernel { .. }) {
            let (d0, d1) = (
                plain.end[i] - plain.start[i],
                slowed.end[i] - slowed.start[i],
            );
            assert!(
                (d1 - d0 - 1e-3).abs() < 1e-9,
                "instruction {i}: {d0} -> {d1}"
            );
        }
    }
    let kernels = p
        .instructions
        .iter()
        .filter(|i| i.stream == Stream::Compute && matches!(i.op, InstrOp::Kernel { .. }))
        .count();
    assert!(slowed.step_time_s >= kernels as f64 * 1e-3);
}

#[test]
fn a_measured_fit_sets_the_collective_time() {
    let (p, c) = two_ranks();
    let mut fitted = c.clone();
    for op in CollectiveKind::ALL {
        fitted
            .hardware
            .collective_fits
            .push(fsdpc_plan::cluster::CollectiveFit {
                op,
                ranks: 2,
                latency_s: 0.5,
                bw: 1e30,
                points: Vec::new(),
            });
    }
    let tl = simulate(&p, &fitted);
    for (i, ins) in p.instructions.iter().enumerate() {
        if matches!(
            ins.op,
            InstrOp::AllGather { .. } | InstrOp::ReduceScatter { .. }
        ) {
            assert!(
                ((tl.end[i] - tl.start[i]) - 0.5).abs() < 1e-9,
                "instruction {i}"
            );
        }
    }
}

#[test]
fn skinny_products_use_their_own_curve() {
    let p = common::plan_with(
        "mlp:layers=2,in=256,hidden=256,classes=10,batch=16",
        1,
        &FsdpConfig::default(),
    );
    let c = p.cluster.clone();
    let base = simulate(&p, &c);
    let mut skinny = c.clone();
    skinny.hardware.skinny_matmul_efficiency = vec![(1.0, 0.01)];
    let slowed = simulate(&p, &skinny);
    let g = &p.training.graph;
    let mut products = 0;
    for (i, ins) in p.instructions.iter().enumerate() {
        let InstrOp::Kernel { node, .. } = ins.op else {
            continue;
        };
        let (d0, d1) = (base.end[i] - base.start[i], slowed.end[i] - slowed.start[i]);
        let skinny_product = matches!(g.node(node).op, fsdpc_ir::Op::MatMul { .. })
            && matmul_min_dim(g, node) <= SKINNY_DIM;
        if skinny_product {
            // Batch 16: every product here has a dimension of 16 or 10.
            assert!(d1 > d0, "instruction {i}: {d0} -> {d1}");
            products += 1;
        } else {
            assert!((d0 - d1).abs() <= 1e-12, "instruction {i}: {d0} -> {d1}");
        }
    }
    assert!(products >= 6, "{products}");
}

/// A half-precision matrix product on a cluster that multiplies in f32
/// (`cast:bf16` measured) pays its operands' widening and its output's
/// narrowing: six bytes per half element at that rate; f32 products and
/// every other kernel cost what they did, and without the figure (GPU
/// presets) nothing changes.
#[test]
fn half_products_pay_their_promotion_where_products_run_in_f32() {
    let cfg = FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: fsdpc_ir::DType::Bf16,
            reduce_dtype: fsdpc_ir::DType::Bf16,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let p = common::plan_with(GPT, 1, &cfg);
    let c = p.cluster.clone();
    let base = simulate(&p, &c);
    let mut cpu = c.clone();
    cpu.hardware
        .kernel_bw
        .insert(PROMOTION_FAMILY.to_string(), 6e6);
    let promoted = simulate(&p, &cpu);
    let g = &p.training.graph;
    let half = |t: &fsdpc_ir::TensorType| t.dtype == fsdpc_ir::DType::Bf16;
    let mut products = 0;
    for (i, ins) in p.instructions.iter().enumerate() {
        let InstrOp::Kernel { node, .. } = ins.op else {
            continue;
        };
        let (d0, d1) = (
            base.end[i] - base.start[i],
            promoted.end[i] - promoted.start[i],
        );
        let elements: u64 = g
            .inputs(node)
            .iter()
            .map(|v| g.value_type(*v))
            .chain(g.node(node).outputs.iter())
            .filter(|t| half(t))
            .map(|t| t.numel())
            .sum();
        if matches!(g.node(node).op, fsdpc_ir::Op::MatMul { .. }) && elements > 0 {
            // 6 bytes per element at 6e6 B/s: 1 us each.
            let want = elements as f64 * 1e-6;
            assert!(
                (d1 - d0 - want).abs() < 1e-9,
                "instruction {i}: {d0} -> {d1}"
            );
            products += 1;
        } else if !matches!(g.node(node).op, fsdpc_ir::Op::Cast { .. }) {
            assert!((d0 - d1).abs() <= 1e-12, "instruction {i}: {d0} -> {d1}");
        }
    }
    assert!(products >= 8, "{products}");
}

/// On such a cluster a collective that converts between bf16 and f32 (a
/// mixed-precision gather of the f32 shard, a reduction of bf16
/// gradients) pays the conversion at the cast rate; f32 collectives pay
/// nothing more.
#[test]
fn converting_collectives_pay_the_cast_where_products_run_in_f32() {
    let bf16 = FsdpConfig {
        settings: fsdpc_plan::Settings {
            param_dtype: fsdpc_ir::DType::Bf16,
            reduce_dtype: fsdpc_ir::DType::Bf16,
            ..fsdpc_plan::Settings::default()
        },
        ..FsdpConfig::default()
    };
    let comm = |ins: &fsdpc_plan::Instr| {
        matches!(
            ins.op,
            InstrOp::AllGather { .. } | InstrOp::ReduceScatter { .. }
        )
    };
    for (cfg, converts) in [(bf16, true), (FsdpConfig::default(), false)] {
        let p = common::plan_with(GPT, 2, &cfg);
        let c = p.cluster.clone();
        let mut cpu = c.clone();
        cpu.hardware
            .kernel_bw
            .insert(PROMOTION_FAMILY.to_string(), 1e6);
        let (base, slow) = (simulate(&p, &c), simulate(&p, &cpu));
        let mut seen = 0;
        for (i, _) in p.instructions.iter().enumerate().filter(|(_, i)| comm(i)) {
            let (d0, d1) = (base.end[i] - base.start[i], slow.end[i] - slow.start[i]);
            if converts {
                assert!(d1 > d0, "instruction {i}: {d0} -> {d1}");
            } else {
                assert!((d1 - d0).abs() <= 1e-12, "instruction {i}: {d0} -> {d1}");
            }
            seen += 1;
        }
        assert!(seen >= 4, "{seen}");
    }
}

/// `LoadInput` costs the per-kernel overhead plus its bytes at the rate
/// calibration measured for the built-in data of its kind: float inputs
/// at `load_input`, integer ones at `load_input_int`; without them, at
/// memory bandwidth.
#[test]
fn loading_an_input_costs_its_bytes_at_the_data_rate() {
    let (p, mut c) = two_ranks();
    let loads: Vec<_> = p
        .instructions
        .iter()
        .filter(|i| matches!(i.op, InstrOp::LoadInput { .. }))
        .collect();
    assert!(!loads.is_empty());
    let bytes = |i: &fsdpc_plan::Instr| match &i.op {
        InstrOp::LoadInput { dst, .. } => p.buffers[dst.buffer.index()].bytes as f64,
        _ => unreachable!(),
    };
    for i in &loads {
        let (t, _) = fsdpc_planner::cost::instr_cost(&p, &c, i);
        assert!((t - bytes(i) / c.hardware.mem_bw).abs() <= 1e-15, "{t}");
    }
    c.hardware.kernel_overhead_s = 2e-6;
    c.hardware.kernel_bw.insert("load_input_int".into(), 1e8);
    c.hardware.kernel_bw.insert("load_input".into(), 5e7);
    for i in &loads {
        // The GPT's inputs are token ids and labels: integers.
        let (t, _) = fsdpc_planner::cost::instr_cost(&p, &c, i);
        let want = 2e-6 + bytes(i) / 1e8;
        assert!((t - want).abs() <= 1e-12 * want, "{t} vs {want}");
    }
}
