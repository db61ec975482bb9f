//! The NCCL communicators of a rank: which (plan stream, group) pairs the
//! lowered work uses (`CommIndex`, in first-use order, the same on every
//! rank), one world communicator per plan stream from the ids rank 0 hands
//! out (`CommSetup`), and each group's communicator split from it.

use super::lower::{lower_step, Layout};
use super::NcclUse;
use crate::error::RuntimeError;
use crate::exec::resolve::Resolved;
use crate::targets::cuda::nccl::NcclComm;
use fsdpc_plan::{Group, Stream};
use std::collections::HashMap;

/// An NCCL unique id.
pub type Id = [u8; crate::targets::cuda::nccl::ID_BYTES];

/// What a rank needs from outside to make its communicators: the ids rank
/// 0 made and handed out (`train::train_cuda`).
pub struct CommSetup<'a> {
    /// When to use NCCL.
    pub nccl: NcclUse,
    /// The id of each plan stream's world communicator, by stream index
    /// (`None`: the stream runs no collective).
    pub ids: &'a [Option<Id>; 4],
    /// The id of the loss report's world communicator (world > 1).
    pub loss: Option<Id>,
}

/// The communicators the lowered work refers to, by (stream, group).
#[derive(Default)]
pub(super) struct CommIndex {
    keys: Vec<(Stream, Group)>,
}

impl CommIndex {
    pub(super) fn get(&mut self, s: Stream, g: Group) -> usize {
        match self.keys.iter().position(|k| *k == (s, g)) {
            Some(i) => i,
            None => {
                self.keys.push((s, g));
                self.keys.len() - 1
            }
        }
    }

    /// Every communicator, in first-use order (the same on every rank).
    pub(super) fn make(
        &self,
        prep: &Resolved,
        rank: usize,
        world: usize,
        ids: &[Option<Id>; 4],
    ) -> Result<Vec<NcclComm>, RuntimeError> {
        if self.keys.is_empty() {
            return Ok(Vec::new());
        }
        let geometry = fsdpc_plan::Geometry {
            world: world as u32,
            ..prep.plan.geometry()
        };
        // One world communicator per stream, then the splits.
        let mut worlds: HashMap<Stream, NcclComm> = HashMap::new();
        for &(s, _) in &self.keys {
            if worlds.contains_key(&s) {
                continue;
            }
            let id = ids[s.index()]
                .as_ref()
                .ok_or_else(|| RuntimeError::plan(format!("no NCCL id for stream {s:?}")))?;
            worlds.insert(s, NcclComm::init(id, world, rank)?);
        }
        let mut out = Vec::new();
        for &(s, g) in &self.keys {
            let ranks = g.members(rank, &geometry);
            let pos = ranks.iter().position(|&r| r == rank).unwrap_or(0);
            let w = &worlds[&s];
            out.push(w.split(ranks[0], rank, ranks.len(), pos)?);
        }
        Ok(out)
    }
}

/// The plan streams whose collectives need a world communicator (ids to
/// hand out), given `nccl`.
pub fn comm_streams(
    prep: &Resolved,
    world: usize,
    rank: usize,
    nccl: NcclUse,
) -> Result<Vec<Stream>, RuntimeError> {
    let mut index = CommIndex::default();
    let zero = Layout { arena: 0 };
    for (i, s) in prep.steps.iter().enumerate() {
        lower_step(prep, i, s, &zero, rank, world, 0, &mut index, nccl)?;
    }
    let mut out: Vec<Stream> = Vec::new();
    for (s, _) in index.keys {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(out)
}
