//! Normalisation: `LayerNorm`, `RmsNorm` (one block per row) and their
//! gradients (dx per row, then the parameter gradients from f32 partials
//! over row chunks in private scratch).

use super::{ins, n_arg, out1, rows_launch, same_count, Action, Lowered, Operand, R};
use crate::targets::cuda::device::{blocks_for, Arg, Launch, Ptr, THREADS};

/// `LayerNorm { eps }`: `(x, gamma[, beta])`.
pub(super) fn layer_norm(eps: f64, xs: &[Operand], ys: &[Operand], l: &mut Lowered) -> R<()> {
    let y = out1(ys)?;
    let (x, g, b) = match xs {
        [x, g] => (*x, *g, None),
        [x, g, b] => (*x, *g, Some(*b)),
        _ => return Err("layer_norm takes (x, gamma[, beta])".into()),
    };
    let (rows, d) = match &b {
        Some(b) => norm_rows(&x, &[&g, b])?,
        None => norm_rows(&x, &[&g])?,
    };
    same_count(&x, &y)?;
    let (bp, bt) = b.map_or((Arg::Ptr(Ptr::Abs(0)), Arg::I32(0)), |b| (b.p(), b.dt()));
    l.actions.push(rows_launch(
        "ln_fwd",
        rows,
        vec![
            x.p(),
            x.dt(),
            g.p(),
            g.dt(),
            bp,
            bt,
            y.p(),
            y.dt(),
            n_arg(rows),
            Arg::I32(d as i32),
            Arg::F32(eps as f32),
        ],
    ));
    Ok(())
}

/// `RmsNorm { eps }`: `(x, gamma)`.
pub(super) fn rms_norm(eps: f64, xs: &[Operand], ys: &[Operand], l: &mut Lowered) -> R<()> {
    let ([x, g], y) = (ins::<2>(xs)?, out1(ys)?);
    let (rows, d) = norm_rows(&x, &[&g])?;
    same_count(&x, &y)?;
    l.actions.push(rows_launch(
        "rms_fwd",
        rows,
        vec![
            x.p(),
            x.dt(),
            g.p(),
            g.dt(),
            y.p(),
            y.dt(),
            n_arg(rows),
            Arg::I32(d as i32),
            Arg::F32(eps as f32),
        ],
    ));
    Ok(())
}

/// Rows and the last axis of a normalised tensor, checking the parameters.
fn norm_rows(x: &Operand, params: &[&Operand]) -> R<(u64, u64)> {
    let d = x.dims().last().copied().unwrap_or(1) as u64;
    if d == 0 {
        return Err(format!(
            "cannot normalise over an empty last axis ({})",
            x.ty
        ));
    }
    for p in params {
        if p.numel() != d {
            return Err(format!(
                "parameter {} does not match the last axis of {}",
                p.ty, x.ty
            ));
        }
    }
    if d > i32::MAX as u64 {
        return Err(format!("last axis of {} too long", x.ty));
    }
    Ok((x.numel() / d, d))
}

/// Row chunks of the parameter-gradient partials.
const NORM_CHUNKS: u64 = 64;

/// The backward of layer norm (`rms`: RMS norm): dx per row, then the
/// parameter gradients from f32 partials over row chunks.
pub(super) fn norm_grad(
    eps: f64,
    rms: bool,
    xs: &[Operand],
    ys: &[Operand],
    l: &mut Lowered,
) -> R<()> {
    let [x, g, dy] = ins::<3>(xs)?;
    let (rows, d) = norm_rows(&x, &[&g])?;
    same_count(&x, &dy)?;
    let (dx, dg, db) = match (rms, ys) {
        (true, [dx, dg]) => (*dx, *dg, None),
        (false, [dx, dg]) => (*dx, *dg, None),
        (false, [dx, dg, db]) => (*dx, *dg, Some(*db)),
        _ => return Err(format!("norm gradient: {} outputs", ys.len())),
    };
    let chunks = NORM_CHUNKS.min(rows).max(1);
    let stats = 0u64;
    let part = stats + (8 * rows).div_ceil(256) * 256;
    l.scratch = part + 4 * 2 * chunks * d;
    let s = |off: u64| Arg::Ptr(Ptr::Scratch(off));
    l.actions.push(rows_launch(
        "norm_bwd_dx",
        rows,
        vec![
            x.p(),
            x.dt(),
            g.p(),
            g.dt(),
            dy.p(),
            dy.dt(),
            dx.p(),
            dx.dt(),
            n_arg(rows),
            Arg::I32(d as i32),
            Arg::F32(eps as f32),
            Arg::I32(rms as i32),
            s(stats),
        ],
    ));
    l.actions.push(Action::Launch(Launch {
        kernel: "norm_bwd_params_partial",
        grid: (d.div_ceil(THREADS as u64) as u32, chunks as u32, 1),
        block: THREADS,
        smem: 0,
        args: vec![
            x.p(),
            x.dt(),
            dy.p(),
            dy.dt(),
            n_arg(rows),
            Arg::I32(d as i32),
            s(stats),
            s(part),
            Arg::I32(db.is_some() as i32),
        ],
    }));
    let (dbp, dbt) = db.map_or((Arg::Ptr(Ptr::Abs(0)), Arg::I32(0)), |b| (b.p(), b.dt()));
    l.actions.push(Action::Launch(Launch {
        kernel: "norm_bwd_params_finish",
        grid: (blocks_for(d), 1, 1),
        block: THREADS,
        smem: 0,
        args: vec![
            s(part),
            Arg::I32(chunks as i32),
            Arg::I32(d as i32),
            dg.p(),
            dg.dt(),
            dbp,
            dbt,
        ],
    }));
    Ok(())
}
