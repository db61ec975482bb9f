//! Injected faults, for the tests of failure handling: one rank dies or
//! stops answering after a given step. `fsdpc train` reads one from the
//! `FSDPC_TEST_FAULT` variable (`RANK:kill|sleep|hang:STEP`); the library takes it
//! as `TrainOptions::fault`. The check runs once per step, between steps,
//! never inside one.

use crate::comm::World;
use crate::error::RuntimeError;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The environment variable `fsdpc train` reads a fault from.
pub const FAULT_VAR: &str = "FSDPC_TEST_FAULT";

/// What the faulty rank does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FaultAction {
    /// The process sends itself SIGKILL (process ranks: a thread rank would
    /// take its whole process with it).
    Kill,
    /// The rank stops answering: it sleeps, never reaching its next
    /// collective. A thread rank wakes once the others have given up (a
    /// thread cannot be killed); a process rank
    /// sleeps until the job is stopped.
    Sleep,
    /// The rank never returns, not even once the others have given up (as
    /// one stuck in a kernel would): the thread launcher stops waiting for
    /// it (`train`), a process rank is stopped with the job.
    Hang,
}

/// Rank `rank` does `action` after step `step` (0-based) completes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fault {
    /// The faulty rank.
    pub rank: usize,
    /// What it does.
    pub action: FaultAction,
    /// After which step.
    pub step: u64,
}

/// A fault description that is not `RANK:kill|sleep|hang:STEP`.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
#[error("{FAULT_VAR}={text:?} is not RANK:kill|sleep|hang:STEP")]
pub struct BadFault {
    /// The text given.
    pub text: String,
}

impl FromStr for Fault {
    type Err = BadFault;

    fn from_str(text: &str) -> Result<Fault, BadFault> {
        let bad = || BadFault { text: text.into() };
        let parts: Vec<&str> = text.trim().split(':').collect();
        let [rank, action, step] = parts[..] else {
            return Err(bad());
        };
        let action = match action {
            "kill" => FaultAction::Kill,
            "sleep" => FaultAction::Sleep,
            "hang" => FaultAction::Hang,
            _ => return Err(bad()),
        };
        Ok(Fault {
            rank: rank.parse().map_err(|_| bad())?,
            action,
            step: step.parse().map_err(|_| bad())?,
        })
    }
}

impl Fault {
    /// Injects the fault on `rank` of `world` when it is this rank's and
    /// `step` is its step. Prints `fault injected at <unix ms>` on stderr
    /// first, so a test can time what follows. A sleeping thread rank
    /// returns `RankFailed` naming itself once another rank has given up.
    pub fn inject(&self, world: &dyn World, rank: usize, step: u64) -> Result<(), RuntimeError> {
        if rank != self.rank || step != self.step {
            return Ok(());
        }
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        eprintln!(
            "fault injected at {ms}: rank {rank} {:?} after step {step}",
            self.action
        );
        match self.action {
            FaultAction::Kill => {
                let pid = std::process::id().to_string();
                // SIGKILL, as `kill -9` from outside would; abort if `kill`
                // cannot be run.
                let _ = std::process::Command::new("kill")
                    .args(["-9", &pid])
                    .status();
                std::process::abort()
            }
            FaultAction::Sleep => loop {
                std::thread::sleep(Duration::from_millis(50));
                if world.failure().is_some() {
                    return Err(RuntimeError::RankFailed {
                        rank,
                        reason: format!("stopped answering after step {step} (injected fault)"),
                    });
                }
            },
            FaultAction::Hang => loop {
                std::thread::sleep(Duration::from_secs(3600));
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_refuses() {
        assert_eq!(
            "1:kill:2".parse(),
            Ok(Fault {
                rank: 1,
                action: FaultAction::Kill,
                step: 2
            })
        );
        assert_eq!(
            "0:sleep:0".parse::<Fault>().map(|f| f.action),
            Ok(FaultAction::Sleep)
        );
        assert_eq!(
            "1:hang:3".parse::<Fault>().map(|f| f.action),
            Ok(FaultAction::Hang)
        );
        for bad in ["", "1:kill", "1:stop:2", "x:kill:2", "1:kill:2:3"] {
            assert!(bad.parse::<Fault>().is_err(), "{bad}");
        }
    }
}
