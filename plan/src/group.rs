//! Which ranks a collective runs over (`Group`) and how it runs
//! (`CollectiveAlgorithm`): the one definition the planner's cost model,
//! the verifier and every runtime read. A group is rank-generic: each rank
//! finds its own members from its rank and the plan's `Geometry`.

use fsdpc_ir::DType;
use serde::{Deserialize, Serialize};

/// Which ranks a collective runs over.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Group {
    /// The F ranks that share one flat parameter: rank r is in the group of
    /// ranks `(r / F) * F .. (r / F + 1) * F`, at position `r % F`.
    Shard,
    /// The world / F ranks that hold the same shard: ranks `r % F + k * F`.
    Replicate,
    /// Under `ReshardAfterForward::To(n)`: the n consecutive ranks of rank
    /// r's shard group that r is among, `b + (p / n) * n .. b + (p / n + 1) * n`
    /// where `b = (r / F) * F` and `p = r % F`.
    Reshard,
    /// A hierarchical collective's first or last step: the k ranks of rank
    /// r's shard group on r's node, `b + (p / k) * k ..`, k the ranks per
    /// node (`CollectiveAlgorithm::Hierarchical` only; no instruction
    /// names it).
    NodeLocal,
    /// A hierarchical collective's cross-node step: the F / k ranks of r's
    /// shard group at r's place on their nodes, `b + p % k + j * k`.
    CrossNode,
    /// The T ranks a layer's matrices are split over: `(r / T) * T .. (r /
    /// T + 1) * T` (see `Geometry`).
    Tensor,
}

/// How a collective runs: the planner's `rewrite` pass chooses, the cost
/// model charges and the runtime executes it.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CollectiveAlgorithm {
    /// One ring over the group.
    #[default]
    Ring,
    /// An all-gather or reduce-scatter over a shard group that spans nodes
    /// (k ranks on each of m nodes), in two levels. All-gather: across
    /// nodes first (the m shards at this rank's place on its node into
    /// `staging`, m shards), then inside the node, once per node's block
    /// (block j of every member into its place). Reduce-scatter: inside
    /// the node first, once per block (block j's k chunks summed over the
    /// node into chunk j of `staging`, f32, m chunks), then across nodes
    /// (divided there). The cross-node step moves 1/k of the ring's bytes.
    /// The sum runs over each node in position order, then over the nodes.
    Hierarchical,
    /// An all-reduce as a reduce-scatter (into `staging`, this member's
    /// 1/n slice in the buffer's dtype, divided) then an all-gather from it:
    /// bit-identical to the all-reduce (one rounding, same order).
    ReduceScatterAllGather,
}

impl CollectiveAlgorithm {
    /// True for `Ring` (the serde default).
    pub fn is_ring(&self) -> bool {
        *self == CollectiveAlgorithm::Ring
    }
}

/// The shape a hierarchical collective over the shard group runs on:
/// `(k, m)`, k > 1 ranks per node on each of m > 1 nodes, F a multiple of
/// the ranks per node; `None` where no two-level form can run.
pub fn hierarchical_shape(shard_factor: u32, ranks_per_node: u32) -> Option<(u32, u32)> {
    let (f, k) = (shard_factor, ranks_per_node);
    (k > 1 && f > k && f.is_multiple_of(k)).then_some((k, f / k))
}

/// Bytes of a hierarchical all-gather's staging: the m shards of the
/// cross-node step, in the gathered buffer's dtype.
pub fn hier_gather_staging_bytes(shard_numel: u64, nodes: u32, dst: DType) -> u64 {
    shard_numel * u64::from(nodes) * dst.size() as u64
}

/// Bytes of a hierarchical reduce-scatter's staging: m chunks of the
/// reduced shard's length, in f32 (the per-node sums are not rounded).
pub fn hier_reduce_staging_bytes(shard_numel: u64, nodes: u32) -> u64 {
    shard_numel * u64::from(nodes) * DType::F32.size() as u64
}

