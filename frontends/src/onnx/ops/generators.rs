//! Tensor generators — ONNX operators Constant (opsets 13–21, every `value*`
//! attribute), ConstantOfShape (13–21), Range (13–21) and Trilu (14–21). They
//! produce folded constants; a Trilu of a run-time tensor becomes a `Where`
//! with a constant mask.

use super::Convert;
use crate::onnx::context::{NodeCx, Val};
use crate::onnx::tensor::{check_size, HostTensor};
use fsdpc_ir::{DType, Op};

pub(super) const OPS: &[(&str, Convert)] = &[
    ("Constant", constant),
    ("ConstantOfShape", constant_of_shape),
    ("Range", range),
    ("Trilu", trilu),
];

fn constant(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let t = if let Some(t) = cx.attr_tensor("value")? {
        t
    } else if cx.has_attr("value_float") {
        HostTensor::floats(DType::F32, vec![], vec![cx.attr_f("value_float", 0.0)?])
    } else if cx.has_attr("value_int") {
        HostTensor::ints(DType::I64, vec![], vec![cx.attr_i("value_int", 0)?])
    } else if let Some(v) = cx.attr_floats("value_floats")? {
        HostTensor::floats(
            DType::F32,
            vec![v.len()],
            v.into_iter().map(f64::from).collect(),
        )
    } else if let Some(v) = cx.attr_ints("value_ints")? {
        HostTensor::vec_i64(v)
    } else {
        return Err("no supported value attribute (value, value_float(s), value_int(s))".into());
    };
    cx.set(0, Val::Const(t));
    Ok(())
}

fn constant_of_shape(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let dims: Vec<usize> = cx
        .konst(0, "shape")?
        .as_i64()
        .into_iter()
        .map(|d| usize::try_from(d).map_err(|_| format!("negative dimension {d}")))
        .collect::<Result<_, _>>()?;
    check_size(&dims)?;
    let fill = cx
        .attr_tensor("value")?
        .unwrap_or_else(|| HostTensor::floats(DType::F32, vec![1], vec![0.0]));
    let n = dims.iter().product();
    let t = if fill.dtype.is_float() {
        HostTensor::floats(
            fill.dtype,
            dims,
            vec![fill.as_f64().first().copied().unwrap_or(0.0); n],
        )
    } else {
        HostTensor::ints(
            fill.dtype,
            dims,
            vec![fill.as_i64().first().copied().unwrap_or(0); n],
        )
    };
    cx.set(0, Val::Const(t));
    Ok(())
}

fn range(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let scalar = |cx: &NodeCx<'_>, i: usize, what: &str| -> Result<(HostTensor, f64), String> {
        let t = cx.konst(i, what)?;
        let v = t
            .as_f64()
            .first()
            .copied()
            .ok_or(format!("{what} is empty"))?;
        Ok((t.clone(), v))
    };
    let (start_t, start) = scalar(cx, 0, "start")?;
    let (_, limit) = scalar(cx, 1, "limit")?;
    let (_, delta) = scalar(cx, 2, "delta")?;
    if delta == 0.0 {
        return Err("delta is 0".into());
    }
    let n = ((limit - start) / delta).ceil().max(0.0) as usize;
    check_size(&[n])?;
    let v = (0..n).map(|i| start + i as f64 * delta).collect();
    cx.set(0, Val::Const(HostTensor::floats(start_t.dtype, vec![n], v)));
    Ok(())
}

/// The Trilu mask of a `[rows, cols]` matrix: true where the element is kept.
fn mask(rows: usize, cols: usize, k: i64, upper: bool) -> Vec<i64> {
    let mut m = Vec::with_capacity(rows * cols);
    for i in 0..rows as i64 {
        for j in 0..cols as i64 {
            m.push(i64::from(if upper { j - i >= k } else { j - i <= k }));
        }
    }
    m
}

fn trilu(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let ty = cx.ty(0)?;
    let dims = ty.shape.dims().to_vec();
    if dims.len() < 2 {
        return Err("input must have rank >= 2".into());
    }
    let k = cx
        .opt_konst(1, "k")?
        .map_or(0, |t| t.as_i64().first().copied().unwrap_or(0));
    let upper = cx.attr_i("upper", 1)? != 0;
    let (rows, cols) = (dims[dims.len() - 2], dims[dims.len() - 1]);
    check_size(&[rows, cols])?;
    let m = HostTensor::ints(DType::Bool, vec![rows, cols], mask(rows, cols, k, upper));
    if let Val::Const(t) = cx.val(0)? {
        let y = fold_mask(t, &m.as_i64());
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let x = cx.ir(0)?;
    let c = cx.constant(&m)?;
    let zero = cx.constant(&HostTensor::floats(ty.dtype, vec![], vec![0.0]))?;
    let y = cx.add(Op::Where, &[c, x, zero], "trilu")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// `t` with the elements outside `keep` (over the last two axes) zeroed.
fn fold_mask(t: &HostTensor, keep: &[i64]) -> HostTensor {
    let plane = keep.len().max(1);
    let v = t
        .as_f64()
        .into_iter()
        .enumerate()
        .map(|(i, x)| if keep[i % plane] != 0 { x } else { 0.0 })
        .collect();
    HostTensor::floats(t.dtype, t.shape.clone(), v)
}
