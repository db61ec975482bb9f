//! Shape manipulation — ONNX operators Shape (opsets 13–21, with `start`/`end`
//! from 15), Reshape (13–21, `allowzero` from 14), Flatten, Transpose,
//! Squeeze and Unsqueeze (13–21, axes as an input), Expand (13–21,
//! bidirectional broadcast). Shapes are static, so `Shape` is always a
//! constant and the computations built on it fold.

use super::Convert;
use crate::onnx::context::{norm_axis, NodeCx, Val};
use crate::onnx::tensor::{
    broadcast, broadcast_indices, check_numel, check_size, strides, HostTensor,
};
use fsdpc_ir::Op;

pub(super) const OPS: &[(&str, Convert)] = &[
    ("Shape", shape),
    ("Reshape", reshape),
    ("Flatten", flatten),
    ("Transpose", transpose),
    ("Squeeze", squeeze),
    ("Unsqueeze", unsqueeze),
    ("Expand", expand),
];

fn shape(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let dims: Vec<i64> = cx.ty(0)?.shape.dims().iter().map(|&d| d as i64).collect();
    let r = dims.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(cx.attr_i("start", 0)?);
    let end = clamp(cx.attr_i("end", r)?);
    let v = dims.get(start..end.max(start)).unwrap_or_default().to_vec();
    cx.set(0, Val::Const(HostTensor::vec_i64(v)));
    Ok(())
}

