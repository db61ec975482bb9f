//! What a target (a way to run plans: thread ranks, MPI process ranks,
//! CUDA ranks) can run, as data. The planner reads a target's
//! `Capabilities` and never emits what the target refuses; every target
//! checks a plan against its own before anything starts, naming the
//! instruction it cannot run.

use crate::buffer::Location;
use crate::document::Plan;
use crate::group::CollectiveAlgorithm;
use crate::instr::InstrOp;
use crate::wire::Wire;
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// A wire format without its parameters (`Wire` less its block size).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireFormat {
    Native,
    Fp8,
    Int8,
}

impl WireFormat {
    /// The format of `wire`.
    pub fn of(wire: &Wire) -> WireFormat {
        match wire {
            Wire::Native => WireFormat::Native,
            Wire::Fp8E4m3 { .. } => WireFormat::Fp8,
            Wire::Int8Block { .. } => WireFormat::Int8,
        }
    }
}

/// What one target runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    /// The target's name (`threads`, `mpi`, `cuda`).
    pub target: String,
    /// The forms of collectives it runs (`Ring` always).
    pub algorithms: Vec<CollectiveAlgorithm>,
    /// Whether it runs bucketed all-gathers (one call for several units).
    pub bucketed_gathers: bool,
    /// The wire formats of its all-gathers and reduce-scatters.
    pub wires: Vec<WireFormat>,
    /// Whether it holds host buffers and their copies (CPU offload).
    pub host_buffers: bool,
    /// Whether it runs the fp16 loss scaler (and steps skipped on inf/NaN).
    pub loss_scaler: bool,
    /// Whether it writes and resumes sharded checkpoints.
    pub checkpoints: bool,
    /// Whether it records measured traces (`--trace`).
    pub traces: bool,
    /// Whether it runs the debug allocator (`--debug-alloc`).
    pub debug_alloc: bool,
    /// Whether it hands the trained parameters back at a world over one
    /// (`--save-onnx`, `--save-safetensors`).
    pub saves_sharded: bool,
    /// Whether it runs tensor-parallel plans (the tensor group's sums).
    #[serde(default = "crate::serde_default::yes")]
    pub tensor_parallel: bool,
}

impl Capabilities {
    /// Everything a plan can hold: what the CPU targets run.
    pub fn all(target: &str) -> Capabilities {
        Capabilities {
            target: target.to_string(),
            algorithms: vec![
                CollectiveAlgorithm::Ring,
                CollectiveAlgorithm::Hierarchical,
                CollectiveAlgorithm::ReduceScatterAllGather,
            ],
            bucketed_gathers: true,
            wires: vec![WireFormat::Native, WireFormat::Fp8, WireFormat::Int8],
            host_buffers: true,
            loss_scaler: true,
            checkpoints: true,
            traces: true,
            debug_alloc: true,
            saves_sharded: true,
            tensor_parallel: true,
        }
    }

    /// Whether it runs collectives of form `a`.
    pub fn runs_algorithm(&self, a: CollectiveAlgorithm) -> bool {
        self.algorithms.contains(&a)
    }

    /// Whether it runs wire format `w`.
    pub fn runs_wire(&self, w: &Wire) -> bool {
        self.wires.contains(&WireFormat::of(w))
    }

    /// The first thing in `plan` this target cannot run, in list order
    /// (host buffers first: they are named by the copy that reaches them).
    pub fn check(&self, plan: &Plan) -> Result<(), Refusal> {
        let refuse = |instr: Option<usize>, what: String, reason: String| Refusal {
            target: self.target.clone(),
            instr,
            what,
            reason,
        };
        if !self.host_buffers {
            if let Some(b) = plan.buffers.iter().find(|b| b.location == Location::Host) {
                let i = plan
                    .instructions
                    .iter()
                    .position(|x| matches!(x.op, InstrOp::Copy { .. }));
                return Err(refuse(
                    i,
                    format!("host buffer {} ({:?})", b.id, b.kind),
                    "CPU offload (host buffers and their copies) does not run here; compile without --cpu-offload".into(),
                ));
            }
        }
        for (i, ins) in plan.instructions.iter().enumerate() {
            let algorithm = match &ins.op {
                InstrOp::AllGather { c, .. } | InstrOp::ReduceScatter { c } => Some(c.algorithm),
                InstrOp::AllReduce { algorithm, .. } => Some(*algorithm),
                _ => None,
            };
            if let Some(a) = algorithm.filter(|a| !self.runs_algorithm(*a)) {
                return Err(refuse(
                    Some(i),
                    format!("a collective of form {a:?}"),
                    format!(
                        "it runs {}; compile for this target (--target {})",
                        names(&self.algorithms),
                        self.target
                    ),
                ));
            }
            if let Some(c) = ins.op.collective() {
                if !self.runs_wire(&c.wire) {
                    return Err(refuse(
                        Some(i),
                        format!("a collective on the {} wire format", c.wire.name()),
                        format!(
                            "its collectives travel {}; compile with --allgather-wire native --reduce-scatter-wire native",
                            names(&self.wires)
                        ),
                    ));
                }
            }
            let what = match &ins.op {
                InstrOp::AllGather { bucketed: true, .. } if !self.bucketed_gathers => Some((
                    "a bucketed all-gather",
                    "compile without the bucket-all-gathers rewrite",
                )),
                InstrOp::ScaleSeed { .. }
                | InstrOp::UnscaleGrads { .. }
                | InstrOp::FoundInfAllReduce { .. }
                | InstrOp::UpdateScale { .. }
                    if !self.loss_scaler =>
                {
                    Some((
                        "a loss-scaler instruction",
                        "the fp16 loss scaler does not run here; use --param-dtype bf16",
                    ))
                }
                InstrOp::TensorAllReduce { .. } | InstrOp::TensorChunks { .. }
                    if !self.tensor_parallel =>
                {
                    Some((
                    "a tensor-parallel sum",
                    "tensor parallelism does not run on this target yet; compile without --tensor-parallel",
                    ))
                }
                InstrOp::OptimizerStep {
                    skip_if: Some(_), ..
                } if !self.loss_scaler => Some((
                    "an optimizer step skipped on inf/NaN",
                    "the fp16 loss scaler does not run here; use --param-dtype bf16",
                )),
                _ => None,
            };
            if let Some((what, reason)) = what {
                return Err(refuse(Some(i), what.into(), reason.into()));
            }
        }
        Ok(())
    }
}

fn names<T: std::fmt::Debug>(v: &[T]) -> String {
    let names: Vec<String> = v
        .iter()
        .map(|x| format!("{x:?}").to_ascii_lowercase())
        .collect();
    names.join(", ")
}

/// Something a target cannot run, with where it is.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[error("{}{what} does not run on the {target} target: {reason}", instr.map(|i| format!("instruction {i}: ")).unwrap_or_default())]
pub struct Refusal {
    pub target: String,
    /// The instruction, where one is to blame.
    pub instr: Option<usize>,
    pub what: String,
    pub reason: String,
}
