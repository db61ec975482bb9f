//! The `cuda` target: the training loop of one GPU rank (`fsdpc train
//! --target cuda`): one
//! process per GPU, rank and world from torchrun, srun or mpirun (or world
//! 1 alone), NCCL ids from rank 0 over the TCP rendezvous of `launch`. It
//! reports what the CPU launchers report (losses, metrics, final
//! parameters) and the device memory: `cuMemGetInfo` after the context is
//! made (the baseline), after set-up and after the steps, beside the
//! planned arena.

use crate::error::RuntimeError;
use crate::launch::LaunchInfo;
use crate::train::{StepReport, TrainOptions, TrainReport};
use std::time::Duration;

/// How the CUDA rank runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CudaConfig {
    /// The GPU (default: the launcher's local rank).
    pub device: Option<usize>,
    /// When collectives go through NCCL.
    pub nccl: NcclMode,
    /// Time every instruction of the last this many steps with CUDA events
    /// (the overlap figure; 0: none).
    pub timed_steps: u64,
}

/// When collectives go through NCCL (`exec::NcclUse`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum NcclMode {
    /// Only for groups of more than one rank.
    #[default]
    Auto,
    /// For every group, even at world 1.
    Always,
}

/// Device memory of a run (bytes), from `cuMemGetInfo`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Used once the context exists (the context itself and anything else
    /// on the device): the baseline the other figures subtract.
    pub baseline_used: u64,
    /// Used after set-up, less the baseline: the allocation, the kernels'
    /// modules, cuBLAS handles, NCCL communicators.
    pub setup_used: u64,
    /// Used after the last step, less the baseline.
    pub end_used: u64,
    /// The plan's arena (`memory.arena_bytes`).
    pub planned_arena: u64,
    /// The one allocation: the arena plus the kernels' scratch and the
    /// cuBLAS workspaces.
    pub allocated: u64,
    /// The device's memory.
    pub total: u64,
}

/// How much of the last step the unshard stream overlapped compute (from
/// CUDA event timings of every instruction).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Overlap {
    /// The step, first instruction start to last end, ms.
    pub step_ms: f64,
    /// Time the compute stream was busy, ms.
    pub compute_ms: f64,
    /// Time the unshard stream was busy, ms.
    pub unshard_ms: f64,
    /// Time both were busy, ms.
    pub both_ms: f64,
}

/// What a GPU rank reports besides what every target does
/// (`TrainReport::device`).
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceReport {
    /// The device's name.
    pub name: String,
    /// Device memory.
    pub memory: MemoryReport,
    /// With `CudaConfig::timed_steps`: the last step's overlap.
    pub overlap: Option<Overlap>,
    /// Every step's wall time (issue to synchronisation).
    pub step_times: Vec<Duration>,
}

/// This process's GPU rank (`--target cuda`): placed by torchrun, srun or
/// mpirun, or alone (world 1).
#[derive(Debug)]
pub struct Cuda {
    launch: Option<LaunchInfo>,
    cfg: CudaConfig,
}

impl Cuda {
    /// This process's GPU rank as its launcher placed it. Without the
    /// `cuda` feature, says that the backend was not compiled in.
    pub fn new() -> Result<Cuda, RuntimeError> {
        if !cfg!(feature = "cuda") {
            return Err(super::CudaError::NotCompiled.into());
        }
        let launch =
            crate::launch::detect_env().map_err(|e| RuntimeError::Launch(e.to_string()))?;
        Ok(Cuda {
            launch,
            cfg: CudaConfig::default(),
        })
    }
}

impl crate::targets::Target for Cuda {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn rank(&self) -> usize {
        self.launch.as_ref().map_or(0, |l| l.rank)
    }

    fn processes(&self) -> Option<u32> {
        self.launch.as_ref().map(|l| l.world as u32)
    }

    fn run(
        &self,
        plan: &fsdpc_plan::Plan,
        opts: &TrainOptions,
        on_step: &mut dyn FnMut(&StepReport),
    ) -> Result<TrainReport, RuntimeError> {
        crate::train::validate(plan)?;
        self.refuse(plan, opts)?;
        train_cuda(plan, opts, self.launch.as_ref(), &self.cfg, on_step)
    }
}

