//! Collectives for ranks that are processes, through MPI (cargo feature
//! `mpi`, the rsmpi crate). Without the feature `MpiWorld::init` says that
//! the backend was not compiled in.
//!
//! Every collective is point-to-point: each member posts non-blocking sends
//! of what the others need and non-blocking receives of what it needs, then
//! polls them against a deadline. Reductions sum the received contributions
//! in position order with the shared-memory communicator's arithmetic
//! (`shm::reduce_into`), so MPI ranks are bit-identical to thread ranks.
//! A member that does not answer within the timeout is named, and the whole
//! job is stopped with `MPI_Abort`: an outstanding MPI request cannot be
//! abandoned, and a stopped job is what the other ranks need.
//!
//! One sub-communicator (`MPI_Comm_split`) per group and tag: collectives of
//! different streams never share one, so their messages cannot cross.

#[cfg(feature = "mpi")]
pub use imp::MpiWorld;

/// Stand-in when the `mpi` feature is off: the backend exists and says so.
#[cfg(not(feature = "mpi"))]
#[derive(Debug)]
pub struct MpiWorld;

#[cfg(not(feature = "mpi"))]
impl MpiWorld {
    /// Always `CommError::NotCompiled`: this build has no MPI.
    pub fn init(_timeout: std::time::Duration) -> Result<MpiWorld, crate::error::CommError> {
        Err(crate::error::CommError::NotCompiled {
            backend: "mpi",
            feature: "mpi",
        })
    }
}

#[cfg(feature = "mpi")]
mod imp {
    use super::super::shm::{convert, reduce_into};
    use super::super::{Buf, BufMut, Communicator, World};
    use crate::error::CommError;
    use fsdpc_ir::DType;
    use mpi::environment::Universe;
    use mpi::point_to_point::{Destination, Source};
    use mpi::request::{scope, Request};
    use mpi::topology::{Color, Communicator as _, SimpleCommunicator};
    use mpi::Threading;
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    /// This process's rank in an MPI job.
    pub struct MpiWorld {
        // Finalizes MPI when dropped; the communicators go first.
        _universe: Universe,
        world: Comm,
        rank: usize,
        size: usize,
        timeout: Duration,
        failure: Arc<Mutex<Option<(usize, String)>>>,
    }

