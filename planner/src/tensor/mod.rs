//! The `tensor` pass: Megatron-style tensor parallelism found in the
//! forward graph and the program rewritten to one member's part of it.
//!
//! A *region* starts at the matrix products that read one activation with
//! a weight parameter (x @ W: the query, key and value projections, or the
//! MLP's up and gate); their weights are split over their output columns
//! (column-parallel) and the activation enters through a `TpCopy`. The
//! split follows the graph (`layout`'s rules: heads through reshapes and
//! attention, biases split with their columns, elementwise ops) until a
//! product reads it along its reduction axis: that weight is split over
//! its input rows (row-parallel) and the product's partial sums leave
//! through a `TpReduce`. A region whose split reaches an op no rule takes
//! (a norm over the split axis, a dropout, the loss) is left replicated and
//! listed with the reason; a dimension T does not divide is an error.
//!
//! The head and the token embedding split by vocabulary (`vocab`): the
//! head's output columns and the table's rows, with the loss computed
//! from the members' per-row logit statistics, never from whole logits.
//!
//! The rewritten program is each member's: split parameters have their
//! part's type and a `TpSlice` saying which elements of the whole they
//! hold, reshapes and slices their part's sizes, and autodiff runs again,
//! so each `TpCopy`'s gradient is the `TpReduce` that sums the members'
//! partial input gradients.

mod layout;
mod sequence;
mod vocab;

use crate::error::PlanError;
use fsdpc_ir::{Graph, NodeId, Op, ParamId, Phase, TpSlice, TrainingProgram, ValueId};
use layout::{Decision, Layout, Refusal, Rules};
use std::collections::{BTreeMap, HashMap, HashSet};

pub use fsdpc_plan::TensorRecord;

/// Splits `program` over `t` ranks, with sequence parallelism between the
/// regions when `sequence` (`sequence::apply`); the program unchanged when
/// `t` is 1.
pub fn apply(
    program: TrainingProgram,
    t: u32,
    sequence: bool,
) -> Result<(TrainingProgram, Option<TensorRecord>), PlanError> {
    if t <= 1 {
        return Ok((program, None));
    }
    let bad = |reason: String| PlanError::Program {
        reason: format!("tensor parallelism over {t} ranks: {reason}"),
    };
    let loss = program.loss;
    let forward = crate::precision::forward_of(&program.graph, loss);
    let found = find(&forward, loss, t as usize).map_err(|r| match r {
        Refusal::Indivisible(m) | Refusal::Unsupported(m) => bad(m),
    })?;
    let vocab = vocab::find(&forward, t as usize, &found.params);
    if found.regions.is_empty() && vocab.split.is_empty() {
        let why = found.replicated.first().map_or(
            "it has no matrix product with a weight".to_string(),
            |(_, w)| w.clone(),
        );
        return Err(bad(format!("no layer of the model splits: {why}")));
    }
    let mut record = TensorRecord {
        degree: t,
        split: found
            .regions
            .iter()
            .map(|r| r.name.clone())
            .chain(vocab.split.iter().cloned())
            .collect(),
        replicated: found
            .replicated
            .iter()
            .filter(|(n, _)| !vocab.split.contains(n))
            .chain(&vocab.replicated)
            .map(|(n, why)| format!("{n}: {why}"))
            .collect(),
        vocabulary_whole: vocab.indivisible.map(|v| v as u64),
        vocabulary_padded: vocab.padded.map(|v| fsdpc_plan::VocabularyPadding {
            vocabulary: v as u64,
            padded: v.div_ceil(t as usize) as u64 * u64::from(t),
        }),
        sequence: None,
    };
    let mut local = rewrite(forward, &found, t as usize).map_err(|e| bad(e.to_string()))?;
    let mut loss = loss;
    if vocab.splits() {
        // The lookups, offsets and loss it inserts run just in time.
        let kept: HashSet<NodeId> = local.node_ids().collect();
        let split = vocab::apply(&mut local, &vocab, t as usize, loss);
        let split = split.and_then(|l| crate::precision::just_in_time(&local, l, &kept));
        (local, loss) = split.map_err(|e| bad(e.to_string()))?;
    }
    if sequence {
        let (s, renumbered_loss) =
            sequence::apply(&mut local, loss, t as usize).map_err(|e| bad(e.to_string()))?;
        loss = renumbered_loss;
        record.sequence = Some(fsdpc_plan::SequenceRecord {
            scattered: s.scattered as u32,
            whole: s.whole as u32,
            gathered: s.gathered as u32,
        });
    }
    let program = fsdpc_ir::build_training_program(local, loss, program.optimizer)
        .map_err(|e| bad(e.to_string()))?;
    Ok((program, Some(record)))
}

