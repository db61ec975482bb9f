//! Indexing — ONNX operator Gather (opsets 13–21: numpy `take` along one
//! axis). Gathers on constants fold (the `Shape -> Gather` of reshape
//! computations); negative constant indices are normalised.

use super::Convert;
use crate::onnx::context::{norm_axis, NodeCx, Val};
use crate::onnx::tensor::{check_size, HostTensor};
use fsdpc_ir::Op;

pub(super) const OPS: &[(&str, Convert)] = &[("Gather", gather)];

fn gather(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let data_ty = cx.ty(0)?;
    let axis = norm_axis(cx.attr_i("axis", 0)?, data_ty.shape.rank())?;
    let dim = data_ty.shape.dims()[axis];
    let indices = match cx.val(1)? {
        Val::Const(t) => Some(normalise(t, dim)?),
        Val::Ir(_) => None,
    };
    if let (Val::Const(data), Some(idx)) = (cx.val(0)?, &indices) {
        let y = fold(data, idx, axis)?;
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let data = cx.ir(0)?;
    let idx = match indices {
        Some(t) => cx.constant(&t)?,
        None => cx.ir(1)?,
    };
    let y = cx.add(Op::Gather { axis }, &[data, idx], "gather")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// Constant indices with negatives counted from the end, checked against `dim`.
fn normalise(t: &HostTensor, dim: usize) -> Result<HostTensor, String> {
    let d = dim as i64;
    let v = t
        .as_i64()
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + d } else { i };
            if (0..d).contains(&j) {
                Ok(j)
            } else {
                Err(format!(
                    "index {i} is out of range for a dimension of {dim}"
                ))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HostTensor::ints(t.dtype, t.shape.clone(), v))
}

fn fold(data: &HostTensor, idx: &HostTensor, axis: usize) -> Result<HostTensor, String> {
    let mut shape = data.shape[..axis].to_vec();
    shape.extend(&idx.shape);
    shape.extend(&data.shape[axis + 1..]);
    check_size(&shape)?;
    let dim = data.shape[axis];
    let outer: usize = data.shape[..axis].iter().product();
    let inner: usize = data.shape[axis + 1..].iter().product();
    let ids = idx.as_i64();
    let mut flat = Vec::with_capacity(shape.iter().product());
    for o in 0..outer {
        for &i in &ids {
            let base = (o * dim + i as usize) * inner;
            flat.extend(base..base + inner);
        }
    }
    Ok(data.pick(&flat, shape))
}
