//! Matrix products — ONNX operators MatMul (opsets 13–21, numpy semantics)
//! and Gemm (opsets 13–21: `alpha * A' B' + beta * C`).

use super::Convert;
use crate::onnx::context::{NodeCx, Val};
use crate::onnx::tensor::HostTensor;
use fsdpc_ir::{BinaryFn, Op};

pub(super) const OPS: &[(&str, Convert)] = &[("MatMul", matmul), ("Gemm", gemm)];

fn matmul(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let (ra, rb) = (cx.rank(0)?, cx.rank(1)?);
    if ra < 2 || rb < 2 {
        return Err(format!(
            "operands of rank {ra} and {rb}: 1-D operands of MatMul are not supported yet"
        ));
    }
    let ta = cx.ty(0)?;
    let a = cx.ir(0)?;
    let b = cx.ir_like(1, &ta)?;
    let y = cx.add(
        Op::MatMul {
            trans_a: false,
            trans_b: false,
        },
        &[a, b],
        "matmul",
    )?;
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
