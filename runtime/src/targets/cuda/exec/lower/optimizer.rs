//! The optimizer: its instruction lowers to the addresses it updates, and
//! each step makes its launch (AdamW's bias corrections depend on the
//! step).

use super::{elems, Lowering};
use crate::targets::cuda::device::{blocks_for, Arg, Launch, Ptr, THREADS};
use crate::targets::cuda::error::CudaError;
use crate::targets::cuda::exec::Work;
use crate::targets::cuda::ops::dt_code;
use fsdpc_ir::{DType, Optimizer};
use fsdpc_plan::BufferId;

/// `Optimizer`: the parameters, gradients and state it updates, and the
/// parts of unit `unit`'s shard weight decay does not apply to.
pub(super) fn optimizer(
    cx: &Lowering,
    unit: usize,
    params: BufferId,
    grads: BufferId,
    state: &[BufferId],
) -> Work {
    let (prep, l) = (cx.prep, cx.l);
    let ((pn, _), (gn, gdt)) = (elems(prep, params), elems(prep, grads));
    let state = state.iter().map(|b| l.buffer(prep, *b)).collect();
    Work::Optimizer {
        params: l.buffer(prep, params),
        grads: l.buffer(prep, grads),
        gdt,
        state,
        n: gn.min(pn),
        undecayed: prep.plan.units.get(unit).map_or_else(Vec::new, |u| {
            u.undecayed(cx.geometry.shard_position(cx.rank) as u64)
        }),
    }
}

/// The optimizer launch of a step (AdamW's constants depend on it).
pub(in crate::targets::cuda::exec) fn optimizer_launch(
    opt: &Optimizer,
    step: u64,
    params: u64,
    grads: u64,
    gdt: DType,
    state: &[u64],
    n: u64,
) -> Result<Launch, CudaError> {
    let p = |a: u64| Arg::Ptr(Ptr::Abs(a));
    let args = match *opt {
        Optimizer::AdamW {
            lr,
            beta1,
            beta2,
            eps,
            weight_decay,
        } => {
            let [m, v] = state else {
                return Err(CudaError::Kernel {
                    node: "optimizer".into(),
                    op: "adamw".into(),
                    reason: format!("needs two state buffers, got {}", state.len()),
                });
            };
            // As optim.rs: t = step + 1.
            let t = (step + 1) as i32;
            let decay = (1.0 - lr * weight_decay) as f32;
            let w1 = (1.0 - beta1) as f32;
            let (b2, w2) = (beta2 as f32, (1.0 - beta2) as f32);
            let bc1 = 1.0 - beta1.powi(t);
            let bc2_sqrt = (1.0 - beta2.powi(t)).sqrt() as f32;
            let step_size = (lr / bc1) as f32;
            vec![
                p(params),
                p(grads),
                Arg::I32(dt_code(gdt)),
                p(*m),
                p(*v),
                Arg::I64(n as i64),
                Arg::F32(decay),
                Arg::F32(w1),
                Arg::F32(b2),
                Arg::F32(w2),
                Arg::F32(bc2_sqrt),
                Arg::F32(step_size),
                Arg::F32(eps as f32),
            ]
        }
        Optimizer::Sgd {
            lr,
            momentum,
            weight_decay,
        } => {
            let buf = state.first().copied().unwrap_or(0);
            vec![
                p(params),
                p(grads),
                Arg::I32(dt_code(gdt)),
                p(buf),
                Arg::I64(n as i64),
                Arg::F32(lr as f32),
                Arg::F32(momentum as f32),
                Arg::F32(weight_decay as f32),
            ]
        }
    };
    let kernel = if matches!(opt, Optimizer::AdamW { .. }) {
        "adamw"
    } else {
        "sgd"
    };
    Ok(Launch {
        kernel,
        grid: (blocks_for(n.max(1)), 1, 1),
        block: THREADS,
        smem: 0,
        args,
    })
}
