//! Module buffers: state a model keeps from step to step that is not
//! trained (a batch normalisation's running mean and variance). PyTorch
//! keeps them beside the parameters as `module.register_buffer`; FSDP
//! neither shards nor reduces them: every rank holds the whole buffer,
//! updates it from its own samples, and rank 0's copy is the one saved.

use crate::param::Init;
use crate::types::TensorType;
use serde::{Deserialize, Serialize};

/// Index of a module buffer in `Graph::buffers`.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ModuleBufferId(pub u32);

/// A module buffer: its PyTorch name (`layer1.0.bn1.running_mean`), type
/// (f32) and initial value. A graph reads it with `Op::ModuleBuffer` and
/// replaces it with `Op::WriteBuffer`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModuleBufferSpec {
    pub name: String,
    #[serde(rename = "type")]
    pub ty: TensorType,
    pub init: Init,
}

impl ModuleBufferSpec {
    /// Its initial values (f32, row-major), from `init` as a parameter's
    /// would be (`crate::init::fill_f32`; `seed` for a random init).
    pub fn initial_values(&self, seed: u64) -> Result<Vec<f32>, crate::IrError> {
        let as_param = crate::ParamSpec {
            name: self.name.clone(),
            ty: self.ty.clone(),
            init: self.init.clone(),
            requires_grad: false,
            tied_to: None,
            tp: None,
        };
        let mut out = vec![0f32; self.ty.numel() as usize];
        crate::init::fill_f32(&as_param, seed, 0, &mut out)?;
        Ok(out)
    }
}
