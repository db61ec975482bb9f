//! Module paths and kinds of imported nodes, so FSDP units can follow the
//! PyTorch module tree. In order of preference:
//! 1. the node's `metadata_props` written by the dynamo exporter
//!    (`pkg.torch.onnx.name_scopes = ['', 'h.0', 'h.0.attn', 'matmul']` with
//!    `pkg.torch.onnx.class_hierarchy = ['GPT', 'Block', 'Attention', 'aten.mm']`);
//! 2. TorchScript-exporter node names (`/h.0/attn/MatMul` -> `h.0.attn`);
//! 3. for parameters, the initializer name (`h.0.attn.c_attn.weight` -> `h.0.attn.c_attn`),
//!    else (`onnx::MatMul_123`, a weight the exporter transposed) the module of
//!    the node that reads it, so it lands in the right FSDP unit.

use fsdpc_ir::{Graph, ModuleId, Op, ValueId};
use onnx_protobuf::NodeProto;

const SCOPES: &str = "pkg.torch.onnx.name_scopes";
const CLASSES: &str = "pkg.torch.onnx.class_hierarchy";

/// The module of `node`, created in `g` with its kinds if new.
pub(crate) fn node_module(g: &mut Graph, node: &NodeProto) -> ModuleId {
    if let Some(m) = from_metadata(g, node) {
        return m;
    }
    from_node_name(g, &node.name).unwrap_or(ModuleId::ROOT)
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

fn from_node_name(g: &mut Graph, name: &str) -> Option<ModuleId> {
    let rest = name.strip_prefix('/')?;
    let (scopes, _op) = rest.rsplit_once('/')?;
    let path = scopes.split('/').collect::<Vec<_>>().join(".");
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

fn valid_path(p: &str) -> bool {
    !p.is_empty()
        && p.split('.')
            .all(|s| !s.is_empty() && s.chars().all(|c| c.is_alphanumeric() || c == '_'))
}

/// A Python list literal of strings (`['', 'a.b']`) as its elements.
fn parse_list(s: &str) -> Option<Vec<String>> {
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
        assert_eq!(from_node_name(&mut g, "MatMul_3"), None);
    }
}
