//! Vocabulary parallelism (`TpLookup`, `TpLogitStats` and their
//! gradients): the embedding lookup and the logits' statistics over this
//! member's rows or columns of the whole vocabulary, from the `offset`
//! operand. Indices and labels outside the whole vocabulary are reported
//! through the stream's error word. A padded vocabulary passes its true
//! size as `whole`: the kernels leave the columns past it out of the
//! statistics and write them a zero gradient.

use super::{ew, float, ins, n_arg, out1, rows_launch, same_count, same_dtype, Action, Operand, R};
use crate::targets::cuda::device::{Arg, Ptr};
use fsdpc_ir::DType;

fn int(x: &Operand, what: &str) -> R<()> {
    if matches!(x.ty.dtype, DType::I64 | DType::I32) && (what != "offset" || x.numel() == 1) {
        Ok(())
    } else {
        Err(format!("{what} must be i64 or i32, got {}", x.ty))
    }
}

/// How the vocabulary is split: over `parts` members, `vocab` in all when
/// the parts are padded.
#[derive(Copy, Clone, Debug)]
pub(super) struct Split {
    parts: u32,
    vocab: Option<usize>,
}

impl Split {
    pub(super) fn new(parts: u32, vocab: Option<usize>) -> Split {
        Split { parts, vocab }
    }

    /// The whole vocabulary, from a member's `n` rows or columns.
    fn whole(self, n: u64) -> u64 {
        self.vocab.map_or(n * u64::from(self.parts), |v| v as u64)
    }
}

/// `(rows, inner)` of a table, and the whole table's row count.
fn table(dims: &[usize], split: Split) -> R<(u64, u64, u64)> {
    let (&n, rest) = dims
        .split_first()
        .ok_or_else(|| "a table of rank 0".to_string())?;
    let inner = rest.iter().map(|&d| d as u64).product::<u64>();
    Ok((n as u64, inner, split.whole(n as u64)))
}

/// `TpLookup { parts, vocab }`: `(table, indices, offset)`.
pub(super) fn lookup(split: Split, xs: &[Operand], ys: &[Operand], a: &mut Vec<Action>) -> R<()> {
    let ([data, idx, off], y) = (ins::<3>(xs)?, out1(ys)?);
    let es = same_dtype(&data, &y)?;
    int(&idx, "indices")?;
    int(&off, "offset")?;
    let (n, inner, whole) = table(data.dims(), split)?;
    if y.numel() != idx.numel() * inner {
        return Err(format!(
            "tp_lookup: output {} does not match table {} and indices {}",
            y.ty, data.ty, idx.ty
        ));
    }
    a.push(ew(
        "vocab_lookup_fwd",
        y.numel(),
        vec![
            data.p(),
            idx.p(),
            idx.dt(),
            off.p(),
            off.dt(),
            y.p(),
            Arg::I32(es),
            n_arg(n),
            n_arg(whole),
            n_arg(inner),
            n_arg(idx.numel()),
            Arg::Ptr(Ptr::Err),
        ],
    ));
    Ok(())
}

/// `TpLookupGrad { parts, vocab, .. }`: `(indices, offset, dy)`; `ws` is
/// the instruction's workspace (an f32 accumulator for a half gradient).
pub(super) fn lookup_grad(
    split: Split,
    xs: &[Operand],
    ys: &[Operand],
    ws: Option<(u64, u64)>,
    a: &mut Vec<Action>,
) -> R<()> {
    let ([idx, off, dy], dx) = (ins::<3>(xs)?, out1(ys)?);
    int(&idx, "indices")?;
    int(&off, "offset")?;
    float(&dx)?;
    let (n, inner, whole) = table(dx.dims(), split)?;
    if dy.numel() != idx.numel() * inner {
        return Err(format!(
            "tp_lookup_grad: dy {} does not match indices {}",
            dy.ty, idx.ty
        ));
    }
    let acc = super::gather::accumulator("tp_lookup_grad", &dx, ws, a)?;
    a.push(ew(
        "vocab_lookup_bwd",
        dy.numel(),
        vec![
            idx.p(),
            idx.dt(),
            off.p(),
            off.dt(),
            dy.p(),
            dy.dt(),
            Arg::Ptr(Ptr::Abs(acc)),
            n_arg(n),
            n_arg(whole),
            n_arg(inner),
            n_arg(idx.numel()),
            Arg::Ptr(Ptr::Err),
        ],
    ));
    super::gather::cast_back(acc, &dx, a);
    Ok(())
}

