//! Data given as tensors: one global batch per input name (axis 0 is the
//! sample), fed at every step. Rank `r` with a micro-batch of `b` takes
//! samples `[r*b, (r+1)*b)`, as from every other source, so `world` ranks
//! with `b = B / world` see the same global batch of `B` samples as one rank
//! with `B`. Used to train on recorded inputs, e.g. to compare a model's first
//! loss with another framework's loss on the same inputs.

use super::{Batch, DataSource};
use crate::error::RuntimeError;
use crate::tensor::{HostTensor, TensorMut};
use std::collections::HashMap;

/// A fixed global batch per input name, the same at every step.
#[derive(Clone, Debug, Default)]
pub struct GivenData {
    tensors: HashMap<String, HostTensor>,
}

impl GivenData {
    /// Data from `(input name, global batch)` pairs. Every tensor needs a
    /// batch axis (rank >= 1); a name given twice is refused.
    pub fn new(
        tensors: impl IntoIterator<Item = (String, HostTensor)>,
    ) -> Result<GivenData, RuntimeError> {
        let mut map = HashMap::new();
        for (name, t) in tensors {
            if t.ty.shape.rank() == 0 {
                return Err(RuntimeError::data(
                    &name,
                    format!("given data {} has no batch axis", t.ty),
                ));
            }
            if map.contains_key(&name) {
                return Err(RuntimeError::data(&name, "given twice"));
            }
            map.insert(name, t);
        }
        Ok(GivenData { tensors: map })
    }

    /// Samples in the global batch of input `name`, if it is given.
    pub fn samples(&self, name: &str) -> Option<usize> {
        self.tensors.get(name).map(|t| t.ty.shape.dims()[0])
    }
}

impl DataSource for GivenData {
    fn fill(&self, name: &str, batch: Batch, mut out: TensorMut<'_>) -> Result<(), RuntimeError> {
        let t = self
            .tensors
            .get(name)
            .ok_or_else(|| RuntimeError::data(name, "no data is given for this input"))?;
        let (given, want) = (t.ty.shape.dims(), out.dims());
        if given.get(1..) != want.get(1..) || want.is_empty() {
            return Err(RuntimeError::data(
                name,
                format!(
                    "the given samples are {}, the model's input is {}",
                    t.ty, out.ty
                ),
            ));
        }
        if t.ty.dtype.is_float() != out.ty.dtype.is_float() {
            return Err(RuntimeError::data(
                name,
                format!("given {} for a {} input", t.ty.dtype, out.ty.dtype),
            ));
        }
        let first = usize::try_from(batch.first_sample).unwrap_or(usize::MAX);
        let end = first.saturating_add(want[0]);
        if end > given[0] {
            return Err(RuntimeError::data(
                name,
                format!(
                    "a rank asks for samples [{first}, {end}) of a given batch of {}",
                    given[0]
                ),
            ));
        }
        let per: usize = want[1..].iter().product();
        let src = t.view();
        for i in 0..out.numel() {
            let j = first * per + i;
            if out.ty.dtype.is_float() {
                out.set_f64(i, src.get_f64(j));
            } else {
                out.set_i64(i, src.get_i64(j));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fsdpc_ir::{DType, TensorType};

    fn ids() -> GivenData {
        let t = HostTensor::from_i64(&[4, 2], &[0, 1, 10, 11, 20, 21, 30, 31]).unwrap();
        GivenData::new([("ids".to_string(), t)]).unwrap()
    }

    fn fill(
        d: &GivenData,
        name: &str,
        ty: &TensorType,
        first: u64,
    ) -> Result<Vec<i64>, RuntimeError> {
        let mut out = HostTensor::zeros(ty.clone());
        let batch = Batch {
            step: 3,
            first_sample: first,
        };
        d.fill(name, batch, out.view_mut())?;
        Ok(out.to_i64())
    }

    #[test]
    fn ranks_take_their_slice_of_the_global_batch() {
        let d = ids();
        let half = TensorType::new(DType::I64, vec![2, 2]);
        assert_eq!(fill(&d, "ids", &half, 0).unwrap(), [0, 1, 10, 11]);
        assert_eq!(fill(&d, "ids", &half, 2).unwrap(), [20, 21, 30, 31]);
        let one = TensorType::new(DType::I32, vec![1, 2]);
        let mut out = HostTensor::zeros(one.clone());
        d.fill(
            "ids",
            Batch {
                step: 0,
                first_sample: 3,
            },
            out.view_mut(),
        )
        .unwrap();
        assert_eq!(out.view().get_i64(0), 30);
        assert_eq!(out.view().get_i64(1), 31);
        assert_eq!(d.samples("ids"), Some(4));
    }

    #[test]
    fn every_step_sees_the_same_batch() {
        let d = ids();
        let ty = TensorType::new(DType::I64, vec![4, 2]);
        let mut a = HostTensor::zeros(ty.clone());
        let mut b = HostTensor::zeros(ty);
        d.fill(
            "ids",
            Batch {
                step: 0,
                first_sample: 0,
            },
            a.view_mut(),
        )
        .unwrap();
        d.fill(
            "ids",
            Batch {
                step: 9,
                first_sample: 0,
            },
            b.view_mut(),
        )
        .unwrap();
        assert_eq!(a.to_i64(), b.to_i64());
    }

    #[test]
    fn mismatches_are_errors() {
        let d = ids();
        let half = TensorType::new(DType::I64, vec![2, 2]);
        let err = |r: Result<Vec<i64>, RuntimeError>| r.unwrap_err().to_string();
        assert!(err(fill(&d, "mask", &half, 0)).contains("no data is given"));
        assert!(err(fill(&d, "ids", &half, 3)).contains("samples [3, 5) of a given batch of 4"));
        let wide = TensorType::new(DType::I64, vec![2, 3]);
        assert!(err(fill(&d, "ids", &wide, 0)).contains("the model's input is"));
        let float = TensorType::new(DType::F32, vec![2, 2]);
        let mut out = HostTensor::zeros(float);
        let e = d
            .fill(
                "ids",
                Batch {
                    step: 0,
                    first_sample: 0,
                },
                out.view_mut(),
            )
            .unwrap_err();
        assert!(e.to_string().contains("given i64 for a f32 input"), "{e}");
        let scalar = HostTensor::from_i64(&[], &[1]).unwrap();
        assert!(GivenData::new([("s".to_string(), scalar)]).is_err());
        let t = HostTensor::from_i64(&[1], &[1]).unwrap();
        assert!(GivenData::new([("a".to_string(), t.clone()), ("a".to_string(), t)]).is_err());
    }
}
