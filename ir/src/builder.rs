//! Conveniences for model builders: one method per common op, each a thin
//! wrapper over `Graph::add1` (which infers the output type and names the node
//! in its error).

use crate::error::IrError;
use crate::graph::{Graph, ModuleId, ValueId};
use crate::op::{BinaryFn, Op, ReduceFn, UnaryFn};
use crate::types::{DType, TensorData};

impl Graph {
    /// `a @ b` (no transposes).
    pub fn matmul(
        &mut self,
        a: ValueId,
        b: ValueId,
        name: &str,
        module: ModuleId,
    ) -> Result<ValueId, IrError> {
        let op = Op::MatMul {
            trans_a: false,
            trans_b: false,
        };
        self.add1(op, &[a, b], name, module)
    }

    /// `f(a, b)` with numpy broadcasting.
    pub fn binary(
        &mut self,
        f: BinaryFn,
        a: ValueId,
        b: ValueId,
        name: &str,
        module: ModuleId,
    ) -> Result<ValueId, IrError> {
        self.add1(Op::Binary { f }, &[a, b], name, module)
    }

    /// `f(x)` elementwise.
    pub fn unary(
        &mut self,
        f: UnaryFn,
        x: ValueId,
        name: &str,
        module: ModuleId,
    ) -> Result<ValueId, IrError> {
        self.add1(Op::Unary { f }, &[x], name, module)
    }

    /// `x` reshaped to `shape`.
    pub fn reshape(
        &mut self,
        x: ValueId,
        shape: &[usize],
        name: &str,
        module: ModuleId,
    ) -> Result<ValueId, IrError> {
        let shape = shape.to_vec();
        self.add1(Op::Reshape { shape }, &[x], name, module)
    }

    /// `x` with its axes permuted by `perm`.
    pub fn transpose(
        &mut self,
        x: ValueId,
        perm: &[usize],
        name: &str,
        module: ModuleId,
    ) -> Result<ValueId, IrError> {
        let perm = perm.to_vec();
        self.add1(Op::Transpose { perm }, &[x], name, module)
    }

    /// The mean of `x` over `axes` (every axis when empty).
    pub fn mean(
        &mut self,
        x: ValueId,
        axes: &[usize],
        keepdims: bool,
        name: &str,
        module: ModuleId,
    ) -> Result<ValueId, IrError> {
        let op = Op::Reduce {
            f: ReduceFn::Mean,
            axes: axes.to_vec(),
            keepdims,
        };
        self.add1(op, &[x], name, module)
    }

    /// A scalar constant of `dtype`.
    pub fn scalar(
        &mut self,
        dtype: DType,
        value: f64,
        name: &str,
        module: ModuleId,
    ) -> Result<ValueId, IrError> {
        let value = TensorData::scalar(dtype, value);
        self.add1(Op::Constant { value }, &[], name, module)
    }
}
