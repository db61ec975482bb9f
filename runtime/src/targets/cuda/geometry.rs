//! The index descriptors the strided kernels take (`Geo`, `RGeo`, `Win`;
//! the structs of `kernels/common.cuh` and `kernels/reduce.cu`,
//! `repr(C)`), and how a broadcast, a strided view, a reduction or a
//! sliding window becomes one. Dimensions
//! of size 1 are dropped and neighbours that are contiguous in every
//! operand merged, so a plain element-wise op walks one dimension.

/// Most dimensions a descriptor holds (`MAXD`).
pub const MAXD: usize = 8;

/// An iteration space of `nd` dimensions and, for up to four operands,
/// each dimension's element stride (0 where the operand is broadcast).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Geo {
    /// Dimensions in use.
    pub nd: i32,
    /// Keeps `dims` 8-byte aligned, as in C.
    pub pad: i32,
    /// Sizes, outermost first.
    pub dims: [i64; MAXD],
    /// Per operand, the stride of each dimension.
    pub st: [[i64; MAXD]; 4],
}

/// Row-major element strides of `dims`.
pub fn strides(dims: &[usize]) -> Vec<usize> {
    let mut st = vec![1usize; dims.len()];
    for d in (0..dims.len().saturating_sub(1)).rev() {
        st[d] = st[d + 1] * dims[d + 1];
    }
    st
}

/// `dims` with, per operand, its strides over them: simplified and packed.
pub fn geo(dims: &[usize], ops: &[Vec<usize>]) -> Result<Geo, String> {
    if ops.len() > 4 {
        return Err(format!("{} operands; a descriptor holds 4", ops.len()));
    }
    // Drop size-1 dimensions, then merge (d, d + 1) when every operand
    // steps over d exactly as over the whole of d + 1.
    let mut keep: Vec<(usize, Vec<usize>)> = Vec::new();
    for (d, &n) in dims.iter().enumerate() {
        if n == 1 {
            continue;
        }
        let st: Vec<usize> = ops.iter().map(|o| o[d]).collect();
        if let Some((pn, pst)) = keep.last_mut() {
            if pst.iter().zip(&st).all(|(&p, &s)| p == s * n) {
                *pn *= n;
                *pst = st;
                continue;
            }
        }
        keep.push((n, st));
    }
    if keep.len() > MAXD {
        return Err(format!(
            "{} dimensions that cannot be merged; the cuda kernels take {MAXD}",
            keep.len()
        ));
    }
    let mut g = Geo {
        nd: keep.len() as i32,
        ..Geo::default()
    };
    for (d, (n, st)) in keep.iter().enumerate() {
        g.dims[d] = *n as i64;
        for (k, &s) in st.iter().enumerate() {
            g.st[k][d] = s as i64;
        }
    }
    Ok(g)
}

/// The strides of an input of shape `x` broadcast (numpy: right-aligned,
/// a 1 repeats) over the output shape `out`.
pub fn broadcast_strides(x: &[usize], out: &[usize]) -> Result<Vec<usize>, String> {
    if x.len() > out.len() {
        return Err(format!("{x:?} has more dimensions than {out:?}"));
    }
    let lead = out.len() - x.len();
    let xs = strides(x);
    let mut st = vec![0usize; out.len()];
    for (j, (&n, &s)) in x.iter().zip(&xs).enumerate() {
        let o = out[lead + j];
        st[lead + j] = match (n, o) {
            (a, b) if a == b => s,
            (1, _) => 0,
            _ => return Err(format!("{x:?} does not broadcast to {out:?}")),
        };
    }
    Ok(st)
}

/// The descriptor of an element-wise op: every input broadcast over `out`,
/// the output itself contiguous (its strides are not stored).
pub fn broadcast(out: &[usize], ins: &[&[usize]]) -> Result<Geo, String> {
    let mut ops = Vec::with_capacity(ins.len() + 1);
    for x in ins {
        ops.push(broadcast_strides(x, out)?);
    }
    // The output's own strides take part in merging (so a broadcast input
    // never merges across a dimension it repeats), in the last slot used.
    ops.push(strides(out));
    geo(out, &ops)
}

/// A reduction of an input of shape `x` onto `target` (right-aligned,
/// every target dimension 1 or equal to x's): the kept and the reduced
/// dimensions with the input's strides.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct RGeo {
    /// Kept dimensions in use.
    pub nk: i32,
    /// Reduced dimensions in use.
    pub nr: i32,
    /// Kept sizes (the output's, row-major).
    pub kdims: [i64; MAXD],
    /// The input's stride of each kept dimension.
    pub kst: [i64; MAXD],
    /// Reduced sizes.
    pub rdims: [i64; MAXD],
    /// The input's stride of each reduced dimension.
    pub rst: [i64; MAXD],
    /// Reduced elements per output element.
    pub count: i64,
}

