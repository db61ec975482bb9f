//! Finite-difference gradient checking through the IR's autodiff and the
//! runtime's reference evaluator.
//!
//! A case is a tiny forward graph whose differentiable leaves are parameters;
//! the loss is `sum(y * w)` with fixed random `w`. The analytic gradients are
//! the program's `ParamGrad` values from `eval_graph`; the numeric ones are
//! central differences `(L(p + eps) - L(p - eps)) / 2 eps` evaluated in f32.
//! Tolerance: `|fd - g| <= ATOL + RTOL * |g|` with eps = 1e-2, ATOL = RTOL =
//! 1e-2 (f32 rounding of the loss divided by 2 eps is ~1e-5; truncation
//! error O(eps^2) ~ 1e-4 for the smooth ops).

use fsdpc_ir::{
    build_training_program, DType, Graph, Init, ModuleId, Op, Optimizer, ParamId, ParamSpec,
    ReduceFn, TensorData, TensorType, ValueId,
};
use fsdpc_runtime::{eval_graph, HostTensor, KernelCtx};
use std::collections::HashMap;

pub const EPS: f32 = 1e-2;
pub const ATOL: f32 = 1e-2;
pub const RTOL: f32 = 1e-2;

/// Deterministic test values.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in [-1, 1).
    pub fn sym(&mut self) -> f32 {
        ((self.next() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.sym()).collect()
    }
    /// Values at least 0.2 away from 0 (for kinks at 0).
    pub fn away(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let v = self.sym();
                v + 0.2 * v.signum()
            })
            .collect()
    }
    pub fn below(&mut self, n: u64) -> i64 {
        (self.next() % n) as i64
    }
}

/// A graph under construction with its parameter values and feeds.
pub struct Case {
    pub g: Graph,
    pub params: HashMap<ParamId, HostTensor>,
    pub feeds: HashMap<String, HostTensor>,
    pub rng: Rng,
}

impl Case {
    pub fn new(seed: u64) -> Case {
        Case {
            g: Graph::new("gradcheck"),
            params: HashMap::new(),
            feeds: HashMap::new(),
            rng: Rng(seed),
        }
    }

    /// A trainable f32 parameter with these values.
    pub fn param(&mut self, shape: &[usize], vals: Vec<f32>) -> ValueId {
        let ty = TensorType::new(DType::F32, shape.to_vec());
        let spec = ParamSpec {
            name: format!("p{}", self.params.len()),
            ty,
            init: Init::Zeros,
            requires_grad: true,
            tied_to: None,
            tp: None,
        };
        let v = self.g.add_param(spec, ModuleId::ROOT);
        self.params.insert(
            ParamId(self.g.params.len() as u32 - 1),
            HostTensor::from_f32(shape, &vals).unwrap(),
        );
        v
    }

    /// A parameter with uniform [-1, 1) values.
    pub fn rand_param(&mut self, shape: &[usize]) -> ValueId {
        let vals = self.rng.vec(shape.iter().product());
        self.param(shape, vals)
    }

    /// An i64 data input.
    pub fn ints(&mut self, name: &str, shape: &[usize], vals: Vec<i64>) -> ValueId {
        let v = self
            .g
            .add_input(name, TensorType::new(DType::I64, shape.to_vec()));
        self.feeds.insert(
            name.to_string(),
            HostTensor::from_i64(shape, &vals).unwrap(),
        );
        v
    }

    /// A constant literal.
    pub fn constant(&mut self, t: &HostTensor) -> ValueId {
        let value = TensorData {
            ty: t.ty.clone(),
            bytes: t.bytes().to_vec(),
        };
        self.g
            .add1(Op::Constant { value }, &[], "const", ModuleId::ROOT)
            .unwrap()
    }

    pub fn op(&mut self, op: Op, ins: &[ValueId]) -> ValueId {
        self.g.add1(op, ins, "op", ModuleId::ROOT).unwrap()
    }

    /// Checks every parameter gradient of `sum(y * w)`; returns the worst
    /// violation as an error message.
    pub fn check(mut self, y: ValueId) -> Result<(), String> {
        let ty = self.g.value_type(y).clone();
        let w = HostTensor::from_f32(&ty.shape.0, &self.rng.vec(ty.numel() as usize)).unwrap();
        let wv = self.constant(&w);
        let prod = self.op(
            Op::Binary {
                f: fsdpc_ir::BinaryFn::Mul,
            },
            &[y, wv],
        );
        let axes: Vec<usize> = (0..ty.shape.rank()).collect();
        let loss = self.op(
            Op::Reduce {
                f: ReduceFn::Sum,
                axes,
                keepdims: false,
            },
            &[prod],
        );
        let sgd = Optimizer::Sgd {
            lr: 0.1,
            momentum: 0.0,
            weight_decay: 0.0,
        };
        let prog = build_training_program(self.g, loss, sgd).map_err(|e| e.to_string())?;
        let ctx = KernelCtx {
            step: 3,
            sample_offset: 0,
            seed: 11,
            eval: false,
        };
        let vals =
            eval_graph(&prog.graph, &self.feeds, &self.params, &ctx).map_err(|e| e.to_string())?;
        for pg in &prog.grads {
            let g = vals[&pg.grad].to_f32();
            let base = self.params[&pg.param].to_f32();
            let shape = self.params[&pg.param].ty.shape.0.clone();
            for j in 0..base.len() {
                let at = |d: f32| -> Result<f32, String> {
                    let mut p = self.params.clone();
                    let mut v = base.clone();
                    v[j] += d;
                    p.insert(pg.param, HostTensor::from_f32(&shape, &v).unwrap());
                    let out = eval_graph(&prog.graph, &self.feeds, &p, &ctx)
                        .map_err(|e| e.to_string())?;
                    Ok(out[&prog.loss].to_f32()[0])
                };
                let fd = (at(EPS)? - at(-EPS)?) / (2.0 * EPS);
                if (fd - g[j]).abs() > ATOL + RTOL * g[j].abs() {
                    return Err(format!(
                        "param {} element {j}: analytic {} vs finite difference {fd}",
                        pg.param.0, g[j]
                    ));
                }
            }
        }
        Ok(())
    }
}
