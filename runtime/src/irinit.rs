//! The IR's counter-based generators (parameter init and dropout masks),
//! behind one seam so the runtime names them in one place.

/// Whether element `element` of a dropout at `step` is kept.
pub fn dropout_keep(seed: u64, step: u64, element: u64, p: f64) -> bool {
    crate::rng::uniform(crate::rng::hash(&[seed, step, element])) >= p
}

/// Fills `out` with elements `start..start + out.len()` of parameter `spec`'s
/// initial value.
pub fn fill_f32(spec: &fsdpc_ir::ParamSpec, seed: u64, start: u64, out: &mut [f32]) {
    use fsdpc_ir::Init;
    for (i, o) in out.iter_mut().enumerate() {
        let e = start + i as u64;
        let key = [
            seed,
            crate::rng::hash(
                spec.name
                    .as_bytes()
                    .iter()
                    .map(|&b| b as u64)
                    .collect::<Vec<_>>()
                    .as_slice(),
            ),
            e,
        ];
        *o = match &spec.init {
            Init::Normal { std } => (crate::rng::normal(&key) * std) as f32,
            Init::Uniform { low, high } => {
                (low + (high - low) * crate::rng::uniform(crate::rng::hash(&key))) as f32
            }
            Init::Zeros => 0.0,
            Init::Ones => 1.0,
            Init::Constant { value } => *value as f32,
            Init::Data { data } => {
                crate::tensor::load_f64(data.ty.dtype, &data.bytes, e as usize) as f32
            }
        };
    }
}
