//! Full parameters from shards: each unit's flat parameter put together
//! from its shards in shard-position order, then cut into the parameters
//! by layout offset.

use super::rank::RankOut;
use super::*;

/// Cuts `unit`'s parameters out of its gathered flat values, by layout offset.
pub(crate) fn cut_params(
    unit: &fsdpc_plan::Unit,
    flat: &[f32],
    params: &mut Vec<(String, Vec<f32>)>,
) -> Result<(), RuntimeError> {
    for p in &unit.params {
        let vals = flat
            .get(p.offset as usize..(p.offset + p.numel) as usize)
            .ok_or_else(|| {
                RuntimeError::plan(format!(
                    "unit {}: parameter {} lies outside the gathered shards",
                    unit.id, p.name
                ))
            })?;
        params.push((p.name.clone(), vals.to_vec()));
    }
    Ok(())
}

/// `unit`'s flat parameter from its shards in shard-position order: each
/// shard's part of each segment put in its place (`Unit::shard_ranges`).
/// Elements no shard provides stay zero.
pub(crate) fn unshard<'s>(
    unit: &fsdpc_plan::Unit,
    shards: impl Iterator<Item = &'s [f32]>,
) -> Vec<f32> {
    let mut flat = vec![0f32; unit.padded_numel as usize];
    for (pos, shard) in shards.enumerate() {
        for (lo, at, n) in unit.shard_ranges(pos as u64) {
            let (lo, at, n) = (lo as usize, at as usize, n as usize);
            if let (Some(dst), Some(src)) = (flat.get_mut(lo..lo + n), shard.get(at..at + n)) {
                dst.copy_from_slice(src);
            }
        }
    }
    flat
}

/// The full parameters by name from the fp32 shards of the first shard
/// group's ranks (`shards[rank][unit]`), for launchers outside this file
/// (`cuda::train`).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))] // the cuda launcher's
pub(crate) fn assemble_shards(
    plan: &Plan,
    shards: Vec<Vec<Vec<f32>>>,
) -> Result<Vec<(String, Vec<f32>)>, RuntimeError> {
    let outs: Vec<RankOut> = shards
        .into_iter()
        .map(|shards| RankOut {
            shards,
            buffers: Vec::new(),
            measured: None,
            debug_peak: None,
            timeline: None,
        })
        .collect();
    assemble(plan, &outs)
}

/// The full parameters by name from the first shard group of each member
/// of the first tensor group (`outs[rank]`): `assemble_unit` for every
/// unit.
pub(crate) fn assemble(
    plan: &Plan,
    outs: &[RankOut],
) -> Result<Vec<(String, Vec<f32>)>, RuntimeError> {
    let mut params = Vec::new();
    for u in 0..plan.units.len() {
        let shard = |rank: usize| {
            outs.get(rank)
                .and_then(|o| o.shards.get(u))
                .map(|s| s.as_slice())
                .unwrap_or(&[])
        };
        params.extend(assemble_unit(plan, u, shard)?);
    }
    Ok(params)
}

/// Unit `u`'s full parameters by name from `shard(rank)`, each rank's
/// shard of it: each member of the first tensor group's parts put together
/// from its first shard group's shards (data ranks 0..F at its tensor
/// position), then the parts of a parameter split over the tensor group
/// (`ParamSpec::tp`) into the whole.
pub(crate) fn assemble_unit<'s>(
    plan: &Plan,
    u: usize,
    shard: impl Fn(usize) -> &'s [f32],
) -> Result<Vec<(String, Vec<f32>)>, RuntimeError> {
    let unit = &plan.units[u];
    let (f, t) = (
        plan.config.shard_factor as usize,
        plan.geometry().t() as usize,
    );
    let mut parts = Vec::with_capacity(t);
    for member in 0..t {
        let flat = unshard(unit, (0..f).map(|d| shard(d * t + member)));
        let mut cut = Vec::new();
        cut_params(unit, &flat, &mut cut)?;
        parts.push(cut);
    }
    let specs = &plan.training.graph.params;
    let mut params = Vec::with_capacity(unit.params.len());
    for (k, fp) in unit.params.iter().enumerate() {
        let spec = specs.get(fp.param.0 as usize);
        let Some((spec, tp)) = spec.and_then(|s| s.tp.as_ref().map(|tp| (s, tp))) else {
            params.push(parts[0][k].clone());
            continue;
        };
        let mut whole = vec![0f32; spec.whole().ty.numel() as usize];
        for (member, part) in parts.iter().enumerate() {
            let vals = &part[k].1;
            for (local, full, n) in tp.runs(&spec.ty.shape.0, member as u32) {
                let (l, w, n) = (local as usize, full as usize, n as usize);
                if let (Some(dst), Some(src)) = (whole.get_mut(w..w + n), vals.get(l..l + n)) {
                    dst.copy_from_slice(src);
                }
            }
        }
        params.push((fp.name.clone(), whole));
    }
    Ok(params)
}
