//! Vocabulary parallelism's kernels (`fsdpc_ir::Op::TpLookup`,
//! `TpLogitStats` and their gradients): the embedding lookup and the
//! logits' per-row statistics over the rows or columns of the whole
//! vocabulary this member holds, from `offset`. A padded vocabulary's
//! rows or columns past the whole one (`Split::vocab`) are never read as
//! a row, count in no statistic and get a zero gradient.

use super::simd;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};

/// How the vocabulary is split: over `parts` members, `vocab` classes in
/// all when the parts are padded.
#[derive(Copy, Clone, Debug)]
pub struct Split {
    parts: u32,
    vocab: Option<usize>,
}

impl Split {
    /// A split over `parts` members of a vocabulary of `vocab` when padded.
    pub fn new(parts: u32, vocab: Option<usize>) -> Split {
        Split { parts, vocab }
    }

    /// The whole vocabulary, from a member's `n` rows or columns.
    fn whole(self, n: usize) -> i64 {
        self.vocab.unwrap_or(n * self.parts as usize) as i64
    }

    /// How many of a member's `n` columns from `off` are the whole
    /// vocabulary's (the rest are padding).
    fn held(self, n: usize, off: i64) -> usize {
        (self.whole(n) - off).clamp(0, n as i64) as usize
    }
}

/// This member's offset into the whole vocabulary.
fn offset_of(offset: &TensorRef) -> KResult<i64> {
    let o = offset.ints()?;
    if o.len() != 1 {
        crate::kbail!("offset must hold one integer, got {}", offset.ty);
    }
    Ok(o.get(0))
}

/// Where whole index `i` lies in this member's `n` rows from `offset`
/// (`None`: another member's), for a whole table of `whole` rows
/// (negative indices count from its end).
#[inline]
fn local(i: i64, offset: i64, n: usize, whole: i64) -> KResult<Option<usize>> {
    let r = if i < 0 { i + whole } else { i };
    if r < 0 || r >= whole {
        crate::kbail!("index {i} out of range for a table of {whole} rows");
    }
    let l = r - offset;
    Ok((0..n as i64).contains(&l).then_some(l as usize))
}

/// `TpLookup { parts, vocab }`: `(table, indices, offset)`.
pub fn lookup(split: Split, ins: [&TensorRef; 3], y: &mut TensorMut) -> KResult<()> {
    let [table, indices, offset] = ins;
    let off = offset_of(offset)?;
    let n = table.dims().first().copied().unwrap_or(0);
    let whole = split.whole(n);
    if table.dtype() != y.dtype() {
        crate::kbail!(
            "tp_lookup: table {} and output {} dtypes differ",
            table.ty,
            y.ty
        );
    }
    let idx = indices.ints()?;
    let run = table.numel().checked_div(n).unwrap_or(0) * table.dtype().size();
    if y.bytes.len() != idx.len() * run {
        crate::kbail!(
            "tp_lookup: output {} does not match table {} and indices {}",
            y.ty,
            table.ty,
            indices.ty
        );
    }
    for (o, i) in idx.iter().enumerate() {
        let dst = &mut y.bytes[o * run..(o + 1) * run];
        match local(i, off, n, whole)? {
            Some(r) => dst.copy_from_slice(&table.bytes[r * run..(r + 1) * run]),
            None => dst.fill(0),
        }
    }
    Ok(())
}

/// `TpLookupGrad { parts, vocab, .. }`: `(indices, offset, dy) -> d table`.
pub fn lookup_grad(split: Split, ins: [&TensorRef; 3], dx: &mut TensorMut) -> KResult<()> {
    let [indices, offset, dy] = ins;
    let off = offset_of(offset)?;
    let n = dx.dims().first().copied().unwrap_or(0);
    let whole = split.whole(n);
    let idx = indices.ints()?;
    let (g, d) = (dy.f32()?, dx.f32_mut()?);
    let inner = d.len().checked_div(n).unwrap_or(0);
    if g.len() != idx.len() * inner {
        crate::kbail!(
            "tp_lookup_grad: dy {} does not match indices {}",
            dy.ty,
            indices.ty
        );
    }
    d.fill(0.0);
    for (o, i) in idx.iter().enumerate() {
        if let Some(r) = local(i, off, n, whole)? {
            let dst = &mut d[r * inner..(r + 1) * inner];
            for (a, &v) in dst.iter_mut().zip(&g[o * inner..(o + 1) * inner]) {
                *a += v;
            }
        }
    }
    Ok(())
}

