//! Gradient reduction and optimizer steps (reduce and compute streams).
//!
//! Conventions (the runtime relies on them):
//! - After the last compute instruction that touches a unit's `FlatGrads`,
//!   compute `Record`s, the reduce stream `Wait`s and runs `ReduceScatter`
//!   over the shard group (sharded strategies, then `Free`s the flat
//!   gradient; where F < world, an in-place `AllReduce` of the gradient
//!   shard over `Group::Replicate` follows, dividing by 1: the
//!   reduce-scatter already divided by the world) or an in-place
//!   `AllReduce` over the world (no_shard), then `Record`s.
//! - Gradient accumulation (K micro-batches): every micro-batch's flat
//!   gradient is reduced as above, dividing by world x K; the first
//!   micro-batch's result is the target, a later one's reduce-scatter
//!   writes a `PartialGrads` shard (no_shard: its flat gradient is
//!   all-reduced in place) that the reduce stream `Accumulate`s into the
//!   target and frees. The replica all-reduce and the `Record` the
//!   optimizer waits on follow the last micro-batch only. With `no_sync`
//!   each later micro-batch's flat gradient is instead `Accumulate`d on
//!   compute into the first one's, which stays unsharded until the last
//!   micro-batch and is reduced once: fewer bytes communicated, every
//!   unit's flat gradient held across the micro-batches.
//! - `cpu_offload`: sharded reductions write a staged device buffer
//!   (`StagedGrads`) in place of the host gradient shard; after the last
//!   micro-batch (and the replica all-reduce) the reduce stream copies it
//!   into the host shard and frees it, before the `Record` (see `offload`).
//! - After the last kernel, for each unit in reduction order: compute
//!   `Wait`s, `OptimizerStep` (and, under no_shard, `Free`s the flat
//!   gradient).

use super::Lowering;
use fsdpc_plan::*;

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

    /// Reduces the gradients of units whose flat gradient is complete at `s`
    /// (in micro-batch `self.m`).
    pub(super) fn emit_reductions(&mut self, s: usize) {
        let k = self.input.cfg.grad_accum.max(1);
        let last = self.m + 1 == k;
        for u in 0..self.input.units.len() {
            if self.facts.grad_done[u].get(self.m as usize) != Some(&s) {
                continue;
            }
            let Some(src) = self.flat_grads[u].take() else {
                continue;
            };
            let unit = UnitId(u as u32);
            if self.input.cfg.no_sync && k > 1 {
                // `no_sync`: add into the first micro-batch's flat gradient
                // on compute; reduce that once, after the last.
                match self.grad_target[u] {
                    None => self.grad_target[u] = Some(src),
                    Some(target) => {
                        self.accumulate(Stream::Compute, unit, src, target);
                    }
                }
                if last {
                    if let Some(target) = self.grad_target[u].take() {
                        self.reduce(unit, target, true, true);
                    }
                }
                continue;
            }
            self.reduce(unit, src, self.m == 0, last);
        }
    }

    /// `dst += src` on `stream`, then `src` freed.
    fn accumulate(&mut self, stream: Stream, unit: UnitId, src: BufferId, dst: BufferId) {
        self.push(
            stream,
            InstrOp::Accumulate {
                unit: Some(unit),
                src,
                dst,
            },
        );
        self.push(stream, InstrOp::Free { buffer: src });
    }

    /// Reduces the flat gradient `src` of `unit` on the reduce stream: the
    /// `first` micro-batch into the gradient shard (or, under no_shard, in
    /// place, kept as what later micro-batches add into), a later one into
    /// a `PartialGrads` shard added into it; after the `last`, the replicas
    /// all-reduce the shard (hybrid) and the optimizer may step.
    fn reduce(&mut self, unit: UnitId, src: BufferId, first: bool, last: bool) {
        let u = unit.index();
        let ready = self.record(Stream::Compute);
        self.push(Stream::Reduce, InstrOp::Wait { event: ready });
        let dtype = self.input.cfg.reduce_dtype;
        let k = self.input.cfg.grad_accum.max(1);
        // Under `cpu_offload` the reduction writes a staged device buffer,
        // copied to the host shard after the last micro-batch (`offload`).
        let mut staged = None;
        match self.shard_grads[u] {
            Some(shard) if self.sharded() => {
                if first {
                    self.grad_target[u] = Some(self.staged_grads(unit, shard));
                }
                let target = self.grad_target[u].unwrap_or(shard);
                let dst = if first {
                    target
                } else {
                    let b = &self.buffers[target.index()];
                    let (dtype, bytes) = (b.dtype, b.bytes);
                    self.new_buffer(BufferKind::PartialGrads, Some(unit), None, dtype, bytes)
                };
                self.push(
                    Stream::Reduce,
                    InstrOp::ReduceScatter {
                        c: Collective {
                            unit,
                            src,
                            dst,
                            dtype,
                            group: Group::Shard,
                            wire: Wire::Native,
                            wire_buffer: None,
                            algorithm: CollectiveAlgorithm::Ring,
                            staging: None,
                        },
                    },
                );
                self.push(Stream::Reduce, InstrOp::Free { buffer: src });
                if !first {
                    self.accumulate(Stream::Reduce, unit, dst, target);
                }
                if !last {
                    return;
                }
                self.grad_target[u] = None;
                staged = Some((target, shard));
                if self.input.world > self.input.shard_factor {
                    // Hybrid: the replicas of this shard sum theirs (each
                    // already divided by the world and the micro-batches).
                    self.push(
                        Stream::Reduce,
                        InstrOp::AllReduce {
                            unit,
                            buffer: target,
                            group: Group::Replicate,
                            divide_by: 1,
                            dtype,
                            algorithm: CollectiveAlgorithm::Ring,
                            staging: None,
                        },
                    );
                }
            }
            _ => {
                self.push(
                    Stream::Reduce,
                    InstrOp::AllReduce {
                        unit,
                        buffer: src,
                        group: Group::Replicate,
                        divide_by: self.input.world * k,
                        dtype,
                        algorithm: CollectiveAlgorithm::Ring,
                        staging: None,
                    },
                );
                match self.grad_target[u] {
                    Some(target) if !first => self.accumulate(Stream::Reduce, unit, src, target),
                    _ => self.grad_target[u] = Some(src),
                }
                if !last {
                    return;
                }
            }
        }
        if let Some((dst, shard)) = staged {
            self.copy_grads_out(unit, dst, shard);
        }
        let done = self.record(Stream::Reduce);
        self.reduced.push((unit, done));
    }

    pub(super) fn emit_optimizer(&mut self) {
        for (unit, event) in std::mem::take(&mut self.reduced) {
            let u = unit.index();
            // The reduced gradient: the shard, or under no_shard the
            // all-reduced flat gradient (kept in `grad_target`).
            let flat = self.grad_target[u].take();
            let grads = if self.sharded() {
                self.shard_grads[u]
            } else {
                flat
            };
            let (Some(params), Some(grads)) = (self.shard_params[u], grads) else {
                continue;
            };
            self.push(Stream::Compute, InstrOp::Wait { event });
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
            if let (false, Some(flat)) = (self.sharded(), flat) {
                self.push(Stream::Compute, InstrOp::Free { buffer: flat });
            }
        }
    }
}
