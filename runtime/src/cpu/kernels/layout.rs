//! Index arithmetic shared by the kernels: contiguous strides, numpy
//! broadcasting, and `Blocks`, which collapses a broadcast elementwise loop
//! into an outer odometer and an inner run where every operand is either
//! contiguous (stride 1) or repeated (stride 0) — the fast path the inner
//! loops are written for.

use crate::error::KResult;

/// Row-major element strides of `dims`.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// Element strides of a tensor of shape `dims` broadcast to `out` (numpy
/// rules, right-aligned): 0 on broadcast axes.
pub fn broadcast_strides(dims: &[usize], out: &[usize]) -> KResult<Vec<usize>> {
    if dims.len() > out.len() {
        crate::kbail!("cannot broadcast {dims:?} to {out:?}");
    }
    let own = strides(dims);
    let lead = out.len() - dims.len();
    let mut s = vec![0usize; out.len()];
    for (i, &d) in dims.iter().enumerate() {
        let o = out[lead + i];
        if d == o {
            s[lead + i] = if d == 1 { 0 } else { own[i] };
        } else if d != 1 {
            crate::kbail!("cannot broadcast {dims:?} to {out:?}");
        }
    }
    Ok(s)
}

/// The numpy broadcast of two shapes.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> KResult<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for (i, o) in out.iter_mut().enumerate() {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        *o = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => crate::kbail!("shapes {a:?} and {b:?} do not broadcast"),
        };
    }
    Ok(out)
}

/// An elementwise loop over a contiguous output of `N` broadcast operands,
/// collapsed to outer dims and one inner run.
#[derive(Clone, Debug)]
pub struct Blocks<const N: usize> {
    outer_dims: Vec<usize>,
    outer_strides: Vec<[usize; N]>,
    /// Length of the inner run.
    pub inner: usize,
    /// Each operand's stride in the inner run: 1 (contiguous) or 0 (repeated).
    pub inner_strides: [usize; N],
    total: usize,
}

impl<const N: usize> Blocks<N> {
    /// Plans the loop for output shape `out` and operand shapes `ins`.
    pub fn new(out: &[usize], ins: [&[usize]; N]) -> KResult<Blocks<N>> {
        let mut st: Vec<Vec<usize>> = Vec::with_capacity(N);
        for d in ins {
            st.push(broadcast_strides(d, out)?);
        }
        // Groups from innermost outward: (size, operand strides).
        let mut groups: Vec<(usize, [usize; N])> = Vec::new();
        for ax in (0..out.len()).rev() {
            if out[ax] == 1 {
                continue;
            }
            let s: [usize; N] = std::array::from_fn(|k| st[k][ax]);
            match groups.last_mut() {
                Some((size, gs)) if (0..N).all(|k| s[k] == gs[k] * *size) => *size *= out[ax],
                _ => groups.push((out[ax], s)),
            }
        }
        let total = out.iter().product();
        let (inner, inner_strides) = groups.first().copied().unwrap_or((1, [0; N]));
        let rest = if groups.is_empty() {
            &[][..]
        } else {
            &groups[1..]
        };
        Ok(Blocks {
            outer_dims: rest.iter().rev().map(|g| g.0).collect(),
            outer_strides: rest.iter().rev().map(|g| g.1).collect(),
            inner: if total == 0 { 0 } else { inner },
            inner_strides,
            total,
        })
    }

    /// Calls `f(operand offsets, output offset)` for each inner run, in
    /// output order.
    #[inline(always)]
    pub fn for_each(&self, mut f: impl FnMut([usize; N], usize)) {
        if self.total == 0 {
            return;
        }
        let nd = self.outer_dims.len();
        let mut idx = vec![0usize; nd];
        let mut offs = [0usize; N];
        let mut out = 0usize;
        loop {
            f(offs, out);
            out += self.inner;
            let mut ax = nd;
            loop {
                if ax == 0 {
                    return;
                }
                ax -= 1;
                idx[ax] += 1;
                for (k, o) in offs.iter_mut().enumerate() {
                    *o += self.outer_strides[ax][k];
                }
                if idx[ax] < self.outer_dims[ax] {
                    break;
                }
                for (k, o) in offs.iter_mut().enumerate() {
                    *o -= self.outer_strides[ax][k] * self.outer_dims[ax];
                }
                idx[ax] = 0;
            }
        }
    }
}

/// Splits `dims` around `axis` into (outer, axis length, inner) element counts.
pub fn split_axis(dims: &[usize], axis: usize) -> KResult<(usize, usize, usize)> {
    if axis >= dims.len() {
        crate::kbail!("axis {axis} out of range for shape {dims:?}");
    }
    let outer = dims[..axis].iter().product();
    let inner = dims[axis + 1..].iter().product();
    Ok((outer, dims[axis], inner))
}
