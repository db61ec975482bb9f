//! `CrossEntropy` and `CrossEntropyGrad` over `logits[.., c]` and integer
//! `labels[..]` (one label per row): the mean over the rows whose label is not
//! `ignore_index`. If every row is ignored the loss is 0 and so is the
//! gradient (PyTorch would give NaN). A label outside `0..c` is an error.

use super::simd;
use crate::error::KResult;
use crate::tensor::{TensorMut, TensorRef};

/// (rows, classes), checking the labels count.
fn geometry(logits: &TensorRef, labels: &TensorRef) -> KResult<(usize, usize)> {
    let c = logits.dims().last().copied().unwrap_or(0);
    if c == 0 || logits.numel() / c != labels.numel() {
        crate::kbail!(
            "cross_entropy: logits {} and labels {} do not match",
            logits.ty,
            labels.ty
        );
    }
    Ok((labels.numel(), c))
}

/// The class of row `r`, or `None` if the row is ignored.
fn class(label: i64, ignore: Option<i64>, c: usize) -> KResult<Option<usize>> {
    if Some(label) == ignore {
        return Ok(None);
    }
    if label < 0 || label >= c as i64 {
        crate::kbail!("cross_entropy: label {label} out of range for {c} classes");
    }
    Ok(Some(label as usize))
}

/// The rows' classes (`None` for ignored rows) and the count of the others.
fn classes(lab: &[i64], ignore: Option<i64>, c: usize) -> KResult<(Vec<Option<usize>>, usize)> {
    let mut out = Vec::with_capacity(lab.len());
    for &l in lab {
        out.push(class(l, ignore, c)?);
    }
    let count = out.iter().filter(|t| t.is_some()).count();
    Ok((out, count))
}

/// `CrossEntropy { ignore_index }`: per row `logsumexp(x) - x[label]`,
/// without materialising the log-probabilities.
pub fn forward(
    ignore: Option<i64>,
    logits: &TensorRef,
    labels: &TensorRef,
    loss: &mut TensorMut,
) -> KResult<()> {
    let (_, c) = geometry(logits, labels)?;
    let (x, lab) = (logits.f32()?, labels.ints()?);
    let (cls, count) = classes(&lab, ignore, c)?;
    let out = loss.f32_mut()?;
    if out.len() != 1 {
        crate::kbail!("cross_entropy writes a scalar, the output is {}", loss.ty);
    }
    let sum = ce_rows(x, c, &cls);
    out[0] = if count == 0 {
        0.0
    } else {
        (sum / count as f64) as f32
    };
    Ok(())
}

/// `CrossEntropyGrad { ignore_index }`: `(logits, labels, dloss) -> dlogits`,
/// `(softmax(x) - onehot(label)) * dloss / count` per row.
pub fn backward(ignore: Option<i64>, ins: [&TensorRef; 3], dlogits: &mut TensorMut) -> KResult<()> {
    let [logits, labels, dloss] = ins;
    let (_, c) = geometry(logits, labels)?;
    let (x, lab, dl) = (logits.f32()?, labels.ints()?, dloss.f32()?);
    let Some(&dl) = dl.first() else {
        crate::kbail!("cross_entropy_grad: dloss is empty");
    };
    let (cls, count) = classes(&lab, ignore, c)?;
    let g = dlogits.f32_mut()?;
    if g.len() != x.len() {
        crate::kbail!(
            "cross_entropy_grad: output {} does not match the logits {}",
            dlogits.ty,
            logits.ty
        );
    }
    let scale = if count == 0 { 0.0 } else { dl / count as f32 };
    ce_grad_rows(x, g, c, &cls, scale);
    Ok(())
}

crate::multiversion! {
    /// Sum over the non-ignored rows of `logsumexp(row) - row[label]`.
    fn ce_rows(x: &[f32], c: usize, cls: &[Option<usize>]) -> f64 {
        let mut sum = 0.0f64;
        for (row, t) in x.chunks_exact(c).zip(cls) {
            if let Some(t) = *t {
                let m = simd::max(row);
                let lse = m + simd::exp_sum(row, m, None).ln();
                sum += (lse - row[t]) as f64;
            }
        }
        sum
    }
}

crate::multiversion! {
    /// `g = (softmax(row) - onehot) * scale` per row; ignored rows zero.
    fn ce_grad_rows(x: &[f32], g: &mut [f32], c: usize, cls: &[Option<usize>], scale: f32) {
        for ((row, gr), t) in x.chunks_exact(c).zip(g.chunks_exact_mut(c)).zip(cls) {
            match *t {
                None => gr.fill(0.0),
                Some(t) => {
                    let m = simd::max(row);
                    let s = simd::exp_sum(row, m, Some(gr));
                    simd::scale(gr, scale / s);
                    gr[t] -= scale;
                }
            }
        }
    }
}
