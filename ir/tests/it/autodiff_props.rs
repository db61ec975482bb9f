//! Property test: random layered graphs (chains with residual connections,
//! broadcasting, matrix products, normalisations, reshapes, tied and frozen
//! parameters) differentiate into programs that validate and keep the
//! planner's contract.

use crate::common::{f32t, param};
use fsdpc_ir::{
    build_training_program, BinaryFn, Graph, Init, ModuleId, Op, Optimizer, Phase, ReduceFn,
    UnaryFn, ValueId,
};
use proptest::prelude::*;
use std::collections::HashSet;

/// One step of a random graph, applied to the current value `[rows, cols]`.
#[derive(Clone, Debug)]
enum Step {
    Unary(u8),
    /// Binary with a new parameter of shape `[]`, `[cols]` or `[rows, cols]`.
    BinaryParam(u8, u8),
    /// Add an earlier value of the same shape (a residual connection).
    Residual(usize),
    /// Multiply by a new `[cols, n]` weight (maybe transposed, maybe reused).
    Linear(usize, bool),
    LayerNorm,
    Softmax,
    /// Transpose twice via reshape round trip.
    ReshapeRoundTrip,
    /// Mean over columns with keepdims, then multiply back (broadcast).
    MeanScale,
    /// Multiply by a frozen parameter.
    Frozen,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (0u8..6).prop_map(Step::Unary),
        (0u8..5, 0u8..3).prop_map(|(f, s)| Step::BinaryParam(f, s)),
        (0usize..8).prop_map(Step::Residual),
        (1usize..5, any::<bool>()).prop_map(|(n, t)| Step::Linear(n, t)),
        Just(Step::LayerNorm),
        Just(Step::Softmax),
        Just(Step::ReshapeRoundTrip),
        Just(Step::MeanScale),
        Just(Step::Frozen),
    ]
}

struct Builder {
    g: Graph,
    history: Vec<ValueId>,
    n: usize,
    tie: Option<ValueId>,
}

impl Builder {
    fn shape(&self, v: ValueId) -> Vec<usize> {
        self.g.value_type(v).shape.0.clone()
    }

