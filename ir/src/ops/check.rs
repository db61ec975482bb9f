//! Small checks shared by the shape rules: arity, dtypes, ranks, axes,
//! sizes and numpy broadcasting. Each returns the reason a rule failed.

use crate::types::{DType, TensorType};

/// The most bytes one tensor may have: 2^60 (an exbibyte), far beyond any
/// device, so that a tensor's element count, its bytes and sums of many
/// tensors' bytes all fit in `u64` without overflow.
pub(crate) const MAX_TENSOR_BYTES: u64 = 1 << 60;

/// The bytes of a tensor of `dtype` and `dims`, if they are at most
/// [`MAX_TENSOR_BYTES`] (computed without overflow).
pub(crate) fn checked_bytes(dtype: DType, dims: &[usize]) -> Option<u64> {
    let bytes = dims.iter().try_fold(dtype.size() as u64, |acc, &d| {
        acc.checked_mul(u64::try_from(d).ok()?)
    })?;
    (bytes <= MAX_TENSOR_BYTES).then_some(bytes)
}

/// A tensor no larger than [`MAX_TENSOR_BYTES`].
pub(crate) fn size(t: &TensorType, what: &str) -> Result<(), String> {
    match checked_bytes(t.dtype, t.shape.dims()) {
        Some(_) => Ok(()),
        None => Err(format!(
            "{what} {t} has more than 2^60 bytes (its size overflows)"
        )),
    }
}

/// Exactly `n` inputs.
pub(crate) fn arity(inputs: &[&TensorType], n: usize, what: &str) -> Result<(), String> {
    if inputs.len() == n {
        Ok(())
    } else {
        Err(format!(
            "expects {n} input{} ({what}), got {}",
            if n == 1 { "" } else { "s" },
            inputs.len()
        ))
    }
}

/// A floating-point input.
pub(crate) fn float(t: &TensorType, what: &str) -> Result<(), String> {
    if t.dtype.is_float() {
        Ok(())
    } else {
        Err(format!("{what} must be floating point, got {t}"))
    }
}

/// An integer input.
pub(crate) fn int(t: &TensorType, what: &str) -> Result<(), String> {
    if t.dtype.is_int() {
        Ok(())
    } else {
        Err(format!("{what} must be an integer tensor, got {t}"))
    }
}

/// A bool input.
pub(crate) fn boolean(t: &TensorType, what: &str) -> Result<(), String> {
    if t.dtype == DType::Bool {
        Ok(())
    } else {
        Err(format!("{what} must be bool, got {t}"))
    }
}

/// Two inputs of one dtype.
pub(crate) fn same_dtype(a: &TensorType, b: &TensorType, what: &str) -> Result<(), String> {
    if a.dtype == b.dtype {
        Ok(())
    } else {
        Err(format!("{what} must have the same dtype, got {a} and {b}"))
    }
}

/// Two inputs of one type.
pub(crate) fn same_type(a: &TensorType, b: &TensorType, what: &str) -> Result<(), String> {
    if a == b {
        Ok(())
    } else {
        Err(format!("{what} must have the same type, got {a} and {b}"))
    }
}

/// A tensor of exactly rank `r`.
pub(crate) fn rank(t: &TensorType, r: usize, what: &str) -> Result<(), String> {
    if t.shape.rank() == r {
        Ok(())
    } else {
        Err(format!("{what} must have rank {r}, got {t}"))
    }
}

/// `axis` is an axis of `t`.
pub(crate) fn axis(t: &TensorType, axis: usize, what: &str) -> Result<(), String> {
    if axis < t.shape.rank() {
        Ok(())
    } else {
        Err(format!(
            "axis {axis} is out of range for {what} of rank {} ({t})",
            t.shape.rank()
        ))
    }
}

/// The numpy broadcast of two shapes: aligned at the right, each pair of dims
/// equal or one of them 1.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Result<Vec<usize>, String> {
    let n = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        let pad = n - s.len();
        if i < pad {
            1
        } else {
            s[i - pad]
        }
    };
    (0..n)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(format!(
                "shapes {a:?} and {b:?} do not broadcast (axis {i} of the result)"
            )),
        })
        .collect()
}

/// True if `from` broadcasts to exactly `to` (numpy `broadcast_to`).
pub fn broadcasts_to(from: &[usize], to: &[usize]) -> bool {
    from.len() <= to.len()
        && from
            .iter()
            .rev()
            .zip(to.iter().rev())
            .all(|(&f, &t)| f == t || f == 1)
}

/// `perm` is a permutation of `0..n`.
pub(crate) fn permutation(perm: &[usize], n: usize) -> Result<(), String> {
    let mut seen = vec![false; n];
    if perm.len() != n {
        return Err(format!(
            "permutation {perm:?} has {} entries for rank {n}",
            perm.len()
        ));
    }
    for &p in perm {
        if p >= n || seen[p] {
            return Err(format!("{perm:?} is not a permutation of 0..{n}"));
        }
        seen[p] = true;
    }
    Ok(())
}
