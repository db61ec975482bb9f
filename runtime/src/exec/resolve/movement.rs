//! Resolving the instructions that move whole buffers, between ranks or
//! between memories: all-gathers (native, bucketed, hierarchical,
//! quantized), reshards, copies, reduce-scatters and all-reduces, with the
//! checks the executor's collectives rely on (parts inside their buffers,
//! staging sized, groups that exist on this world).

use super::*;

/// The step of buffer-moving instruction `i`.
pub(super) fn step<'p>(
    plan: &'p Plan,
    i: usize,
    op: &'p InstrOp,
) -> Result<Step<'p>, RuntimeError> {
    Ok(match op {
        InstrOp::AllGather {
            c: Collective { src, dst, .. },
            ..
        }
        | InstrOp::ReduceScatter {
            c: Collective { src, dst, .. },
        } if src == dst => {
            return Err(err(
                i,
                format!("collective reads and writes the same buffer {src}"),
            ));
        }
        InstrOp::AllGather {
            c: Collective {
                wire, algorithm, ..
            },
            ..
        }
        | InstrOp::ReduceScatter {
            c: Collective {
                wire, algorithm, ..
            },
        } if !wire.is_native() => {
            if !algorithm.is_ring() {
                return Err(err(
                    i,
                    format!(
                        "a {} collective runs as one ring, not {algorithm:?}",
                        wire.name()
                    ),
                ));
            }
            wire_step(plan, i, op)?
        }
        InstrOp::AllGather {
            c:
                Collective {
                    unit: u,
                    src,
                    dst,
                    group,
                    algorithm,
                    staging,
                    ..
                },
            ..
        } => {
            let u = unit(plan, i, *u)?;
            let (src, dst) = (buffer(plan, i, *src)?, buffer(plan, i, *dst)?);
            let parts = match group {
                // A resharded slice is a contiguous piece of the whole
                // gathered flat parameter.
                Group::Reshard => vec![(0, 0, reshard_slice(plan, i, dst, src)?)],
                Group::Shard => gather_parts(plan, i, u, src, dst)?,
                g => return Err(err(i, format!("an all-gather cannot name group {g:?}"))),
            };
            let hier = match algorithm {
                CollectiveAlgorithm::Ring => None,
                CollectiveAlgorithm::Hierarchical if *group == Group::Shard => {
                    let (_, m) = hier_shape(plan, i)?;
                    let shard = plan.buffers[src.index()].bytes
                        / plan.buffers[src.index()].dtype.size().max(1) as u64;
                    let dt = plan.buffers[dst.index()].dtype;
                    let want = hier_gather_staging_bytes(shard, m as u32, dt);
                    Some(staging_of(plan, i, *staging, want, &[src, dst])?)
                }
                a => {
                    return Err(err(
                        i,
                        format!("an all-gather over {group:?} cannot run as {a:?}"),
                    ))
                }
            };
            Step::AllGather {
                src,
                dst,
                parts,
                group: *group,
                hier,
                with: Vec::new(),
            }
        }
        InstrOp::Reshard {
            unit: u,
            src,
            dst,
            group,
        } => {
            unit(plan, i, *u)?;
            let (src, dst) = (buffer(plan, i, *src)?, buffer(plan, i, *dst)?);
            if src == dst {
                return Err(err(
                    i,
                    format!("reshard reads and writes the same buffer {src}"),
                ));
            }
            reshard_slice(plan, i, src, dst)?;
            Step::Reshard {
                src,
                dst,
                group: *group,
            }
        }
        InstrOp::Copy { unit: u, src, dst } => {
            unit(plan, i, *u)?;
            let (src, dst) = (buffer(plan, i, *src)?, buffer(plan, i, *dst)?);
            let (sb, db) = (&plan.buffers[src.index()], &plan.buffers[dst.index()]);
            if src == dst || sb.bytes != db.bytes {
                return Err(err(
                    i,
                    format!(
                        "copy from buffer {src} ({} bytes) into buffer {dst} ({} bytes): needs two buffers of one size",
                        sb.bytes, db.bytes
                    ),
                ));
            }
            Step::Copy { src, dst }
        }
        InstrOp::ReduceScatter {
            c:
                Collective {
                    unit: u,
                    src,
                    dst,
                    algorithm,
                    staging,
                    ..
                },
        } => {
            let (src, dst) = (buffer(plan, i, *src)?, buffer(plan, i, *dst)?);
            let hier = match algorithm {
                CollectiveAlgorithm::Ring => None,
                CollectiveAlgorithm::Hierarchical => {
                    let (_, m) = hier_shape(plan, i)?;
                    let shard = plan.buffers[dst.index()].bytes
                        / plan.buffers[dst.index()].dtype.size().max(1) as u64;
                    let want = hier_reduce_staging_bytes(shard, m as u32);
                    Some(staging_of(plan, i, *staging, want, &[src, dst])?)
                }
                a => return Err(err(i, format!("a reduce-scatter cannot run as {a:?}"))),
            };
            Step::ReduceScatter {
                unit: unit(plan, i, *u)?,
                src,
                dst,
                hier,
            }
        }
        InstrOp::AllReduce {
            unit: u,
            buffer: b,
            group,
            divide_by,
            algorithm,
            staging,
            ..
        } => {
            if *divide_by == 0 {
                return Err(err(i, "all_reduce divides by zero".into()));
            }
            if matches!(group, Group::NodeLocal | Group::CrossNode) {
                return Err(err(i, format!("an all-reduce cannot name group {group:?}")));
            }
            let b = buffer(plan, i, *b)?;
            let staging = match algorithm {
                CollectiveAlgorithm::Ring => None,
                CollectiveAlgorithm::ReduceScatterAllGather => {
                    let n = group_size(plan, *group) as u64;
                    let bytes = plan.buffers[b.index()].bytes;
                    let esize = plan.buffers[b.index()].dtype.size().max(1) as u64;
                    if n == 0 || !(bytes / esize).is_multiple_of(n) {
                        return Err(err(
                            i,
                            format!(
                                "all-reduce of {} elements as reduce-scatter and all-gather over {n} ranks: {n} does not divide it",
                                bytes / esize
                            ),
                        ));
                    }
                    Some(staging_of(plan, i, *staging, bytes / n, &[b])?)
                }
                a => return Err(err(i, format!("an all-reduce cannot run as {a:?}"))),
            };
            Step::AllReduce {
                unit: unit(plan, i, *u)?,
                buffer: b,
                group: *group,
                divide_by: *divide_by,
                staging,
            }
        }
        _ => return Err(err(i, "not an instruction that moves buffers".into())),
    })
}