/// Trains `plan` on this process's GPU as rank `launch.rank` of
/// `launch.world` (world 1 when `launch` is `None`).
#[cfg(not(feature = "cuda"))]
pub fn train_cuda(
    _plan: &fsdpc_plan::Plan,
    _opts: &TrainOptions,
    _launch: Option<&LaunchInfo>,
    _cfg: &CudaConfig,
    _on_step: &mut dyn FnMut(&StepReport),
) -> Result<TrainReport, RuntimeError> {
    Err(super::CudaError::NotCompiled.into())
}

/// Trains `plan` on this process's GPU as rank `launch.rank` of
/// `launch.world` (world 1 when `launch` is `None`).
#[cfg(feature = "cuda")]
pub fn train_cuda(
    plan: &fsdpc_plan::Plan,
    opts: &TrainOptions,
    launch: Option<&LaunchInfo>,
    cfg: &CudaConfig,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<TrainReport, RuntimeError> {
    imp::train_cuda(plan, opts, launch, cfg, on_step)
}

/// Intervals' total length after merging overlaps.
fn union(mut v: Vec<(f64, f64)>) -> Vec<(f64, f64)> {
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out: Vec<(f64, f64)> = Vec::new();
    for (s, e) in v {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

fn length(v: &[(f64, f64)]) -> f64 {
    v.iter().map(|(s, e)| e - s).sum()
}

/// The overlap of two merged interval lists.
fn intersection(a: &[(f64, f64)], b: &[(f64, f64)]) -> f64 {
    let (mut i, mut j, mut t) = (0, 0, 0.0);
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if e > s {
            t += e - s;
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    t
}

/// The overlap figures of busy intervals on the compute and unshard
/// streams (ms, any origin).
pub fn overlap_of(compute: Vec<(f64, f64)>, unshard: Vec<(f64, f64)>) -> Overlap {
    let lo = compute
        .iter()
        .chain(&unshard)
        .map(|x| x.0)
        .fold(f64::INFINITY, f64::min);
    let hi = compute
        .iter()
        .chain(&unshard)
        .map(|x| x.1)
        .fold(f64::NEG_INFINITY, f64::max);
    let (c, u) = (union(compute), union(unshard));
    Overlap {
        step_ms: if hi > lo { hi - lo } else { 0.0 },
        compute_ms: length(&c),
        unshard_ms: length(&u),
        both_ms: intersection(&c, &u),
    }
}

#[cfg(feature = "cuda")]
mod imp {
    use super::*;
    use crate::exec::resolve::resolve;
    use crate::targets::cuda::device::Device;
    use crate::targets::cuda::exec::{comm_streams, CommSetup, GpuRank, Id, NcclUse};
    use crate::targets::cuda::libs::{self, Library};
    use crate::targets::cuda::nccl;
    use crate::targets::cuda::CudaError;
    use crate::train::{assemble_shards, evaluate, open_eval, validate, StepLog, StepScalars};
    use fsdpc_plan::{BufferKind, Plan, Stream};
    use std::time::Instant;

    fn refuse(what: &str, reason: &str) -> RuntimeError {
        CudaError::Unsupported {
            instr: 0,
            what: what.into(),
            reason: reason.into(),
        }
        .into()
    }

    /// Options the CUDA rank does not run, refused before any work: what
    /// its capabilities say, and injected faults (the failure tests run on
    /// CPU ranks).
    fn check_options(plan: &Plan, opts: &TrainOptions) -> Result<(), RuntimeError> {
        let caps = crate::targets::cuda_capabilities();
        crate::targets::check_options(&caps, plan, opts)?;
        if opts.fault.is_some() {
            return Err(refuse(
                "injected faults",
                "the failure tests run on CPU ranks",
            ));
        }
        Ok(())
    }

    /// The ids of every stream's world communicator and the loss
    /// communicator's: made by rank 0, handed to the others.
    fn exchange_ids(
        streams: &[Stream],
        world: usize,
        rank: usize,
        master: Option<&str>,
        timeout: Duration,
    ) -> Result<([Option<Id>; 4], Option<Id>), RuntimeError> {
        let n = streams.len() + usize::from(world > 1);
        if n == 0 {
            return Ok(([None; 4], None));
        }
        libs::ensure(Library::Nccl)?;
        let blob: Vec<u8> = if rank == 0 {
            let mut b = Vec::with_capacity(n * nccl::ID_BYTES);
            for _ in 0..n {
                b.extend_from_slice(&nccl::unique_id()?);
            }
            b
        } else {
            Vec::new()
        };
        let blob = if world > 1 {
            let addr = master.ok_or_else(|| refuse("the NCCL rendezvous", "world > 1 needs MASTER_ADDR and MASTER_PORT (rank 0's address and a free port)"))?;
            crate::launch::rendezvous(
                addr,
                rank,
                world,
                (rank == 0).then_some(blob.as_slice()),
                timeout,
            )
            .map_err(|e| RuntimeError::Comm {
                rank,
                source: crate::error::CommError::Mismatch {
                    op: "rendezvous".into(),
                    reason: e.to_string(),
                },
            })?
        } else {
            blob
        };
        if blob.len() != n * nccl::ID_BYTES {
            return Err(RuntimeError::plan(format!(
                "the rendezvous gave {} bytes of NCCL ids, {} expected",
                blob.len(),
                n * nccl::ID_BYTES
            )));
        }
        let id = |k: usize| -> Id {
            let mut x = [0u8; nccl::ID_BYTES];
            x.copy_from_slice(&blob[k * nccl::ID_BYTES..(k + 1) * nccl::ID_BYTES]);
            x
        };
        let mut ids = [None; 4];
        for (k, s) in streams.iter().enumerate() {
            ids[s.index()] = Some(id(k));
        }
        Ok((ids, (world > 1).then(|| id(streams.len()))))
    }

    /// Fills every unit's fp32 shard on the host and copies it in.
    fn init_shards(
        plan: &Plan,
        rank: &GpuRank,
        pos: (u64, u32),
        seed: u64,
    ) -> Result<(), RuntimeError> {
        for (u, unit) in plan.units.iter().enumerate() {
            let Some(b) = plan
                .buffers
                .iter()
                .find(|b| b.kind == BufferKind::ShardParams && b.unit == Some(unit.id))
            else {
                continue;
            };
            let mut out = vec![0f32; (b.bytes / 4) as usize];
            crate::init::fill_shard(
                &plan.units[u],
                &plan.training.graph.params,
                pos,
                seed,
                &mut out,
            )?;
            rank.upload(b.id, 0, bytemuck::cast_slice(&out))?;
        }
        Ok(())
    }

    /// Sets every module buffer (running statistics) to its initial values.
    fn init_module_buffers(plan: &Plan, rank: &GpuRank, seed: u64) -> Result<(), RuntimeError> {
        for (b, spec) in module_buffers(plan) {
            let values = spec
                .initial_values(seed)
                .map_err(|e| RuntimeError::plan(format!("module buffer `{}`: {e}", spec.name)))?;
            rank.upload(b.id, 0, bytemuck::cast_slice(&values))?;
        }
        Ok(())
    }

    /// Each `ModuleBuffer` buffer of the plan with its module buffer.
    fn module_buffers(
        plan: &Plan,
    ) -> impl Iterator<Item = (&fsdpc_plan::Buffer, &fsdpc_ir::ModuleBufferSpec)> {
        plan.buffers
            .iter()
            .filter(|b| b.kind == BufferKind::ModuleBuffer)
            .filter_map(|b| {
                Some((
                    b,
                    plan.training
                        .graph
                        .buffers
                        .get(b.module_buffer?.0 as usize)?,
                ))
            })
    }

    /// This rank's module buffers by name, read back.
    fn read_module_buffers(
        plan: &Plan,
        rank: &GpuRank,
    ) -> Result<Vec<(String, Vec<f32>)>, RuntimeError> {
        module_buffers(plan)
            .map(|(b, spec)| {
                let v = rank
                    .download(b.id, 0, b.bytes as usize)?
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect();
                Ok((spec.name.clone(), v))
            })
            .collect()
    }

    /// Every unit's fp32 shard, read back.
    fn shards(plan: &Plan, rank: &GpuRank) -> Result<Vec<Vec<f32>>, RuntimeError> {
        let mut out = Vec::new();
        for unit in &plan.units {
            let v = match plan
                .buffers
                .iter()
                .find(|b| b.kind == BufferKind::ShardParams && b.unit == Some(unit.id))
            {
                Some(b) => rank
                    .download(b.id, 0, b.bytes as usize)?
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                None => Vec::new(),
            };
            out.push(v);
        }
        Ok(out)
    }

    pub fn train_cuda(
        plan: &Plan,
        opts: &TrainOptions,
        launch: Option<&LaunchInfo>,
        cfg: &CudaConfig,
        on_step: &mut dyn FnMut(&StepReport),
    ) -> Result<TrainReport, RuntimeError> {
        validate(plan)?;
        let (rank, world, local, master) = launch.map_or((0, 1, 0, None), |l| {
            (l.rank, l.world, l.local_rank, l.master.as_deref())
        });
        if plan.cluster.world as usize != world {
            return Err(RuntimeError::WorldMismatch {
                plan_world: plan.cluster.world as usize,
                launcher_world: world,
                launcher: launch.map_or("this process (world 1)".into(), |l| {
                    l.launcher.name().to_string()
                }),
            });
        }
        check_options(plan, opts)?;
        crate::targets::cuda_capabilities().check(plan)?;
        let prep = resolve(plan)?;
        let dev = Device::open(cfg.device.unwrap_or(local))?;
        let device = dev.name.clone();
        let baseline = dev.used_bytes()?;
        let total = dev.mem_info()?.1 as u64;
        let data = crate::data::open(&opts.data, &plan.training.graph, opts.seed)?;
        let eval = open_eval(plan, opts, world)?;
        let nccl = match cfg.nccl {
            NcclMode::Auto => NcclUse::Auto,
            NcclMode::Always => NcclUse::Always,
        };
        let streams = comm_streams(&prep, world, rank, nccl)?;
        let (ids, loss) = exchange_ids(&streams, world, rank, master, opts.comm_timeout)?;
        let setup = CommSetup {
            nccl,
            ids: &ids,
            loss,
        };
        // Steps timed by CUDA events: the overlap figure's and the trace's.
        let timed = cfg.timed_steps.max(opts.trace_steps);
        let mut gpu = GpuRank::new(dev, &prep, rank, world, opts.seed, &setup, timed > 0)?;
        let g = plan.geometry();
        let pos = (
            g.shard_position(rank) as u64,
            g.tensor_position(rank) as u32,
        );
        init_shards(plan, &gpu, pos, opts.seed)?;
        init_module_buffers(plan, &gpu, opts.seed)?;
        let setup_used = gpu.dev.used_bytes()?.saturating_sub(baseline);
        let mut log = StepLog::new(plan, world, eval.as_ref().map_or(0, |e| e.1));
        let mut step_times = Vec::new();
        let mut overlap = None;
        let mut traced: Vec<(Stream, crate::exec::timeline::Span)> = Vec::new();
        let start = Instant::now();
        for step in 0..opts.steps {
            gpu.set_timed(step + timed >= opts.steps);
            let began = Instant::now();
            let spans = gpu.step(step, &*data)?;
            let time = began.elapsed();
            step_times.push(time);
            let loss = gpu.read_loss()?;
            let losses = gpu.gather_losses(loss)?;
            let scalars = StepScalars {
                grad_norm: gpu.read_grad_norm()?,
                loss_scale: None,
            };
            // After the step's loss is read: an evaluation rewrites it.
            let evaluated = match (&eval, &opts.eval) {
                (Some((held_out, batches)), Some(e)) => {
                    let mine = evaluate(e, step, opts.steps, *batches, &mut |j| {
                        gpu.eval(j, &**held_out)
                    })?;
                    match mine {
                        Some((loss, time)) => Some((gpu.gather_losses(loss)?, time)),
                        None => None,
                    }
                }
                _ => None,
            };
            let evaluated = evaluated.as_ref().map(|(l, t)| (l.as_slice(), *t));
            log.record(
                step,
                losses.into_iter(),
                (scalars, None, time),
                evaluated,
                on_step,
            );
            if let Some(s) = spans {
                if step + opts.trace_steps >= opts.steps {
                    traced.extend(trace_spans(&s, step, (began - start).as_nanos()));
                }
                let pick = |want: Stream| {
                    s.iter()
                        .filter(|x| x.0 == want)
                        .map(|x| (f64::from(x.2), f64::from(x.3)))
                        .collect()
                };
                overlap = Some(overlap_of(pick(Stream::Compute), pick(Stream::Unshard)));
            }
        }
        let elapsed = start.elapsed();
        let end_used = gpu.dev.used_bytes()?.saturating_sub(baseline);
        // One rank holds the whole parameters only without a tensor split.
        let final_params = if opts.keep_params && plan.config.tensor_parallel <= 1 {
            assemble_shards(plan, vec![shards(plan, &gpu)?])?
        } else {
            Vec::new()
        };
        let final_buffers = if opts.keep_params && rank == 0 {
            read_module_buffers(plan, &gpu)?
        } else {
            Vec::new()
        };
        let memory = MemoryReport {
            baseline_used: baseline,
            setup_used,
            end_used,
            planned_arena: plan.memory.arena_bytes,
            allocated: gpu.allocated_bytes(),
            total,
        };
        // What the plan says this rank holds beyond the context: the
        // arena and the lines outside it but the context's (measured from
        // the memory in use once the context exists).
        let context = plan.memory.outside_bytes(fsdpc_plan::OutsideKind::Context);
        let planned =
            plan.memory.rank_bytes + plan.memory.outside_arena_bytes().saturating_sub(context);
        Ok(TrainReport {
            measured_peak_bytes: Some(end_used.max(setup_used)),
            planned_peak_bytes: planned,
            timelines: timeline(rank, traced),
            device: Some(Box::new(DeviceReport {
                name: device,
                memory,
                overlap,
                step_times,
            })),
            final_buffers,
            ..log.into_report(elapsed, world, final_params)
        })
    }
}

/// The spans of step `step` (instruction, ms after the step's start
/// event), as the trace's spans: nanoseconds after the run's start, the
/// step having begun `began_ns` after it.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn trace_spans(
    spans: &[(fsdpc_plan::Stream, usize, f32, f32)],
    step: u64,
    began_ns: u128,
) -> impl Iterator<Item = (fsdpc_plan::Stream, crate::exec::timeline::Span)> + '_ {
    let ns = move |ms: f32| (began_ns as f64 + f64::from(ms) * 1e6).max(0.0) as u64;
    spans.iter().map(move |&(stream, instr, t0, t1)| {
        (
            stream,
            crate::exec::timeline::Span {
                instr: instr as u32,
                step,
                start_ns: ns(t0),
                end_ns: ns(t1),
                live_bytes: None,
            },
        )
    })
}

/// One rank's timeline of `spans` by stream, in the streams' fixed order
/// and each stream's spans by start (none: no timeline).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
fn timeline(
    rank: usize,
    spans: Vec<(fsdpc_plan::Stream, crate::exec::timeline::Span)>,
) -> Vec<crate::exec::timeline::RankTimeline> {
    use crate::exec::timeline::{RankTimeline, StreamTimeline};
    if spans.is_empty() {
        return Vec::new();
    }
    let streams = fsdpc_plan::Stream::ALL
        .iter()
        .filter_map(|&stream| {
            let mut v: Vec<_> = spans
                .iter()
                .filter(|(s, _)| *s == stream)
                .map(|(_, x)| *x)
                .collect();
            v.sort_by_key(|x| (x.start_ns, x.instr));
            (!v.is_empty()).then_some(StreamTimeline { stream, spans: v })
        })
        .collect();
    vec![RankTimeline { rank, streams }]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_spans_become_a_timeline_by_stream() {
        use fsdpc_plan::Stream;
        let step = [
            (Stream::Compute, 3, 0.5f32, 1.5f32),
            (Stream::Unshard, 1, 0.0, 2.0),
            (Stream::Compute, 2, 0.0, 0.5),
        ];
        let spans: Vec<_> = trace_spans(&step, 7, 1_000_000).collect();
        let t = timeline(2, spans);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].rank, 2);
        let compute = &t[0].streams[0];
        assert_eq!(compute.stream, Stream::Compute);
        let got: Vec<_> = compute
            .spans
            .iter()
            .map(|s| (s.instr, s.step, s.start_ns, s.end_ns))
            .collect();
        assert_eq!(
            got,
            [(2, 7, 1_000_000, 1_500_000), (3, 7, 1_500_000, 2_500_000)]
        );
        assert_eq!(t[0].streams[1].stream, Stream::Unshard);
        assert_eq!(t[0].streams[1].spans[0].end_ns, 3_000_000);
        assert!(timeline(0, Vec::new()).is_empty());
    }

    #[test]
    fn overlap_merges_each_streams_intervals_and_intersects_them() {
        let o = overlap_of(vec![(0.0, 4.0), (3.0, 6.0), (8.0, 10.0)], vec![(5.0, 9.0)]);
        assert_eq!(o.step_ms, 10.0);
        assert_eq!(o.compute_ms, 8.0);
        assert_eq!(o.unshard_ms, 4.0);
        assert_eq!(o.both_ms, 2.0);
    }
}