/// The `RGeo` of reducing `x` onto `target`.
pub fn reduction(x: &[usize], target: &[usize]) -> Result<RGeo, String> {
    if target.len() > x.len() {
        return Err(format!("cannot reduce {x:?} onto {target:?}"));
    }
    let lead = x.len() - target.len();
    let xs = strides(x);
    let (mut kept, mut red) = (Vec::new(), Vec::new());
    for d in 0..x.len() {
        let t = if d < lead { 1 } else { target[d - lead] };
        if x[d] == 1 {
            continue;
        }
        if t == x[d] {
            kept.push((x[d], xs[d]));
        } else if t == 1 {
            red.push((x[d], xs[d]));
        } else {
            return Err(format!("cannot reduce {x:?} onto {target:?}"));
        }
    }
    let merge = |v: Vec<(usize, usize)>| {
        let mut out: Vec<(usize, usize)> = Vec::new();
        for (n, s) in v {
            match out.last_mut() {
                Some((pn, ps)) if *ps == s * n => {
                    *pn *= n;
                    *ps = s;
                }
                _ => out.push((n, s)),
            }
        }
        out
    };
    let (kept, red) = (merge(kept), merge(red));
    if kept.len() > MAXD || red.len() > MAXD {
        return Err(format!(
            "reducing {x:?} onto {target:?} needs more than {MAXD} dimensions"
        ));
    }
    let mut g = RGeo {
        nk: kept.len() as i32,
        nr: red.len() as i32,
        count: red.iter().map(|r| r.0 as i64).product(),
        ..RGeo::default()
    };
    for (d, (n, s)) in kept.iter().enumerate() {
        g.kdims[d] = *n as i64;
        g.kst[d] = *s as i64;
    }
    for (d, (n, s)) in red.iter().enumerate() {
        g.rdims[d] = *n as i64;
        g.rst[d] = *s as i64;
    }
    Ok(g)
}

/// A 2-D sliding window over `[h, w]` planes giving `[oh, ow]` ones: an
/// `fsdpc_ir::Window2d` with its sizes, as the convolution and pooling
/// kernels take it (the `Win` of `kernels/common.cuh`).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Win {
    /// The input's `[h, w]`.
    pub hw: [i32; 2],
    /// The output's `[oh, ow]`.
    pub out: [i32; 2],
    /// The window's `[kh, kw]`.
    pub kernel: [i32; 2],
    /// Its strides.
    pub stride: [i32; 2],
    /// Its dilations.
    pub dilation: [i32; 2],
    /// `[top, left, bottom, right]` padding.
    pub pads: [i32; 4],
}

impl Win {
    /// `window` over an input of `hw` giving `out`; an error when a size
    /// exceeds the kernels' 32-bit ones or the window is not valid.
    pub fn new(
        window: &fsdpc_ir::Window2d,
        hw: [usize; 2],
        out: [usize; 2],
    ) -> Result<Win, String> {
        window.check()?;
        let small = |v: [usize; 2], what: &str| -> Result<[i32; 2], String> {
            let one = |x: usize| {
                i32::try_from(x).map_err(|_| format!("{what} {v:?} exceeds the kernels' 32 bits"))
            };
            Ok([one(v[0])?, one(v[1])?])
        };
        let p = window.pads;
        let ([t, l], [b, r]) = (small([p[0], p[1]], "pads")?, small([p[2], p[3]], "pads")?);
        Ok(Win {
            hw: small(hw, "input")?,
            out: small(out, "output")?,
            kernel: small(window.kernel, "kernel")?,
            stride: small(window.stride, "stride")?,
            dilation: small(window.dilation, "dilation")?,
            pads: [t, l, b, r],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offsets the kernels' `offsets` computes for linear index `o`.
    fn offsets(g: &Geo, mut o: i64, n: usize) -> Vec<i64> {
        let mut off = vec![0; n];
        for d in (0..g.nd as usize).rev() {
            let c = o % g.dims[d];
            o /= g.dims[d];
            for (k, x) in off.iter_mut().enumerate() {
                *x += c * g.st[k][d];
            }
        }
        off
    }

    #[test]
    fn a_contiguous_op_walks_one_dimension_and_a_broadcast_keeps_its_repeats() {
        let g = broadcast(&[4, 3, 5], &[&[4, 3, 5], &[4, 3, 5]]).unwrap();
        assert_eq!((g.nd, g.dims[0]), (1, 60));
        // b = [3, 1]: repeats along the last axis and the first.
        let g = broadcast(&[4, 3, 5], &[&[4, 3, 5], &[3, 1]]).unwrap();
        for o in 0..60i64 {
            let (i, j, k) = (o / 15, (o / 5) % 3, o % 5);
            assert_eq!(offsets(&g, o, 2), vec![i * 15 + j * 5 + k, j], "{o}");
        }
        assert!(broadcast(&[4, 3], &[&[2, 3]]).is_err());
    }

    #[test]
    fn a_reduction_splits_kept_and_reduced_dimensions() {
        let g = reduction(&[2, 3, 4], &[3, 1]).unwrap();
        assert_eq!((g.nk, g.nr, g.count), (1, 2, 8));
        assert_eq!((g.kdims[0], g.kst[0]), (3, 4));
        let g = reduction(&[6, 4], &[4]).unwrap();
        assert_eq!((g.kdims[0], g.kst[0], g.rdims[0], g.rst[0]), (4, 1, 6, 4));
        assert!(reduction(&[6, 4], &[2]).is_err());
    }
}
