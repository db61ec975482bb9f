//! `Reduce { f: Sum | Mean | Max, axes, keepdims }`. The axes must be
//! distinct and in range; an empty `axes` reduces over every axis (ONNX's
//! default). `Mean` needs floating point.
//!
//! Gradients: `Sum` expands `dy` back (through a reshape that restores the
//! reduced axes as 1s when `keepdims` is false); `Mean` first scales `dy` by
//! `1 / count`; `Max` routes `dy` to the arg-max positions (`ReduceMaxGrad`).

use super::check::{arity, float};
use super::{in_numel, misrouted, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::{BinaryFn, Op, ReduceFn};
use crate::types::{DType, TensorType};

pub(crate) struct Reduce;

impl Family for Reduce {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        let Op::Reduce { f, axes, keepdims } = op else {
            return Err(misrouted(op, "reduce"));
        };
        arity(inputs, 1, "x")?;
        let x = inputs[0];
        match f {
            ReduceFn::Mean => float(x, "the input of a mean")?,
            _ if x.dtype == DType::Bool => return Err(format!("cannot reduce a bool tensor {x}")),
            _ => {}
        }
        let shape = reduced_shape(x.shape.dims(), axes, *keepdims)?;
        Ok(vec![TensorType::new(x.dtype, shape)])
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let Op::Reduce { f, axes, keepdims } = op else {
            return Err(misrouted(op, "reduce"));
        };
        let (x, dy) = (cx.x(0)?, cx.dy());
        if *f == ReduceFn::Max {
            let op = Op::ReduceMaxGrad {
                axes: axes.clone(),
                keepdims: *keepdims,
            };
            let ins = [x, cx.y(), dy];
            return Ok(vec![Some(cx.emit(op, &ins)?)]);
        }
        let x_ty = cx.ty(x)?;
        let x_shape = x_ty.shape.dims();
        let mut g = dy;
        if *f == ReduceFn::Mean {
            let count: u64 = reduced_axes(x_shape.len(), axes)
                .map(|a| x_shape[a] as u64)
                .product();
            let scale = cx.scalar(x_ty.dtype, 1.0 / count.max(1) as f64)?;
            g = cx.emit(Op::Binary { f: BinaryFn::Mul }, &[g, scale])?;
        }
        let kept = reduced_shape(x_shape, axes, true)?;
        if cx.shape(g)? != kept {
            g = cx.emit(Op::Reshape { shape: kept }, &[g])?;
        }
        let shape = x_shape.to_vec();
        Ok(vec![Some(cx.emit(Op::Expand { shape }, &[g])?)])
    }

    fn flops(&self, _op: &Op, inputs: &[&TensorType], _outputs: &[TensorType]) -> f64 {
        in_numel(inputs, 0)
    }
}

/// The axes a reduction over `axes` of a rank-`rank` tensor reduces (all of
/// them when `axes` is empty).
pub(crate) fn reduced_axes(rank: usize, axes: &[usize]) -> impl Iterator<Item = usize> + '_ {
    (0..rank).filter(move |a| axes.is_empty() || axes.contains(a))
}

/// The shape of `x` reduced over `axes` (see `reduced_axes`).
pub(crate) fn reduced_shape(
    x: &[usize],
    axes: &[usize],
    keepdims: bool,
) -> Result<Vec<usize>, String> {
    for (i, &a) in axes.iter().enumerate() {
        if a >= x.len() {
            return Err(format!(
                "axis {a} is out of range for a tensor of rank {} ({x:?})",
                x.len()
            ));
        }
        if axes[..i].contains(&a) {
            return Err(format!("axis {a} appears twice in {axes:?}"));
        }
    }
    let reduced: Vec<usize> = reduced_axes(x.len(), axes).collect();
    Ok(x.iter()
        .enumerate()
        .filter_map(|(i, &d)| match (reduced.contains(&i), keepdims) {
            (false, _) => Some(d),
            (true, true) => Some(1),
            (true, false) => None,
        })
        .collect())
}
