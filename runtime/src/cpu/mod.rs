//! The CPU backend: kernels on host memory, matrix products through `gemm`.

pub mod kernels;

use crate::backend::{Backend, KernelCtx, OptimizerArgs, Workspace};
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};
use fsdpc_ir::Node;
use gemm::Parallelism;

/// Settings of the CPU backend.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CpuConfig {
    /// Threads one matrix product may use (1: no parallelism, the default).
    pub threads: usize,
}

impl Default for CpuConfig {
    fn default() -> CpuConfig {
        CpuConfig { threads: 1 }
    }
}

/// The CPU kernel set.
#[derive(Clone, Debug, Default)]
pub struct CpuBackend {
    cfg: CpuConfig,
}

impl CpuBackend {
    /// A backend with these settings.
    pub fn new(cfg: CpuConfig) -> CpuBackend {
        CpuBackend { cfg }
    }

    fn kernel_cfg(&self) -> kernels::Cfg {
        let par = if self.cfg.threads > 1 {
            Parallelism::Rayon(self.cfg.threads)
        } else {
            Parallelism::None
        };
        kernels::Cfg { par }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &str {
        "cpu"
    }

    fn run(
        &self,
        node: &Node,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
        ctx: &KernelCtx,
        ws: &mut Workspace,
    ) -> KResult<()> {
        if outputs.len() != node.outputs.len() {
            crate::kbail!(
                "node has {} outputs, {} views given",
                node.outputs.len(),
                outputs.len()
            );
        }
        kernels::run(&self.kernel_cfg(), &node.op, inputs, outputs, ctx, ws)
    }

    fn optimizer_step(&self, args: OptimizerArgs<'_>) -> KResult<()> {
        crate::optim::step(args)
    }
}
