//! Parameter initialisation, shard by shard: a rank creates only its own
//! shard of each unit's flat parameter — its part of each segment of the
//! flat buffer (`Unit::shard_ranges`; one segment `[pos*shard,
//! (pos+1)*shard)` without frozen parameters), mapped back to (parameter,
//! element index) through the unit's layout — from the IR's counter-based
//! init, so the values are the same for every F. A parameter split over a
//! tensor group is read from the whole parameter's elements its member
//! holds (`fsdpc_ir::TpSlice`). Padding is zero.

use crate::error::RuntimeError;
use fsdpc_ir::ParamSpec;
use fsdpc_plan::Unit;

/// Fills `out` (the shard at position `pos`) of `unit`'s flat parameter,
/// whose parameters split over a tensor group (`ParamSpec::tp`) are member
/// `member`'s parts.
pub fn fill_shard(
    unit: &Unit,
    params: &[ParamSpec],
    (pos, member): (u64, u32),
    seed: u64,
    out: &mut [f32],
) -> Result<(), RuntimeError> {
    if out.len() as u64 != unit.shard_numel {
        return Err(RuntimeError::plan(format!(
            "unit {}: shard buffer holds {} elements, the layout says {}",
            unit.id,
            out.len(),
            unit.shard_numel
        )));
    }
    out.fill(0.0);
    for (lo, at, n) in unit.shard_ranges(pos) {
        let hi = lo + n;
        for fp in &unit.params {
            let spec = params.get(fp.param.0 as usize).ok_or_else(|| {
                RuntimeError::plan(format!(
                    "unit {}: parameter {} does not exist",
                    unit.id, fp.param.0
                ))
            })?;
            let (s, e) = (fp.offset.max(lo), (fp.offset + fp.numel).min(hi));
            if s < e {
                let range = (s - lo + at) as usize..(e - lo + at) as usize;
                let dst = out.get_mut(range).ok_or_else(|| {
                    RuntimeError::plan(format!(
                        "unit {}: segment at flat element {lo} lies outside the shard",
                        unit.id
                    ))
                })?;
                fsdpc_ir::init::fill_part(spec, member, s - fp.offset, dst, |whole, at, out| {
                    crate::irinit::fill_f32(whole, seed, at, out)
                })?;
            }
        }
    }
    Ok(())
}