    impl std::fmt::Debug for MpiWorld {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "MpiWorld(rank {} of {})", self.rank, self.size)
        }
    }

    /// An MPI communicator that may be used from any thread.
    struct Comm(SimpleCommunicator);

    // SAFETY: `MpiWorld::init` insists on MPI_THREAD_MULTIPLE, under which
    // MPI may be called from any thread; each communicator is used by one
    // stream at a time (the plan's collectives on one stream are ordered).
    unsafe impl Send for Comm {}
    unsafe impl Sync for Comm {}

    impl MpiWorld {
        /// Initializes MPI (once per process) with full thread support; a
        /// collective that waits longer than `timeout` stops the job.
        pub fn init(timeout: Duration) -> Result<MpiWorld, CommError> {
            let (universe, provided) = mpi::initialize_with_threading(Threading::Multiple)
                .ok_or_else(|| CommError::Mpi {
                    reason: "MPI was already initialized in this process".into(),
                })?;
            if provided != Threading::Multiple {
                return Err(CommError::Mpi {
                    reason: format!(
                        "the MPI library provides thread level {provided:?}, fsdpc's streams need Multiple"
                    ),
                });
            }
            let world = universe.world();
            let (rank, size) = (world.rank() as usize, world.size() as usize);
            Ok(MpiWorld {
                _universe: universe,
                world: Comm(world),
                rank,
                size,
                timeout,
                failure: Arc::new(Mutex::new(None)),
            })
        }

        /// This process's rank.
        pub fn rank(&self) -> usize {
            self.rank
        }

        /// Stops every process of the job after printing `message`.
        pub fn abort(&self, message: &str) -> ! {
            abort_job(message)
        }
    }

    /// Prints `message` and stops every process of the job.
    fn abort_job(message: &str) -> ! {
        eprintln!("error: {message}; stopping every rank (MPI_Abort)");
        SimpleCommunicator::world().abort(1)
    }

    impl World for MpiWorld {
        fn size(&self) -> usize {
            self.size
        }

        fn timeout(&self) -> Duration {
            self.timeout
        }

        fn communicator(
            &self,
            ranks: &[usize],
            tag: &str,
            rank: usize,
        ) -> Result<Box<dyn Communicator>, CommError> {
            let pos = ranks.iter().position(|&r| r == rank);
            let (Some(pos), true) = (pos, rank == self.rank) else {
                return Err(CommError::Mismatch {
                    op: "communicator".into(),
                    reason: format!(
                        "rank {rank} asked for group {ranks:?} in the process of rank {}",
                        self.rank
                    ),
                });
            };
            // Groups of one kind partition the world: the first member names
            // the group. MPI_Comm_split is collective over the world; every
            // rank makes its communicators in the same order.
            let color = Color::with_value(ranks[0] as i32);
            let comm = self
                .world
                .0
                .split_by_color_with_key(color, pos as i32)
                .ok_or_else(|| CommError::Mpi {
                    reason: format!("MPI_Comm_split gave no communicator for group {ranks:?}"),
                })?;
            Ok(Box::new(MpiComm {
                comm: Comm(comm),
                ranks: ranks.to_vec(),
                pos,
                tag: tag.to_string(),
                timeout: self.timeout,
                failure: self.failure.clone(),
            }))
        }

        fn poison(&self, rank: usize, reason: &str) {
            let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
            if f.is_none() {
                *f = Some((rank, reason.to_string()));
            }
        }

        fn failure(&self) -> Option<(usize, String)> {
            self.failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        }
    }

    /// One member's communicator on one group.
    struct MpiComm {
        comm: Comm,
        /// World ranks of the members, in position order.
        ranks: Vec<usize>,
        pos: usize,
        tag: String,
        timeout: Duration,
        failure: Arc<Mutex<Option<(usize, String)>>>,
    }

    /// Started requests: the member each one talks to, and whether it is a
    /// receive.
    type Pending<'a, 's> = Vec<(
        usize,
        bool,
        Request<'a, [u8], &'s mpi::request::LocalScope<'a>>,
    )>;

    impl MpiComm {
        /// Sends `sends[q]` to every member `q` that has one and receives
        /// `recvs[q]` from every member that has one; returns when all are
        /// done. Past the timeout, or when another stream of this process
        /// failed, stops the job naming the members that did not answer.
        /// Exchanges `sends` (one per member, `None` for this one) and
        /// returns what every other member sent, `bytes` each (this
        /// member's entry is empty).
        fn exchange_parts(&self, op: &str, sends: &[Option<&[u8]>], bytes: usize) -> Vec<Vec<u8>> {
            let mut parts: Vec<Vec<u8>> = (0..sends.len())
                .map(|q| {
                    if q == self.pos {
                        Vec::new()
                    } else {
                        vec![0u8; bytes]
                    }
                })
                .collect();
            let mut recvs: Vec<Option<&mut [u8]>> = parts
                .iter_mut()
                .enumerate()
                .map(|(q, p)| (q != self.pos).then_some(p.as_mut_slice()))
                .collect();
            self.exchange(op, sends, &mut recvs);
            parts
        }

        /// Sums every member's contribution (`own` for this one, `parts`
        /// for the others) in position order into `out`, with the
        /// shared-memory communicator's arithmetic, so the bits match.
        fn reduce_in_order(
            &self,
            own: &[u8],
            parts: &[Vec<u8>],
            dtype: DType,
            out: BufMut<'_>,
            divide_by: u32,
        ) {
            let part = |q: usize| -> (&[u8], DType) {
                if q == self.pos {
                    (own, dtype)
                } else {
                    (&parts[q], dtype)
                }
            };
            reduce_into(
                Some(part(0)),
                parts.len() - 1,
                |k| part(k + 1),
                out.bytes,
                out.dtype,
                divide_by,
            );
        }

        fn exchange(&self, op: &str, sends: &[Option<&[u8]>], recvs: &mut [Option<&mut [u8]>]) {
            let start = Instant::now();
            scope(|sc| {
                let mut pending: Pending = Vec::new();
                for (q, r) in recvs.iter_mut().enumerate() {
                    if let Some(r) = r.as_deref_mut() {
                        let p = self.comm.0.process_at_rank(q as i32);
                        pending.push((q, true, p.immediate_receive_into(sc, r)));
                    }
                }
                for (q, s) in sends.iter().enumerate() {
                    if let Some(s) = s {
                        let p = self.comm.0.process_at_rank(q as i32);
                        pending.push((q, false, p.immediate_send(sc, *s)));
                    }
                }
                let mut spins = 0u32;
                while !pending.is_empty() {
                    pending = pending
                        .into_iter()
                        .filter_map(|(q, rx, req)| req.test().err().map(|req| (q, rx, req)))
                        .collect();
                    if pending.is_empty() {
                        break;
                    }
                    self.check(op, start, &pending);
                    spins = spins.saturating_add(1);
                    if spins < 1000 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(200));
                    }
                }
            });
        }

        /// Stops the job when this exchange has waited too long or another
        /// stream of this process failed.
        fn check(&self, op: &str, start: Instant, pending: &Pending) {
            let failed = self
                .failure
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone();
            if let Some((rank, reason)) = failed {
                abort_job(&format!("rank {rank} failed: {reason}"));
            }
            let waited = start.elapsed();
            if waited < self.timeout {
                return;
            }
            // Members whose data never came (else those not taking ours).
            let mut silent: Vec<usize> = pending
                .iter()
                .filter(|p| p.1)
                .map(|p| self.ranks[p.0])
                .collect();
            if silent.is_empty() {
                silent = pending.iter().map(|p| self.ranks[p.0]).collect();
            }
            silent.dedup();
            abort_job(&format!(
                "rank {}: collective `{op}` ({}) timed out after {waited:.1?}: no answer from rank{} {}",
                self.ranks[self.pos],
                self.tag,
                if silent.len() == 1 { "" } else { "s" },
                silent
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }

        fn size_n(&self) -> usize {
            self.ranks.len()
        }
    }

    fn mismatch(op: &str, reason: String) -> CommError {
        CommError::Mismatch {
            op: op.into(),
            reason,
        }
    }

    impl Communicator for MpiComm {
        fn size(&self) -> usize {
            self.size_n()
        }

        fn position(&self) -> usize {
            self.pos
        }

        fn all_gather(&self, send: Buf<'_>, recv: BufMut<'_>) -> Result<(), CommError> {
            let n = self.size_n();
            let s = send.len();
            if recv.len() != n * s {
                return Err(mismatch(
                    "all_gather",
                    format!(
                        "{n} x {s} elements do not fill a receive buffer of {}",
                        recv.len()
                    ),
                ));
            }
            // The shard is cast to the receive dtype before it is sent (a
            // bf16 gather of an f32 shard moves half the bytes), the same on
            // every member (the plan is SPMD).
            let cast: Option<Vec<u8>> = (send.dtype != recv.dtype).then(|| {
                let mut v = vec![0u8; s * recv.dtype.size()];
                convert(send.bytes, send.dtype, &mut v, recv.dtype);
                v
            });
            let wire = cast.as_deref().unwrap_or(send.bytes);
            let sends: Vec<Option<&[u8]>> =
                (0..n).map(|q| (q != self.pos).then_some(wire)).collect();
            let parts = self.exchange_parts("all_gather", &sends, wire.len());
            let out = s * recv.dtype.size();
            for (q, dst) in recv.bytes.chunks_exact_mut(out.max(1)).enumerate().take(n) {
                let src = if q == self.pos { wire } else { &parts[q] };
                dst.copy_from_slice(src);
            }
            Ok(())
        }

        fn reduce_scatter(
            &self,
            send: Buf<'_>,
            recv: BufMut<'_>,
            divide_by: u32,
        ) -> Result<(), CommError> {
            let n = self.size_n();
            let t = send.len();
            if !t.is_multiple_of(n) || recv.len() != t / n {
                return Err(mismatch(
                    "reduce_scatter",
                    format!("{t} elements over {n} members do not give {}", recv.len()),
                ));
            }
            let cb = t / n * send.dtype.size();
            let chunk = |q: usize| &send.bytes[q * cb..(q + 1) * cb];
            let sends: Vec<Option<&[u8]>> =
                (0..n).map(|q| (q != self.pos).then(|| chunk(q))).collect();
            let parts = self.exchange_parts("reduce_scatter", &sends, cb);
            self.reduce_in_order(chunk(self.pos), &parts, send.dtype, recv, divide_by);
            Ok(())
        }

        fn all_reduce(&self, buf: BufMut<'_>, divide_by: u32) -> Result<(), CommError> {
            let n = self.size_n();
            let own = buf.bytes.to_vec();
            let sends: Vec<Option<&[u8]>> = (0..n)
                .map(|q| (q != self.pos).then_some(own.as_slice()))
                .collect();
            let parts = self.exchange_parts("all_reduce", &sends, own.len());
            let dtype = buf.dtype;
            self.reduce_in_order(&own, &parts, dtype, buf, divide_by);
            Ok(())
        }

        fn all_to_all(&self, send: Buf<'_>, recv: BufMut<'_>) -> Result<(), CommError> {
            let n = self.size_n();
            let t = send.len();
            if !t.is_multiple_of(n) || recv.len() != t || recv.dtype != send.dtype {
                return Err(mismatch(
                    "all_to_all",
                    format!(
                        "{t} elements over {n} members do not match a receive buffer of {}",
                        recv.len()
                    ),
                ));
            }
            let cb = t / n * send.dtype.size();
            let chunk = |q: usize| &send.bytes[q * cb..(q + 1) * cb];
            let sends: Vec<Option<&[u8]>> =
                (0..n).map(|q| (q != self.pos).then(|| chunk(q))).collect();
            let parts = self.exchange_parts("all_to_all", &sends, cb);
            for (q, dst) in recv.bytes.chunks_exact_mut(cb.max(1)).enumerate().take(n) {
                if q == self.pos {
                    dst.copy_from_slice(chunk(q));
                } else {
                    dst.copy_from_slice(&parts[q]);
                }
            }
            Ok(())
        }

        fn broadcast(&self, buf: BufMut<'_>, root: usize) -> Result<(), CommError> {
            let n = self.size_n();
            if root >= n {
                return Err(mismatch(
                    "broadcast",
                    format!("root {root} is not a member"),
                ));
            }
            if self.pos == root {
                let sends: Vec<Option<&[u8]>> =
                    (0..n).map(|q| (q != root).then_some(&*buf.bytes)).collect();
                let mut recvs: Vec<Option<&mut [u8]>> = (0..n).map(|_| None).collect();
                self.exchange("broadcast", &sends, &mut recvs);
            } else {
                let sends: Vec<Option<&[u8]>> = vec![None; n];
                let mut recvs: Vec<Option<&mut [u8]>> = (0..n).map(|_| None).collect();
                recvs[root] = Some(buf.bytes);
                self.exchange("broadcast", &sends, &mut recvs);
            }
            Ok(())
        }

        fn barrier(&self) -> Result<(), CommError> {
            let n = self.size_n();
            let sends: Vec<Option<&[u8]>> =
                (0..n).map(|q| (q != self.pos).then_some(&[][..])).collect();
            let mut empty: Vec<[u8; 0]> = vec![[]; n];
            let mut recvs: Vec<Option<&mut [u8]>> = empty
                .iter_mut()
                .enumerate()
                .map(|(q, e)| (q != self.pos).then_some(&mut e[..]))
                .collect();
            self.exchange("barrier", &sends, &mut recvs);
            Ok(())
        }
    }
}
