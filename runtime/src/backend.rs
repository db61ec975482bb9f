//! The kernel set a backend provides: one entry point that runs a graph
//! node's kernel on input and output views, and the optimizer update.

use crate::error::{KResult, KernelError};
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
    /// Evaluation (`model.eval()` in PyTorch): dropout passes its input
    /// through unchanged.
    pub eval: bool,
}

/// Scratch memory a kernel may use (attention tiles, normalisation rows,
/// promoted copies of half-precision operands): the first
/// `workspace_bytes` of its stream's `Workspace` buffer in the arena, as the
/// plan sized it (`fsdpc_plan::workspace`). A kernel asking for more than
/// it was given fails: the plan's figure is the kernel's contract.
#[derive(Debug, Default)]
pub struct Workspace<'a> {
    bytes: &'a mut [u8],
}

impl<'a> Workspace<'a> {
    /// Scratch over `bytes` (8-byte aligned).
    pub fn new(bytes: &'a mut [u8]) -> Workspace<'a> {
        Workspace { bytes }
    }

    /// No scratch at all.
    pub fn empty() -> Workspace<'a> {
        Workspace { bytes: &mut [] }
    }

    fn too_small(&self, need: usize) -> KernelError {
        KernelError(format!(
            "needs {need} bytes of workspace, the plan gave it {}",
            self.bytes.len()
        ))
    }

    /// `n` f32 of scratch (contents unspecified), reused by the next call.
    /// Asking for none always succeeds, also without a workspace (whose
    /// empty slice need not be 4-byte aligned): a pointwise convolution
    /// needs no scratch and is given none.
    pub fn f32s(&mut self, n: usize) -> KResult<&mut [f32]> {
        if n == 0 {
            return Ok(&mut []);
        }
        let need = n.saturating_mul(4);
        if need > self.bytes.len() {
            return Err(self.too_small(need));
        }
        bytemuck::try_cast_slice_mut(&mut self.bytes[..need])
            .map_err(|_| KernelError("the workspace is not 4-byte aligned".into()))
    }

    /// Takes `n` bytes (rounded up to 8) off the front for the caller to
    /// keep; the rest stays scratch.
    pub fn carve(&mut self, n: usize) -> KResult<&'a mut [u8]> {
        let need = n.div_ceil(8).saturating_mul(8);
        if need > self.bytes.len() {
            return Err(self.too_small(need));
        }
        let (head, tail) = std::mem::take(&mut self.bytes).split_at_mut(need);
        self.bytes = tail;
        Ok(&mut head[..n])
    }

    /// Bytes available.
    pub fn bytes(&self) -> usize {
        self.bytes.len()
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
        ws: &mut Workspace<'_>,
    ) -> KResult<()>;

    /// Applies the optimizer to a flat shard, element by element.
    fn optimizer_step(&self, args: OptimizerArgs<'_>) -> KResult<()>;
}

#[cfg(test)]
mod tests {
    use super::Workspace;

    #[test]
    fn no_scratch_is_granted_without_a_workspace() {
        let mut ws = Workspace::empty();
        assert_eq!(ws.f32s(0).map(|s| s.len()), Ok(0));
        assert!(ws.f32s(1).is_err());
    }
}
