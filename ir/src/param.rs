//! Parameters: described, never materialised, at plan time.

use crate::types::{DType, TensorData, TensorType};
use serde::{Deserialize, Serialize};

/// Index of a parameter in `Graph::params`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ParamId(pub u32);

/// How a parameter's initial value is made. A description, never a tensor: a
/// 175-billion-parameter model is planned without parameter memory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Init {
    /// Normal(0, std), from the counter-based generator keyed by
    /// (seed, parameter, element index).
    Normal {
        std: f64,
    },
    /// Uniform(low, high), from the same generator.
    Uniform {
        low: f64,
        high: f64,
    },
    Zeros,
    Ones,
    Constant {
        value: f64,
    },
    /// Bytes that came with the model (an ONNX initializer).
    Data {
        data: TensorData,
    },
    /// A checkpoint tensor left in its file: the parameter's elements,
    /// row-major in `dtype` (f32, f16 or bf16), start at byte `offset` of
    /// `path` (a Hugging Face safetensors file; `tensor` is its name there).
    /// The runtime maps the file and reads each rank's shard alone.
    File {
        path: String,
        tensor: String,
        dtype: DType,
        offset: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamSpec {
    /// The original name (`transformer.h.3.attn.c_attn.weight`).
    pub name: String,
    #[serde(rename = "type")]
    pub ty: TensorType,
    pub init: Init,
    pub requires_grad: bool,
    /// Set on a parameter that shares the storage of another one (a tied output
    /// projection). Builders normally reuse the same `Param` node instead; this
    /// records ties that a frontend found by name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tied_to: Option<ParamId>,
    /// Set on a parameter split over a tensor-parallel group: `ty` is one
    /// member's part, and this says which elements of the whole it holds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp: Option<TpSlice>,
}

/// The part of a parameter each member of a tensor-parallel group holds.
/// Axis `axis` of the whole parameter is the concatenation of `segments`
/// (their lengths, in order: the query, key and value columns of a fused
/// projection are three); each segment is cut into `parts` chunks of
/// `ceil(segment / parts)`, and member `t` holds chunk `t` of every
/// segment, concatenated in segment order. One segment is Megatron's plain
/// column or row split.
///
/// A segment `parts` does not divide is *padded* (a vocabulary of 50,257
/// over 2 members: Megatron's `--make-vocab-size-divisible-by`, done as a
/// layout): member `t` holds the whole segment's `[t·chunk, min((t+1)·chunk,
/// segment))` followed by zeros up to `chunk`. The padding belongs to no
/// element of the whole: `runs` and `locate` skip it, and the whole
/// parameter (`full_shape`) is never padded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TpSlice {
    pub axis: usize,
    pub segments: Vec<usize>,
    pub parts: u32,
}

impl TpSlice {
    /// The whole parameter's shape, from one member's.
    pub fn full_shape(&self, local: &[usize]) -> Vec<usize> {
        let mut s = local.to_vec();
        if let Some(d) = s.get_mut(self.axis) {
            *d = self.segments.iter().sum();
        }
        s
    }

    /// One member's length of split axis `axis` (padding included).
    pub fn local_len(&self) -> usize {
        let parts = self.parts.max(1) as usize;
        self.segments.iter().map(|s| s.div_ceil(parts)).sum()
    }

    /// Whether a member's part holds padding (a segment `parts` does not
    /// divide).
    pub fn padded(&self) -> bool {
        let parts = self.parts.max(1) as usize;
        self.segments.iter().any(|s| !s.is_multiple_of(parts))
    }

    /// Member `member`'s chunk of a segment of `seg`: its length with
    /// padding, where it starts in the segment, and how many of its
    /// entries are the segment's (the rest is padding).
    fn chunk(&self, seg: u64, member: u32) -> (u64, u64, u64) {
        let chunk = seg.div_ceil(u64::from(self.parts.max(1)));
        let from = (u64::from(member) * chunk).min(seg);
        (chunk, from, (seg - from).min(chunk))
    }

    /// Member `member`'s elements as runs `(local start, whole start, len)`
    /// of consecutive row-major elements, in local order; `local` is the
    /// member's shape. Padding is in no run; a slice whose axis `local`
    /// lacks has none.
    pub fn runs(&self, local: &[usize], member: u32) -> Vec<(u64, u64, u64)> {
        if self.axis >= local.len() {
            return Vec::new();
        }
        let full = self.full_shape(local);
        let outer: u64 = local[..self.axis].iter().map(|&d| d as u64).product();
        let inner: u64 = local[self.axis + 1..].iter().map(|&d| d as u64).product();
        let (local_len, full_len) = (local[self.axis] as u64, full[self.axis] as u64);
        let mut runs = Vec::new();
        for o in 0..outer {
            let (mut at_local, mut seg_start) = (0u64, 0u64);
            for &seg in &self.segments {
                let (chunk, from, held) = self.chunk(seg as u64, member);
                let local_start = (o * local_len + at_local) * inner;
                let full_start = (o * full_len + seg_start + from) * inner;
                match runs.last_mut() {
                    _ if held == 0 || inner == 0 => {}
                    Some((ls, fs, n)) if *ls + *n == local_start && *fs + *n == full_start => {
                        *n += held * inner
                    }
                    _ => runs.push((local_start, full_start, held * inner)),
                }
                at_local += chunk;
                seg_start += seg as u64;
            }
        }
        runs
    }