/// One split region: its name (the module path of its first product), the
/// activations it enters through and the partial sums it leaves through.
struct Region {
    name: String,
    enters: Vec<(ValueId, Vec<NodeId>)>,
    leaves: Vec<ValueId>,
}

/// What `find` decided: every split value's layout, every split
/// parameter's slice, the regions, and the regions left replicated with
/// why.
struct Found {
    layouts: HashMap<ValueId, Layout>,
    params: BTreeMap<ParamId, (usize, Vec<usize>)>,
    regions: Vec<Region>,
    replicated: Vec<(String, String)>,
    selects: Vec<Select>,
}

/// A whole operand of which each member reads its part: input `slot` of
/// `node`, cut on `axis` in `segments` (`Layout::Split`).
struct Select {
    node: NodeId,
    slot: usize,
    axis: usize,
    segments: Vec<usize>,
}

/// Each member's offset `k * step` (member k of `t`) as one integer: a
/// constant of every member's offset split over the tensor group, so every
/// member runs the same program and no communication is needed. `name`
/// names the constant and its split.
pub(super) fn member_offset(
    g: &mut Graph,
    step: u64,
    t: usize,
    name: &str,
    module: fsdpc_ir::ModuleId,
) -> Result<ValueId, fsdpc_ir::IrError> {
    let all: Vec<f64> = (0..t as u64).map(|k| (k * step) as f64).collect();
    let ty = fsdpc_ir::TensorType::new(fsdpc_ir::DType::I64, vec![t, 1]);
    let value = fsdpc_ir::TensorData::from_f64s(ty, &all)
        .ok_or_else(|| fsdpc_ir::IrError::Invalid(format!("{name}: member offsets")))?;
    let c = g.add1(Op::Constant { value }, &[], format!("{name}s"), module)?;
    let parts = t as u32;
    g.add1(Op::TpSplit { axis: 0, parts }, &[c], name, module)
}

/// The matrix products that may start a region, by the activation they
/// read: `x @ W` with `W` a matrix parameter no other node reads.
fn seeds(g: &Graph, order: &[NodeId]) -> Vec<(ValueId, Vec<NodeId>)> {
    let users_of_param = |v: ValueId| g.users(v).len();
    let mut by_input: Vec<(ValueId, Vec<NodeId>)> = Vec::new();
    for &n in order {
        let node = g.node(n);
        if node.phase != Phase::Forward || !matches!(node.op, Op::MatMul { trans_a: false, .. }) {
            continue;
        }
        let ins = g.inputs(n);
        let is_weight = matches!(g.node(ins[1].node).op, Op::Param { .. })
            && g.value_type(ins[1]).shape.0.len() == 2
            && users_of_param(ins[1]) == 1;
        let x_is_param = matches!(g.node(ins[0].node).op, Op::Param { .. });
        // A low-rank adapter's down-projection (read only by the product
        // with its up weight) does not start a region, as the input of a
        // row-parallel product or whole beside a column-parallel one; its
        // up-projection splits with the product it is added to
        // (`Rules::adapter`),
        let out = ValueId { node: n, slot: 0 };
        let down = !g.users(out).is_empty()
            && g.users(out).iter().all(|&(u, slot)| {
                slot == 0
                    && matches!(g.node(u).op, Op::MatMul { .. })
                    && matches!(g.node(g.inputs(u)[1].node).op, Op::Param { .. })
            });
        // and so does its up-projection, which reads the down one.
        let up = matches!(g.node(ins[0].node).op, Op::MatMul { .. })
            && matches!(g.node(g.inputs(ins[0].node)[1].node).op, Op::Param { .. });
        if !is_weight || x_is_param || down || up {
            continue;
        }
        match by_input.iter_mut().find(|(x, _)| *x == ins[0]) {
            Some((_, ns)) => ns.push(n),
            None => by_input.push((ins[0], vec![n])),
        }
    }
    by_input
}

