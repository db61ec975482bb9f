//! `MatMul`: `a[..., m, k] x b[..., k, n]` after the optional transposes of
//! the last two axes; the leading (batch) dimensions broadcast as numpy does.
//! Both operands have rank >= 2 (frontends reshape 1-D operands).
//!
//! Gradients are matrix products with transposes, summed back over broadcast
//! batch dimensions. The common `x[b, s, k] x w[k, n]` case computes `dw` as
//! one `[b·s, k]ᵀ x [b·s, n]` product rather than a batched product and a sum.
//!
//! `Geometry` is the one statement of a product's m, k, n and batch: the
//! shape rule here, the CPU and cuBLAS kernels, the workspace sizing and
//! the cost model all read it.

use super::check::{arity, broadcast_shapes, float, same_dtype};
use super::{misrouted, out_numel, Family, VjpCtx};
use crate::graph::ValueId;
use crate::op::Op;
use crate::types::TensorType;

pub(crate) struct MatMul;

/// The geometry of a matrix product `op(a) op(b)` on operands of shapes
/// `a` and `b`, `op` transposing the last two axes where asked: the rows
/// `m`, inner size `k` and columns `n` of one matrix product, and the
/// leading (batch) dimensions, which broadcast as numpy's do. A rank-1 `a`
/// is a row vector `[1, k]` and a rank-1 `b` a column vector `[k, 1]`
/// (numpy's promotion; the shape rule itself takes rank >= 2 only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    /// `a`'s batch dimensions (none for a matrix or a vector).
    pub batch_a: Vec<usize>,
    /// `b`'s batch dimensions.
    pub batch_b: Vec<usize>,
    /// Rows of `op(a)` and of the output.
    pub m: usize,
    /// Columns of `op(a)`: the inner size.
    pub k: usize,
    /// Rows of `op(b)`: `k` again in a well-formed product.
    pub k_b: usize,
    /// Columns of `op(b)` and of the output.
    pub n: usize,
    pub trans_a: bool,
    pub trans_b: bool,
}

impl Geometry {
    /// The geometry of `op(a) op(b)`; `None` when an operand has rank 0.
    pub fn of(a: &[usize], b: &[usize], trans_a: bool, trans_b: bool) -> Option<Geometry> {
        let pa: Vec<usize> = match a {
            [x] => vec![1, *x],
            _ => a.to_vec(),
        };
        let pb: Vec<usize> = match b {
            [x] => vec![*x, 1],
            _ => b.to_vec(),
        };
        if pa.len() < 2 || pb.len() < 2 {
            return None;
        }
        let (ra, rb) = (pa.len() - 2, pb.len() - 2);
        let (m, k) = if trans_a {
            (pa[ra + 1], pa[ra])
        } else {
            (pa[ra], pa[ra + 1])
        };
        let (k_b, n) = if trans_b {
            (pb[rb + 1], pb[rb])
        } else {
            (pb[rb], pb[rb + 1])
        };
        Some(Geometry {
            batch_a: pa[..ra].to_vec(),
            batch_b: pb[..rb].to_vec(),
            m,
            k,
            k_b,
            n,
            trans_a,
            trans_b,
        })
    }

    /// The output's batch dimensions: the operands' batches broadcast, or
    /// why they do not (`broadcast_shapes`'s message).
    pub fn batch(&self) -> Result<Vec<usize>, String> {
        broadcast_shapes(&self.batch_a, &self.batch_b)
    }

    /// Each operand's batch with leading 1s to the output batch's rank.
    pub fn padded_batches(&self) -> (Vec<usize>, Vec<usize>) {
        let rank = self.batch_a.len().max(self.batch_b.len());
        let pad = |x: &[usize]| -> Vec<usize> {
            std::iter::repeat_n(1, rank - x.len())
                .chain(x.iter().copied())
                .collect()
        };
        (pad(&self.batch_a), pad(&self.batch_b))
    }

    /// Whether one call of the matrix library computes the whole product,
    /// the batch folded into the rows: `a` not transposed and `b` without
    /// a batch (its elements multiply to 1), so `a`'s matrices are blocks
    /// of consecutive rows of one `[batch·m, k]` matrix.
    pub fn folds(&self) -> bool {
        !self.trans_a && self.batch_b.iter().product::<usize>() == 1
    }