/// Moves each bucketed gather into the call of the next all-gather of its
/// stream (waits may come between; nothing else may).
pub(super) fn join_buckets(plan: &Plan, steps: &mut [Step<'_>]) -> Result<(), RuntimeError> {
    for s in Stream::ALL {
        let mut pending: Vec<(usize, Bucketed)> = Vec::new();
        for (i, ins) in plan.instructions.iter().enumerate() {
            if ins.stream != s {
                continue;
            }
            let bucketed = matches!(ins.op, InstrOp::AllGather { bucketed: true, .. });
            match &mut steps[i] {
                Step::Wait(_) => {}
                step @ Step::AllGather {
                    hier: None,
                    group: Group::Shard,
                    ..
                } if bucketed => {
                    if let Step::AllGather {
                        src, dst, parts, ..
                    } = std::mem::replace(step, Step::Bucketed)
                    {
                        pending.push((i, (src, dst, parts)));
                    }
                }
                _ if bucketed => {
                    return Err(err(
                        i,
                        "a bucketed all-gather must be a ring gather over the shard group".into(),
                    ))
                }
                Step::AllGather {
                    hier: None,
                    group: Group::Shard,
                    with,
                    ..
                } => with.extend(pending.drain(..).map(|(_, b)| b)),
                _ => {
                    if let Some(&(at, _)) = pending.first() {
                        return Err(err(
                            at,
                            format!(
                                "bucketed all-gather joins no call: instruction {i} of its stream comes before any ring all-gather over the shard group"
                            ),
                        ));
                    }
                }
            }
        }
        if let Some(&(at, _)) = pending.first() {
            return Err(err(
                at,
                "bucketed all-gather joins no call: no all-gather follows on its stream".into(),
            ));
        }
    }
    Ok(())
}

/// The per-segment parts of unit `u`'s all-gather from `src` into `dst`,
/// checked to lie inside both buffers (whose element size is their dtype's).
fn gather_parts(
    plan: &Plan,
    i: usize,
    u: UnitId,
    src: BufferId,
    dst: BufferId,
) -> Result<Vec<(usize, usize, usize)>, RuntimeError> {
    let unit = &plan.units[u.index()];
    let f = unit.factor();
    let elems = |b: BufferId| {
        let b = &plan.buffers[b.index()];
        b.bytes / (b.dtype.size() as u64).max(1)
    };
    let (src_n, dst_n) = (elems(src), elems(dst));
    let mut parts = Vec::new();
    let mut end = 0;
    for s in unit.segments() {
        let n = s.numel / f;
        // In flat order and disjoint: the executor splits the gathered
        // buffer into the parts' places.
        if s.flat_offset < end {
            return Err(err(
                i,
                format!(
                    "unit {u}: segment at flat element {} overlaps or precedes the one before (ending at {end})",
                    s.flat_offset
                ),
            ));
        }
        end = s.flat_offset + s.numel;
        if s.shard_offset + n > src_n || s.flat_offset + s.numel > dst_n {
            return Err(err(
                i,
                format!(
                    "unit {u}: segment at flat element {} ({} elements) does not fit the shard ({src_n}) or the gathered buffer ({dst_n})",
                    s.flat_offset, s.numel
                ),
            ));
        }
        parts.push((s.shard_offset as usize, s.flat_offset as usize, n as usize));
    }
    Ok(parts)
}

/// The shape a hierarchical collective runs on: k ranks of the shard
/// group on each of m nodes (k the ranks per node, k > 1, F = k m, m > 1).
fn hier_shape(plan: &Plan, i: usize) -> Result<(usize, usize), RuntimeError> {
    let (f, k) = (plan.config.shard_factor, plan.cluster.ranks_per_node);
    hierarchical_shape(f, k)
        .map(|(k, m)| (k as usize, m as usize))
        .ok_or_else(|| {
            err(
                i,
                format!(
                    "a hierarchical collective needs a shard group of whole nodes with more than one rank each: F = {f}, {k} ranks per node"
                ),
            )
        })
}

/// Members of a group of kind `g` (`Group::members`): what the ranks make
/// their communicators over.
fn group_size(plan: &Plan, g: Group) -> usize {
    g.members(0, &plan.geometry()).len()
}

/// A rewritten collective's staging buffer: named, a `Staging` buffer of
/// its own (none of `operands`) of at least `want` bytes (the collective
/// uses the first `want`).
fn staging_of(
    plan: &Plan,
    i: usize,
    staging: Option<BufferId>,
    want: u64,
    operands: &[BufferId],
) -> Result<BufferId, RuntimeError> {
    let b = staging
        .ok_or_else(|| err(i, "a rewritten collective has no staging buffer".into()))
        .and_then(|b| buffer(plan, i, b))?;
    let buf = &plan.buffers[b.index()];
    if operands.contains(&b) || buf.kind != BufferKind::Staging || buf.bytes < want {
        return Err(err(
            i,
            format!(
                "staging buffer {b} must be a Staging buffer of its own of at least {want} bytes, it is {:?} of {} bytes",
                buf.kind, buf.bytes
            ),
        ));
    }
    Ok(b)
}

/// A quantized all-gather or reduce-scatter (`wire`): over the shard
/// group, with a `Wire` scratch distinct from its operands (its size is
/// checked against the group when it runs), a float source and
/// destination; an int8 block size of at least 1; fp8 for gathers only.
fn wire_step<'p>(plan: &Plan, i: usize, op: &InstrOp) -> Result<Step<'p>, RuntimeError> {
    let (InstrOp::AllGather {
        c:
            Collective {
                unit: u,
                src,
                dst,
                group,
                wire,
                wire_buffer,
                ..
            },
        ..
    }
    | InstrOp::ReduceScatter {
        c:
            Collective {
                unit: u,
                src,
                dst,
                group,
                wire,
                wire_buffer,
                ..
            },
    }) = op
    else {
        return Err(err(i, "not a collective with a wire format".into()));
    };
    let u = unit(plan, i, *u)?;
    let (src, dst) = (buffer(plan, i, *src)?, buffer(plan, i, *dst)?);
    let scratch = wire_buffer
        .ok_or_else(|| {
            err(
                i,
                format!("a {} collective has no scratch buffer", wire.name()),
            )
        })
        .and_then(|w| buffer(plan, i, w))?;
    if *group != Group::Shard {
        return Err(err(
            i,
            format!(
                "a {} collective runs over the shard group, not {group:?}",
                wire.name()
            ),
        ));
    }
    if scratch == src || scratch == dst || kind(plan, scratch) != Some(BufferKind::Wire) {
        return Err(err(
            i,
            format!("wire scratch {scratch} must be a Wire buffer of its own"),
        ));
    }
    let dtypes = [src, dst].map(|b| plan.buffers[b.index()].dtype);
    if dtypes.iter().any(|d| !d.is_float()) {
        return Err(err(
            i,
            format!("a {} collective moves floats, not {dtypes:?}", wire.name()),
        ));
    }
    match (op, *wire) {
        (_, Wire::Int8Block { block: 0 }) => Err(err(i, "int8 block size 0".into())),
        (InstrOp::AllGather { .. }, wire) => Ok(Step::WireGather {
            src,
            dst,
            scratch,
            parts: gather_parts(plan, i, u, src, dst)?,
            wire,
        }),
        (_, Wire::Int8Block { block }) => Ok(Step::WireReduceScatter {
            unit: u,
            src,
            dst,
            scratch,
            block: block as usize,
        }),
        (_, wire) => Err(err(
            i,
            format!("a reduce-scatter cannot travel as {}", wire.name()),
        )),
    }
}

/// The elements of a resharded slice `slice` of the gathered buffer
/// `whole` (same dtype; `whole` holds `reshard_after_forward` slices).
fn reshard_slice(
    plan: &Plan,
    i: usize,
    whole: BufferId,
    slice: BufferId,
) -> Result<usize, RuntimeError> {
    let (w, s) = (&plan.buffers[whole.index()], &plan.buffers[slice.index()]);
    let n = u64::from(plan.reshard_group().unwrap_or(0));
    if n == 0 || w.dtype != s.dtype || s.bytes.checked_mul(n) != Some(w.bytes) {
        return Err(err(
            i,
            format!(
                "buffer {slice} ({} bytes of {}) is not a 1/n slice of buffer {whole} ({} bytes of {}) for the plan's reshard_after_forward",
                s.bytes, s.dtype, w.bytes, w.dtype
            ),
        ));
    }
    Ok((s.bytes / (s.dtype.size() as u64).max(1)) as usize)
}