/// How the output columns of product `n` are cut: by the slices that read
/// them along the last axis (a fused query-key-value projection is three
/// segments), looking through a bias add and reshapes that keep the last
/// axis (an exporter's flattened product); one segment otherwise.
fn column_segments(g: &Graph, n: NodeId) -> Vec<usize> {
    let out = ValueId { node: n, slot: 0 };
    let width = *g.value_type(out).shape.0.last().unwrap_or(&0);
    let mut v = out;
    loop {
        let users = g.users(v);
        let last = g.value_type(v).shape.0.len().saturating_sub(1);
        let slices: Vec<(usize, usize)> = users
            .iter()
            .filter_map(|(u, _)| match g.node(*u).op {
                Op::Slice {
                    axis,
                    start,
                    end,
                    step: 1,
                } if axis == last => Some((start, end.min(width))),
                _ => None,
            })
            .collect();
        if !slices.is_empty() && slices.len() == users.len() {
            let mut s = slices;
            s.sort_unstable();
            s.dedup();
            let tiles = s.windows(2).all(|w| w[0].1 == w[1].0);
            if tiles && s[0].0 == 0 && s[s.len() - 1].1 == width {
                return s.iter().map(|(a, b)| b - a).collect();
            }
            return vec![width];
        }
        // Through one bias add or a reshape that keeps the last axis.
        let next = match users.as_slice() {
            [(u, _)] => match &g.node(*u).op {
                Op::Binary { .. } => true,
                Op::Reshape { shape } => shape.last() == Some(&width),
                _ => false,
            }
            .then_some(*u),
            _ => None,
        };
        match next {
            Some(u) => v = ValueId { node: u, slot: 0 },
            None => return vec![width],
        }
    }
}

/// Finds the regions of `g` (the forward graph; `loss` its output).
fn find(g: &Graph, loss: ValueId, t: usize) -> Result<Found, Refusal> {
    let order = g
        .topo_order()
        .map_err(|_| Refusal::Unsupported("the forward graph has a cycle".into()))?;
    let pos: HashMap<NodeId, usize> = order.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let rules = Rules {
        g,
        t,
        select: false,
    };
    let mut found = Found {
        layouts: HashMap::new(),
        params: BTreeMap::new(),
        regions: Vec::new(),
        replicated: Vec::new(),
        selects: Vec::new(),
    };
    // The head is the vocabulary's (`vocab`).
    let mut claimed: HashSet<NodeId> = vocab::head_product(g).into_iter().collect();
    for (x, products) in seeds(g, &order) {
        if products.iter().any(|p| claimed.contains(p)) || found.layouts.contains_key(&x) {
            continue;
        }
        let name = g.module_info(g.node(products[0]).module).path.clone();
        let (result, products) = match trial(&rules, &order, &pos, loss, &products, &found) {
            Err(Refusal::Indivisible(m)) => {
                retry_whole(&rules, &order, &pos, loss, &products, &mut found, m)?
            }
            r => (r, products),
        };
        match result {
            Ok(r) => {
                claimed.extend(r.nodes.iter().copied());
                found.layouts.extend(r.layouts);
                found.params.extend(r.params);
                found.selects.extend(r.selects);
                let mut enters = vec![(x, products)];
                enters.extend(r.enters);
                found.regions.push(Region {
                    name,
                    enters,
                    leaves: r.leaves,
                });
            }
            Err(Refusal::Indivisible(m)) => return Err(Refusal::Indivisible(m)),
            Err(Refusal::Unsupported(m)) => {
                if !found.replicated.contains(&(name.clone(), m.clone())) {
                    found.replicated.push((name, m));
                }
            }
        }
    }
    Ok(found)
}

