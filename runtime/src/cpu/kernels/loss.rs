//! `CrossEntropy` and `CrossEntropyGrad` over `logits[.., c]` and integer
//! `labels[..]` (one label per row): the mean over the rows whose label is not
//! `ignore_index`. If every row is ignored the loss is 0 and so is the
//! gradient (PyTorch would give NaN). A label outside `0..c` is an error.

use super::softmax::log_softmax_row;
use crate::backend::Workspace;
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

/// `CrossEntropy { ignore_index }`.
pub fn forward(
    ignore: Option<i64>,
    logits: &TensorRef,
    labels: &TensorRef,
    loss: &mut TensorMut,
    ws: &mut Workspace,
) -> KResult<()> {
    let (n, c) = geometry(logits, labels)?;
    let (x, lab) = (logits.f32()?, labels.ints()?);
    let row = ws.f32s(c);
    let (mut sum, mut count) = (0.0f64, 0usize);
    for r in 0..n {
        let Some(t) = class(lab[r], ignore, c)? else {
            continue;
        };
        log_softmax_row(&x[r * c..(r + 1) * c], row);
        sum -= row[t] as f64;
        count += 1;
    }
    let out = loss.f32_mut()?;
    if out.len() != 1 {
        crate::kbail!("cross_entropy writes a scalar, the output is {}", loss.ty);
    }
    out[0] = if count == 0 {
        0.0
    } else {
        (sum / count as f64) as f32
    };
    Ok(())
}

/// `CrossEntropyGrad { ignore_index }`: `(logits, labels, dloss) -> dlogits`.
pub fn backward(ignore: Option<i64>, ins: [&TensorRef; 3], dlogits: &mut TensorMut) -> KResult<()> {
    let [logits, labels, dloss] = ins;
    let (n, c) = geometry(logits, labels)?;
    let (x, lab, dl) = (logits.f32()?, labels.ints()?, dloss.f32()?);
    let Some(&dl) = dl.first() else {
        crate::kbail!("cross_entropy_grad: dloss is empty");
    };
    let mut count = 0usize;
    for &l in lab.iter() {
        count += usize::from(class(l, ignore, c)?.is_some());
    }
    let g = dlogits.f32_mut()?;
    let scale = if count == 0 { 0.0 } else { dl / count as f32 };
    for r in 0..n {
        let gr = &mut g[r * c..(r + 1) * c];
        match class(lab[r], ignore, c)? {
            None => gr.fill(0.0),
            Some(t) => {
                super::softmax::softmax_row(&x[r * c..(r + 1) * c], gr);
                gr[t] -= 1.0;
                for v in gr.iter_mut() {
                    *v *= scale;
                }
            }
        }
    }
    Ok(())
}