    /// Where element `whole` (row-major) of the whole parameter lies:
    /// `(member, element in that member's part, elements of the same run
    /// from there)`, the run ending where the member's part of the segment
    /// does (before its padding); `local` is a member's shape. `None` past
    /// the end.
    pub fn locate(&self, local: &[usize], whole: u64) -> Option<(u32, u64, u64)> {
        if self.axis >= local.len() {
            return None;
        }
        let full = self.full_shape(local);
        let inner: u64 = local[self.axis + 1..].iter().map(|&d| d as u64).product();
        let (local_len, full_len) = (local[self.axis] as u64, full[self.axis] as u64);
        let total: u64 = full.iter().map(|&d| d as u64).product();
        if whole >= total || inner == 0 {
            return None;
        }
        let parts = u64::from(self.parts.max(1));
        let o = whole / (full_len * inner);
        let x = whole / inner % full_len;
        let (mut seg_start, mut at_local) = (0u64, 0u64);
        for &seg in &self.segments {
            let (seg, chunk) = (seg as u64, (seg as u64).div_ceil(parts));
            if x < seg_start + seg && chunk > 0 {
                let member = (x - seg_start) / chunk;
                let within = (x - seg_start) % chunk;
                let (_, _, held) = self.chunk(seg, member as u32);
                let local_x = at_local + within;
                let element = (o * local_len + local_x) * inner + whole % inner;
                let run = (held - within) * inner - whole % inner;
                return Some((member as u32, element, run));
            }
            seg_start += seg;
            at_local += chunk;
        }
        None
    }
}

impl ParamSpec {
    /// The whole parameter a tensor-parallel part belongs to (the spec
    /// itself when it is not split).
    pub fn whole(&self) -> ParamSpec {
        let mut p = self.clone();
        if let Some(tp) = p.tp.take() {
            p.ty.shape = crate::types::Shape(tp.full_shape(&self.ty.shape.0));
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::TpSlice;

    /// `locate` inverts `runs`: every element of every member's runs is
    /// found at its member and local place, and a run never crosses the end
    /// of the member's chunk.
    #[test]
    fn locate_inverts_the_runs() {
        for (tp, local) in [
            // A fused query-key-value projection split on its last axis.
            (
                TpSlice {
                    axis: 1,
                    segments: vec![8, 4, 4],
                    parts: 2,
                },
                vec![3, 8],
            ),
            // Rows of a row-parallel weight.
            (
                TpSlice {
                    axis: 0,
                    segments: vec![8],
                    parts: 4,
                },
                vec![2, 5],
            ),
            // A padded vocabulary: 7 rows over 4 members of 2 rows, the
            // last holding one row and one of padding.
            (
                TpSlice {
                    axis: 0,
                    segments: vec![7],
                    parts: 4,
                },
                vec![2, 3],
            ),
            // Padded segments on the last axis, one divisible between.
            (
                TpSlice {
                    axis: 1,
                    segments: vec![5, 4, 3],
                    parts: 2,
                },
                vec![3, 7],
            ),
        ] {
            assert_eq!(tp.local_len(), local[tp.axis], "{tp:?}");
            let mut seen = 0;
            for member in 0..tp.parts {
                for (l, w, n) in tp.runs(&local, member) {
                    for k in 0..n {
                        let (m, at, run) = tp.locate(&local, w + k).expect("inside");
                        assert_eq!((m, at), (member, l + k), "{tp:?} element {}", w + k);
                        assert!(
                            run >= 1 && k + run <= n,
                            "{tp:?}: run {run} from {k} of {n}"
                        );
                        seen += 1;
                    }
                }
            }
            let total: usize = tp.full_shape(&local).iter().product();
            assert_eq!(seen, total);
            assert_eq!(tp.locate(&local, total as u64), None);
        }
    }

    /// A padded member's runs cover its part but for the padding: the
    /// local elements no run holds are exactly the padding rows, and no
    /// whole element is located there.
    #[test]
    fn padding_lies_in_no_run() {
        let tp = TpSlice {
            axis: 0,
            segments: vec![7],
            parts: 4,
        };
        let local = [2usize, 3];
        assert!(tp.padded());
        assert_eq!(tp.full_shape(&local), vec![7, 3]);
        for member in 0..4 {
            let mut held = [false; 6];
            for (l, _, n) in tp.runs(&local, member) {
                held[l as usize..(l + n) as usize].fill(true);
            }
            let padding: Vec<usize> = (0..6).filter(|&e| !held[e]).collect();
            let want: Vec<usize> = if member == 3 { vec![3, 4, 5] } else { vec![] };
            assert_eq!(padding, want, "member {member}");
        }
        let divisible = TpSlice {
            axis: 0,
            segments: vec![8],
            parts: 4,
        };
        assert!(!divisible.padded());
        assert_eq!(divisible.local_len(), 2);
        // A slice on an axis the shape lacks (a damaged manifest) holds
        // nothing, and nothing panics.
        let off_axis = TpSlice { axis: 2, ..tp };
        assert!(off_axis.runs(&local, 0).is_empty());
        assert_eq!(off_axis.locate(&local, 0), None);
    }
}
