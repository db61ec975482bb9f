//! Launch conventions: which rank this process is, of how many, read from
//! the environment the launcher sets (torchrun, Slurm's `srun`, `mpirun`),
//! and a small TCP rendezvous that hands a blob from rank 0 to every rank
//! before any communicator exists (a GPU backend's NCCL unique id).
//!
//! The rendezvous: rank 0 listens on `MASTER_ADDR:MASTER_PORT`; every other
//! rank connects (retrying until the deadline: rank 0 may start last), sends
//! its rank as a little-endian u32, and reads the blob as a little-endian
//! u64 length and the bytes. Every wait is bounded by the timeout given.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};
use thiserror::Error;

/// The largest blob the rendezvous carries (a NCCL id is 128 bytes).
pub const MAX_BLOB: u64 = 1 << 20;

/// How often a waiting rank retries (connecting, accepting).
const RETRY: Duration = Duration::from_millis(20);

/// Who started the processes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// `torchrun` (or any launcher setting RANK/WORLD_SIZE/LOCAL_RANK).
    Torchrun,
    /// Slurm's `srun` (SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID).
    Slurm,
    /// `mpirun`/`mpiexec` of Open MPI (OMPI_COMM_WORLD_*) or MPICH (PMI_*).
    Mpi,
}

impl Launcher {
    /// The launcher's command name, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "srun",
            Launcher::Mpi => "mpirun",
        }
    }
}

/// This process's place in a launched job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchInfo {
    /// Who started it.
    pub launcher: Launcher,
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// Number of processes.
    pub world: usize,
    /// This process's rank among those on its node.
    pub local_rank: usize,
    /// Where rank 0 listens for the rendezvous (`MASTER_ADDR:MASTER_PORT`),
    /// when the launcher says.
    pub master: Option<String>,
}

