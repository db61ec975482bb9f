//! PyTorch names of initializers the exporter renamed. The dynamo exporter's
//! optimiser folds `Transpose(W)` of a `Linear` weight into a constant named
//! `val_N`, so the file holds `W` transposed under a made-up name. The file's
//! metadata still says what it was:
//! 1. the `value_info` of `val_N` lists what it was folded from
//!    (`pkg.onnxscript.optimizer.folded_from = "['model.lm_head.weight']"`);
//! 2. failing that, the node that reads it records the FX node it came from
//!    (`pkg.torch.onnx.fx_node`: `aten.linear(%x, %p_lm_head_weight)`) and its
//!    module path (`pkg.torch.onnx.name_scopes`: `[..., 'lm_head', 'linear']`),
//!    which together spell `lm_head.weight`.
//!
//! A name is recovered only when its orientation is known too: every reader
//! is an `aten.linear` reading it as the weight of a `MatMul` (so it holds
//! `W` transposed) or of a `Gemm` (transposed unless `transB`). The import
//! names the parameter after `W` in PyTorch's orientation; the write-back
//! uses the same function to find the initializer again.

use super::names::{parse_list, valid_path};
use onnx_protobuf::{GraphProto, NodeProto};
use std::collections::{HashMap, HashSet};

const FOLDED_FROM: &str = "pkg.onnxscript.optimizer.folded_from";
const FX_NODE: &str = "pkg.torch.onnx.fx_node";
const SCOPES: &str = "pkg.torch.onnx.name_scopes";
const LINEAR: &str = "target=torch.ops.aten.linear.";

/// The PyTorch parameter an initializer holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Recovered {
    /// The parameter's name (`model.lm_head.weight`).
    pub name: String,
    /// True when the initializer holds the parameter transposed (a 2-D
    /// `[in, out]` for PyTorch's `[out, in]`).
    pub transposed: bool,
}

/// Every initializer of `graph` whose PyTorch name the metadata gives, by
/// initializer name. A name already used in the file, or recovered for two
/// initializers, is not recovered.
pub(crate) fn recovered_params(graph: &GraphProto) -> HashMap<String, Recovered> {
    let readers = readers(graph);
    let folded = folded_from(graph);
    let mut found: HashMap<String, Recovered> = HashMap::new();
    for t in graph.initializer.iter().filter(|t| t.dims.len() == 2) {
        let users = readers.get(t.name.as_str()).map_or(&[][..], Vec::as_slice);
        let Some(transposed) = orientation(users) else {
            continue;
        };
        let name = folded
            .get(t.name.as_str())
            .filter(|s| users.iter().all(|(n, _)| fx_names(n, s)))
            .map(|s| s.to_string())
            .or_else(|| from_fx(users));
        if let Some(name) = name {
            found.insert(t.name.clone(), Recovered { name, transposed });
        }
    }
    let taken = names_in_file(graph);
    let mut count: HashMap<String, usize> = HashMap::new();
    for r in found.values() {
        *count.entry(r.name.clone()).or_default() += 1;
    }
    found.retain(|_, r| count.get(&r.name) == Some(&1) && !taken.contains(r.name.as_str()));
    found
}

/// The nodes reading each value, with the input slot.
fn readers(graph: &GraphProto) -> HashMap<&str, Vec<(&NodeProto, usize)>> {
    let mut out: HashMap<&str, Vec<(&NodeProto, usize)>> = HashMap::new();
    for n in &graph.node {
        for (i, name) in n.input.iter().enumerate() {
            out.entry(name.as_str()).or_default().push((n, i));
        }
    }
    out
}

/// Values folded from one value that looks like a parameter name (a dotted
/// path), from `value_info` metadata.
fn folded_from(graph: &GraphProto) -> HashMap<&str, String> {
    graph
        .value_info
        .iter()
        .filter_map(|v| {
            let p = v.metadata_props.iter().find(|p| p.key == FOLDED_FROM)?;
            let mut src = parse_list(&p.value)?;
            let s = src.pop().filter(|s| src.is_empty() && is_param_name(s))?;
            Some((v.name.as_str(), s))
        })
        .collect()
}

/// `a.b.weight`: a module path and a leaf.
fn is_param_name(s: &str) -> bool {
    valid_path(s) && s.contains('.')
}

/// Whether the readers hold the weight transposed: `Some` only when every
/// reader is an `aten.linear` reading it as its weight.
fn orientation(users: &[(&NodeProto, usize)]) -> Option<bool> {
    let mut all = users.iter().map(|&(n, slot)| {
        let linear = meta(n, FX_NODE).is_some_and(|fx| fx.contains(LINEAR));
        match (n.op_type.as_str(), slot, linear) {
            ("MatMul", 1, true) => Some(true),
            ("Gemm", 1, true) => Some(!trans_b(n)),
            _ => None,
        }
    });
    let first = all.next()??;
    all.all(|o| o == Some(first)).then_some(first)
}

fn trans_b(n: &NodeProto) -> bool {
    n.attribute.iter().any(|a| a.name == "transB" && a.i != 0)
}

fn meta<'a>(n: &'a NodeProto, key: &str) -> Option<&'a str> {
    n.metadata_props
        .iter()
        .find(|p| p.key == key)
        .map(|p| p.value.as_str())
}

/// The weight argument of an `aten.linear` FX node
/// (`aten.linear.default](args = (%x, %p_lm_head_weight, ...)` -> `p_lm_head_weight`).
fn linear_weight_arg(fx: &str) -> Option<&str> {
    let args = fx.split_once("args = (")?.1;
    let weight = args.split(", ").nth(1)?;
    let weight = weight.strip_prefix('%')?;
    let end = weight
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(weight.len());
    Some(&weight[..end])
}

