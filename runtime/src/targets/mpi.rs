//! The `mpi` target: this process's rank of a world of processes that
//! mpirun or srun started (`fsdpc train --target mpi`, feature `mpi`), its
//! collectives through MPI (`comm::mpi`): the loss gathered from every rank
//! each step, checkpoints committed together, the full parameters gathered
//! to rank 0. `train_rank` runs one rank of any process world.

use super::Target;
use crate::account::{self, RankTag};
use crate::checkpoint::Checkpoint;
use crate::comm::{BufMut, World};
use crate::cpu::{CpuBackend, CpuConfig};
use crate::data::{self};
use crate::error::RuntimeError;
use crate::exec::memory::Arena;
use crate::exec::resolve::resolve;
use crate::exec::ExecMode;
use crate::train::params::assemble_unit;
use crate::train::rank::{RankCtx, RankStep, Saver};
use crate::train::*;
use fsdpc_plan::Plan;
use std::time::{Duration, Instant};

/// This process's rank of an MPI job (`--target mpi`).
pub struct Mpi {
    world: crate::comm::mpi::MpiWorld,
}

impl Mpi {
    /// Joins the MPI job this process belongs to; its collectives wait
    /// `timeout` for the others. Without the `mpi` feature, says so.
    pub fn init(timeout: Duration) -> Result<Mpi, RuntimeError> {
        crate::comm::mpi::MpiWorld::init(timeout)
            .map(|world| Mpi { world })
            .map_err(|e| RuntimeError::Launch(e.to_string()))
    }
}

impl Target for Mpi {
    fn name(&self) -> &'static str {
        "mpi"
    }

    #[cfg(feature = "mpi")]
    fn rank(&self) -> usize {
        self.world.rank()
    }

    #[cfg(feature = "mpi")]
    fn processes(&self) -> Option<u32> {
        Some(World::size(&self.world) as u32)
    }

    #[cfg(feature = "mpi")]
    fn run(
        &self,
        plan: &Plan,
        opts: &TrainOptions,
        on_step: &mut dyn FnMut(&StepReport),
    ) -> Result<TrainReport, RuntimeError> {
        let run = validate(plan)
            .and_then(|()| self.refuse(plan, opts))
            .and_then(|()| {
                train_rank(
                    plan,
                    opts,
                    &self.world,
                    self.world.rank(),
                    "mpirun",
                    on_step,
                )
            });
        match run {
            Ok(r) => Ok(r),
            // The other processes wait in a collective: stop them all.
            Err(e) => self.world.abort(&e.to_string()),
        }
    }

    /// Never called: without the `mpi` feature `Mpi::init` fails.
    #[cfg(not(feature = "mpi"))]
    fn run(
        &self,
        _plan: &Plan,
        _opts: &TrainOptions,
        _on_step: &mut dyn FnMut(&StepReport),
    ) -> Result<TrainReport, RuntimeError> {
        let _ = &self.world;
        Err(RuntimeError::Launch(
            crate::error::CommError::NotCompiled {
                backend: "mpi",
                feature: "mpi",
            }
            .to_string(),
        ))
    }
}

