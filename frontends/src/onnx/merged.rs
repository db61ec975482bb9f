//! Initializers the exporter merged. The dynamo exporter's optimiser
//! (`torch.onnx.export(..., dynamo=True)`, on by default) replaces equal
//! initializers by one: in a freshly initialised model every LayerNorm's
//! all-ones weight (and all-zeros bias) becomes a single tensor named after
//! the first of them. Imported as is, that tensor would train as one tied
//! parameter of several modules, which the source model never had.
//!
//! A merge is told from a genuine tie (GPT-2's `wte` read by the embedding
//! and, transposed, by `lm_head`) by its structure: a parameter whose
//! elements are all equal, read (in the forward pass) by nodes of two or
//! more different modules. A genuine tie holds trained, varied values.
//! [`merged_initializers`] finds them; [`untie_merged`] gives each module
//! its own copy, initialised to the same values and named after that module
//! (`h.1.ln_2.weight` beside the file's `h.0.ln_1.weight`).
//!
//! The same optimiser drops the `Add` of an all-zero bias after a matrix
//! product (GPT-2's fresh `Conv1D` biases: a `Gemm` without `C`), and with it
//! the bias initializer; nothing in the file is left to untie, so the warning
//! says so and points to `optimize=False`.

use fsdpc_ir::{Graph, Init, ModuleId, NodeId, Op, ParamSpec, Phase, TensorData, ValueId};
use std::collections::HashSet;
use std::fmt;

/// One merged initializer: its name, the value all its elements hold, and
/// the modules that read it.
#[derive(Clone, Debug, PartialEq)]
pub struct MergedInitializer {
    /// The initializer's (and parameter's) name in the file.
    pub name: String,
    /// The value every element holds.
    pub value: f64,
    /// The module paths of its readers, in graph order.
    pub modules: Vec<String>,
}

impl fmt::Display for MergedInitializer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "initializer `{}` (every element {}) is read by {} modules ({}): the exporter \
             merged equal initializers, so they would train as one tied parameter; pass \
             --untie-merged-initializers to give each module its own copy, or export with \
             torch.onnx.export(..., optimize=False). The same optimisation also removes \
             any all-zero bias added to a matrix product (a fresh Linear's or Conv1D's) \
             from the file; untying cannot bring those back, so such a model trains with \
             fewer parameters than the PyTorch module (optimize=False keeps them)",
            self.name,
            self.value,
            self.modules.len(),
            self.modules.join(", ")
        )
    }
}

/// A merged parameter and its forward readers grouped by module.
struct Merge {
    spec: ParamSpec,
    fill: f64,
    groups: Vec<(ModuleId, Vec<(NodeId, u32)>)>,
}

/// Every merged initializer of `g` (see the module documentation).
pub fn merged_initializers(g: &Graph) -> Vec<MergedInitializer> {
    merges(g)
        .into_iter()
        .map(|m| MergedInitializer {
            name: m.spec.name,
            value: m.fill,
            modules: m
                .groups
                .iter()
                .map(|(module, _)| g.module_info(*module).path.clone())
                .collect(),
        })
        .collect()
}

/// Gives every module that reads a merged initializer its own parameter,
/// initialised to the same values: the module the file's name belongs to
/// keeps it (else the first reader's), each other module gets
/// `<module path>.<last segment of the name>`. Returns the merges undone.
pub fn untie_merged(g: &mut Graph) -> Vec<MergedInitializer> {
    let found = merged_initializers(g);
    let mut names: HashSet<String> = g.params.iter().map(|p| p.name.clone()).collect();
    for m in merges(g) {
        let (stem, suffix) = m.spec.name.rsplit_once('.').unwrap_or(("", &m.spec.name));
        let keeper = m
            .groups
            .iter()
            .position(|(module, _)| g.module_info(*module).path == stem)
            .unwrap_or(0);
        for (i, (module, users)) in m.groups.iter().enumerate() {
            if i == keeper {
                continue;
            }
            let path = &g.module_info(*module).path;
            let mut name = format!("{path}.{suffix}");
            if names.contains(&name) {
                name = format!("{path}.{}", m.spec.name);
            }
            names.insert(name.clone());
            let spec = ParamSpec {
                name,
                tied_to: None,
                tp: None,
                ..m.spec.clone()
            };
            let copy = g.add_param(spec, *module);
            for &(user, slot) in users {
                g.set_input(user, slot, copy);
            }
        }
    }
    found
}

/// The merged parameters of `g`, in parameter order.
fn merges(g: &Graph) -> Vec<Merge> {
    let mut params: Vec<(NodeId, usize)> = g
        .node_ids()
        .filter_map(|n| match g.node(n).op {
            Op::Param { param } => Some((n, param.0 as usize)),
            _ => None,
        })
        .collect();
    params.sort_by_key(|&(_, p)| p);
    params
        .into_iter()
        .filter_map(|(n, p)| {
            let spec = g.params.get(p)?;
            let Init::Data { data } = &spec.init else {
                return None;
            };
            let fill = uniform(data)?;
            let value = ValueId { node: n, slot: 0 };
            let groups = readers_by_module(g, value);
            (groups.len() >= 2).then(|| Merge {
                spec: spec.clone(),
                fill,
                groups,
            })
        })
        .collect()
}

