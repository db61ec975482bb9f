//! Gather windows of units whose parameters other units read
//! (`--shared-params owner`, see `units`): the tied embedding owned by
//! `transformer.wte` is read by the token lookup at the start of forward and
//! by the head at its end.
//!
//! Conventions:
//! - `gather::windows` makes one window of the run of a phase's steps
//!   that read a unit, from its first reader to its last. For such a unit
//!   that run spans every block in between, holding its gathered parameters
//!   through all of them. Under `owner` a window is therefore split where,
//!   between two consecutive readers, a step reads the parameters of a unit
//!   that is neither the root nor an ancestor or descendant of it (the
//!   blocks between the lookup and the head): each part is a window of its
//!   own, gathered before its first reader and freed after its last, like
//!   any other window (prefetch and the rate limiter treat it as one).
//! - Nested units (a unit wrapped inside another) never split each other,
//!   the root's window and the windows of units kept gathered from forward
//!   to backward are never split, and under `root` nothing is split, so
//!   those plans are exactly as before.

use super::gather::Window;
use fsdpc_plan::UnitId;

/// `windows` with every window of a non-root unit split at the gaps where
/// an unrelated non-root unit is read (see the module header); in issue
/// order (by first reader). `parent` is each unit's enclosing unit.
pub(super) fn split_windows(
    windows: Vec<Window>,
    reads_units: &[Vec<UnitId>],
    parent: &[Option<UnitId>],
) -> Vec<Window> {
    let mut out: Vec<Window> = Vec::with_capacity(windows.len());
    for w in windows {
        if w.unit == UnitId(0) || !w.limited {
            out.push(w);
            continue;
        }
        let reads: Vec<usize> = (w.first..=w.last)
            .filter(|&s| reads_units[s].contains(&w.unit))
            .collect();
        let mut start = w.first;
        for pair in reads.windows(2) {
            let (a, b) = (pair[0], pair[1]);
            let unrelated = (a + 1..b).any(|s| {
                reads_units[s]
                    .iter()
                    .any(|&v| v != UnitId(0) && v != w.unit && !related(parent, w.unit, v))
            });
            if unrelated {
                out.push(Window {
                    first: start,
                    last: a,
                    ..w.clone()
                });
                start = b;
            }
        }
        out.push(Window { first: start, ..w });
    }
    out.sort_by_key(|w| w.first);
    out
}

/// True if `a` is `b`, or one contains the other.
fn related(parent: &[Option<UnitId>], a: UnitId, b: UnitId) -> bool {
    within(parent, a, b) || within(parent, b, a)
}

/// True if unit `u` lies inside unit `outer` (or is it).
fn within(parent: &[Option<UnitId>], mut u: UnitId, outer: UnitId) -> bool {
    for _ in 0..=parent.len() {
        if u == outer {
            return true;
        }
        match parent.get(u.index()).copied().flatten() {
            Some(p) => u = p,
            None => return false,
        }
    }
    false
}