/// What a rank needs to find the members of its groups: the world, the
/// tensor-parallel degree T, the sharding factor F, the resharded group's
/// size n (`ReshardAfterForward::To`) and the ranks per node
/// (`Plan::geometry`).
///
/// The ranks form a mesh with the tensor dimension innermost: rank r is
/// member `r % T` of tensor group `r / T` (T consecutive ranks, on one node
/// when T divides the ranks per node), and its data rank is `r / T`. The
/// data-parallel groups (`Shard`, `Replicate`, `Reshard`, `NodeLocal`,
/// `CrossNode`) are those of the world / T data ranks, each member keeping
/// the tensor position r % T: their formulas below are in data ranks.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub world: u32,
    /// T, the ranks a layer's matrices are split over (1: none).
    pub tensor: u32,
    pub shard_factor: u32,
    /// n of `Group::Reshard`, where a unit reshards to n ranks.
    pub reshard: Option<u32>,
    pub ranks_per_node: u32,
}

impl Geometry {
    /// T, at least 1 and at most the world.
    pub fn t(&self) -> u32 {
        self.tensor.clamp(1, self.world.max(1))
    }

    /// The data-parallel ranks: world / T.
    pub fn data_world(&self) -> u32 {
        (self.world.max(1) / self.t()).max(1)
    }

    /// Rank `rank`'s data rank (`rank / T`): which samples it computes on.
    pub fn data_rank(&self, rank: usize) -> usize {
        rank / self.t() as usize
    }

    /// Rank `rank`'s position in its tensor group (`rank % T`): which part
    /// of every split parameter it holds.
    pub fn tensor_position(&self, rank: usize) -> usize {
        rank % self.t() as usize
    }

    /// F, at least 1 and at most the data world.
    fn f(&self) -> u32 {
        self.shard_factor.clamp(1, self.data_world())
    }

    /// The data ranks' own geometry: T = 1, world / T ranks, ranks per node
    /// / T.
    fn data(&self) -> Geometry {
        Geometry {
            world: self.data_world(),
            tensor: 1,
            shard_factor: self.shard_factor,
            reshard: self.reshard,
            ranks_per_node: (self.ranks_per_node / self.t()).max(1),
        }
    }

    /// Rank `rank`'s position in its shard group (`(rank / T) % F`): which
    /// shard of every flat parameter it holds.
    pub fn shard_position(&self, rank: usize) -> usize {
        self.data_rank(rank) % self.f() as usize
    }

    /// How `group`'s ranks lie on nodes: `(ranks per node, nodes)`. The
    /// same for every rank (the groups of one kind are translates of each
    /// other); equal to counting `Group::members` by node where the group
    /// lies evenly on nodes (F a multiple or a divisor of the ranks per
    /// node), the nearest even layout elsewhere.
    pub fn layout(&self, group: Group) -> (u32, u32) {
        let rpn = self.ranks_per_node.max(1);
        // `n` consecutive ranks.
        let consecutive = |n: u32| {
            if n <= rpn {
                (n, 1)
            } else {
                (rpn, n.div_ceil(rpn))
            }
        };
        if group == Group::Tensor {
            return consecutive(self.t());
        }
        if self.t() > 1 {
            return self.data().layout(group);
        }
        let world = self.world.max(1);
        let f = self.f();
        match group {
            Group::Shard => consecutive(f),
            Group::Replicate => {
                let r = (world / f).max(1);
                if f >= rpn {
                    // Every replica on its own node.
                    (1, r)
                } else {
                    let k = (rpn / f).clamp(1, r);
                    (k, r.div_ceil(k))
                }
            }
            Group::Reshard => consecutive(self.reshard.map_or(f, |n| n.clamp(1, f))),
            Group::NodeLocal => (consecutive(f).0, 1),
            Group::CrossNode => (1, consecutive(f).1),
            Group::Tensor => unreachable!("answered above"),
        }
    }

    /// Ranks in `group` (of any member).
    pub fn size(&self, group: Group) -> usize {
        let (k, m) = self.layout(group);
        (k * m) as usize
    }
}

impl Group {
    /// The shard group, the default of collectives that name no group.
    pub fn shard() -> Group {
        Group::Shard
    }

