//! Vocabulary parallelism: the embedding table and the head split by
//! vocabulary rows over the tensor group (Megatron's vocab-parallel
//! embedding and cross-entropy). Each member holds `rows` consecutive rows
//! of the whole table starting at its `offset` (an input, so that the
//! program is the same on every member).
//!
//! - `TpLookup (table, indices, offset)` looks up the rows this member
//!   holds and writes zeros for the others; a `TpReduce` after it sums the
//!   members' parts into the whole lookup. Its gradient `TpLookupGrad
//!   (indices, offset, dy)` adds `dy`'s rows into this member's rows.
//! - `TpLogitStats (logits, labels, offset)` reduces this member's columns
//!   of the logits to three numbers per row (maximum, sum of exponentials
//!   relative to it, the label's logit if held here). Gathered over the
//!   group they give each row's log-sum-exp and target logit, so the loss
//!   is computed without the logits ever being gathered. Its gradient
//!   `TpLogitStatsGrad (logits, labels, offset, stats, dstats)` is the
//!   chain rule through the three: `dstats[1] * exp(x - m)` everywhere,
//!   `dstats[2]` at the label's column, and `dstats[0] - dstats[1] *
//!   stats[1]` at the row's first maximum.
//!
//! A vocabulary `parts` does not divide is padded (`crate::TpSlice`): each
//! member holds `ceil(vocab / parts)` rows or columns, the last ones past
//! the whole `vocab` zeros. The ops carry `vocab`: no index or label
//! reaches the padding, the statistics leave its columns out, and their
//! gradient is zero there, so the padding stays zero through training.

use super::check::{arity, float, int, rank};
use super::gather::gather_type;
use super::vjp::not_differentiable;
use super::{in_numel, misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::{DType, TensorType};

pub(crate) struct Vocab;

/// A member's offset: one integer.
fn offset(t: &TensorType) -> Result<(), String> {
    int(t, "offset")?;
    if t.numel() != 1 {
        return Err(format!("offset must hold one integer, got {t}"));
    }
    Ok(())
}

/// Checks a padded vocabulary against the `local` rows or columns of each
/// of `parts` members.
fn padded(vocab: Option<usize>, local: usize, parts: u32) -> Result<(), String> {
    match vocab {
        Some(v) if v == 0 || v > local * parts as usize => Err(format!(
            "a vocabulary of {v} does not fit {parts} parts of {local}"
        )),
        _ => Ok(()),
    }
}

/// The classes (last axis) of a member's logits.
fn columns(logits: &TensorType) -> usize {
    logits.shape.dims().last().copied().unwrap_or(0)
}

/// The statistics of `TpLogitStats` on logits of `rows` rows.
fn stats_type(rows: usize) -> TensorType {
    TensorType::new(DType::F32, vec![1, rows, 3])
}

impl Family for Vocab {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        match op {
            Op::TpLookup { parts, vocab } => {
                arity(inputs, 3, "table, indices, offset")?;
                offset(inputs[2])?;
                let rows = inputs[0].shape.dims().first().copied().unwrap_or(0);
                padded(*vocab, rows, *parts)?;
                Ok(vec![gather_type(inputs[0], inputs[1], 0)?])
            }
            Op::TpLookupGrad {
                table_shape,
                parts,
                vocab,
            } => {
                arity(inputs, 3, "indices, offset, dy")?;
                padded(*vocab, table_shape.first().copied().unwrap_or(0), *parts)?;
                int(inputs[0], "indices")?;
                offset(inputs[1])?;
                float(inputs[2], "dy")?;
                let table = TensorType::new(inputs[2].dtype, table_shape.clone());
                let want = gather_type(&table, inputs[0], 0)?;
                if want.shape != inputs[2].shape {
                    return Err(format!(
                        "dy {} does not match a lookup of {} rows by {}",
                        inputs[2], table, inputs[0]
                    ));
                }
                Ok(vec![table])
            }
            Op::TpLogitStats { parts, vocab, .. } => {
                arity(inputs, 3, "logits, labels, offset")?;
                super::loss::check_logits_labels(inputs[0], inputs[1])?;
                padded(*vocab, columns(inputs[0]), *parts)?;
                offset(inputs[2])?;
                Ok(vec![stats_type(inputs[0].shape.dims()[0])])
            }
            Op::TpLogitStatsGrad { parts, vocab, .. } => {
                arity(inputs, 5, "logits, labels, offset, stats, dstats")?;
                super::loss::check_logits_labels(inputs[0], inputs[1])?;
                padded(*vocab, columns(inputs[0]), *parts)?;
                offset(inputs[2])?;
                let want = stats_type(inputs[0].shape.dims()[0]);
                for (t, what) in [(inputs[3], "stats"), (inputs[4], "dstats")] {
                    rank(t, 3, what)?;
                    if *t != want {
                        return Err(format!("{what} must be {want}, got {t}"));
                    }
                }
                Ok(vec![inputs[0].clone()])
            }
            _ => Err(misrouted(op, "vocabulary-parallel")),
        }
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        match *op {
            Op::TpLookup { parts, vocab } => {
                let table_shape = cx.shape(cx.x(0)?)?;
                let ins = [cx.x(1)?, cx.x(2)?, cx.dy()];
                let op = Op::TpLookupGrad {
                    parts,
                    table_shape,
                    vocab,
                };
                let g = cx.emit(op, &ins)?;
                Ok(vec![Some(g), None, None])
            }
            Op::TpLogitStats {
                ignore_index,
                parts,
                vocab,
            } => {
                let ins = [cx.x(0)?, cx.x(1)?, cx.x(2)?, cx.y(), cx.dy()];
                let g = cx.emit(
                    Op::TpLogitStatsGrad {
                        ignore_index,
                        parts,
                        vocab,
                    },
                    &ins,
                )?;
                Ok(vec![Some(g), None, None])
            }
            _ => Err(not_differentiable(op)),
        }
    }

    /// A lookup moves data; its gradient adds one number per element of
    /// `dy`. The statistics take a maximum, a subtraction, an exponential
    /// and an addition per logit, their gradient about as many.
    fn flops(&self, op: &Op, inputs: &[&TensorType], _outputs: &[TensorType]) -> f64 {
        match op {
            Op::TpLookupGrad { .. } => in_numel(inputs, 2),
            Op::TpLogitStats { .. } => 4.0 * in_numel(inputs, 0),
            Op::TpLogitStatsGrad { .. } => 4.0 * in_numel(inputs, 0),
            _ => 0.0,
        }
    }
}
