//! The fp16 loss scaler's instructions (`InstrOp::ScaleSeed` and the rest):
//! resolving them against a plan and executing them on one rank.
//!
//! State: the `LossScale` buffer holds `[scale, good steps]` (f32), set to
//! `[init_scale, 0]` before the first step (`init_loss_scale`); the
//! `FoundInf` buffer holds the flag. Unscaling multiplies by the f32
//! reciprocal of the scale computed in f64 (PyTorch's
//! `scale.double().reciprocal().float()`), element by element, and checks
//! every element for inf/NaN (PyTorch's
//! `_amp_foreach_non_finite_check_and_unscale_`).

use super::memory::Memory;
use super::rank::RankEnv;
use crate::comm::BufMut;
use crate::error::RuntimeError;
use fsdpc_ir::{DType, Graph, TensorType};
use fsdpc_plan::{BufferId, BufferKind, Group, InstrOp, Plan, Stream};

/// A resolved scaler instruction.
#[derive(Debug)]
pub enum ScalerStep<'p> {
    Seed {
        scale: BufferId,
        dst: super::resolve::Region,
        ty: &'p TensorType,
    },
    Unscale {
        grads: &'p [BufferId],
        scale: BufferId,
        found_inf: BufferId,
    },
    AllReduce {
        flag: BufferId,
        group: Group,
    },
    Update {
        scale: BufferId,
        found_inf: BufferId,
        growth: f64,
        backoff: f64,
        interval: u32,
    },
}

fn err(i: usize, reason: String) -> RuntimeError {
    RuntimeError::plan_at(i, reason)
}

/// Checks that `b` is an f32 buffer of `kind` and `bytes`.
fn state(
    plan: &Plan,
    i: usize,
    b: BufferId,
    kind: BufferKind,
    bytes: u64,
) -> Result<BufferId, RuntimeError> {
    match plan.buffers.get(b.index()) {
        Some(buf) if buf.kind == kind && buf.dtype == DType::F32 && buf.bytes == bytes => Ok(b),
        _ => Err(err(
            i,
            format!("buffer {b} is not the {bytes}-byte f32 {kind:?} buffer"),
        )),
    }
}

/// Resolves a scaler instruction; `None` for any other instruction.
pub fn resolve<'p>(
    plan: &'p Plan,
    graph: &'p Graph,
    i: usize,
    op: &'p InstrOp,
) -> Result<Option<ScalerStep<'p>>, RuntimeError> {
    let scale_of = |b| state(plan, i, b, BufferKind::LossScale, 8);
    let flag_of = |b| state(plan, i, b, BufferKind::FoundInf, 4);
    Ok(Some(match op {
        InstrOp::ScaleSeed { node, scale, dst } => {
            let ty = graph
                .try_node(*node)
                .and_then(|n| n.outputs.first())
                .ok_or_else(|| err(i, format!("seed node {node} has no output")))?;
            if ty.numel() != 1 || !ty.dtype.is_float() {
                return Err(err(
                    i,
                    format!("the seed of backward is {ty}, not a float scalar"),
                ));
            }
            ScalerStep::Seed {
                scale: scale_of(*scale)?,
                dst: super::resolve::region(plan, *dst, ty.bytes()).map_err(|e| err(i, e))?,
                ty,
            }
        }
        InstrOp::UnscaleGrads {
            grads,
            scale,
            found_inf,
        } => {
            for g in grads {
                match plan.buffers.get(g.index()) {
                    Some(b) if b.dtype.is_float() => {}
                    _ => return Err(err(i, format!("gradient buffer {g} is not a float buffer"))),
                }
            }
            ScalerStep::Unscale {
                grads,
                scale: scale_of(*scale)?,
                found_inf: flag_of(*found_inf)?,
            }
        }
        InstrOp::FoundInfAllReduce { buffer, group } => ScalerStep::AllReduce {
            flag: flag_of(*buffer)?,
            group: *group,
        },
        InstrOp::UpdateScale {
            scale,
            found_inf,
            growth_factor,
            backoff_factor,
            growth_interval,
        } => ScalerStep::Update {
            scale: scale_of(*scale)?,
            found_inf: flag_of(*found_inf)?,
            growth: *growth_factor,
            backoff: *backoff_factor,
            interval: *growth_interval,
        },
        _ => return Ok(None),
    }))
}

