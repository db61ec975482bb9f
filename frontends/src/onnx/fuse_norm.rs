//! Fusion of LayerNorm as exporters write it before opset 17 (and as
//! hand-written modules compute it): with `d = x - mean(x)` over the last
//! axis, `d / sqrt(mean(d²) + eps) * w + b` becomes `LayerNorm{eps}(x, w, b)`
//! when nothing else reads the intermediates and `w`, `b` are vectors of the
//! last dimension.

use super::pattern::{bin, match_root, mul, replace_node, Found, Pat};
use fsdpc_ir::{BinaryFn, Graph, NodeId, Op, UnaryFn, ValueId};

/// `x - mean(x)`.
fn centred() -> Pat {
    bin(BinaryFn::Sub, Pat::X, Pat::MeanLast(Box::new(Pat::X)))
}

/// The normalised `x` with the variance as `mean(d^2)` or `mean(d·d)`.
fn normalised(square: impl Fn() -> Pat) -> Pat {
    let var = Pat::MeanLast(Box::new(square()));
    let std = Pat::Un(UnaryFn::Sqrt, Box::new(bin(BinaryFn::Add, var, Pat::Eps)));
    bin(BinaryFn::Div, centred(), std)
}

fn patterns() -> Vec<Pat> {
    let pow = || bin(BinaryFn::Pow, centred(), Pat::C(2.0));
    let prod = || mul(centred(), centred());
    [normalised(pow), normalised(prod)]
        .into_iter()
        .map(|n| bin(BinaryFn::Add, mul(n, Pat::Any(0)), Pat::Any(1)))
        .collect()
}

/// The LayerNorm rooted at `root`: input, weight, bias and epsilon.
fn match_at(g: &Graph, root: NodeId) -> Option<(ValueId, ValueId, ValueId, f64)> {
    let v = ValueId {
        node: root,
        slot: 0,
    };
    let found: Found = patterns().iter().find_map(|p| match_root(g, v, p))?;
    let (x, eps) = (found.x?, found.eps?);
    let (w, b) = (found.any.first().copied()??, found.any.get(1).copied()??);
    let h = *g.value_type(x).shape.dims().last()?;
    let vector = |v: ValueId| g.value_type(v).shape.dims() == [h];
    (found.is_private(g) && vector(w) && vector(b)).then_some((x, w, b, eps))
}

/// Replaces every decomposed LayerNorm in `g`; returns how many.
pub(crate) fn fuse_layer_norm(g: &mut Graph) -> usize {
    let roots: Vec<NodeId> = g
        .node_ids()
        .filter(|&n| g.node(n).op == Op::Binary { f: BinaryFn::Add })
        .collect();
    let mut fused = 0;
    for root in roots {
        if !g.contains(root) {
            continue;
        }
        let Some((x, w, b, eps)) = match_at(g, root) else {
            continue;
        };
        let (name, module) = (g.node(root).name.clone(), g.node(root).module);
        let Ok(y) = g.add1(
            Op::LayerNorm { eps },
            &[x, w, b],
            format!("{name}/fused_layer_norm"),
            module,
        ) else {
            continue;
        };
        replace_node(g, root, y);
        fused += 1;
    }
    fused
}