    /// The library calls a kernel makes: the rows of one call (`m`, or
    /// `m` times `a`'s batch when it `folds`) and how many calls (one when
    /// it folds, else one per element of the output batch; at least one).
    pub fn calls(&self) -> (usize, usize) {
        if self.folds() {
            let a_batch: usize = self.batch_a.iter().product();
            return (a_batch * self.m, 1);
        }
        let count = self.batch().map_or(1, |b| b.iter().product::<usize>());
        (self.m, count.max(1))
    }
}

impl Family for MatMul {
    fn infer(&self, op: &Op, inputs: &[&TensorType]) -> Result<Vec<TensorType>, String> {
        let Op::MatMul { trans_a, trans_b } = op else {
            return Err(misrouted(op, "matmul"));
        };
        arity(inputs, 2, "a, b")?;
        let (a, b) = (inputs[0], inputs[1]);
        float(a, "a")?;
        same_dtype(a, b, "a and b")?;
        for (t, what) in [(a, "a"), (b, "b")] {
            if t.shape.dims().len() < 2 {
                return Err(format!(
                    "{what} must have rank >= 2, got {t} (reshape a vector to a matrix)"
                ));
            }
        }
        let g = Geometry::of(a.shape.dims(), b.shape.dims(), *trans_a, *trans_b)
            .ok_or_else(|| format!("a {a} and b {b} are not matrices"))?;
        let (ka, kb) = (g.k, g.k_b);
        if ka != kb {
            return Err(format!(
                "inner dimensions differ: a {a}{} has k = {ka}, b {b}{} has k = {kb}",
                if *trans_a { " (transposed)" } else { "" },
                if *trans_b { " (transposed)" } else { "" },
            ));
        }
        let mut shape = g.batch().map_err(|e| format!("batch dimensions: {e}"))?;
        shape.extend([g.m, g.n]);
        Ok(vec![TensorType::new(a.dtype, shape)])
    }

    fn vjp(&self, op: &Op, cx: &mut VjpCtx<'_>) -> Result<Vec<Option<ValueId>>, String> {
        let Op::MatMul { trans_a, trans_b } = *op else {
            return Err(misrouted(op, "matmul"));
        };
        let da = if cx.needs(0) {
            Some(grad_a(cx, trans_a, trans_b)?)
        } else {
            None
        };
        let db = if cx.needs(1) {
            Some(grad_b(cx, trans_a, trans_b)?)
        } else {
            None
        };
        Ok(vec![da, db])
    }

    fn flops(&self, op: &Op, inputs: &[&TensorType], outputs: &[TensorType]) -> f64 {
        let (Op::MatMul { trans_a, trans_b }, Some(a), Some(b)) =
            (op, inputs.first(), inputs.get(1))
        else {
            return 0.0;
        };
        let k = Geometry::of(a.shape.dims(), b.shape.dims(), *trans_a, *trans_b).map_or(0, |g| g.k);
        2.0 * out_numel(outputs) * k as f64
    }
}

/// `da`: `dy · b'ᵀ` (or its transpose when `a` was transposed), summed back
/// to the shape of `a`.
fn grad_a(cx: &mut VjpCtx<'_>, ta: bool, tb: bool) -> Result<ValueId, String> {
    let (a, b, dy) = (cx.x(0)?, cx.x(1)?, cx.dy());
    let g = if ta {
        cx.emit(mm(tb, true), &[b, dy])?
    } else {
        cx.emit(mm(false, !tb), &[dy, b])?
    };
    let shape = cx.shape(a)?;
    cx.sum_to(g, &shape)
}

/// `db`: `a'ᵀ · dy` (or its transpose when `b` was transposed), summed back
/// to the shape of `b`.
fn grad_b(cx: &mut VjpCtx<'_>, ta: bool, tb: bool) -> Result<ValueId, String> {
    let (a, b, dy) = (cx.x(0)?, cx.x(1)?, cx.dy());
    let (a_shape, b_shape) = (cx.shape(a)?, cx.shape(b)?);
    if b_shape.len() == 2 && a_shape.len() > 2 && !ta {
        return grad_b_flat(cx, a, &a_shape, tb);
    }
    let g = if tb {
        cx.emit(mm(true, ta), &[dy, a])?
    } else {
        cx.emit(mm(!ta, false), &[a, dy])?
    };
    cx.sum_to(g, &b_shape)
}