/// A region tried from the products `products` reading `x`.
struct Trial {
    layouts: HashMap<ValueId, Layout>,
    params: BTreeMap<ParamId, (usize, Vec<usize>)>,
    leaves: Vec<ValueId>,
    nodes: Vec<NodeId>,
    selects: Vec<Select>,
    /// Adapters' up-projections made column-parallel, with their inputs.
    enters: Vec<(ValueId, Vec<NodeId>)>,
}

type Tried = Result<Trial, Refusal>;

/// A region whose products do not all split (grouped-query attention with
/// fewer key/value heads than T): the products that do not split alone are
/// computed whole on every member, and each member reads its query heads'
/// share of their heads (`Rules::select`). The error `m` stands when that
/// does not make a region either.
fn retry_whole(
    rules: &Rules<'_>,
    order: &[NodeId],
    pos: &HashMap<NodeId, usize>,
    loss: ValueId,
    products: &[NodeId],
    found: &mut Found,
    m: String,
) -> Result<(Tried, Vec<NodeId>), Refusal> {
    let g = rules.g;
    let (whole, split): (Vec<NodeId>, Vec<NodeId>) = products.iter().partition(|&&p| {
        matches!(
            trial(rules, order, pos, loss, &[p], found),
            Err(Refusal::Indivisible(_))
        )
    });
    if whole.is_empty() || split.is_empty() {
        return Err(Refusal::Indivisible(m));
    }
    let selecting = Rules {
        g,
        t: rules.t,
        select: true,
    };
    match trial(&selecting, order, pos, loss, &split, found) {
        Ok(r) => {
            for p in whole {
                let path = g.module_info(g.node(p).module).path.clone();
                let why = format!("computed whole on every member, each taking its share ({m})");
                found.replicated.push((path, why));
            }
            Ok((Ok(r), split))
        }
        Err(_) => Err(Refusal::Indivisible(m)),
    }
}