/// The value every element of `data` holds, for a float tensor of two or
/// more elements that holds one value.
fn uniform(data: &TensorData) -> Option<f64> {
    let w = data.ty.dtype.size();
    if !data.ty.dtype.is_float() || data.ty.numel() < 2 || w == 0 {
        return None;
    }
    let first = data.bytes.get(..w)?;
    data.bytes
        .chunks_exact(w)
        .all(|c| c == first)
        .then(|| data.get_f64(0))
        .flatten()
}

/// The forward readers of `v` outside the root module, grouped by module in
/// the order of their first reader.
fn readers_by_module(g: &Graph, v: ValueId) -> Vec<(ModuleId, Vec<(NodeId, u32)>)> {
    let mut users = g.users(v);
    users.sort();
    let mut groups: Vec<(ModuleId, Vec<(NodeId, u32)>)> = Vec::new();
    for (user, slot) in users {
        let node = g.node(user);
        if node.phase != Phase::Forward || node.module == ModuleId::ROOT {
            continue;
        }
        match groups.iter_mut().find(|(m, _)| *m == node.module) {
            Some((_, list)) => list.push((user, slot)),
            None => groups.push((node.module, vec![(user, slot)])),
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use fsdpc_ir::{DType, TensorType};

    fn data(values: &[f32]) -> TensorData {
        TensorData {
            ty: TensorType::new(DType::F32, vec![values.len()]),
            bytes: values.iter().flat_map(|v| v.to_le_bytes()).collect(),
        }
    }

    fn param(g: &mut Graph, name: &str, values: &[f32], module: ModuleId) -> ValueId {
        let spec = ParamSpec {
            name: name.into(),
            ty: TensorType::new(DType::F32, vec![values.len()]),
            init: Init::Data { data: data(values) },
            requires_grad: true,
            tied_to: None,
            tp: None,
        };
        g.add_param(spec, module)
    }

    /// Two blocks whose LayerNorms read one weight `w` of `values`, and an
    /// embedding read by two modules (a tie).
    fn graph(values: &[f32]) -> Graph {
        let mut g = Graph::new("t");
        let ln1 = g.module("h.0.ln_1", "LayerNorm");
        let ln2 = g.module("h.1.ln_2", "LayerNorm");
        let head = g.module("lm_head", "Linear");
        let x = g.add_input("x", TensorType::new(DType::F32, vec![2, 3]));
        let w = param(&mut g, "h.0.ln_1.weight", values, ln1);
        let tied = param(&mut g, "wte.weight", &[0.5, -1.0, 2.0], ModuleId::ROOT);
        let ln = |eps| Op::LayerNorm { eps };
        let a = g.add1(ln(1e-5), &[x, w], "ln_1", ln1).unwrap();
        let b = g.add1(ln(1e-5), &[a, w], "ln_2", ln2).unwrap();
        let mul = Op::Binary {
            f: fsdpc_ir::BinaryFn::Mul,
        };
        let y = g.add1(mul.clone(), &[b, tied], "head", head).unwrap();
        g.add1(mul, &[y, tied], "ln_2_again", ln2).unwrap();
        g
    }

    #[test]
    fn an_all_ones_weight_of_two_modules_is_merged_a_varied_one_is_not() {
        let g = graph(&[1.0, 1.0, 1.0]);
        let found = merged_initializers(&g);
        assert_eq!(
            found,
            [MergedInitializer {
                name: "h.0.ln_1.weight".into(),
                value: 1.0,
                modules: vec!["h.0.ln_1".into(), "h.1.ln_2".into()],
            }]
        );
        let msg = found[0].to_string();
        assert!(msg.contains("--untie-merged-initializers") && msg.contains("optimize=False"));
        assert!(msg.contains("removes any all-zero bias"), "{msg}");
        // The same structure with varied values is a tie the model has.
        assert_eq!(merged_initializers(&graph(&[1.0, 2.0, 1.0])), []);
    }

    #[test]
    fn untying_gives_each_module_its_own_copy() {
        let mut g = graph(&[1.0, 1.0, 1.0]);
        let undone = untie_merged(&mut g);
        assert_eq!(undone.len(), 1);
        assert_eq!(merged_initializers(&g), []);
        let names: Vec<&str> = g.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["h.0.ln_1.weight", "wte.weight", "h.1.ln_2.weight"]);
        assert_eq!(g.params[2].init, g.params[0].init);
        // ln_2 now reads the copy, which lives in its module.
        let ln2 = g.node_ids().find(|&n| g.node(n).name == "ln_2").unwrap();
        let w = g.inputs(ln2)[1];
        assert_eq!(
            g.node(w.node).op,
            Op::Param {
                param: fsdpc_ir::ParamId(2)
            }
        );
        assert_eq!(g.module_info(g.node(w.node).module).path, "h.1.ln_2");
        assert!(fsdpc_ir::validate(&g).is_ok());
    }
}
