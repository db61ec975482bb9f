//! `Gather` (an embedding lookup is axis 0) and `GatherGrad` (scatter-add,
//! into f32 workspace when the gradient is half precision). Indices out of
//! range are reported through the stream's error word.

use super::{ew, float, ins, n_arg, out1, same_dtype, split_axis, Action, Operand, R};
use crate::targets::cuda::device::{Arg, Ptr};
use fsdpc_ir::DType;

/// `Gather { axis }`: `(data, indices)`.
pub(super) fn gather(axis: usize, xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let ([data, idx], y) = (ins::<2>(xs)?, out1(ys)?);
    let es = same_dtype(&data, &y)?;
    int_indices(&idx)?;
    let (outer, n, inner) = split_axis(data.dims(), axis)?;
    if y.numel() != outer * idx.numel() * inner {
        return Err(format!(
            "gather: output {} does not match data {} and indices {}",
            y.ty, data.ty, idx.ty
        ));
    }
    let total = y.numel();
    a.push(ew(
        "gather_fwd",
        total,
        vec![
            data.p(),
            idx.p(),
            idx.dt(),
            y.p(),
            Arg::I32(es),
            n_arg(outer),
            n_arg(n),
            n_arg(inner),
            n_arg(idx.numel()),
            Arg::Ptr(Ptr::Err),
        ],
    ));
    Ok(())
}

/// `GatherGrad { axis }`: `(indices, dy)`; `ws` is the instruction's
/// workspace.
pub(super) fn gather_grad(
    axis: usize,
    xs: &[Operand],
    ys: &[Operand],
    ws: Option<(u64, u64)>,
    a: &mut Vec<Action>,
) -> R<()> {
    let ([idx, dy], dx) = (ins::<2>(xs)?, out1(ys)?);
    int_indices(&idx)?;
    float(&dx)?;
    let (outer, n, inner) = split_axis(dx.dims(), axis)?;
    if dy.numel() != outer * idx.numel() * inner {
        return Err(format!(
            "gather_grad: dy {} does not match indices {}",
            dy.ty, idx.ty
        ));
    }
    let acc = accumulator("gather_grad", &dx, ws, a)?;
    let total = dy.numel();
    a.push(ew(
        "gather_bwd",
        total,
        vec![
            idx.p(),
            idx.dt(),
            dy.p(),
            dy.dt(),
            Arg::Ptr(Ptr::Abs(acc)),
            n_arg(outer),
            n_arg(n),
            n_arg(inner),
            n_arg(idx.numel()),
            Arg::Ptr(Ptr::Err),
        ],
    ));
    cast_back(acc, &dx, a);
    Ok(())
}

/// The zeroed f32 accumulator a scatter-add into `dx` adds into: `dx`
/// itself when it is f32, else the instruction's workspace `ws` (the
/// plan's promoted-output share), cast into `dx` by `cast_back`.
pub(super) fn accumulator(
    kernel: &str,
    dx: &Operand,
    ws: Option<(u64, u64)>,
    a: &mut Vec<Action>,
) -> R<u64> {
    let acc = if dx.ty.dtype == DType::F32 {
        dx.ptr
    } else {
        match ws {
            Some((p, bytes)) if bytes >= 4 * dx.numel() => p,
            _ => {
                return Err(format!(
                    "{kernel} into {} needs {} bytes of f32 workspace, the plan gave {}",
                    dx.ty,
                    4 * dx.numel(),
                    ws.map_or(0, |w| w.1)
                ))
            }
        }
    };
    a.push(Action::Zero {
        ptr: Ptr::Abs(acc),
        bytes: 4 * dx.numel(),
    });
    Ok(acc)
}

/// Casts the f32 accumulator `acc` into `dx` when they differ.
pub(super) fn cast_back(acc: u64, dx: &Operand, a: &mut Vec<Action>) {
    if acc != dx.ptr {
        let m = dx.numel();
        a.push(ew(
            "cast",
            m,
            vec![
                Arg::Ptr(Ptr::Abs(acc)),
                Arg::I32(0),
                dx.p(),
                dx.dt(),
                n_arg(m),
            ],
        ));
    }
}

fn int_indices(idx: &Operand) -> R<()> {
    if matches!(idx.ty.dtype, DType::I64 | DType::I32) {
        Ok(())
    } else {
        Err(format!("indices must be i64 or i32, got {}", idx.ty))
    }
}