fn trial(
    rules: &Rules<'_>,
    order: &[NodeId],
    pos: &HashMap<NodeId, usize>,
    loss: ValueId,
    products: &[NodeId],
    done: &Found,
) -> Result<Trial, Refusal> {
    let g = rules.g;
    let mut tr = Trial {
        layouts: HashMap::new(),
        params: BTreeMap::new(),
        leaves: Vec::new(),
        nodes: Vec::new(),
        selects: Vec::new(),
        enters: Vec::new(),
    };
    let take = |tr: &mut Trial, n: NodeId, d: Decision| -> Result<(), Refusal> {
        for (p, axis, segs) in d.split_params {
            let taken = done.params.get(&p).or_else(|| tr.params.get(&p));
            if taken.is_some_and(|s| *s != (axis, segs.clone())) {
                return Err(Refusal::Unsupported(format!(
                    "parameter `{}` would be split two ways",
                    g.param(p).name
                )));
            }
            let whole = g.param(p).ty.shape.0[axis];
            if !whole.is_multiple_of(rules.t) {
                return Err(Refusal::Indivisible(format!(
                    "parameter `{}`: its dimension {axis} of {whole} does not split over T = {}",
                    g.param(p).name,
                    rules.t
                )));
            }
            tr.params.insert(p, (axis, segs));
        }
        let v = ValueId { node: n, slot: 0 };
        if d.partial {
            tr.leaves.push(v);
        }
        for (value, layout) in d.also {
            tr.nodes.push(value.node);
            tr.layouts.insert(value, layout);
        }
        for p in d.enter {
            tr.enters.push((g.inputs(p)[0], vec![p]));
        }
        for (slot, axis, segments) in d.select {
            tr.selects.push(Select {
                node: n,
                slot,
                axis,
                segments,
            });
        }
        if let Some(l @ Layout::Split { .. }) = d.out {
            tr.layouts.insert(v, l);
        }
        tr.nodes.push(n);
        Ok(())
    };
    for &p in products {
        let d = rules.column(p, column_segments(g, p))?;
        take(&mut tr, p, d)?;
    }
    let start = products.iter().map(|p| pos[p]).min().unwrap_or(0);
    for &n in &order[start..] {
        if products.contains(&n) {
            continue;
        }
        let ins: Vec<Layout> = g
            .inputs(n)
            .iter()
            .map(|v| tr.layouts.get(v).cloned().unwrap_or(Layout::Rep))
            .collect();
        if ins.iter().all(|l| *l == Layout::Rep) {
            continue;
        }
        let d = rules.apply(n, &ins)?;
        take(&mut tr, n, d)?;
    }
    if tr.layouts.contains_key(&loss) {
        return Err(Refusal::Unsupported("the split reaches the loss".into()));
    }
    // A region must end in row-parallel products; `x` itself stays whole.
    if tr.leaves.is_empty() {
        return Err(Refusal::Unsupported(
            "no product reads the split along its reduction axis".into(),
        ));
    }
    Ok(tr)
}

/// Where the gradient of a whole operand `v`, read in part, is summed over
/// the group: the first value up from `v` through reshapes, transposes and
/// expansions, each the only reader of the value above it.
fn sum_point(g: &Graph, v: ValueId) -> ValueId {
    let mut at = v;
    loop {
        let moves = matches!(
            g.node(at.node).op,
            Op::Reshape { .. } | Op::Transpose { .. } | Op::Expand { .. }
        );
        match g.inputs(at.node).as_slice() {
            [up] if moves && g.users(*up).len() == 1 => at = *up,
            _ => return at,
        }
    }
}