/// Gives input 0 the shape `dims`: folds a constant, else adds a `Reshape`.
pub(super) fn set_reshaped(cx: &mut NodeCx<'_>, dims: Vec<usize>) -> Result<(), String> {
    if let Val::Const(t) = cx.val(0)? {
        let y = t.reshaped(dims);
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let x = cx.ir(0)?;
    let y = if cx.ty(0)?.shape.dims() == dims.as_slice() {
        x
    } else {
        cx.add(Op::Reshape { shape: dims }, &[x], "reshape")?
    };
    cx.set(0, Val::Ir(y));
    Ok(())
}

fn reshape(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let input = cx.ty(0)?.shape.dims().to_vec();
    let spec = cx.konst(1, "target shape")?.as_i64();
    let allow_zero = cx.attr_i("allowzero", 0)? != 0;
    let dims = target(&input, &spec, allow_zero)?;
    set_reshaped(cx, dims)
}

/// The shape `spec` asks for (0 copies the input's dimension unless
/// `allow_zero`; one -1 is inferred).
fn target(input: &[usize], spec: &[i64], allow_zero: bool) -> Result<Vec<usize>, String> {
    let numel: usize = input.iter().product();
    let as_dims: Vec<usize> = spec.iter().map(|&d| d.max(1) as usize).collect();
    check_numel(&as_dims)?;
    let mut infer = None;
    let mut dims = Vec::with_capacity(spec.len());
    for (i, &d) in spec.iter().enumerate() {
        dims.push(match d {
            -1 if infer.is_none() => {
                infer = Some(i);
                1
            }
            0 if !allow_zero => *input
                .get(i)
                .ok_or_else(|| format!("0 at position {i} copies a dimension the input lacks"))?,
            d if d >= 0 => d as usize,
            _ => return Err(format!("invalid target shape {spec:?}")),
        });
    }
    let known: usize = dims.iter().product();
    if let Some(i) = infer {
        if known == 0 || numel % known != 0 {
            return Err(format!("cannot reshape {input:?} to {spec:?}"));
        }
        dims[i] = numel / known;
    }
    if dims.iter().product::<usize>() != numel {
        return Err(format!(
            "cannot reshape {input:?} ({numel} elements) to {spec:?}"
        ));
    }
    Ok(dims)
}

fn flatten(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let dims = cx.ty(0)?.shape.dims().to_vec();
    let r = dims.len() as i64;
    let a = cx.attr_i("axis", 1)?;
    let axis = if a < 0 { a + r } else { a };
    if !(0..=r).contains(&axis) {
        return Err(format!("axis {a} is out of range for rank {r}"));
    }
    let (head, tail) = dims.split_at(axis as usize);
    set_reshaped(cx, vec![head.iter().product(), tail.iter().product()])
}

fn transpose(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let rank = cx.rank(0)?;
    let perm: Vec<usize> = match cx.attr_ints("perm")? {
        Some(p) => p
            .iter()
            .map(|&a| norm_axis(a, rank))
            .collect::<Result<_, _>>()?,
        None => (0..rank).rev().collect(),
    };
    let mut seen = perm.clone();
    seen.sort_unstable();
    if seen != (0..rank).collect::<Vec<_>>() {
        return Err(format!("perm {perm:?} is not a permutation of 0..{rank}"));
    }
    if let Val::Const(t) = cx.val(0)? {
        let y = fold_transpose(t, &perm)?;
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let x = cx.ir(0)?;
    let y = cx.add(Op::Transpose { perm }, &[x], "transpose")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

fn fold_transpose(t: &HostTensor, perm: &[usize]) -> Result<HostTensor, String> {
    let out: Vec<usize> = perm.iter().map(|&p| t.shape[p]).collect();
    check_size(&out)?;
    let st = strides(&t.shape);
    let pst: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let mut flat = Vec::with_capacity(t.numel());
    let mut idx = vec![0usize; out.len()];
    for _ in 0..t.numel() {
        flat.push(idx.iter().zip(&pst).map(|(i, s)| i * s).sum());
        for k in (0..out.len()).rev() {
            idx[k] += 1;
            if idx[k] < out[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    Ok(t.pick(&flat, out))
}

/// Axes from input 1 (or, for `Squeeze`, every axis of size 1).
fn axes(cx: &NodeCx<'_>, rank: usize) -> Result<Option<Vec<usize>>, String> {
    match cx.opt_konst(1, "axes")? {
        None => Ok(None),
        Some(t) => {
            let mut a = t
                .as_i64()
                .into_iter()
                .map(|a| norm_axis(a, rank))
                .collect::<Result<Vec<_>, _>>()?;
            a.sort_unstable();
            a.dedup();
            Ok(Some(a))
        }
    }
}

fn squeeze(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let dims = cx.ty(0)?.shape.dims().to_vec();
    let axes = axes(cx, dims.len())?;
    let keep = |i: usize| match &axes {
        Some(a) => !a.contains(&i),
        None => dims[i] != 1,
    };
    if let Some(a) = axes
        .as_ref()
        .and_then(|a| a.iter().find(|&&a| dims[a] != 1))
    {
        return Err(format!("axis {a} has size {}, not 1", dims[*a]));
    }
    let out = (0..dims.len())
        .filter(|&i| keep(i))
        .map(|i| dims[i])
        .collect();
    set_reshaped(cx, out)
}

fn unsqueeze(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let dims = cx.ty(0)?.shape.dims().to_vec();
    let n = cx.konst(1, "axes")?.numel();
    let axes = axes(cx, dims.len() + n)?.unwrap_or_default();
    let mut src = dims.into_iter();
    let out = (0..axes.len() + src.len())
        .map(|i| {
            if axes.contains(&i) {
                1
            } else {
                src.next().unwrap_or(1)
            }
        })
        .collect();
    set_reshaped(cx, out)
}

fn expand(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let spec = cx.konst(1, "target shape")?.as_i64();
    let spec: Vec<usize> = spec
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("negative dimension {d} in {spec:?}")))
        .collect::<Result<_, _>>()?;
    let input = cx.ty(0)?.shape.dims().to_vec();
    let out = broadcast(&input, &spec)?;
    check_numel(&out)?;
    if let Val::Const(t) = cx.val(0)? {
        check_size(&out)?;
        let y = t.pick(&broadcast_indices(&t.shape, &out), out);
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let x = cx.ir(0)?;
    let y = if out == input {
        x
    } else {
        cx.add(Op::Expand { shape: out }, &[x], "expand")?
    };
    cx.set(0, Val::Ir(y));
    Ok(())
}