/// `db` for a matrix `b` and a batched, untransposed `a[..., m, k]`: the batch
/// and row dimensions are folded into one.
fn grad_b_flat(
    cx: &mut VjpCtx<'_>,
    a: ValueId,
    a_shape: &[usize],
    tb: bool,
) -> Result<ValueId, String> {
    let dy = cx.dy();
    let (k, rows) = match a_shape.split_last() {
        Some((k, lead)) => (*k, lead.iter().product::<usize>()),
        None => return Err("internal: a batched `a` has no dimensions".into()),
    };
    let n = cx.shape(dy)?.last().copied().unwrap_or(1);
    let a2 = cx.emit(
        Op::Reshape {
            shape: vec![rows, k],
        },
        &[a],
    )?;
    let dy2 = cx.emit(
        Op::Reshape {
            shape: vec![rows, n],
        },
        &[dy],
    )?;
    if tb {
        cx.emit(mm(true, false), &[dy2, a2])
    } else {
        cx.emit(mm(true, false), &[a2, dy2])
    }
}

fn mm(trans_a: bool, trans_b: bool) -> Op {
    Op::MatMul { trans_a, trans_b }
}

#[cfg(test)]
mod tests {
    use super::Geometry;

    fn of(a: &[usize], b: &[usize], ta: bool, tb: bool) -> Geometry {
        Geometry::of(a, b, ta, tb).unwrap_or_else(|| panic!("{a:?} x {b:?}"))
    }

    #[test]
    fn transposes_swap_the_last_two_axes() {
        let g = of(&[3, 4], &[4, 5], false, false);
        assert_eq!((g.m, g.k, g.k_b, g.n), (3, 4, 4, 5));
        let g = of(&[4, 3], &[5, 4], true, true);
        assert_eq!((g.m, g.k, g.k_b, g.n), (3, 4, 4, 5));
        let g = of(&[2, 8, 128, 64], &[2, 8, 96, 64], false, true);
        assert_eq!((g.m, g.k, g.n), (128, 64, 96));
        assert_eq!(
            (g.batch_a.as_slice(), g.batch_b.as_slice()),
            (&[2, 8][..], &[2, 8][..])
        );
    }

    #[test]
    fn vectors_are_promoted_and_scalars_refused() {
        let g = of(&[4], &[4, 5], false, false);
        assert_eq!((g.m, g.k, g.n), (1, 4, 5));
        let g = of(&[3, 4], &[4], false, false);
        assert_eq!((g.m, g.k, g.k_b, g.n), (3, 4, 4, 1));
        assert!(g.batch_a.is_empty() && g.batch_b.is_empty());
        assert_eq!(Geometry::of(&[], &[4, 5], false, false), None);
        assert_eq!(Geometry::of(&[3, 4], &[], false, false), None);
    }

    #[test]
    fn batches_broadcast_and_pad() {
        let g = of(&[2, 1, 128, 64], &[8, 64, 128], false, false);
        assert_eq!(g.batch(), Ok(vec![2, 8]));
        assert_eq!(g.padded_batches(), (vec![2, 1], vec![1, 8]));
        let g = of(&[3, 4, 5], &[2, 5, 6], false, false);
        assert!(g.batch().is_err());
    }

    #[test]
    fn the_batch_folds_into_rows_or_counts_calls() {
        // b without a batch, a not transposed: one [4·128, 64] product.
        let g = of(&[4, 128, 64], &[64, 32], false, false);
        assert!(g.folds());
        assert_eq!(g.calls(), (512, 1));
        // A batch of ones in b folds too.
        assert_eq!(
            of(&[4, 128, 64], &[1, 64, 32], false, false).calls(),
            (512, 1)
        );
        // Transposed a: one call per batch element.
        let g = of(&[4, 64, 128], &[64, 32], true, false);
        assert!(!g.folds());
        assert_eq!((g.calls(), g.m), ((128, 4), 128));
        // Both batched: one call per element of the broadcast batch.
        assert_eq!(
            of(&[2, 8, 128, 64], &[2, 8, 96, 64], false, true).calls(),
            (128, 16)
        );
        assert_eq!(
            of(&[2, 1, 128, 64], &[8, 64, 128], false, false).calls(),
            (128, 16)
        );
    }
}