/// torch.export's placeholder name of parameter `name` (`a.b.weight` -> `p_a_b_weight`).
fn placeholder(name: &str) -> String {
    format!("p_{}", name.replace('.', "_"))
}

/// True when `n` has no FX node, or its FX node's weight is parameter `name`.
fn fx_names(n: &NodeProto, name: &str) -> bool {
    meta(n, FX_NODE)
        .and_then(linear_weight_arg)
        .is_none_or(|w| w == placeholder(name))
}

/// The parameter name the readers' FX node and module path spell, when they
/// agree: module `lm_head` and weight `%p_lm_head_weight` give `lm_head.weight`.
fn from_fx(users: &[(&NodeProto, usize)]) -> Option<String> {
    let mut names = users.iter().map(|(n, _)| {
        let weight = linear_weight_arg(meta(n, FX_NODE)?)?;
        let scopes = parse_list(meta(n, SCOPES)?)?;
        // The last scope is the op itself (`linear`), the one before it the module.
        let module = scopes.iter().rev().nth(1).filter(|p| valid_path(p))?;
        let leaf = weight
            .strip_prefix(&placeholder(module))?
            .strip_prefix('_')?;
        let name = format!("{module}.{leaf}");
        is_param_name(&name).then_some(name)
    });
    let first = names.next()??;
    names.all(|n| n.as_ref() == Some(&first)).then_some(first)
}

/// Every value name the file uses: initializers, inputs and node outputs.
fn names_in_file(graph: &GraphProto) -> HashSet<&str> {
    let inits = graph.initializer.iter().map(|t| t.name.as_str());
    let inputs = graph.input.iter().map(|v| v.name.as_str());
    let outputs = graph
        .node
        .iter()
        .flat_map(|n| n.output.iter().map(String::as_str));
    inits.chain(inputs).chain(outputs).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use onnx_protobuf::{StringStringEntryProto, TensorProto, ValueInfoProto};

    fn entry(key: &str, value: &str) -> StringStringEntryProto {
        StringStringEntryProto {
            key: key.into(),
            value: value.into(),
            ..Default::default()
        }
    }

    /// `y = MatMul(x, w)` from `aten.linear(x, %p_<weight>)` in module `module`.
    fn linear(op: &str, w: &str, module: &str, weight: &str) -> NodeProto {
        let fx = format!(
            "%linear : [num_users=1] = call_function[target=torch.ops.aten.linear.default]\
             (args = (%x, %{}), kwargs = {{}})",
            placeholder(weight)
        );
        NodeProto {
            op_type: op.into(),
            input: vec!["x".into(), w.into()],
            output: vec![format!("{w}_out")],
            metadata_props: vec![
                entry(FX_NODE, &fx),
                entry(SCOPES, &format!("['', '{module}', 'linear']")),
            ],
            ..Default::default()
        }
    }

    fn init(name: &str) -> TensorProto {
        TensorProto {
            name: name.into(),
            dims: vec![4, 3],
            ..Default::default()
        }
    }

    fn folded(name: &str, from: &str) -> ValueInfoProto {
        ValueInfoProto {
            name: name.into(),
            metadata_props: vec![entry(FOLDED_FROM, &format!("['{from}']"))],
            ..Default::default()
        }
    }

    #[test]
    fn folded_linear_weights_get_their_names_back() {
        let mut g = GraphProto::new();
        g.initializer = vec![init("val_1"), init("val_2"), init("val_3")];
        g.value_info = vec![folded("val_1", "h.0.fc.weight")];
        g.node = vec![
            linear("MatMul", "val_1", "h.0.fc", "h.0.fc.weight"),
            // No folded_from: the FX node and the module path spell it.
            linear("MatMul", "val_2", "h.0.proj", "h.0.proj.weight"),
            // A Gemm without transB reads it as [in, out] too.
            linear("Gemm", "val_3", "head", "head.weight"),
        ];
        let r = recovered_params(&g);
        let got = |n: &str| r.get(n).map(|r| (r.name.as_str(), r.transposed));
        assert_eq!(got("val_1"), Some(("h.0.fc.weight", true)));
        assert_eq!(got("val_2"), Some(("h.0.proj.weight", true)));
        assert_eq!(got("val_3"), Some(("head.weight", true)));
    }

    #[test]
    fn unknown_orientation_disagreement_or_a_taken_name_recover_nothing() {
        let mut g = GraphProto::new();
        g.initializer = vec![
            init("val_1"),
            init("val_2"),
            init("fc.weight"),
            init("val_4"),
        ];
        g.value_info = vec![
            folded("val_1", "a.weight"),
            folded("val_2", "b.weight"),
            folded("val_4", "fc.weight"),
        ];
        let mut add = linear("Add", "val_1", "a", "a.weight");
        add.input.swap(0, 1);
        g.node = vec![
            // Not a linear's weight: orientation unknown.
            add,
            // folded_from and the FX node disagree.
            linear("MatMul", "val_2", "b", "c.weight"),
            // The file already has a `fc.weight`.
            linear("MatMul", "val_4", "fc", "fc.weight"),
        ];
        assert_eq!(recovered_params(&g), HashMap::new());
    }

    #[test]
    fn fx_weight_arguments_parse() {
        let fx = "%linear_3 : [num_users=1] = call_function[target=torch.ops.aten.linear.default]\
                  (args = (%gelu, %p_transformer_h_0_mlp_c_proj_weight, %p_b), kwargs = {})";
        assert_eq!(
            linear_weight_arg(fx),
            Some("p_transformer_h_0_mlp_c_proj_weight")
        );
        assert_eq!(linear_weight_arg("no args"), None);
    }
}
