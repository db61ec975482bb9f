//! Gradient reduction and optimizer steps (reduce and compute streams).
//!
//! Conventions (the runtime relies on them):
//! - After the last compute instruction that touches a unit's `FlatGrads`,
//!   compute `Record`s, the reduce stream `Wait`s and runs `ReduceScatter`
//!   (full_shard, then `Free`s the flat gradient) or an in-place `AllReduce`
//!   (no_shard), then `Record`s.
//! - After the last kernel, for each unit in reduction order: compute
//!   `Wait`s, `OptimizerStep` (and, under no_shard, `Free`s the flat
//!   gradient).

use super::Lowering;
use crate::plan::*;

impl Lowering<'_> {
    /// The unit's flat gradient: its trainable segment only (frozen
    /// parameters, laid out after it, have no gradient).
    pub(super) fn flat_grad(&mut self, u: UnitId) -> BufferId {
        if let Some(b) = self.flat_grads[u.index()] {
            return b;
        }
        // Gradients are computed in the parameters' dtype (see `precision`).
        let dtype = self.input.cfg.param_dtype;
        let bytes = self.input.units[u.index()].trainable_numel() * dtype.size() as u64;
        let b = self.new_buffer(BufferKind::FlatGrads, Some(u), None, dtype, bytes);
        self.flat_grads[u.index()] = Some(b);
        b
    }

    /// Reduces the gradients of units whose flat gradient is complete at `s`.
    pub(super) fn emit_reductions(&mut self, s: usize) {
        for u in 0..self.input.units.len() {
            if self.facts.grad_done[u] != Some(s) {
                continue;
            }
            let Some(src) = self.flat_grads[u] else {
                continue;
            };
            let unit = UnitId(u as u32);
            let ready = self.record(Stream::Compute);
            self.push(Stream::Reduce, InstrOp::Wait { event: ready });
            let dtype = self.input.cfg.reduce_dtype;
            match self.shard_grads[u] {
                Some(dst) if self.sharded() => {
                    self.push(
                        Stream::Reduce,
                        InstrOp::ReduceScatter {
                            unit,
                            src,
                            dst,
                            dtype,
                        },
                    );
                    self.push(Stream::Reduce, InstrOp::Free { buffer: src });
                }
                _ => {
                    let divide_by = self.input.world;
                    let group = Group::Replicate;
                    self.push(
                        Stream::Reduce,
                        InstrOp::AllReduce {
                            unit,
                            buffer: src,
                            group,
                            divide_by,
                            dtype,
                        },
                    );
                }
            }
            let done = self.record(Stream::Reduce);
            self.reduced.push((unit, done));
        }
    }

    pub(super) fn emit_optimizer(&mut self) {
        for (unit, event) in std::mem::take(&mut self.reduced) {
            let u = unit.index();
            let (Some(params), Some(flat)) = (self.shard_params[u], self.flat_grads[u]) else {
                continue;
            };
            self.push(Stream::Compute, InstrOp::Wait { event });
            let grads = if self.sharded() {
                self.shard_grads[u].unwrap_or(flat)
            } else {
                flat
            };
            let state = self.opt_state[u].clone();
            self.push(
                Stream::Compute,
                InstrOp::OptimizerStep {
                    unit,
                    params,
                    grads,
                    state,
                    skip_if: None,
                },
            );
            if !self.sharded() {
                self.push(Stream::Compute, InstrOp::Free { buffer: flat });
            }
        }
    }
}
