//! Pass 2, flat parameters: lays each unit's parameters end to end (in
//! `ParamId` order) in one flat buffer, padded to a multiple of the sharding
//! factor F, so that every rank owns one contiguous shard of `padded / F`
//! elements. Records each parameter's element offset.

use crate::error::PlanError;
use crate::plan::{FlatParam, Unit, UnitId};
use crate::units::UnitAssignment;
use fsdpc_ir::{DType, Graph};

/// The flat layout of every unit for sharding factor `shard_factor` (>= 1).
/// Parameters must be f32 (the flat parameter's dtype).
pub fn layout_units(
    graph: &Graph,
    assign: &UnitAssignment,
    shard_factor: u32,
) -> Result<Vec<Unit>, PlanError> {
    let f = u64::from(shard_factor.max(1));
    assign
        .units
        .iter()
        .enumerate()
        .map(|(i, def)| {
            let mut offset = 0u64;
            let mut params = Vec::with_capacity(def.params.len());
            for &p in &def.params {
                let spec = graph.param(p);
                if spec.ty.dtype != DType::F32 {
                    return Err(PlanError::Program {
                        reason: format!(
                            "parameter `{}` is {}; flat parameters hold f32 only",
                            spec.name, spec.ty.dtype
                        ),
                    });
                }
                let numel = spec.ty.numel();
                params.push(FlatParam {
                    param: p,
                    name: spec.name.clone(),
                    shape: spec.ty.shape.0.clone(),
                    offset,
                    numel,
                    requires_grad: spec.requires_grad,
                });
                offset += numel;
            }
            let padded = offset.div_ceil(f) * f;
            Ok(Unit {
                id: UnitId(i as u32),
                module: def.path.clone(),
                kind: def.kind.clone(),
                flat_numel: offset,
                padded_numel: padded,
                shard_numel: padded / f,
                params,
            })
        })
        .collect()
}
