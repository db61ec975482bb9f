//! Read a plan written by `fsdpc compile ... -o plan.json` from Rust: the
//! plan is a serde type (`fsdpc::planner::Plan`), and `Plan::from_json`
//! parses it, checks its schema version and validates it. Prints, per unit,
//! its all-gathers and the bytes they gather in a step, then the peak memory
//! of a rank; `examples/read_plan.py` does the same from Python.
//!
//! ```sh
//! fsdpc compile gpt2 --world 8 -o plan.json
//! cargo run --example read_plan -- plan.json
//! ```

use fsdpc::plan::Collective;
use fsdpc::plan::{InstrOp, Plan};
use std::error::Error;
use std::fmt::Write;

/// The report of the plan in `json`.
pub fn run(json: &str) -> Result<String, Box<dyn Error>> {
    let plan = Plan::from_json(json)?;
    let mut out = String::new();
    writeln!(
        out,
        "{:>4}  {:<24} {:>11} {:>20}",
        "unit", "module", "all-gathers", "gathered bytes/step"
    )?;
    for unit in &plan.units {
        let mut gathers = 0;
        let mut bytes = 0;
        for ins in &plan.instructions {
            if let InstrOp::AllGather {
                c: Collective { unit: u, dst, .. },
                ..
            } = &ins.op
            {
                if *u == unit.id {
                    gathers += 1;
                    bytes += plan.buffers.get(dst.index()).map_or(0, |b| b.bytes);
                }
            }
        }
        let module = if unit.module.is_empty() {
            "(root)"
        } else {
            &unit.module
        };
        writeln!(
            out,
            "{:>4}  {:<24} {:>11} {:>20}",
            unit.id.0, module, gathers, bytes
        )?;
    }
    writeln!(out, "peak bytes per rank: {}", plan.memory.peak_bytes)?;
    Ok(out)
}

fn main() -> Result<(), Box<dyn Error>> {
    let path = std::env::args()
        .nth(1)
        .ok_or("usage: read_plan PLAN.json (written by `fsdpc compile ... -o PLAN.json`)")?;
    let json = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    print!("{}", run(&json)?);
    Ok(())
}
