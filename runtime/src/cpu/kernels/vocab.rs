//! Vocabulary parallelism's kernels (`fsdpc_ir::Op::TpLookup`,
//! `TpLogitStats` and their gradients): the embedding lookup and the
//! logits' per-row statistics over the rows or columns of the whole
//! vocabulary this member holds, from `offset`.

use super::simd;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};

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

/// `TpLookup { parts }`: `(table, indices, offset)`.
pub fn lookup(parts: u32, ins: [&TensorRef; 3], y: &mut TensorMut) -> KResult<()> {
    let [table, indices, offset] = ins;
    let off = offset_of(offset)?;
    let n = table.dims().first().copied().unwrap_or(0);
    let whole = (n * parts as usize) as i64;
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

/// `TpLookupGrad { parts, .. }`: `(indices, offset, dy) -> d table`.
pub fn lookup_grad(parts: u32, ins: [&TensorRef; 3], dx: &mut TensorMut) -> KResult<()> {
    let [indices, offset, dy] = ins;
    let off = offset_of(offset)?;
    let n = dx.dims().first().copied().unwrap_or(0);
    let whole = (n * parts as usize) as i64;
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
/// vocabulary of `c * parts` classes.
#[inline]
fn column(l: i64, ignore: Option<i64>, off: i64, c: usize, parts: u32) -> KResult<Option<usize>> {
    if Some(l) == ignore {
        return Ok(None);
    }
    let whole = (c * parts as usize) as i64;
    if l < 0 || l >= whole {
        crate::kbail!("cross_entropy: label {l} out of range for {whole} classes");
    }
    let j = l - off;
    Ok((0..c as i64).contains(&j).then_some(j as usize))
}

/// `TpLogitStats { ignore_index, parts }`: `(logits, labels, offset) ->
/// [1, n, 3]`.
pub fn logit_stats(
    ignore: Option<i64>,
    parts: u32,
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
    for (r, (row, o)) in x.chunks_exact(c).zip(out.chunks_exact_mut(3)).enumerate() {
        let m = simd::max(row);
        o[0] = m;
        o[1] = simd::exp_sum(row, m, None);
        o[2] = column(lab.get(r), ignore, off, c, parts)?.map_or(0.0, |j| row[j]);
    }
    Ok(())
}

/// `TpLogitStatsGrad { ignore_index, parts }`: `(logits, labels, offset,
/// stats, dstats) -> dlogits`.
pub fn logit_stats_grad(
    ignore: Option<i64>,
    parts: u32,
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
    for (r, (row, gr)) in x.chunks_exact(c).zip(g.chunks_exact_mut(c)).enumerate() {
        let (m, s) = (st[3 * r], st[3 * r + 1]);
        let (dm, dsum, dt) = (ds[3 * r], ds[3 * r + 1], ds[3 * r + 2]);
        simd::exp_sum(row, m, Some(gr));
        simd::scale(gr, dsum);
        if let Some(j) = row.iter().position(|&v| v == m) {
            gr[j] += dm - dsum * s;
        }
        if let Some(j) = column(lab.get(r), ignore, off, c, parts)? {
            gr[j] += dt;
        }
    }
    Ok(())
}
