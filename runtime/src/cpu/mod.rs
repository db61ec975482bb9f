//! The CPU backend: kernels on host memory, matrix products through `gemm`.

pub mod kernels;

use crate::backend::{Backend, KernelCtx, OptimizerArgs, Workspace};
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};
use fsdpc_ir::Node;
use fsdpc_plan::cluster::GemmBlocking;
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

/// How `gemm` 0.19 blocks f32 products on this CPU, for the memory plan's
/// bound of its packing buffers (`fsdpc_plan::workspace::gemm_call_bytes`):
/// the micro-kernel it dispatches to (its `gemm_def!`: AVX-512F, which
/// this crate's `x86-v4` feature compiles in, else FMA, else the scalar
/// kernel) and the cache sizes its detection reads, which size its
/// per-thread packing slab and its blocks. `None` off x86-64, where the plan keeps its
/// bound over every CPU.
pub fn gemm_blocking() -> Option<GemmBlocking> {
    #[cfg(target_arch = "x86_64")]
    {
        let (simd_lanes, mr, nr) = if std::arch::is_x86_feature_detected!("avx512f") {
            (16, 64, 6)
        } else if std::arch::is_x86_feature_detected!("fma") {
            (8, 16, 6)
        } else {
            (1, 2, 4)
        };
        let info = &gemm_common::cache::CACHE_INFO;
        Some(GemmBlocking {
            simd_lanes,
            mr,
            nr,
            slab_bytes: info[1].cache_bytes as u64,
            l2_assoc: info[1].associativity as u32,
            l3_bytes: info[2].cache_bytes as u64,
            l3_assoc: info[2].associativity as u32,
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}
