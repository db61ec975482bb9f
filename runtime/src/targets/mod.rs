//! Targets: the ways this runtime runs a plan, side by side behind one
//! trait. `threads` runs every rank as a thread of this process (the
//! default: nothing to install); `mpi` runs this process's rank of a job
//! that mpirun or srun started (feature `mpi`); `cuda` runs this process's
//! GPU rank (feature `cuda`). Each says what it can run as data
//! (`fsdpc_plan::target::Capabilities`), which the planner reads when it
//! compiles for that target and which every run checks first: a plan or an
//! option a target cannot run is refused before anything starts, naming
//! the instruction or the flag.
//!
//! Every target reports a run the same way (`TrainReport`), the GPU's
//! device figures in its `device` part.

pub mod cuda;
pub mod mpi;
pub mod threads;

use crate::error::RuntimeError;
use crate::exec::ExecMode;
use crate::train::{StepReport, TrainOptions, TrainReport};
use fsdpc_plan::cluster::GemmBlocking;
use fsdpc_plan::target::{Capabilities, Refusal, WireFormat};
use fsdpc_plan::{CollectiveAlgorithm, Plan};
use std::time::Duration;

/// The targets' names, as `--target` takes them.
pub const NAMES: [&str; 3] = ["threads", "mpi", "cuda"];

/// A way to run plans.
pub trait Target {
    /// The target's name (`NAMES`).
    fn name(&self) -> &'static str;

    /// What it runs (`capabilities(self.name())`).
    fn capabilities(&self) -> Capabilities {
        capabilities(self.name()).unwrap_or_else(|| Capabilities::all(self.name()))
    }

    /// This process's rank: 0 where one process runs every rank. Rank 0
    /// reports for the run.
    fn rank(&self) -> usize {
        0
    }

    /// How many processes the launcher started, when it started them (the
    /// world a model is planned for when none is given).
    fn processes(&self) -> Option<u32> {
        None
    }

    /// The matrix library's blocking on the CPU the ranks compute on, when
    /// they run on this machine: a plan made for this target then states
    /// the library's heap exactly. `None`: the plan keeps its bound.
    fn host_gemm(&self) -> Option<GemmBlocking> {
        None
    }

    /// Runs `plan` for `opts.steps` steps, calling `on_step` after each
    /// (on every rank of a process world). Refuses first what it cannot run
    /// (`refuse`).
    fn run(
        &self,
        plan: &Plan,
        opts: &TrainOptions,
        on_step: &mut dyn FnMut(&StepReport),
    ) -> Result<TrainReport, RuntimeError>;

    /// What of `plan` and `opts` this target cannot run, named.
    fn refuse(&self, plan: &Plan, opts: &TrainOptions) -> Result<(), RuntimeError> {
        let caps = self.capabilities();
        caps.check(plan)?;
        check_options(&caps, plan, opts)?;
        Ok(())
    }
}

/// What target `name` runs, without starting it (the planner's input for
/// `fsdpc compile --target NAME`); `None` for an unknown name.
pub fn capabilities(name: &str) -> Option<Capabilities> {
    match name {
        "threads" | "mpi" => Some(Capabilities::all(name)),
        "cuda" => Some(cuda_capabilities()),
        _ => None,
    }
}

/// What the `cuda` target runs: ring collectives (bucketed gathers too),
/// native wire formats, device buffers only, no loss scaler; no
/// checkpoints or debug allocator; traces timed by CUDA events (no live
/// heap: the arena is one allocation); saved parameters at world 1.
pub(crate) fn cuda_capabilities() -> Capabilities {
    Capabilities {
        target: "cuda".into(),
        algorithms: vec![CollectiveAlgorithm::Ring],
        bucketed_gathers: true,
        wires: vec![WireFormat::Native],
        host_buffers: false,
        loss_scaler: false,
        checkpoints: false,
        traces: true,
        debug_alloc: false,
        saves_sharded: false,
        tensor_parallel: true,
    }
}

/// Starts target `name` for this process: thread ranks; this process's
/// rank of an MPI job (its collectives time out after `timeout`); this
/// process's GPU rank, placed by a launcher or alone. A build without the
/// target's feature, or a launch the target cannot serve, is an error.
pub fn open(name: &str, timeout: Duration) -> Result<Box<dyn Target>, RuntimeError> {
    match name {
        "threads" => Ok(Box::new(threads::Threads::new()?)),
        "mpi" => Ok(Box::new(mpi::Mpi::init(timeout)?)),
        "cuda" => Ok(Box::new(cuda::Cuda::new()?)),
        _ => Err(RuntimeError::UnknownTarget {
            name: name.to_string(),
            known: NAMES.join(", "),
        }),
    }
}

/// The options of a run that `caps` does not serve, named by their flag.
pub(crate) fn check_options(
    caps: &Capabilities,
    plan: &Plan,
    opts: &TrainOptions,
) -> Result<(), Refusal> {
    let refuse = |what: &str, reason: &str| Refusal {
        target: caps.target.clone(),
        instr: None,
        what: what.into(),
        reason: reason.into(),
    };
    if !caps.checkpoints && (opts.checkpoint.is_some() || opts.resume.is_some()) {
        return Err(refuse(
            "--checkpoint-dir and --resume",
            "sharded checkpoints are written by the CPU targets (threads, mpi)",
        ));
    }
    if !caps.debug_alloc && opts.mode == ExecMode::DebugAlloc {
        return Err(refuse("--debug-alloc", "it runs the arena only"));
    }
    if !caps.traces && opts.trace_steps > 0 {
        return Err(refuse(
            "--trace",
            "measured traces are written by the CPU targets (threads, mpi)",
        ));
    }
    if !caps.saves_sharded && opts.keep_params && plan.cluster.world > 1 {
        return Err(refuse(
            "--save-onnx and --save-safetensors",
            "saving the trained parameters needs world 1 here",
        ));
    }
    Ok(())
}
