//! `CrossEntropy` and its gradient over the last axis: row losses and
//! valid-label flags in private scratch, then one block that sums them
//! (the mean over valid rows, and the count the gradient divides by).

use super::{ew, float, ins, n_arg, out1, rows_launch, same_count, Action, Lowered, Operand, R};
use crate::targets::cuda::device::{Arg, Launch, Ptr};
use fsdpc_ir::DType;

/// `CrossEntropy { ignore_index }`: the mean loss into an f32 scalar.
pub(super) fn forward(
    ignore_index: Option<i64>,
    xs: &[Operand],
    ys: &[Operand],
    l: &mut Lowered,
) -> R<()> {
    let ([logits, labels], y) = (ins::<2>(xs)?, out1(ys)?);
    if y.ty.dtype != DType::F32 || y.numel() != 1 {
        return Err(format!(
            "cross_entropy writes an f32 scalar, the output is {}",
            y.ty
        ));
    }
    cross_entropy(&logits, &labels, ignore_index, Target::Loss(y.ptr), l)?;
    Ok(())
}

/// `CrossEntropyGrad { ignore_index }`: the logits' gradient.
pub(super) fn backward(
    ignore_index: Option<i64>,
    xs: &[Operand],
    ys: &[Operand],
    l: &mut Lowered,
) -> R<()> {
    let ([logits, labels, dloss], dx) = (ins::<3>(xs)?, out1(ys)?);
    same_count(&logits, &dx)?;
    if dloss.ty.dtype != DType::F32 || dloss.numel() == 0 {
        return Err(format!(
            "cross_entropy_grad: dloss must be f32, got {}",
            dloss.ty
        ));
    }
    cross_entropy(
        &logits,
        &labels,
        ignore_index,
        Target::Grad {
            dloss: dloss.ptr,
            dx,
        },
        l,
    )?;
    Ok(())
}

/// What a cross-entropy lowering computes.
enum Target<'a> {
    /// The mean loss into this f32 scalar.
    Loss(u64),
    /// The logits' gradient.
    Grad { dloss: u64, dx: Operand<'a> },
}

fn cross_entropy(
    logits: &Operand,
    labels: &Operand,
    ignore: Option<i64>,
    target: Target,
    l: &mut Lowered,
) -> R<()> {
    float(logits)?;
    if labels.ty.dtype.is_float() || labels.ty.dtype == DType::Bool {
        return Err(format!(
            "cross_entropy labels must be integers, got {}",
            labels.ty
        ));
    }
    let c = logits.dims().last().copied().unwrap_or(0) as u64;
    if c == 0 || logits.numel() / c != labels.numel() {
        return Err(format!(
            "cross_entropy: logits {} and labels {} do not match",
            logits.ty, labels.ty
        ));
    }
    let rows = labels.numel();
    let (rl, valid) = (0u64, (8 * rows).div_ceil(256) * 256);
    let count = valid + (4 * rows).div_ceil(256) * 256;
    l.scratch = count + 256;
    let s = |off: u64| Arg::Ptr(Ptr::Scratch(off));
    let null = Arg::Ptr(Ptr::Abs(0));
    let (hi, ig) = (
        Arg::I32(ignore.is_some() as i32),
        Arg::I64(ignore.unwrap_or(0)),
    );
    let finish = |loss: Arg| {
        Action::Launch(Launch {
            kernel: "ce_finish",
            grid: (1, 1, 1),
            block: 1024,
            smem: 0,
            args: vec![s(rl), s(valid), n_arg(rows), loss, s(count)],
        })
    };
    match target {
        Target::Loss(y) => {
            l.actions.push(rows_launch(
                "ce_rows",
                rows,
                vec![
                    logits.p(),
                    logits.dt(),
                    labels.p(),
                    labels.dt(),
                    n_arg(rows),
                    n_arg(c),
                    hi,
                    ig,
                    s(rl),
                    s(valid),
                    Arg::Ptr(Ptr::Err),
                ],
            ));
            l.actions.push(finish(Arg::Ptr(Ptr::Abs(y))));
        }
        Target::Grad { dloss, dx } => {
            l.actions.push(ew(
                "ce_valid",
                rows,
                vec![
                    labels.p(),
                    labels.dt(),
                    n_arg(rows),
                    n_arg(c),
                    hi,
                    ig,
                    s(valid),
                    Arg::Ptr(Ptr::Err),
                ],
            ));
            // Count only: no row losses.
            let Action::Launch(mut f) = finish(null) else {
                unreachable!("finish makes a launch")
            };
            f.args[0] = null;
            l.actions.push(Action::Launch(f));
            l.actions.push(rows_launch(
                "ce_bwd",
                rows,
                vec![
                    logits.p(),
                    logits.dt(),
                    labels.p(),
                    labels.dt(),
                    Arg::Ptr(Ptr::Abs(dloss)),
                    s(count),
                    dx.p(),
                    dx.dt(),
                    n_arg(rows),
                    n_arg(c),
                    hi,
                    ig,
                    Arg::Ptr(Ptr::Err),
                ],
            ));
        }
    }
    Ok(())
}