/// The forward graph `g` as one member's part: split parameters and the
/// sizes of split values divided, a `TpCopy` where each region is
/// entered and a `TpReduce` where it is left.
fn rewrite(mut g: Graph, found: &Found, t: usize) -> Result<Graph, fsdpc_ir::IrError> {
    let order = g
        .topo_order()
        .map_err(|_| fsdpc_ir::IrError::Invalid("the forward graph has a cycle".into()))?;
    // Parameters: their part's type and slice.
    for (&p, (axis, segs)) in &found.params {
        let spec = &mut g.params[p.0 as usize];
        spec.ty.shape.0[*axis] /= t;
        spec.tp = Some(TpSlice {
            axis: *axis,
            segments: segs.clone(),
            parts: t as u32,
        });
    }
    let local_len = |segs: &[usize]| segs.iter().sum::<usize>() / t;
    // Attributes that name sizes of the split axis.
    for &n in &order {
        let out = ValueId { node: n, slot: 0 };
        let in_layout = g
            .inputs(n)
            .first()
            .and_then(|v| found.layouts.get(v))
            .cloned();
        let out_layout = found.layouts.get(&out).cloned();
        let node = g.node_mut(n);
        match (&mut node.op, &out_layout, &in_layout) {
            (Op::Reshape { shape }, Some(Layout::Split { axis, segments }), _)
            | (Op::Expand { shape }, Some(Layout::Split { axis, segments }), _) => {
                shape[*axis] = local_len(segments);
            }
            (
                Op::Slice {
                    axis, start, end, ..
                },
                _,
                Some(Layout::Split { axis: a, segments }),
            ) if *axis == *a => {
                let mut whole = vec![0];
                let mut local = vec![0];
                for s in segments.iter() {
                    whole.push(whole[whole.len() - 1] + s);
                    local.push(local[local.len() - 1] + s / t);
                }
                let stop = (*end).min(whole[whole.len() - 1]);
                if let (Some(i), Some(j)) = (
                    whole.iter().position(|b| b == start),
                    whole.iter().position(|&b| b == stop),
                ) {
                    (*start, *end) = (local[i], local[j]);
                }
            }
            _ => {}
        }
    }
    // The boundaries.
    let mut left: Vec<ValueId> = Vec::new();
    for r in &found.regions {
        for (x, products) in &r.enters {
            let module = g.node(products[0]).module;
            let name = format!("{}.tp_copy", g.node(products[0]).name);
            let c = g.add1(Op::TpCopy, &[*x], name, module)?;
            for &p in products {
                g.set_input(p, 0, c);
            }
        }
        left.extend(r.leaves.iter().copied());
    }
    // Whole operands read in part: summed over the group in backward (each
    // member's gradient covers its part), then each member's elements.
    for s in &found.selects {
        let v = g.inputs(s.node)[s.slot];
        let node = g.node(s.node);
        let (name, module) = (format!("{}.tp_select{}", node.name, s.slot), node.module);
        let mut rows = vec![Vec::new(); t];
        let mut start = 0;
        for &seg in &s.segments {
            for (k, r) in rows.iter_mut().enumerate() {
                let n = seg / t;
                r.extend((start + k * n..start + (k + 1) * n).map(|i| i as f64));
            }
            start += seg;
        }
        let local = rows[0].len();
        let all: Vec<f64> = rows.concat();
        let ty = fsdpc_ir::TensorType::new(fsdpc_ir::DType::I64, vec![t, local]);
        let value = fsdpc_ir::TensorData::from_f64s(ty, &all)
            .ok_or_else(|| fsdpc_ir::IrError::Invalid("selection indices".into()))?;
        let parts = t as u32;
        let c = g.add1(
            Op::Constant { value },
            &[],
            format!("{name}.indices"),
            module,
        )?;
        let mine = g.add1(
            Op::TpSplit { axis: 0, parts },
            &[c],
            format!("{name}.mine"),
            module,
        )?;
        let mine = g.add1(
            Op::Reshape { shape: vec![local] },
            &[mine],
            format!("{name}.mine_flat"),
            module,
        )?;
        let part = g.add1(
            Op::Gather { axis: s.axis },
            &[v, mine],
            name.clone(),
            module,
        )?;
        g.set_input(s.node, s.slot as u32, part);
        // The sum goes as far up as only data movement read by nothing
        // else separates it from the gather (before grouped-query
        // attention's repeat of the key/value heads: a fraction of the
        // bytes), so every op below it that reads parameters still sees
        // the summed gradient.
        let at = sum_point(&g, v);
        let (reader, slot) = g.users(at).first().copied().unwrap_or((part.node, 0));
        let summed = g.add1(Op::TpCopy, &[at], format!("{name}.tp_copy"), module)?;
        g.set_input(reader, slot, summed);
    }
    // Retype in order: parameters first, then every node from its inputs.
    for &n in &order {
        if let Op::Param { param } = g.node(n).op {
            let ty = g.param(param).ty.clone();
            g.node_mut(n).outputs = vec![ty];
        }
    }
    let order = g
        .topo_order()
        .map_err(|_| fsdpc_ir::IrError::Invalid("the forward graph has a cycle".into()))?;
    for &n in &order {
        if g.node(n).op.is_source() {
            continue;
        }
        crate::precision::infer_outputs(&mut g, n)?;
    }
    for v in left {
        let node = g.node(v.node);
        let (name, module) = (format!("{}.tp_reduce", node.name), node.module);
        let r = g.add1(Op::TpReduce, &[v], name, module)?;
        g.replace_uses(v, r);
    }
    Ok(g)
}
