//! The flat pass (flat parameters): lays each unit's parameters end to
//! end in one flat buffer, in two segments, each padded to a multiple of
//! the sharding factor F:
//! `[trainable parameters | pad | frozen parameters | pad]`
//! (within a segment, in `ParamId` order). Records each parameter's element
//! offset and the frozen segment's length (`Unit::frozen_numel`).
//!
//! Why two segments: every rank's shard is then its part of each segment,
//! end to end, `[trainable shard | frozen shard]` (`Unit::shard_ranges`),
//! so the flat gradient covers the trainable segment only, and the gradient
//! shard and the optimizer state cover the first `trainable_shard_numel`
//! elements of the parameter shard: frozen parameters cost no gradient
//! memory, no reduce-scatter bytes and no optimizer state even when they
//! share a unit with trainable ones (the mixed FlatParameter case). The
//! price is one all-gather per segment (the runtime gathers each segment
//! into its place) and at most F - 1 more padding elements. A unit without
//! frozen parameters has one segment and the layout of one flat buffer.

use crate::error::PlanError;
use crate::units::UnitAssignment;
use fsdpc_ir::{Graph, NodeId, Op, ParamId, ValueId};
use fsdpc_plan::{FlatParam, Unit, UnitId};
use std::collections::HashMap;

/// Whether weight decay applies to parameter `p` unless every parameter
/// decays: not to tensors of rank < 2 (norms' scales and shifts, biases)
/// nor to embedding tables (the data of an axis-0 `Gather`, tied or not),
/// as nanoGPT's `configure_optimizers` and Hugging Face's trainer group
/// them (which embeddings decay differs between the two; fsdpc takes them
/// out).
pub fn decays(graph: &Graph, params: &HashMap<ParamId, NodeId>, p: ParamId) -> bool {
    if graph.param(p).ty.shape.0.len() < 2 {
        return false;
    }
    let Some(&node) = params.get(&p) else {
        return true;
    };
    let value = ValueId { node, slot: 0 };
    !graph.users(value).iter().any(|&(n, slot)| {
        slot == 0
            && matches!(
                graph.node(n).op,
                Op::Gather { axis: 0 } | Op::TpLookup { .. }
            )
    })
}

/// Marks each parameter's `decay` (`decays`; all of them with `decay_all`).
pub fn mark_decay(graph: &Graph, units: &mut [Unit], decay_all: bool) {
    let params = graph.param_nodes();
    for fp in units.iter_mut().flat_map(|u| u.params.iter_mut()) {
        fp.decay = decay_all || decays(graph, &params, fp.param);
    }
}

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
            let mut params = Vec::with_capacity(def.params.len());
            let trainable: Vec<ParamId> = def
                .params
                .iter()
                .copied()
                .filter(|&p| graph.param(p).requires_grad)
                .collect();
            let frozen: Vec<ParamId> = def
                .params
                .iter()
                .copied()
                .filter(|&p| !graph.param(p).requires_grad)
                .collect();
            let t = lay_out(graph, &trainable, 0, &mut params)?;
            let t_padded = t.div_ceil(f) * f;
            let z = lay_out(graph, &frozen, t_padded, &mut params)?;
            let z_padded = z.div_ceil(f) * f;
            let padded = t_padded + z_padded;
            Ok(Unit {
                reshard_after_forward: None,
                id: UnitId(i as u32),
                module: def.path.clone(),
                kind: def.kind.clone(),
                flat_numel: t + z,
                padded_numel: padded,
                shard_numel: padded / f,
                frozen_numel: z_padded,
                params,
            })
        })
        .collect()
}

/// Lays `ids` out from element `start`; returns their elements.
fn lay_out(
    graph: &Graph,
    ids: &[ParamId],
    start: u64,
    out: &mut Vec<FlatParam>,
) -> Result<u64, PlanError> {
    let mut offset = start;
    for &p in ids {
        let spec = graph.param(p);
        // The shard is f32 (the master copy); parameters are read in the
        // policy's float dtype, which `precision::apply` made uniform.
        if !spec.ty.dtype.is_float() {
            return Err(PlanError::Program {
                reason: format!(
                    "parameter `{}` is {}; flat parameters hold floating-point values only",
                    spec.name, spec.ty.dtype
                ),
            });
        }
        let numel = spec.ty.numel();
        out.push(FlatParam {
            param: p,
            name: spec.name.clone(),
            shape: spec.ty.shape.0.clone(),
            offset,
            numel,
            requires_grad: spec.requires_grad,
            decay: true,
        });
        offset += numel;
    }
    Ok(offset - start)
}
