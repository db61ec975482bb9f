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
}