    /// The members of rank `rank`'s group of this kind, in position order
    /// (see each variant for the formula, in data ranks).
    pub fn members(self, rank: usize, g: &Geometry) -> Vec<usize> {
        let t = g.t() as usize;
        if self == Group::Tensor {
            let first = (rank / t) * t;
            return (first..first + t).collect();
        }
        if t > 1 {
            let at = rank % t;
            return self
                .members(rank / t, &g.data())
                .into_iter()
                .map(|d| d * t + at)
                .collect();
        }
        let world = g.world.max(1) as usize;
        let f = g.f() as usize;
        let n = g.reshard.map_or(f, |n| (n as usize).clamp(1, f));
        let k = (g.ranks_per_node as usize).clamp(1, f);
        let base = (rank / f) * f;
        let p = rank % f;
        match self {
            Group::Shard => (base..base + f).collect(),
            Group::Replicate => (0..world / f).map(|j| p + j * f).collect(),
            Group::Reshard => {
                let first = base + (p / n) * n;
                (first..first + n).collect()
            }
            Group::NodeLocal => {
                let first = base + (p / k) * k;
                (first..first + k).collect()
            }
            Group::CrossNode => (0..f / k).map(|j| base + p % k + j * k).collect(),
            Group::Tensor => unreachable!("answered above"),
        }
    }

    /// Rank `rank`'s position among its members of this kind.
    pub fn position(self, rank: usize, g: &Geometry) -> usize {
        self.members(rank, g)
            .iter()
            .position(|&r| r == rank)
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `layout` is `members` counted by node, for every group of every
    /// geometry up to 16 ranks whose groups lie evenly on nodes (F and n
    /// multiples or divisors of the ranks per node).
    #[test]
    fn layout_counts_the_members_by_node() {
        let groups = [
            Group::Shard,
            Group::Replicate,
            Group::Reshard,
            Group::NodeLocal,
            Group::CrossNode,
        ];
        for world in 1..=16u32 {
            for f in (1..=world).filter(|f| world % f == 0) {
                let even = |n: u32, rpn: u32| n.is_multiple_of(rpn) || rpn.is_multiple_of(n);
                for rpn in (1..=world).filter(|k| world % k == 0 && even(f, *k)) {
                    let ns = (1..=f).filter(|n| f % n == 0 && even(*n, rpn));
                    for reshard in std::iter::once(None).chain(ns.map(Some)) {
                        let g = Geometry {
                            world,
                            tensor: 1,
                            shard_factor: f,
                            reshard,
                            ranks_per_node: rpn,
                        };
                        for group in groups {
                            let hier = matches!(group, Group::NodeLocal | Group::CrossNode);
                            if hier && hierarchical_shape(f, rpn).is_none() {
                                continue;
                            }
                            let m = group.members(0, &g);
                            let mut nodes: Vec<u32> = m.iter().map(|&r| r as u32 / rpn).collect();
                            nodes.dedup();
                            let per_node = m.len() as u32 / nodes.len() as u32;
                            assert_eq!(
                                g.layout(group),
                                (per_node, nodes.len() as u32),
                                "{group:?} of {g:?}: members {m:?}"
                            );
                            assert_eq!(g.size(group), m.len());
                        }
                    }
                }
            }
        }
    }

    /// On a mesh, the tensor groups are consecutive ranks, and every data
    /// group is the T = 1 group of the data ranks with each member at the
    /// rank's tensor position; every pair of ranks shares exactly one
    /// tensor group or one (shard, replicate) cell.
    #[test]
    fn a_mesh_keeps_the_tensor_position_in_every_data_group() {
        for (world, t, f, rpn) in [(8, 2, 2, 4), (8, 4, 2, 8), (8, 2, 4, 2), (16, 4, 2, 4)] {
            let g = Geometry {
                world,
                tensor: t,
                shard_factor: f,
                reshard: None,
                ranks_per_node: rpn,
            };
            for r in 0..world as usize {
                let tg = Group::Tensor.members(r, &g);
                let first = r / t as usize * t as usize;
                assert_eq!(tg, (first..first + t as usize).collect::<Vec<_>>());
                for group in [Group::Shard, Group::Replicate] {
                    let m = group.members(r, &g);
                    assert!(m.contains(&r), "{group:?} of {r} in {g:?}: {m:?}");
                    assert!(m
                        .iter()
                        .all(|&x| g.tensor_position(x) == g.tensor_position(r)));
                    assert_eq!(m.len(), g.size(group), "{group:?} of {g:?}");
                }
                assert_eq!(Group::Shard.members(r, &g).len(), f as usize);
                assert_eq!(g.shard_position(r), (r / t as usize) % f as usize);
            }
            assert_eq!(g.layout(Group::Tensor), (t.min(rpn), t.div_ceil(rpn)));
        }
    }
}