/// Runs `plan` as rank `rank` of a world of processes (one rank per
/// process; `world` is the launcher's, e.g. `comm::mpi::MpiWorld`). Each
/// process fills only its own samples. The loss of a step is gathered from
/// every rank and averaged in rank order, as `train` does, so every rank
/// reports the same global loss; `on_step` runs on every rank (the caller
/// prints on rank 0 only). Checkpoints: each rank of the first shard group
/// writes its own file, rank 0 the manifest (`RankCtx::commit_ranks`);
/// `opts.resume` loads each rank's shard, re-sharded when the plan differs.
/// With `keep_params` the full parameters are gathered to rank 0, unit by
/// unit, and are `final_params` there (empty on the other ranks).
pub fn train_rank(
    plan: &Plan,
    opts: &TrainOptions,
    world: &dyn World,
    rank: usize,
    launcher: &str,
    on_step: &mut dyn FnMut(&StepReport),
) -> Result<TrainReport, RuntimeError> {
    validate(plan)?;
    let n = world.size();
    if plan.cluster.world as usize != n {
        return Err(RuntimeError::WorldMismatch {
            plan_world: plan.cluster.world as usize,
            launcher_world: n,
            launcher: launcher.to_string(),
        });
    }
    let all: Vec<usize> = (0..n).collect();
    let comm = world
        .communicator(&all, "loss", rank)
        .map_err(|e| crate::exec::rank::comm_err(rank, e))?;
    let losses_comm = &*comm;
    let (opts, resume, eval) = open_resume_eval(plan, opts, n, |o| {
        open_resume_ranks(plan, o, losses_comm, rank)
    })?;
    let opts = &opts;
    let data = data::open(&opts.data, &plan.training.graph, opts.seed)?;
    let prep = resolve(plan)?;
    let backend = CpuBackend::new(CpuConfig {
        threads: opts.threads_per_rank.max(1),
    });
    let tag = account::installed().then(|| account::claim(1)).flatten();
    let mut arena = match opts.mode {
        ExecMode::Arena => {
            let _tag = tag.map(RankTag::enter);
            Some(Arena::for_plan(plan))
        }
        ExecMode::DebugAlloc => None,
    };
    let ctx = RankCtx {
        rank,
        tag,
        world,
        prep: &prep,
        backend: &backend,
        data: &*data,
        eval: eval.as_ref().map(|(d, k)| (&**d, *k)),
        opts,
        resume: resume.as_ref(),
        saver: Saver::Process(losses_comm),
        epoch: Instant::now(),
    };
    let mut log = StepLog::new(plan, n, eval.as_ref().map_or(0, |e| e.1));
    let start = Instant::now();
    let mut report = |step: u64, out: RankStep| {
        // Each rank's loss and evaluation loss (every rank evaluates after
        // the same steps).
        let mine = [out.loss, out.eval.map_or(0.0, |e| e.0)];
        let mut all = vec![0u8; 8 * n];
        losses_comm
            .all_gather(
                crate::comm::Buf {
                    dtype: fsdpc_ir::DType::F32,
                    bytes: bytemuck::cast_slice(&mine),
                },
                BufMut {
                    dtype: fsdpc_ir::DType::F32,
                    bytes: &mut all,
                },
            )
            .map_err(|e| crate::exec::rank::comm_err(rank, e))?;
        let all: Vec<f32> = all
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        // The same order and arithmetic as the thread launcher's `collect`.
        let rank_losses = all.iter().step_by(2).copied();
        let eval_losses: Vec<f32> = all.iter().skip(1).step_by(2).copied().collect();
        let eval = out.eval.map(|e| (eval_losses.as_slice(), e.1));
        let after = (out.scalars, out.measured, out.time);
        log.record(step, rank_losses, after, eval, on_step);
        Ok(())
    };
    let mut out = ctx.run(arena.as_mut(), &mut report)?;
    let elapsed = start.elapsed();
    // The arena goes before the full parameters are gathered.
    drop(arena);
    let final_params = if opts.keep_params {
        gather_params(plan, losses_comm, rank, &out.shards)?
    } else {
        Vec::new()
    };
    Ok(TrainReport {
        measured_peak_bytes: out.measured,
        debug_peak_bytes: out.debug_peak,
        timelines: out.timeline.take().into_iter().collect(),
        final_buffers: std::mem::take(&mut out.buffers),
        ..log.into_report(elapsed, n, final_params)
    })
}

/// `open_resume` for one process of several: rank 0 opens the checkpoint
/// and readies the checkpoint directory, then tells the others whether that
/// worked (a broadcast, so no process removes files another still reads);
/// the others then open the checkpoint themselves.
fn open_resume_ranks(
    plan: &Plan,
    opts: &TrainOptions,
    comm: &dyn crate::comm::Communicator,
    rank: usize,
) -> Result<(TrainOptions, Option<Checkpoint>), RuntimeError> {
    let lead = if rank == 0 {
        Some(open_resume(plan, opts, true))
    } else {
        None
    };
    let mut ok = [u8::from(lead.as_ref().is_some_and(|r| r.is_ok())); 4];
    comm.broadcast(
        BufMut {
            dtype: fsdpc_ir::DType::F32,
            bytes: &mut ok,
        },
        0,
    )
    .map_err(|e| crate::exec::rank::comm_err(rank, e))?;
    match lead {
        Some(r) => r,
        None if ok[0] == 1 => open_resume(plan, opts, false),
        None => Err(RuntimeError::RankFailed {
            rank: 0,
            reason: "could not open the checkpoint to resume or ready the checkpoint directory"
                .into(),
        }),
    }
}

/// The full parameters on rank 0 (empty elsewhere), gathered unit by unit
/// over `comm` (every rank of the world): each unit's shards end to end,
/// put together as `assemble_unit` does. Only one unit's
/// gathered shards exist at a time besides the parameters already cut out.
fn gather_params(
    plan: &Plan,
    comm: &dyn crate::comm::Communicator,
    rank: usize,
    shards: &[Vec<f32>],
) -> Result<Vec<(String, Vec<f32>)>, RuntimeError> {
    let n = comm.size();
    let mut params = Vec::new();
    for u in 0..plan.units.len() {
        let shard = shards.get(u).map_or(&[][..], |s| s.as_slice());
        let send: &[u8] = bytemuck::cast_slice(shard);
        let mut all = vec![0u8; send.len() * n];
        comm.all_gather(
            crate::comm::Buf {
                dtype: fsdpc_ir::DType::F32,
                bytes: send,
            },
            BufMut {
                dtype: fsdpc_ir::DType::F32,
                bytes: &mut all,
            },
        )
        .map_err(|e| crate::exec::rank::comm_err(rank, e))?;
        if rank != 0 {
            continue;
        }
        let all: Vec<f32> = all
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let len = shard.len();
        let of_rank = |r: usize| all.get(r * len..(r + 1) * len).unwrap_or(&[]);
        params.extend(assemble_unit(plan, u, of_rank)?);
    }
    Ok(params)
}
