//! The terms of the collective rewrites as an egg language (`Coll`, see
//! the parent module for what each node means) and the analysis that
//! sizes every e-class's value (`Payloads`).

use egg::{define_language, Analysis, DidMerge, EGraph, Id, RecExpr, Symbol};
use fsdpc_ir::DType;
use std::fmt;
use std::str::FromStr;

/// A dtype leaf of a term.
#[derive(Copy, Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Ty(DType);

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl FromStr for Ty {
    type Err = ();
    fn from_str(s: &str) -> Result<Ty, ()> {
        [DType::F32, DType::Bf16, DType::F16]
            .into_iter()
            .find(|d| d.to_string() == s)
            .map(Ty)
            .ok_or(())
    }
}

define_language! {
    pub(super) enum Coll {
        "shard" = Shard([Id; 2]),
        "ag" = Ag([Id; 1]),
        "hag" = HierAg([Id; 1]),
        "rs" = Rs([Id; 1]),
        "hrs" = HierRs([Id; 1]),
        "ar" = Ar([Id; 1]),
        "cast" = Cast([Id; 2]),
        "recv" = Recv([Id; 2]),
        "cat" = Cat([Id; 2]),
        "then" = Then([Id; 2]),
        Num(u64),
        Ty(Ty),
        Other(Symbol),
    }
}

/// What an e-class holds: a count, a dtype, or a value of `numel`
/// elements (this rank's) of `dtype`, made of `parts` gathers' payloads
/// (more than one where buckets concatenate them).
#[derive(Copy, Clone, Debug, PartialEq)]
pub(super) enum Data {
    Num(u64),
    Ty(DType),
    Val {
        numel: u64,
        dtype: DType,
        parts: u32,
    },
    None,
}

/// The analysis: `n`, the members of the collective's group.
pub(super) struct Payloads {
    pub(super) n: u64,
}

impl Analysis<Coll> for Payloads {
    type Data = Data;

    fn make(egraph: &mut EGraph<Coll, Self>, enode: &Coll, _id: Id) -> Data {
        let n = egraph.analysis.n.max(1);
        let d = |i: &Id| egraph[*i].data;
        let val = |i: &Id| match d(i) {
            Data::Val {
                numel,
                dtype,
                parts,
            } => Some((numel, dtype, parts)),
            _ => None,
        };
        let of = |v: Option<(u64, DType, u32)>| {
            v.map_or(Data::None, |(numel, dtype, parts)| Data::Val {
                numel,
                dtype,
                parts,
            })
        };
        match enode {
            Coll::Num(x) => Data::Num(*x),
            Coll::Ty(t) => Data::Ty(t.0),
            Coll::Other(_) | Coll::Then(_) => Data::None,
            Coll::Shard([t, x]) => match (d(t), d(x)) {
                (Data::Ty(dtype), Data::Num(numel)) => Data::Val {
                    numel,
                    dtype,
                    parts: 1,
                },
                _ => Data::None,
            },
            Coll::Ag([x]) | Coll::HierAg([x]) => of(val(x).map(|(e, t, p)| (e * n, t, p))),
            Coll::Rs([x]) | Coll::HierRs([x]) => of(val(x).map(|(e, t, p)| (e / n, t, p))),
            Coll::Ar([x]) => of(val(x)),
            Coll::Cast([t, x]) | Coll::Recv([t, x]) => match (d(t), val(x)) {
                (Data::Ty(dtype), Some((numel, _, parts))) => Data::Val {
                    numel,
                    dtype,
                    parts,
                },
                _ => Data::None,
            },
            // One dtype per run (`runs`): a concatenation of two.
            Coll::Cat([a, b]) => match (val(a), val(b)) {
                (Some((ea, ta, pa)), Some((eb, tb, pb))) if ta == tb => Data::Val {
                    numel: ea + eb,
                    dtype: ta,
                    parts: pa + pb,
                },
                _ => Data::None,
            },
        }
    }

    fn merge(&mut self, a: &mut Data, b: Data) -> DidMerge {
        // Equal classes hold equal values; keep whichever is known.
        if *a == Data::None && b != Data::None {
            *a = b;
            return DidMerge(true, false);
        }
        DidMerge(false, b == Data::None && *a != Data::None)
    }
}

/// An e-graph of `start` alone, over a group of `n`: its only form is the
/// start term (whose cost the rules' savings are measured against).
pub(super) fn unrewritten(start: &RecExpr<Coll>, n: u64) -> (EGraph<Coll, Payloads>, Id) {
    let mut eg = EGraph::<Coll, Payloads>::new(Payloads { n });
    let at = eg.add_expr(start);
    eg.rebuild();
    (eg, at)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_analysis_sizes_every_form() {
        let mut eg = EGraph::<Coll, Payloads>::new(Payloads { n: 4 });
        let e: RecExpr<Coll> = "(ag (cast bf16 (shard f32 100)))".parse().unwrap();
        let id = eg.add_expr(&e);
        assert_eq!(
            eg[id].data,
            Data::Val {
                numel: 400,
                dtype: DType::Bf16,
                parts: 1
            }
        );
        let e: RecExpr<Coll> = "(ag (rs (shard f32 400)))".parse().unwrap();
        let id = eg.add_expr(&e);
        assert_eq!(
            eg[id].data,
            Data::Val {
                numel: 400,
                dtype: DType::F32,
                parts: 1
            }
        );
    }
}