/// The rows and this member's columns of `logits`, checking the labels.
fn geometry(logits: &TensorRef, labels: &TensorRef) -> KResult<(usize, usize)> {
    let c = logits.dims().last().copied().unwrap_or(0);
    if c == 0 || logits.numel() / c != labels.numel() {
        crate::kbail!(
            "tp_logit_stats: logits {} and labels {} do not match",
            logits.ty,
            labels.ty
        );
    }
    Ok((labels.numel(), c))
}

/// The column of row label `l` in this member's `c` columns from `off`
/// (`None`: ignored, or another member's), checked against the whole
/// vocabulary.
#[inline]
fn column(l: i64, ignore: Option<i64>, off: i64, c: usize, split: Split) -> KResult<Option<usize>> {
    if Some(l) == ignore {
        return Ok(None);
    }
    let whole = split.whole(c);
    if l < 0 || l >= whole {
        crate::kbail!("cross_entropy: label {l} out of range for {whole} classes");
    }
    let j = l - off;
    Ok((0..c as i64).contains(&j).then_some(j as usize))
}

/// `TpLogitStats { ignore_index, parts, vocab }`: `(logits, labels,
/// offset) -> [1, n, 3]`, over the columns held (a member holding none
/// writes a maximum of -inf and a sum of 0).
pub fn logit_stats(
    ignore: Option<i64>,
    split: Split,
    ins: [&TensorRef; 3],
    y: &mut TensorMut,
) -> KResult<()> {
    let [logits, labels, offset] = ins;
    let (rows, c) = geometry(logits, labels)?;
    let off = offset_of(offset)?;
    let (x, lab) = (logits.f32()?, labels.ints()?);
    let out = y.f32_mut()?;
    if out.len() != 3 * rows {
        crate::kbail!(
            "tp_logit_stats writes [1, {rows}, 3], the output is {}",
            y.ty
        );
    }
    let held = split.held(c, off);
    for (r, (row, o)) in x.chunks_exact(c).zip(out.chunks_exact_mut(3)).enumerate() {
        let row = &row[..held];
        let m = simd::max(row);
        o[0] = m;
        o[1] = simd::exp_sum(row, m, None);
        o[2] = column(lab.get(r), ignore, off, c, split)?.map_or(0.0, |j| row[j]);
    }
    Ok(())
}

/// `TpLogitStatsGrad { ignore_index, parts, vocab }`: `(logits, labels,
/// offset, stats, dstats) -> dlogits`, zero at the padding columns.
pub fn logit_stats_grad(
    ignore: Option<i64>,
    split: Split,
    ins: [&TensorRef; 5],
    dx: &mut TensorMut,
) -> KResult<()> {
    let [logits, labels, offset, stats, dstats] = ins;
    let (rows, c) = geometry(logits, labels)?;
    let off = offset_of(offset)?;
    let (x, lab, st, ds) = (logits.f32()?, labels.ints()?, stats.f32()?, dstats.f32()?);
    let g = dx.f32_mut()?;
    if g.len() != x.len() || st.len() != 3 * rows || ds.len() != 3 * rows {
        crate::kbail!(
            "tp_logit_stats_grad: output {}, stats {} and dstats {} do not match the logits {}",
            dx.ty,
            stats.ty,
            dstats.ty,
            logits.ty
        );
    }
    let held = split.held(c, off);
    for (r, (row, gr)) in x.chunks_exact(c).zip(g.chunks_exact_mut(c)).enumerate() {
        let (m, s) = (st[3 * r], st[3 * r + 1]);
        let (dm, dsum, dt) = (ds[3 * r], ds[3 * r + 1], ds[3 * r + 2]);
        gr[held..].fill(0.0);
        let (row, gr) = (&row[..held], &mut gr[..held]);
        simd::exp_sum(row, m, Some(gr));
        simd::scale(gr, dsum);
        if let Some(j) = row.iter().position(|&v| v == m) {
            gr[j] += dm - dsum * s;
        }
        if let Some(j) = column(lab.get(r), ignore, off, c, split)? {
            gr[j] += dt;
        }
    }
    Ok(())
}
