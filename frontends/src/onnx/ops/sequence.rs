//! Tensor sequences — ONNX operators SplitToSequence (opsets 11–21),
//! SequenceAt (11–21) and SequenceLength (11–21), as the dynamo exporter
//! emits them for `torch.split` with `optimize=False`. Sequences are resolved
//! at import and never reach the IR: a split is recorded as the parts of its
//! source, and `SequenceAt` with a constant position becomes a slice of it.
//! Any other reader of a sequence is refused with its name (see
//! `NodeCx::opt`).

use super::slice::slice_val;
use super::Convert;
use crate::onnx::context::{norm_axis, NodeCx, Parts, Sequence, Val};
use crate::onnx::tensor::HostTensor;
use fsdpc_ir::{DType, Op};

pub(super) const OPS: &[(&str, Convert)] = &[
    ("SplitToSequence", split_to_sequence),
    ("SequenceAt", sequence_at),
    ("SequenceLength", sequence_length),
];

fn split_to_sequence(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let dims = cx.ty(0)?.shape.dims().to_vec();
    let axis = norm_axis(cx.attr_i("axis", 0)?, dims.len())?;
    let dim = dims[axis];
    let split = cx.opt_konst(1, "split")?.cloned();
    let (parts, squeeze) = match split {
        None => (Parts::Every(1), cx.attr_i("keepdims", 1)? == 0),
        Some(t) => (parts(&t, dim)?, false),
    };
    let seq = Sequence {
        source: cx.val(0)?.clone(),
        axis,
        dim,
        parts,
        squeeze,
        made_by: cx.label(),
    };
    if let Some(name) = cx.node.output.first().filter(|n| !n.is_empty()) {
        cx.imp.seqs.insert(name.clone(), seq);
    }
    Ok(())
}

/// How a `split` input cuts an axis of length `dim`: a scalar is the length
/// of every part but a shorter last one; a list gives each length, and they
/// must add up to `dim`.
fn parts(split: &HostTensor, dim: usize) -> Result<Parts, String> {
    let v = split.as_i64();
    if split.shape.is_empty() {
        return v
            .first()
            .and_then(|&n| usize::try_from(n).ok())
            .filter(|&n| n > 0)
            .map(Parts::Every)
            .ok_or_else(|| format!("split {v:?} must be a positive length"));
    }
    if split.shape.len() != 1 {
        return Err(format!(
            "split must be a scalar or a list, not of shape {:?}",
            split.shape
        ));
    }
    let mut ranges = Vec::with_capacity(v.len());
    let mut start = 0usize;
    for &n in &v {
        let end = usize::try_from(n)
            .ok()
            .and_then(|n| start.checked_add(n))
            .filter(|&e| e <= dim)
            .ok_or_else(|| format!("split sizes {v:?} are negative or run past {dim}"))?;
        ranges.push((start, end));
        start = end;
    }
    if start != dim {
        return Err(format!("split sizes {v:?} add up to {start}, not {dim}"));
    }
    Ok(Parts::Ranges(ranges))
}

fn sequence_at(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let seq = cx.seq(0)?.clone();
    let pos = cx.konst(1, "position")?.as_i64();
    let &[pos] = pos.as_slice() else {
        return Err(format!("the position must be one integer, not {pos:?}"));
    };
    let n = seq.count();
    let i = if pos < 0 {
        pos.saturating_add(n as i64)
    } else {
        pos
    };
    let part = usize::try_from(i)
        .ok()
        .and_then(|i| seq.part(i))
        .ok_or_else(|| {
            format!(
                "position {pos} is outside the {n} elements of the sequence from `{}`",
                seq.made_by
            )
        })?;
    let y = slice_val(cx, &seq.source, seq.axis, part, "at")?;
    let y = if seq.squeeze {
        squeezed(cx, y, seq.axis)?
    } else {
        y
    };
    cx.set(0, y);
    Ok(())
}

/// `y` without its `axis` (of length 1).
fn squeezed(cx: &mut NodeCx<'_>, y: Val, axis: usize) -> Result<Val, String> {
    Ok(match y {
        Val::Const(t) => {
            let mut shape = t.shape.clone();
            shape.remove(axis);
            Val::Const(t.reshaped(shape))
        }
        Val::Ir(v) => {
            let mut shape = cx.imp.g.value_type(v).shape.dims().to_vec();
            shape.remove(axis);
            Val::Ir(cx.add(Op::Reshape { shape }, &[v], "squeeze")?)
        }
    })
}

fn sequence_length(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let n = cx.seq(0)?.count();
    let n = i64::try_from(n).map_err(|_| format!("{n} elements"))?;
    cx.set(0, Val::Const(HostTensor::ints(DType::I64, vec![], vec![n])));
    Ok(())
}
