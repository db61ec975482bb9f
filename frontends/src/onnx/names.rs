//! Module paths and kinds of imported nodes, so FSDP units can follow the
//! PyTorch module tree. In order of preference:
//! 1. the node's `metadata_props` written by the dynamo exporter
//!    (`pkg.torch.onnx.name_scopes = ['', 'h.0', 'h.0.attn', 'matmul']` with
//!    `pkg.torch.onnx.class_hierarchy = ['GPT', 'Block', 'Attention', 'aten.mm']`);
//! 2. TorchScript-exporter node names (`/h.0/attn/MatMul` -> `h.0.attn`),
//!    without a leading segment the parameter names lack (an exporter's wrapper
//!    module: `/model/model.0/encoder/MatMul` with `model.0.encoder.bias`);
//! 3. for parameters, the initializer name (`h.0.attn.c_attn.weight` -> `h.0.attn.c_attn`),
//!    else (`onnx::MatMul_123`, a weight the exporter transposed) the module of
//!    the node that reads it, so it lands in the right FSDP unit.

use fsdpc_ir::{Graph, ModuleId, Op, ValueId};
use onnx_protobuf::{GraphProto, NodeProto};
use std::collections::HashSet;

const SCOPES: &str = "pkg.torch.onnx.name_scopes";
const CLASSES: &str = "pkg.torch.onnx.class_hierarchy";

/// The module of `node`, created in `g` with its kinds if new; `skip`
/// leading segments of a TorchScript node-name path are dropped (see
/// [`node_path_skip`]).
pub(crate) fn node_module(g: &mut Graph, node: &NodeProto, skip: usize) -> ModuleId {
    if let Some(m) = from_metadata(g, node) {
        return m;
    }
    let path = ts_path(&node.name).map(|p| skip_segments(&p, skip).to_string());
    match path.filter(|p| valid_path(p)) {
        Some(p) => intern(g, &p, None),
        None => ModuleId::ROOT,
    }
}

/// 1 when TorchScript node-name paths carry one leading segment more than the
/// initializer names (`/model/model.0/...` with `model.0....weight`: the
/// exporter wrapped the module), judged by which matches more parameter
/// modules; else 0.
pub(crate) fn node_path_skip(graph: &GraphProto) -> usize {
    let params: HashSet<&str> = graph
        .initializer
        .iter()
        .filter_map(|t| t.name.rsplit_once('.').map(|(p, _)| p))
        .filter(|p| valid_path(p))
        .collect();
    let score = |skip: usize| {
        graph
            .node
            .iter()
            .filter_map(|n| ts_path(&n.name))
            .filter(|p| params.contains(skip_segments(p, skip)))
            .count()
    };
    usize::from(score(1) > score(0))
}

/// `path` without its first `skip` dotted segments ("" when it has no more).
fn skip_segments(path: &str, skip: usize) -> &str {
    let mut rest = path;
    for _ in 0..skip {
        rest = rest.split_once('.').map_or("", |(_, r)| r);
    }
    rest
}

/// The module of a parameter named `name` (`a.b.weight` -> `a.b`).
pub(crate) fn param_module(g: &mut Graph, name: &str) -> ModuleId {
    match name.rsplit_once('.') {
        Some((path, _)) if valid_path(path) => intern(g, path, None),
        _ => ModuleId::ROOT,
    }
}

/// Moves every parameter left at the root (its name is not a module path) into
/// the module of its first reader, when that reader has one.
pub(crate) fn adopt_orphan_params(g: &mut Graph) {
    let orphans: Vec<_> = g
        .node_ids()
        .filter(|&n| matches!(g.node(n).op, Op::Param { .. }) && g.node(n).module == ModuleId::ROOT)
        .collect();
    for n in orphans {
        let reader = g
            .users(ValueId { node: n, slot: 0 })
            .first()
            .map(|&(u, _)| g.node(u).module);
        if let Some(m) = reader.filter(|&m| m != ModuleId::ROOT) {
            g.node_mut(n).module = m;
        }
    }
}

