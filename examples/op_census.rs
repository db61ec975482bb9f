//! Prints the kernels of the throughput target's plan by op, with their
//! output elements per step: `cargo run --release -p fsdpc-runtime --example op_census`.

use fsdpc_ir::{build_training_program, Optimizer};
use fsdpc_plan::{InstrOp, ModelInfo};
use fsdpc_planner::{compile, count_params, FsdpConfig};
use std::collections::BTreeMap;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let m =
        fsdpc_frontends::zoo::build("gpt:layers=2,hidden=128,heads=4,seq=128,vocab=1024,batch=8")?;
    let prog = build_training_program(m.graph, m.loss, Optimizer::adamw(1e-3))?;
    let model = ModelInfo {
        name: m.name.clone(),
        params: count_params(&prog),
        tokens_per_rank_step: 1024,
    };
    let plan = compile(
        prog,
        model,
        &fsdpc_planner::preset("cpu-local", 2, 2)?,
        &FsdpConfig::default(),
    )?;
    let g = &plan.training.graph;
    let mut by: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for i in &plan.instructions {
        if let InstrOp::Kernel { node, .. } = &i.op {
            let n = g.node(*node);
            let e = by.entry(n.op.name()).or_default();
            e.0 += 1;
            e.1 += n.outputs.iter().map(|t| t.numel()).sum::<u64>();
        }
    }
    for (op, (count, elems)) in by {
        println!("{op:28} {count:4} kernels {elems:10} output elements");
    }
    Ok(())
}
