//! `CrossEntropy` and `CrossEntropyGrad` over `logits[.., c]` and integer
//! `labels[..]` (one label per row): the mean over the rows whose label is not
//! `ignore_index`. If every row is ignored the loss is 0 and so is the
//! gradient (PyTorch would give NaN). A label outside `0..c` is an error.

use super::simd;
use crate::error::KResult;
use crate::tensor::{Ints, TensorMut, TensorRef};

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

/// Checks every label and counts the rows that are not ignored.
fn count_rows(lab: &Ints, ignore: Option<i64>, c: usize) -> KResult<usize> {
    let mut count = 0;
    for l in lab.iter() {
        count += usize::from(class(l, ignore, c)?.is_some());
    }
    Ok(count)
}

/// The labels of the rows, checked by `count_rows`: the class of each row,
/// `None` for an ignored one.
#[derive(Copy, Clone)]
struct Classes<'a> {
    lab: Ints<'a>,
    ignore: Option<i64>,
}

impl Classes<'_> {
    #[inline]
    fn get(&self, r: usize) -> Option<usize> {
        let l = self.lab.get(r);
        (Some(l) != self.ignore).then_some(l as usize)
    }
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
    let count = count_rows(&lab, ignore, c)?;
    let cls = Classes { lab, ignore };
    let out = loss.f32_mut()?;
    if out.len() != 1 {
        crate::kbail!("cross_entropy writes a scalar, the output is {}", loss.ty);
    }
    let sum = ce_rows(x, c, cls);
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
    let count = count_rows(&lab, ignore, c)?;
    let cls = Classes { lab, ignore };
    let g = dlogits.f32_mut()?;
    if g.len() != x.len() {
        crate::kbail!(
            "cross_entropy_grad: output {} does not match the logits {}",
            dlogits.ty,
            logits.ty
        );
    }
    let scale = if count == 0 { 0.0 } else { dl / count as f32 };
    ce_grad_rows(x, g, c, cls, scale);
    Ok(())
}

crate::multiversion! {
    /// Sum over the non-ignored rows of `logsumexp(row) - row[label]`.
    fn ce_rows(x: &[f32], c: usize, cls: Classes<'_>) -> f64 {
        let mut sum = 0.0f64;
        for (r, row) in x.chunks_exact(c).enumerate() {
            if let Some(t) = cls.get(r) {
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
    fn ce_grad_rows(x: &[f32], g: &mut [f32], c: usize, cls: Classes<'_>, scale: f32) {
        for (r, (row, gr)) in x.chunks_exact(c).zip(g.chunks_exact_mut(c)).enumerate() {
            match cls.get(r) {
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