/// Rows, this member's columns and the whole vocabulary of `logits`
/// against `labels`.
fn geometry(logits: &Operand, labels: &Operand, split: Split) -> R<(u64, u64, u64)> {
    float(logits)?;
    int(labels, "labels")?;
    let c = logits.dims().last().copied().unwrap_or(0) as u64;
    if c == 0 || logits.numel() / c != labels.numel() {
        return Err(format!(
            "tp_logit_stats: logits {} and labels {} do not match",
            logits.ty, labels.ty
        ));
    }
    // The gradient finds a row's first maximum through f32 column numbers.
    if c > 1 << 24 {
        return Err(format!(
            "tp_logit_stats: {c} columns per member exceed 2^24"
        ));
    }
    Ok((labels.numel(), c, split.whole(c)))
}

fn ignore_args(ignore: Option<i64>) -> [Arg; 2] {
    [
        Arg::I32(ignore.is_some() as i32),
        Arg::I64(ignore.unwrap_or(0)),
    ]
}

fn f32_stats(s: &Operand, rows: u64, what: &str) -> R<()> {
    if s.ty.dtype != DType::F32 || s.numel() != 3 * rows {
        return Err(format!("{what} must be f32 [1, {rows}, 3], got {}", s.ty));
    }
    Ok(())
}

/// `TpLogitStats { ignore_index, parts, vocab }`: `(logits, labels,
/// offset)`.
pub(super) fn stats(
    ignore: Option<i64>,
    split: Split,
    xs: &[Operand],
    ys: &[Operand],
    a: &mut Vec<Action>,
) -> R<()> {
    let ([logits, labels, off], y) = (ins::<3>(xs)?, out1(ys)?);
    int(&off, "offset")?;
    let (rows, c, whole) = geometry(&logits, &labels, split)?;
    f32_stats(&y, rows, "the statistics")?;
    let [hi, ig] = ignore_args(ignore);
    a.push(rows_launch(
        "vocab_stats",
        rows,
        vec![
            logits.p(),
            logits.dt(),
            labels.p(),
            labels.dt(),
            off.p(),
            off.dt(),
            n_arg(rows),
            n_arg(c),
            n_arg(whole),
            hi,
            ig,
            y.p(),
            Arg::Ptr(Ptr::Err),
        ],
    ));
    Ok(())
}

/// `TpLogitStatsGrad { ignore_index, parts, vocab }`: `(logits, labels,
/// offset, stats, dstats)`.
pub(super) fn stats_grad(
    ignore: Option<i64>,
    split: Split,
    xs: &[Operand],
    ys: &[Operand],
    a: &mut Vec<Action>,
) -> R<()> {
    let ([logits, labels, off, st, ds], dx) = (ins::<5>(xs)?, out1(ys)?);
    int(&off, "offset")?;
    let (rows, c, whole) = geometry(&logits, &labels, split)?;
    f32_stats(&st, rows, "stats")?;
    f32_stats(&ds, rows, "dstats")?;
    same_count(&logits, &dx)?;
    let [hi, ig] = ignore_args(ignore);
    a.push(rows_launch(
        "vocab_stats_bwd",
        rows,
        vec![
            logits.p(),
            logits.dt(),
            labels.p(),
            labels.dt(),
            off.p(),
            off.dt(),
            st.p(),
            ds.p(),
            dx.p(),
            dx.dt(),
            n_arg(rows),
            n_arg(c),
            n_arg(whole),
            hi,
            ig,
            Arg::Ptr(Ptr::Err),
        ],
    ));
    Ok(())
}
