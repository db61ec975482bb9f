//! Corrupted ONNX files give errors, never panics: random byte changes and
//! truncations of the fixtures are imported and must return `Ok` or `Err`.

use fsdpc_frontends::onnx::import;
use proptest::prelude::*;
use std::collections::HashMap;
use std::path::PathBuf;

fn fixture(name: &str) -> Vec<u8> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name);
    std::fs::read(p).unwrap_or_else(|e| panic!("{e}"))
}

fn try_import(bytes: &[u8]) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
    let path = dir.path().join("m.onnx");
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{e}"));
    let dims: HashMap<String, usize> = [("batch".to_string(), 2), ("seq".to_string(), 4)].into();
    let _ = import(&path, &dims);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn mutated_models_do_not_panic(
        which in 0usize..4,
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let name = ["tiny_gpt.onnx", "mlp.onnx", "mlp_loss.onnx", "gpt_torchscript.onnx"][which];
        let mut bytes = fixture(name);
        for (at, b) in edits {
            let i = at.index(bytes.len());
            bytes[i] = b;
        }
        if truncate {
            bytes.truncate(cut.index(bytes.len()));
        }
        try_import(&bytes);
    }
}

/// Values that break naive index arithmetic.
const NASTY: [i64; 9] = [-3, -1, 0, 1, 2, 7, 1 << 40, i64::MAX, i64::MIN];

/// Sets integer attribute `attr` of node `node` (indices taken modulo) to `v`.
fn mutate_attr(m: &mut onnx_protobuf::ModelProto, node: usize, attr: usize, v: i64) {
    let Some(g) = m.graph.0.as_deref_mut() else {
        return;
    };
    let n = node % g.node.len().max(1);
    if let Some(node) = g.node.get_mut(n) {
        let k = node.attribute.len();
        if let Some(a) = node.attribute.get_mut(attr % k.max(1)) {
            a.i = v;
            a.ints.iter_mut().for_each(|x| *x = v);
        }
    }
}

/// Sets one element of an integer initializer (shape constants) to `v`.
fn mutate_init(m: &mut onnx_protobuf::ModelProto, which: usize, elem: usize, v: i64) {
    let Some(g) = m.graph.0.as_deref_mut() else {
        return;
    };
    let ints: Vec<usize> = (0..g.initializer.len())
        .filter(|&i| g.initializer[i].data_type == 7)
        .collect();
    let Some(&i) = ints.get(which % ints.len().max(1)) else {
        return;
    };
    let t = &mut g.initializer[i];
    if t.raw_data.len() >= 8 {
        let e = elem % (t.raw_data.len() / 8);
        t.raw_data[e * 8..e * 8 + 8].copy_from_slice(&v.to_le_bytes());
    } else {
        let n = t.int64_data.len().max(1);
        if let Some(x) = t.int64_data.get_mut(elem % n) {
            *x = v;
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn nasty_attribute_and_shape_values_do_not_panic(
        which in 0usize..4,
        node in any::<usize>(),
        attr in any::<usize>(),
        init in any::<usize>(),
        elem in any::<usize>(),
        a in 0usize..NASTY.len(),
        b in 0usize..NASTY.len(),
    ) {
        use onnx_protobuf::Message;
        let name = ["tiny_gpt.onnx", "mlp.onnx", "mlp_loss.onnx", "gpt_torchscript.onnx"][which];
        let mut m = onnx_protobuf::ModelProto::parse_from_bytes(&fixture(name)).unwrap_or_default();
        mutate_attr(&mut m, node, attr, NASTY[a]);
        mutate_init(&mut m, init, elem, NASTY[b]);
        try_import(&m.write_to_bytes().unwrap_or_default());
    }
}
