//! The kernel set a backend provides: one entry point that runs a graph
//! node's kernel on input and output views, and the optimizer update.

use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};
use fsdpc_ir::{Node, Optimizer};

/// What a kernel may know about where it runs.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelCtx {
    /// The training step (0-based); keys dropout masks.
    pub step: u64,
    /// This rank's first global sample index: dropout masks are keyed by the
    /// global element index, so sharded and unsharded runs draw the same mask.
    pub sample_offset: u64,
    /// The run's seed.
    pub seed: u64,
}

/// Scratch memory kernels may use (attention probabilities, promoted copies of
/// half-precision operands). Owned by the caller and reused across calls, so
/// after the first step no kernel allocates; its size is bounded by the
/// largest single request (for attention: two `seq x seq` f32 tiles).
#[derive(Debug, Default)]
pub struct Workspace {
    f32s: Vec<f32>,
}

impl Workspace {
    /// `n` f32 of scratch (contents unspecified).
    pub fn f32s(&mut self, n: usize) -> &mut [f32] {
        if self.f32s.len() < n {
            self.f32s.resize(n, 0.0);
        }
        &mut self.f32s[..n]
    }

    /// Bytes currently held.
    pub fn bytes(&self) -> usize {
        self.f32s.len() * 4
    }
}

/// Arguments of one optimizer update over a flat fp32 shard.
pub struct OptimizerArgs<'a> {
    /// The program's optimizer and its hyper-parameters.
    pub optimizer: &'a Optimizer,
    /// 0-based training step; bias correction uses `t = step + 1`.
    pub step: u64,
    /// The fp32 master shard, updated in place.
    pub params: &'a mut [f32],
    /// The reduced gradient of the shard.
    pub grads: &'a [f32],
    /// One buffer per state slot (`Optimizer::state_slots`), each as long as
    /// `params`.
    pub state: Vec<&'a mut [f32]>,
}

/// A kernel set.
pub trait Backend: Send + Sync {
    /// A short name (`cpu`).
    fn name(&self) -> &str;

    /// Runs the kernel of `node` (its op and attributes) on `inputs` (in slot
    /// order) into `outputs` (one per node output). Views carry their types;
    /// every output element is written.
    fn run(
        &self,
        node: &Node,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
        ctx: &KernelCtx,
        ws: &mut Workspace,
    ) -> KResult<()>;

    /// Applies the optimizer to a flat shard, element by element.
    fn optimizer_step(&self, args: OptimizerArgs<'_>) -> KResult<()>;
}