    fn op(&mut self, op: Op, ins: &[ValueId]) -> ValueId {
        self.n += 1;
        let m = self.g.module(&format!("layer{}", self.n), "Layer");
        self.g
            .add1(op, ins, format!("layer{}", self.n), m)
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn param(&mut self, shape: &[usize]) -> ValueId {
        self.n += 1;
        let m = self.g.module(&format!("layer{}", self.n), "Layer");
        param(
            &mut self.g,
            &format!("p{}", self.n),
            shape,
            Init::Normal { std: 0.1 },
            m,
        )
    }

    fn apply(&mut self, x: ValueId, s: &Step) -> ValueId {
        let [rows, cols] = self.shape(x)[..] else {
            unreachable!()
        };
        let unary = [
            UnaryFn::Tanh,
            UnaryFn::GeluTanh,
            UnaryFn::Relu,
            UnaryFn::Sigmoid,
            UnaryFn::Silu,
            UnaryFn::Square,
        ];
        let binary = [
            BinaryFn::Add,
            BinaryFn::Sub,
            BinaryFn::Mul,
            BinaryFn::Max,
            BinaryFn::Min,
        ];
        match s {
            Step::Unary(f) => self.op(
                Op::Unary {
                    f: unary[*f as usize],
                },
                &[x],
            ),
            Step::BinaryParam(f, sh) => {
                let shape = [vec![], vec![cols], vec![rows, cols]][*sh as usize].clone();
                let p = self.param(&shape);
                self.op(
                    Op::Binary {
                        f: binary[*f as usize],
                    },
                    &[x, p],
                )
            }
            Step::Residual(back) => {
                let same: Vec<ValueId> = self
                    .history
                    .iter()
                    .copied()
                    .filter(|&v| self.shape(v) == [rows, cols])
                    .collect();
                let r = same[same.len() - 1 - back % same.len()];
                self.op(Op::Binary { f: BinaryFn::Add }, &[x, r])
            }
            Step::Linear(n, trans) => {
                let w = match self.tie {
                    Some(w) if self.shape(w) == [cols, *n] && !trans => w,
                    _ => {
                        let w = self.param(&if *trans { [*n, cols] } else { [cols, *n] });
                        self.tie = Some(w);
                        w
                    }
                };
                let trans = self.shape(w) != [cols, *n];
                self.op(
                    Op::MatMul {
                        trans_a: false,
                        trans_b: trans,
                    },
                    &[x, w],
                )
            }
            Step::LayerNorm => {
                let (gamma, beta) = (self.param(&[cols]), self.param(&[cols]));
                self.op(Op::LayerNorm { eps: 1e-5 }, &[x, gamma, beta])
            }
            Step::Softmax => self.op(Op::Softmax { axis: 1 }, &[x]),
            Step::ReshapeRoundTrip => {
                let t = self.op(Op::Transpose { perm: vec![1, 0] }, &[x]);
                let r = self.op(
                    Op::Reshape {
                        shape: vec![rows * cols],
                    },
                    &[t],
                );
                let r = self.op(
                    Op::Reshape {
                        shape: vec![cols, rows],
                    },
                    &[r],
                );
                self.op(Op::Transpose { perm: vec![1, 0] }, &[r])
            }
            Step::MeanScale => {
                let m = self.op(
                    Op::Reduce {
                        f: ReduceFn::Mean,
                        axes: vec![1],
                        keepdims: true,
                    },
                    &[x],
                );
                self.op(Op::Binary { f: BinaryFn::Mul }, &[x, m])
            }
            Step::Frozen => {
                let p = self.param(&[cols]);
                let id = self.g.params.len() - 1;
                self.g.params[id].requires_grad = false;
                self.op(Op::Binary { f: BinaryFn::Mul }, &[x, p])
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_graphs_differentiate(steps in prop::collection::vec(step(), 1..12), rows in 1usize..4, cols in 1usize..4) {
        let mut b = Builder { g: Graph::new("random"), history: Vec::new(), n: 0, tie: None };
        let mut x = b.g.add_input("x", f32t(&[rows, cols]));
        b.history.push(x);
        for s in &steps {
            x = b.apply(x, s);
            b.history.push(x);
        }
        let mean = Op::Reduce { f: ReduceFn::Mean, axes: vec![0, 1], keepdims: false };
        let loss = b.g.add1(mean, &[x], "loss", ModuleId::ROOT).unwrap();
        let trainable: HashSet<usize> = (0..b.g.params.len()).filter(|&i| b.g.params[i].requires_grad).collect();
        let forward_nodes = b.g.node_count();
        let opt = Optimizer::Sgd { lr: 0.1, momentum: 0.9, weight_decay: 0.0 };
        let p = build_training_program(b.g, loss, opt).map_err(|e| TestCaseError::fail(e.to_string()))?;
        if let Err(e) = p.validate() { return Err(TestCaseError::fail(e.to_string())); }
        let got: HashSet<usize> = p.grads.iter().map(|g| g.param.0 as usize).collect();
        prop_assert_eq!(got, trainable);
        let mut seen = HashSet::new();
        for pg in &p.grads {
            let node = p.graph.node(pg.grad.node);
            prop_assert_eq!(node.phase, Phase::Backward);
            prop_assert!(!node.op.is_source());
            prop_assert!(seen.insert(pg.grad));
            prop_assert!(p.graph.users(pg.grad).is_empty());
        }
        let order: Vec<_> = p.graph.topo_order().unwrap();
        prop_assert_eq!(&order, &p.graph.node_ids().collect::<Vec<_>>());
        for &n in &order[forward_nodes..] {
            prop_assert_eq!(p.graph.node(n).phase, Phase::Backward);
        }
    }
}