/// Numbered modules (`layer.0`, `model.1`) whose class the file does not
/// give (TorchScript exports) get the kind `Module(child,child,...)` from
/// their child modules, so numbered siblings that are different classes
/// (a sentence-transformers `Sequential` of encoder and pooling) no longer
/// look alike to the `blocks` wrap policy, while repeated layers still do.
pub(crate) fn structural_kinds(g: &mut Graph) {
    let mut children: Vec<Vec<&str>> = vec![Vec::new(); g.modules.len()];
    for m in &g.modules {
        if let Some(p) = m.parent {
            let last = m.path.rsplit('.').next().unwrap_or(&m.path);
            children[p.0 as usize].push(last);
        }
    }
    let kinds: Vec<Option<String>> = g
        .modules
        .iter()
        .zip(&mut children)
        .map(|(m, kids)| {
            let numbered = m
                .path
                .rsplit('.')
                .next()
                .is_some_and(|s| s.parse::<u64>().is_ok());
            (numbered && m.kind == "Module" && !kids.is_empty()).then(|| {
                kids.sort_unstable();
                format!("Module({})", kids.join(","))
            })
        })
        .collect();
    for (i, k) in kinds.into_iter().enumerate() {
        if let Some(k) = k {
            g.set_module_kind(ModuleId(i as u32), &k);
        }
    }
}

fn from_metadata(g: &mut Graph, node: &NodeProto) -> Option<ModuleId> {
    let get = |k: &str| {
        node.metadata_props
            .iter()
            .find(|p| p.key == k)
            .map(|p| p.value.as_str())
    };
    let scopes = parse_list(get(SCOPES)?)?;
    let classes = get(CLASSES).and_then(parse_list).unwrap_or_default();
    if let Some(root) = classes.first() {
        g.set_module_kind(ModuleId::ROOT, short_class(root));
    }
    let mut m = ModuleId::ROOT;
    for (i, path) in scopes.iter().enumerate().skip(1) {
        let class = classes.get(i).map(|c| short_class(c));
        // The last entry is the op itself (`aten.mm.default`), not a module.
        if class.is_some_and(|c| !c.starts_with(char::is_uppercase)) || !valid_path(path) {
            break;
        }
        m = intern(g, path, class);
    }
    Some(m)
}

/// The module path of a TorchScript node name (`/h.0/attn/MatMul` ->
/// `h.0.attn`). A container the model calls itself (a `Sequential`) has a
/// scope of its own before its children's, which the exporter names by
/// their path from the container's parent (`/layer1/layer1.0/conv1/Conv`):
/// that child is `layer1.0`, as its parameters are named.
fn ts_path(name: &str) -> Option<String> {
    let rest = name.strip_prefix('/')?;
    let (scopes, _op) = rest.rsplit_once('/')?;
    let mut path: Vec<&str> = Vec::new();
    for scope in scopes.split('/') {
        if let Some(&last) = path.last() {
            if scope.strip_prefix(last).is_some_and(|r| r.starts_with('.')) {
                path.pop();
            }
        }
        path.push(scope);
    }
    Some(path.join("."))
}

#[cfg(test)]
fn from_node_name(g: &mut Graph, name: &str) -> Option<ModuleId> {
    let path = ts_path(name)?;
    valid_path(&path).then(|| intern(g, &path, None))
}

/// The module at `path` with class `kind` (kept as it is when unknown).
fn intern(g: &mut Graph, path: &str, kind: Option<&str>) -> ModuleId {
    let m = g.module(path, kind.unwrap_or("Module"));
    if let Some(k) = kind {
        g.set_module_kind(m, k);
    }
    m
}

/// `torch.nn.modules.linear.Linear` -> `Linear`; `__main__.Block` -> `Block`.
fn short_class(c: &str) -> &str {
    c.rsplit('.').next().unwrap_or(c)
}

