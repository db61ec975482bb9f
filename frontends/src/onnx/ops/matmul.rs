//! Matrix products — ONNX operators MatMul (opsets 13–21, numpy semantics,
//! 1-D operands included)
//! and Gemm (opsets 13–21: `alpha * A' B' + beta * C`).

use super::Convert;
use crate::onnx::context::{NodeCx, Val};
use crate::onnx::tensor::HostTensor;
use fsdpc_ir::{BinaryFn, Op};

pub(super) const OPS: &[(&str, Convert)] = &[("MatMul", matmul), ("Gemm", gemm)];

/// numpy `matmul`: a 1-D operand gets a unit axis for the product, which is
/// then removed from the result.
fn matmul(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let (ta, tb) = (cx.ty(0)?, cx.ty(1)?);
    let (ra, rb) = (ta.shape.rank(), tb.shape.rank());
    if ra == 0 || rb == 0 {
        return Err("MatMul operands must have rank >= 1".into());
    }
    let mut a = cx.ir(0)?;
    let mut b = cx.ir_like(1, &ta)?;
    if ra == 1 {
        a = cx.add(
            Op::Reshape {
                shape: vec![1, ta.shape.dims()[0]],
            },
            &[a],
            "row",
        )?;
    }
    if rb == 1 {
        b = cx.add(
            Op::Reshape {
                shape: vec![tb.shape.dims()[0], 1],
            },
            &[b],
            "column",
        )?;
    }
    let op = Op::MatMul {
        trans_a: false,
        trans_b: false,
    };
    let mut y = cx.add(op, &[a, b], "matmul")?;
    if ra == 1 || rb == 1 {
        let mut dims = cx.imp.g.value_type(y).shape.dims().to_vec();
        let n = dims.len();
        if rb == 1 {
            dims.remove(n - 1);
        }
        if ra == 1 {
            dims.remove(n - 2);
        }
        y = cx.add(Op::Reshape { shape: dims }, &[y], "squeeze")?;
    }
    cx.set(0, Val::Ir(y));
    Ok(())
}

fn gemm(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let trans_a = cx.attr_i("transA", 0)? != 0;
    let trans_b = cx.attr_i("transB", 0)? != 0;
    let alpha = cx.attr_f("alpha", 1.0)?;
    let beta = cx.attr_f("beta", 1.0)?;
    let ta = cx.ty(0)?;
    let a = cx.ir(0)?;
    let b = cx.ir_like(1, &ta)?;
    let mut y = cx.add(Op::MatMul { trans_a, trans_b }, &[a, b], "matmul")?;
    if alpha != 1.0 {
        let s = cx.constant(&HostTensor::floats(ta.dtype, vec![], vec![alpha]))?;
        y = cx.add(Op::Binary { f: BinaryFn::Mul }, &[y, s], "alpha")?;
    }
    if cx.opt(2)?.is_some() && beta != 0.0 {
        let mut c = cx.ir_like(2, &ta)?;
        if beta != 1.0 {
            let s = cx.constant(&HostTensor::floats(ta.dtype, vec![], vec![beta]))?;
            c = cx.add(Op::Binary { f: BinaryFn::Mul }, &[c, s], "beta")?;
        }
        y = cx.add(Op::Binary { f: BinaryFn::Add }, &[y, c], "add_c")?;
    }
    cx.set(0, Val::Ir(y));
    Ok(())
}