impl RankEnv<'_> {
    /// Sets every `LossScale` buffer to `[init_scale, 0]` (before the first
    /// step; the scale is not part of a checkpoint, so a resumed run starts
    /// again from `init_scale`).
    pub fn init_loss_scale(&self, mem: &Memory) -> Result<(), RuntimeError> {
        let Some(s) = &self.prep.plan.config.loss_scaler else {
            return Ok(());
        };
        for b in self
            .prep
            .plan
            .buffers
            .iter()
            .filter(|b| b.kind == BufferKind::LossScale)
        {
            // SAFETY: called before the first step, when no stream runs.
            let st = unsafe { self.f32s(mem, b.id)? };
            if let [scale, good] = st {
                (*scale, *good) = (s.init_scale as f32, 0.0);
            }
        }
        Ok(())
    }

    /// The loss scale in use and whether this step was skipped (an inf or
    /// NaN gradient on some rank), after a step; `None` without a scaler.
    pub fn read_loss_scale(&self, mem: &Memory) -> Result<Option<(f32, bool)>, RuntimeError> {
        let find = |k| {
            self.prep
                .plan
                .buffers
                .iter()
                .find(|b| b.kind == k)
                .map(|b| b.id)
        };
        let (Some(scale), Some(flag)) = (find(BufferKind::LossScale), find(BufferKind::FoundInf))
        else {
            return Ok(None);
        };
        // SAFETY: called between steps, when no stream runs.
        let (s, f) = unsafe { (self.f32s(mem, scale)?[0], self.f32s(mem, flag)?[0]) };
        Ok(Some((s, f != 0.0)))
    }

    /// Executes a scaler instruction.
    ///
    /// # Safety
    /// As for `Memory::view_mut`: the plan orders conflicting accesses.
    pub(super) unsafe fn scaler(
        &self,
        mem: &Memory,
        stream: Stream,
        s: &ScalerStep,
    ) -> Result<(), RuntimeError> {
        match s {
            ScalerStep::Seed { scale, dst, ty } => {
                let v = self.f32s(mem, *scale)?[0];
                let bytes = mem.view_mut(*dst)?;
                crate::cpu::kernels::cast::store_f32s(ty.dtype, &[v], bytes);
                Ok(())
            }
            ScalerStep::Unscale {
                grads,
                scale,
                found_inf,
            } => {
                let inv = (1.0 / f64::from(self.f32s(mem, *scale)?[0])) as f32;
                let mut found = false;
                for g in grads.iter() {
                    self.with_f32(mem, *g, |_, xs| {
                        for x in xs.iter_mut() {
                            found |= !x.is_finite();
                            *x *= inv;
                        }
                    })?;
                }
                self.f32s(mem, *found_inf)?[0] = if found { 1.0 } else { 0.0 };
                Ok(())
            }
            ScalerStep::AllReduce { flag, group } => {
                let buf = BufMut {
                    dtype: DType::F32,
                    bytes: mem.view_mut(mem.whole(*flag))?,
                };
                self.comm(stream, *group)?
                    .all_reduce(buf, 1)
                    .map_err(|e| super::rank::comm_err(self.rank, e))
            }
            ScalerStep::Update {
                scale,
                found_inf,
                growth,
                backoff,
                interval,
            } => {
                let found = self.f32s(mem, *found_inf)?[0] != 0.0;
                if let [s, good] = self.f32s(mem, *scale)? {
                    if found {
                        (*s, *good) = ((f64::from(*s) * backoff) as f32, 0.0);
                    } else if *good + 1.0 >= *interval as f32 {
                        (*s, *good) = ((f64::from(*s) * growth) as f32, 0.0);
                    } else {
                        *good += 1.0;
                    }
                }
                Ok(())
            }
        }
    }
}
