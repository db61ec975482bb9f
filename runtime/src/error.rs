//! Errors of the runtime. Every failure a user can cause (a bad plan, a bad
//! data file, a kernel given inconsistent shapes, a failed rank) is one of
//! these structured variants; nothing input can reach panics.

use fsdpc_plan::PlanViolation;
use std::time::Duration;
use thiserror::Error;

/// What went wrong inside one kernel; the executor adds the node and op.
#[derive(Debug, Error, Clone, PartialEq)]
#[error("{0}")]
pub struct KernelError(pub String);

impl KernelError {
    /// A kernel error with this reason.
    pub fn new(reason: impl Into<String>) -> KernelError {
        KernelError(reason.into())
    }
}

/// Shorthand for kernel results.
pub type KResult<T> = Result<T, KernelError>;

/// Returns early from a kernel with a formatted `KernelError`.
#[macro_export]
macro_rules! kbail {
    ($($arg:tt)*) => { return Err($crate::error::KernelError(format!($($arg)*))) };
}

/// Errors of collectives.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum CommError {
    /// Another rank of the world failed; every blocked collective reports it.
    #[error("rank {rank} failed: {reason}")]
    RankFailed {
        /// The rank that failed first.
        rank: usize,
        /// What it reported.
        reason: String,
    },
    /// A wait ran past the communicator's timeout.
    #[error("collective `{op}` timed out after {waited:?}: no answer from rank(s) {}", list(.missing))]
    Timeout {
        /// The collective.
        op: String,
        /// How long it waited.
        waited: Duration,
        /// The world ranks of the members that never arrived.
        missing: Vec<usize>,
    },
    /// The ranks called the collective with inconsistent arguments.
    #[error("collective `{op}`: {reason}")]
    Mismatch {
        /// The collective.
        op: String,
        /// What differed.
        reason: String,
    },
    /// The MPI library refused or could not do what was asked.
    #[error("MPI: {reason}")]
    Mpi {
        /// What went wrong.
        reason: String,
    },
    /// A communication backend this build does not contain.
    #[error("the {backend} target was not compiled in; rebuild with `--features {feature}`")]
    NotCompiled {
        /// The backend asked for.
        backend: &'static str,
        /// The cargo feature that builds it.
        feature: &'static str,
    },
}

/// Ranks as `1, 3`.
fn list(ranks: &[usize]) -> String {
    let v: Vec<String> = ranks.iter().map(|r| r.to_string()).collect();
    v.join(", ")
}

/// Errors of the runtime.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum RuntimeError {
    /// A rank failed (error or panic); names the rank that failed first.
    #[error("rank {rank} failed: {reason}")]
    RankFailed {
        /// The rank that failed first.
        rank: usize,
        /// What it reported.
        reason: String,
    },
    /// A wait (collective or event) ran past its timeout.
    #[error("rank {rank}: {what} timed out after {waited:?}")]
    Timeout {
        /// The rank that gave up.
        rank: usize,
        /// What it waited for.
        what: String,
        /// How long it waited.
        waited: Duration,
    },
    /// A kernel failed.
    #[error("kernel of node {node} ({op}): {reason}")]
    Kernel {
        /// The node (id and name).
        node: String,
        /// The op's short name.
        op: String,
        /// What the kernel reported.
        reason: String,
    },
    /// A collective failed.
    #[error("rank {rank}: {source}")]
    Comm {
        /// The rank that saw it.
        rank: usize,
        /// The collective's error.
        #[source]
        source: CommError,
    },
    /// The data source could not produce an input.
    #[error("data input `{input}`: {reason}")]
    Data {
        /// The input's name.
        input: String,
        /// What went wrong.
        reason: String,
    },
    /// The plan breaks invariants `Plan::validate` checks; every violation,
    /// in the verifier's order. Nothing of such a plan is executed.
    #[error("{}", describe_violations(.violations))]
    InvalidPlan {
        /// Every broken invariant, with where it is.
        violations: Vec<PlanViolation>,
    },
    /// The plan cannot be executed as written.
    #[error("plan: {reason}{}", instr.map(|i| format!(" (instruction {i})")).unwrap_or_default())]
    Plan {
        /// The instruction, if one is to blame.
        instr: Option<usize>,
        /// What is wrong.
        reason: String,
    },
    /// The launcher runs a different number of ranks than the plan was
    /// compiled for.
    #[error(
        "the plan was compiled for world {plan_world} but {launcher} runs {launcher_world} ranks"
    )]
    WorldMismatch {
        /// `plan.cluster.world`.
        plan_world: usize,
        /// The ranks the launcher started.
        launcher_world: usize,
        /// Who started them (`mpirun`, `srun`, `torchrun`, ...).
        launcher: String,
    },
    /// The reference evaluator was given inconsistent feeds or parameters.
    #[error("eval: {0}")]
    Eval(String),
    /// Reading a file.
    #[error("{path}: {reason}")]
    Io {
        /// The file.
        path: String,
        /// The OS error.
        reason: String,
    },
    /// Writing or reading a checkpoint.
    #[error(transparent)]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    /// The CUDA backend (`cuda`): a missing library, no GPU, a device
    /// error, an instruction it does not lower.
    #[error(transparent)]
    Cuda(#[from] crate::targets::cuda::CudaError),
    /// A plan or an option the target does not run (its capabilities).
    #[error(transparent)]
    Unsupported(#[from] fsdpc_plan::target::Refusal),
    /// A target this runtime does not have.
    #[error("unknown target `{name}`; the targets: {known}")]
    UnknownTarget {
        /// The name asked for.
        name: String,
        /// The targets there are.
        known: String,
    },
    /// A launch the target cannot serve (thread ranks started as one of
    /// several processes, a launcher's environment that does not parse).
    #[error("{0}")]
    Launch(String),
}

impl RuntimeError {
    /// A plan error without an instruction index.
    pub fn plan(reason: impl Into<String>) -> RuntimeError {
        RuntimeError::Plan {
            instr: None,
            reason: reason.into(),
        }
    }

    /// A plan error at instruction `instr`.
    pub fn plan_at(instr: usize, reason: impl Into<String>) -> RuntimeError {
        RuntimeError::Plan {
            instr: Some(instr),
            reason: reason.into(),
        }
    }

    /// A data error for input `input`.
    pub fn data(input: &str, reason: impl Into<String>) -> RuntimeError {
        RuntimeError::Data {
            input: input.to_string(),
            reason: reason.into(),
        }
    }
}

/// Violations shown in an `InvalidPlan` message; the error holds them all.
const SHOWN_VIOLATIONS: usize = 3;

/// One line: how many violations, the first few, and how many more.
fn describe_violations(v: &[PlanViolation]) -> String {
    let shown: Vec<String> = v
        .iter()
        .take(SHOWN_VIOLATIONS)
        .map(|x| x.to_string())
        .collect();
    let more = v.len().saturating_sub(SHOWN_VIOLATIONS);
    let tail = if more > 0 {
        format!("; and {more} more")
    } else {
        String::new()
    };
    format!(
        "the plan fails validation ({} violation(s)): {}{tail}",
        v.len(),
        shown.join("; ")
    )
}