/// Errors of launch detection and the rendezvous.
#[derive(Debug, Error, Clone, PartialEq)]
pub enum LaunchError {
    /// A launcher variable is set but is not what it must be.
    #[error("{launcher}: environment variable {var}={value:?}: {reason}")]
    BadVar {
        /// The launcher whose convention it is.
        launcher: &'static str,
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The rendezvous address cannot be used.
    #[error("rendezvous at {addr}: {reason}")]
    Rendezvous {
        /// `host:port`.
        addr: String,
        /// What went wrong.
        reason: String,
    },
    /// The rendezvous did not complete in time.
    #[error("rendezvous at {addr}: rank {rank} gave up after {waited:?}: {what}")]
    Timeout {
        /// `host:port`.
        addr: String,
        /// The rank that gave up.
        rank: usize,
        /// How long it waited.
        waited: Duration,
        /// What it waited for (the ranks that never connected, or rank 0).
        what: String,
    },
}

/// This process's place in a launched job, from the variables `var` reads
/// (`std::env::var(..).ok()` in a real run), or `None` when no launcher's
/// variables are set. Torchrun's are read first, then Slurm's, then MPI's.
pub fn detect(var: &dyn Fn(&str) -> Option<String>) -> Result<Option<LaunchInfo>, LaunchError> {
    let master = match (var("MASTER_ADDR"), var("MASTER_PORT")) {
        (Some(a), Some(p)) => Some(format!("{a}:{p}")),
        _ => None,
    };
    let conventions: [(Launcher, [&'static str; 3]); 4] = [
        (Launcher::Torchrun, ["RANK", "WORLD_SIZE", "LOCAL_RANK"]),
        (
            Launcher::Slurm,
            ["SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"],
        ),
        (
            Launcher::Mpi,
            [
                "OMPI_COMM_WORLD_RANK",
                "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_RANK",
            ],
        ),
        (Launcher::Mpi, ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"]),
    ];
    for (launcher, [rank_var, world_var, local_var]) in conventions {
        let (Some(rank), Some(world)) = (var(rank_var), var(world_var)) else {
            continue;
        };
        let num = |name: &'static str, v: &str| {
            v.trim().parse::<usize>().map_err(|_| LaunchError::BadVar {
                launcher: launcher.name(),
                var: name,
                value: v.to_string(),
                reason: "not a non-negative integer".into(),
            })
        };
        let (rank, world) = (num(rank_var, &rank)?, num(world_var, &world)?);
        let local_rank = var(local_var).map_or(Ok(0), |v| num(local_var, &v))?;
        if world == 0 || rank >= world {
            return Err(LaunchError::BadVar {
                launcher: launcher.name(),
                var: rank_var,
                value: rank.to_string(),
                reason: format!("not a rank of a world of {world}"),
            });
        }
        return Ok(Some(LaunchInfo {
            launcher,
            rank,
            world,
            local_rank,
            master: master.clone(),
        }));
    }
    Ok(None)
}

/// `detect` on this process's environment.
pub fn detect_env() -> Result<Option<LaunchInfo>, LaunchError> {
    detect(&|k| std::env::var(k).ok())
}

/// Refuses a plan compiled for another world than the launcher started,
/// naming both.
pub fn check_world(plan_world: usize, info: &LaunchInfo) -> Result<(), crate::RuntimeError> {
    if plan_world == info.world {
        return Ok(());
    }
    Err(crate::RuntimeError::WorldMismatch {
        plan_world,
        launcher_world: info.world,
        launcher: info.launcher.name().to_string(),
    })
}

/// Hands `blob` from rank 0 to every rank of `world` through `addr`
/// (`host:port`): rank 0 passes `Some(blob)` and gets it back once every
/// other rank has it; the others pass `None` and get rank 0's. Every wait
/// ends by `timeout`.
pub fn rendezvous(
    addr: &str,
    rank: usize,
    world: usize,
    blob: Option<&[u8]>,
    timeout: Duration,
) -> Result<Vec<u8>, LaunchError> {
    let err = |reason: String| LaunchError::Rendezvous {
        addr: addr.to_string(),
        reason,
    };
    let sock = addr
        .to_socket_addrs()
        .map_err(|e| err(format!("cannot resolve: {e}")))?
        .next()
        .ok_or_else(|| err("resolves to no address".into()))?;
    match (rank, blob) {
        (0, Some(b)) if b.len() as u64 <= MAX_BLOB => serve(addr, sock, world, b, timeout),
        (0, Some(b)) => Err(err(format!(
            "a blob of {} bytes is more than the {MAX_BLOB} the rendezvous carries",
            b.len()
        ))),
        (0, None) => Err(err("rank 0 must provide the blob".into())),
        (r, _) if r >= world => Err(err(format!("rank {r} is not a rank of a world of {world}"))),
        (r, _) => fetch(addr, sock, r, timeout),
    }
}

/// Rank 0: accepts every other rank once and sends each the blob.
fn serve(
    addr: &str,
    sock: SocketAddr,
    world: usize,
    blob: &[u8],
    timeout: Duration,
) -> Result<Vec<u8>, LaunchError> {
    let err = |reason: String| LaunchError::Rendezvous {
        addr: addr.to_string(),
        reason,
    };
    let start = Instant::now();
    let listener = TcpListener::bind(sock).map_err(|e| err(format!("cannot listen: {e}")))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| err(e.to_string()))?;
    let mut missing: BTreeSet<usize> = (1..world).collect();
    while !missing.is_empty() {
        match listener.accept() {
            Ok((mut s, _)) => {
                let left = timeout.saturating_sub(start.elapsed()).max(RETRY);
                let r = greet(&mut s, blob, left).map_err(|e| err(e.to_string()))?;
                if !missing.remove(&r) {
                    return Err(err(format!(
                        "a peer said it is rank {r}, which is not a missing rank of a world of {world}"
                    )));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if start.elapsed() >= timeout {
                    return Err(LaunchError::Timeout {
                        addr: addr.to_string(),
                        rank: 0,
                        waited: start.elapsed(),
                        what: format!(
                            "rank(s) {} never connected",
                            missing
                                .iter()
                                .map(|r| r.to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    });
                }
                std::thread::sleep(RETRY);
            }
            Err(e) => return Err(err(format!("accept: {e}"))),
        }
    }
    Ok(blob.to_vec())
}

/// Reads a peer's rank and sends it the blob.
fn greet(s: &mut TcpStream, blob: &[u8], timeout: Duration) -> std::io::Result<usize> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    let mut r = [0u8; 4];
    s.read_exact(&mut r)?;
    s.write_all(&(blob.len() as u64).to_le_bytes())?;
    s.write_all(blob)?;
    s.flush()?;
    Ok(u32::from_le_bytes(r) as usize)
}

/// Any other rank: connects (retrying until the deadline) and reads the
/// blob.
fn fetch(
    addr: &str,
    sock: SocketAddr,
    rank: usize,
    timeout: Duration,
) -> Result<Vec<u8>, LaunchError> {
    let start = Instant::now();
    let timed_out = |what: String| LaunchError::Timeout {
        addr: addr.to_string(),
        rank,
        waited: start.elapsed(),
        what,
    };
    let mut s = loop {
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() {
            return Err(timed_out("rank 0 never accepted a connection".into()));
        }
        match TcpStream::connect_timeout(&sock, left) {
            Ok(s) => break s,
            Err(_) => std::thread::sleep(RETRY.min(left)),
        }
    };
    let left = timeout.saturating_sub(start.elapsed()).max(RETRY);
    let io = |e: std::io::Error| match e.kind() {
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
            timed_out("rank 0 never sent the blob".into())
        }
        _ => LaunchError::Rendezvous {
            addr: addr.to_string(),
            reason: e.to_string(),
        },
    };
    s.set_read_timeout(Some(left)).map_err(io)?;
    s.set_write_timeout(Some(left)).map_err(io)?;
    s.write_all(&(rank as u32).to_le_bytes()).map_err(io)?;
    let mut n = [0u8; 8];
    s.read_exact(&mut n).map_err(io)?;
    let n = u64::from_le_bytes(n);
    if n > MAX_BLOB {
        return Err(LaunchError::Rendezvous {
            addr: addr.to_string(),
            reason: format!("rank 0 announced {n} bytes, more than {MAX_BLOB}"),
        });
    }
    let mut blob = vec![0u8; n as usize];
    s.read_exact(&mut blob).map_err(io)?;
    Ok(blob)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn reads_each_launchers_convention() {
        let t = detect(&env(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]));
        assert_eq!(
            t,
            Ok(Some(LaunchInfo {
                launcher: Launcher::Torchrun,
                rank: 3,
                world: 4,
                local_rank: 1,
                master: Some("10.0.0.1:29500".into()),
            }))
        );
        let s = detect(&env(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "1"),
        ]))
        .ok()
        .flatten()
        .map(|i| (i.launcher, i.rank, i.world, i.local_rank));
        assert_eq!(s, Some((Launcher::Slurm, 5, 8, 1)));
        let m = detect(&env(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
        ]))
        .ok()
        .flatten()
        .map(|i| (i.launcher, i.rank, i.world, i.local_rank));
        assert_eq!(m, Some((Launcher::Mpi, 1, 2, 0)));
        assert_eq!(detect(&env(&[])), Ok(None));
    }

    #[test]
    fn bad_values_are_errors_naming_the_variable() {
        let e = detect(&env(&[("RANK", "x"), ("WORLD_SIZE", "2")]));
        assert!(
            matches!(e, Err(LaunchError::BadVar { var: "RANK", .. })),
            "{e:?}"
        );
        let e = detect(&env(&[("SLURM_PROCID", "4"), ("SLURM_NTASKS", "4")]));
        assert!(
            matches!(
                e,
                Err(LaunchError::BadVar {
                    var: "SLURM_PROCID",
                    ..
                })
            ),
            "{e:?}"
        );
    }

    #[test]
    fn a_plan_for_another_world_is_refused_naming_both() {
        let info = LaunchInfo {
            launcher: Launcher::Slurm,
            rank: 0,
            world: 2,
            local_rank: 0,
            master: None,
        };
        let e = check_world(4, &info).err().map(|e| e.to_string());
        assert_eq!(
            e.as_deref(),
            Some("the plan was compiled for world 4 but srun runs 2 ranks")
        );
        assert!(check_world(2, &info).is_ok());
    }

    /// A free loopback port (bound, then released).
    fn port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(0)
    }

    #[test]
    fn rank_zero_hands_its_blob_to_every_rank() {
        let addr = format!("127.0.0.1:{}", port());
        let world = 4;
        let blob: Vec<u8> = (0..128u8).collect();
        let got: Vec<Result<Vec<u8>, LaunchError>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..world)
                .rev() // the others start first and retry until rank 0 listens
                .map(|r| {
                    let (addr, blob) = (&addr, &blob);
                    s.spawn(move || {
                        let mine = (r == 0).then_some(blob.as_slice());
                        rendezvous(addr, r, world, mine, Duration::from_secs(10))
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Ok(Vec::new())))
                .collect()
        });
        for g in got {
            assert_eq!(g, Ok(blob.clone()));
        }
    }

    #[test]
    fn a_missing_rank_times_out_naming_it() {
        let addr = format!("127.0.0.1:{}", port());
        let t = Instant::now();
        let e = std::thread::scope(|s| {
            let a = &addr;
            let r1 = s.spawn(move || rendezvous(a, 1, 3, None, Duration::from_secs(5)));
            let r0 = rendezvous(&addr, 0, 3, Some(b"id"), Duration::from_millis(500));
            let _ = r1.join();
            r0
        });
        assert!(
            matches!(&e, Err(LaunchError::Timeout { rank: 0, what, .. }) if what == "rank(s) 2 never connected"),
            "{e:?}"
        );
        assert!(t.elapsed() < Duration::from_secs(5));
        // Nobody listens: a rank other than 0 gives up in time too.
        let e = rendezvous(&addr, 1, 2, None, Duration::from_millis(300));
        assert!(
            matches!(e, Err(LaunchError::Timeout { rank: 1, .. })),
            "{e:?}"
        );
    }
}