pub(crate) fn valid_path(p: &str) -> bool {
    !p.is_empty()
        && p.split('.')
            .all(|s| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_'))
}

/// A Python list literal of strings (`['', 'a.b']`) as its elements.
pub(crate) fn parse_list(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('[')?.strip_suffix(']')?;
    let mut out = Vec::new();
    let mut chars = inner.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace() || *c == ',') {
            chars.next();
        }
        let Some(q) = chars.next() else {
            return Some(out);
        };
        if q != '\'' && q != '"' {
            return None;
        }
        let mut item = String::new();
        loop {
            match chars.next()? {
                '\\' => item.push(chars.next()?),
                c if c == q => break,
                c => item.push(c),
            }
        }
        out.push(item);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn python_lists_parse() {
        assert_eq!(
            parse_list("['', 'h.0', \"h.0.attn\"]"),
            Some(vec!["".into(), "h.0".into(), "h.0.attn".into()])
        );
        assert_eq!(parse_list("[]"), Some(vec![]));
        assert_eq!(parse_list("['a"), None);
        assert_eq!(parse_list("nope"), None);
    }

    #[test]
    fn unnamed_params_join_their_reader() {
        let mut g = Graph::new("t");
        let m = g.module("blocks.0.mlp", "Module");
        let spec = fsdpc_ir::ParamSpec {
            name: "onnx::MatMul_7".into(),
            ty: fsdpc_ir::TensorType::new(fsdpc_ir::DType::F32, [2, 2]),
            init: fsdpc_ir::Init::Zeros,
            requires_grad: true,
            tied_to: None,
            tp: None,
        };
        let w = g.add_param(spec, ModuleId::ROOT);
        let x = g.add_input("x", fsdpc_ir::TensorType::new(fsdpc_ir::DType::F32, [3, 2]));
        let mm = Op::MatMul {
            trans_a: false,
            trans_b: false,
        };
        g.add1(mm, &[x, w], "mm", m)
            .unwrap_or_else(|e| panic!("{e}"));
        adopt_orphan_params(&mut g);
        assert_eq!(g.node(w.node).module, m);
    }

    #[test]
    fn torchscript_names_give_paths() {
        let mut g = Graph::new("t");
        let m = from_node_name(&mut g, "/blocks.0/attn/MatMul");
        assert_eq!(
            m.map(|m| g.module_info(m).path.clone()).as_deref(),
            Some("blocks.0.attn")
        );
        assert_eq!(from_node_name(&mut g, "/MatMul"), None);
        assert_eq!(
            ts_path("/model/layer1/layer1.0/conv1/Conv").as_deref(),
            Some("model.layer1.0.conv1")
        );
        assert_eq!(from_node_name(&mut g, "MatMul_3"), None);
    }

    #[test]
    fn a_wrapper_segment_the_parameters_lack_is_skipped() {
        let mut graph = GraphProto::new();
        let mut t = onnx_protobuf::TensorProto::new();
        t.name = "encoder.layer.0.dense.bias".into();
        graph.initializer.push(t);
        let mut n = NodeProto::new();
        n.name = "/model/encoder/layer.0/dense/Add".into();
        graph.node.push(n.clone());
        assert_eq!(node_path_skip(&graph), 1);
        let mut g = Graph::new("t");
        let m = node_module(&mut g, &n, 1);
        assert_eq!(g.module_info(m).path, "encoder.layer.0.dense");
        graph.initializer[0].name = "model.encoder.layer.0.dense.bias".into();
        assert_eq!(node_path_skip(&graph), 0);
        // A called container's own scope is not a wrapper: `/model/model.0`
        // is the container `model`'s child `model.0`.
        graph.initializer[0].name = "model.0.encoder.layer.0.dense.bias".into();
        graph.node[0].name = "/model/model.0/encoder/layer.0/dense/Add".into();
        assert_eq!(node_path_skip(&graph), 0);
        let m = node_module(&mut g, &graph.node[0], 0);
        assert_eq!(g.module_info(m).path, "model.0.encoder.layer.0.dense");
    }
}
