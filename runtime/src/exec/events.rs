//! A rank's events: `Record` marks one, `Wait` blocks until it is marked.
//! Events are per step (reset between steps). A wait gives up when the world
//! is poisoned (another rank or stream failed) or after the timeout.

use crate::comm::World;
use crate::error::RuntimeError;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

const POLL: Duration = Duration::from_millis(20);

/// The events of one rank.
#[derive(Debug)]
pub struct Events {
    recorded: Mutex<Vec<bool>>,
    cv: Condvar,
}

impl Events {
    /// `n` unrecorded events.
    pub fn new(n: usize) -> Events {
        Events {
            recorded: Mutex::new(vec![false; n]),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<bool>> {
        self.recorded.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Clears every event (between steps, when no stream runs).
    pub fn reset(&self) {
        self.lock().fill(false);
    }

    /// Marks event `e`.
    pub fn record(&self, e: usize) {
        self.lock()[e] = true;
        self.cv.notify_all();
    }

    /// Whether `e` has been recorded.
    pub fn is_recorded(&self, e: usize) -> bool {
        self.lock()[e]
    }

    /// Blocks until `e` is recorded.
    pub fn wait(&self, e: usize, rank: usize, world: &dyn World) -> Result<(), RuntimeError> {
        let start = Instant::now();
        // Twice the collective timeout: an event waits on this rank's own
        // streams, and a stream stuck in a collective gives up first, naming
        // the rank that did not answer. This wait is the safety net.
        let timeout = world.timeout().saturating_mul(2);
        let mut g = self.lock();
        while !g[e] {
            if let Some((r, reason)) = world.failure() {
                return Err(RuntimeError::RankFailed { rank: r, reason });
            }
            let waited = start.elapsed();
            if waited >= timeout {
                return Err(RuntimeError::Timeout {
                    rank,
                    what: format!("waiting for event {e}"),
                    waited,
                });
            }
            g = self
                .cv
                .wait_timeout(g, POLL.min(timeout - waited))
                .map(|r| r.0)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        Ok(())
    }
}
