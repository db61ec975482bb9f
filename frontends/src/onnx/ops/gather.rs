//! Indexing — ONNX operators Gather (opsets 13–21: numpy `take` along one
//! axis), GatherElements (13+: `torch.gather`) and GatherND (13+, with
//! `batch_dims` 0: advanced indexing such as `mask[batch_idx, kv_idx]`).
//! Gathers on constants fold (the `Shape -> Gather` of reshape
//! computations); negative constant indices are normalised.
//!
//! GatherElements and GatherND need constant indices (exporters build them
//! from `Range`s that fold): the picked elements are then known, and the node
//! becomes a `Reshape` of the data to the gathered axes flattened into one
//! and a `Gather` of those flat positions.

use super::Convert;
use crate::onnx::context::{norm_axis, NodeCx, Val};
use crate::onnx::tensor::{check_size, strides, HostTensor};
use fsdpc_ir::{DType, Op};

pub(super) const OPS: &[(&str, Convert)] = &[
    ("Gather", gather),
    ("GatherElements", gather_elements),
    ("GatherND", gather_nd),
];

fn gather(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let data_ty = cx.ty(0)?;
    let axis = norm_axis(cx.attr_i("axis", 0)?, data_ty.shape.rank())?;
    let dim = data_ty.shape.dims()[axis];
    let indices = match cx.val(1)? {
        Val::Const(t) => Some(normalise(t, dim)?),
        Val::Ir(_) => None,
    };
    if let (Val::Const(data), Some(idx)) = (cx.val(0)?, &indices) {
        let y = fold(data, idx, axis)?;
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let data = cx.ir(0)?;
    let idx = match indices {
        Some(t) => cx.constant(&t)?,
        None => cx.ir(1)?,
    };
    let y = cx.add(Op::Gather { axis }, &[data, idx], "gather")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

/// Constant indices with negatives counted from the end, checked against `dim`.
fn normalise(t: &HostTensor, dim: usize) -> Result<HostTensor, String> {
    let d = dim as i64;
    let v = t
        .as_i64()
        .into_iter()
        .map(|i| {
            let j = if i < 0 { i + d } else { i };
            if (0..d).contains(&j) {
                Ok(j)
            } else {
                Err(format!(
                    "index {i} is out of range for a dimension of {dim}"
                ))
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(HostTensor::ints(t.dtype, t.shape.clone(), v))
}

fn fold(data: &HostTensor, idx: &HostTensor, axis: usize) -> Result<HostTensor, String> {
    let mut shape = data.shape[..axis].to_vec();
    shape.extend(&idx.shape);
    shape.extend(&data.shape[axis + 1..]);
    check_size(&shape)?;
    let dim = data.shape[axis];
    let outer: usize = data.shape[..axis].iter().product();
    let inner: usize = data.shape[axis + 1..].iter().product();
    let ids = idx.as_i64();
    let mut flat = Vec::with_capacity(shape.iter().product());
    for o in 0..outer {
        for &i in &ids {
            let base = (o * dim + i as usize) * inner;
            flat.extend(base..base + inner);
        }
    }
    Ok(data.pick(&flat, shape))
}

/// A constant index, negatives counted from the end, checked against `dim`.
fn index(i: i64, dim: usize) -> Result<usize, String> {
    let d = dim as i64;
    let j = if i < 0 { i + d } else { i };
    if (0..d).contains(&j) {
        Ok(j as usize)
    } else {
        Err(format!(
            "index {i} is out of range for a dimension of {dim}"
        ))
    }
}

/// The constant indices of input 1, or why they must be constant.
fn const_indices(cx: &NodeCx<'_>) -> Result<HostTensor, String> {
    match cx.val(1)? {
        Val::Const(t) => Ok(t.clone()),
        Val::Ir(_) => Err(
            "indices computed at run time are not supported (only constant \
                           indices, which fold from the exporter's Range/Shape arithmetic)"
                .into(),
        ),
    }
}

/// GatherElements: `out[i][j][k] = data[i][idx[i][j][k]][k]` for axis 1.
fn gather_elements(cx: &mut NodeCx<'_>) -> Result<(), String> {
    let data_ty = cx.ty(0)?;
    let dims = data_ty.shape.dims().to_vec();
    let axis = norm_axis(cx.attr_i("axis", 0)?, dims.len())?;
    let idx = const_indices(cx)?;
    let pos = element_positions(&dims, &idx, axis)?;
    pick(cx, &dims, dims.len(), &pos, idx.shape.clone())
}

/// Flat positions in `data` of GatherElements' output elements.
fn element_positions(data: &[usize], idx: &HostTensor, axis: usize) -> Result<Vec<usize>, String> {
    if idx.shape.len() != data.len()
        || idx
            .shape
            .iter()
            .zip(data)
            .enumerate()
            .any(|(j, (i, d))| j != axis && i > d)
    {
        return Err(format!(
            "indices {:?} do not fit data {data:?} outside axis {axis}",
            idx.shape
        ));
    }
    let (ds, is) = (strides(data), strides(&idx.shape));
    idx.as_i64()
        .into_iter()
        .enumerate()
        .map(|(n, v)| {
            let mut pos = 0;
            for j in 0..data.len() {
                let coord = if j == axis {
                    index(v, data[axis])?
                } else {
                    n / is[j] % idx.shape[j]
                };
                pos += coord * ds[j];
            }
            Ok(pos)
        })
        .collect()
}

/// GatherND with `batch_dims` 0: the last axis of the indices addresses the
/// leading `k` axes of the data; the output is
/// `indices.shape[..-1] ++ data.shape[k..]`.
fn gather_nd(cx: &mut NodeCx<'_>) -> Result<(), String> {
    if cx.attr_i("batch_dims", 0)? != 0 {
        return Err("batch_dims other than 0 is not supported".into());
    }
    let dims = cx.ty(0)?.shape.dims().to_vec();
    let idx = const_indices(cx)?;
    let Some((&k, lead)) = idx.shape.split_last() else {
        return Err("indices must have rank >= 1".into());
    };
    if k == 0 || k > dims.len() {
        return Err(format!(
            "index tuples of length {k} for data of rank {}",
            dims.len()
        ));
    }
    let st = strides(&dims[..k]);
    let pos = idx
        .as_i64()
        .chunks(k)
        .map(|t| {
            t.iter()
                .zip(&dims[..k])
                .zip(&st)
                .map(|((&v, &d), &s)| Ok(index(v, d)? * s))
                .sum::<Result<usize, String>>()
        })
        .collect::<Result<Vec<_>, String>>()?;
    pick(cx, &dims, k, &pos, lead.to_vec())
}

/// Output 0 = the data with its leading `k` axes flattened into one, gathered
/// at the flat positions `pos` along it, shaped `lead ++ dims[k..]`. Folds on
/// constant data.
fn pick(
    cx: &mut NodeCx<'_>,
    dims: &[usize],
    k: usize,
    pos: &[usize],
    lead: Vec<usize>,
) -> Result<(), String> {
    let mut flat = vec![dims[..k].iter().product::<usize>()];
    flat.extend(&dims[k..]);
    let mut out = lead.clone();
    out.extend(&dims[k..]);
    check_size(&out)?;
    let at = HostTensor::ints(DType::I64, lead, pos.iter().map(|&p| p as i64).collect());
    if let Val::Const(data) = cx.val(0)? {
        let y = fold(&data.reshaped(flat), &at, 0)?;
        cx.set(0, Val::Const(y));
        return Ok(());
    }
    let mut data = cx.ir(0)?;
    if flat != dims {
        data = cx.add(Op::Reshape { shape: flat }, &[data], "flatten")?;
    }
    let at = cx.constant(&at)?;
    let y = cx.add(Op::Gather { axis: 0 }, &[data, at], "gather")?;
    cx.set(0, Val::Ir(y));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::context::Importer;
    use fsdpc_ir::{Graph, ModuleId, TensorType};
    use onnx_protobuf::attribute_proto::AttributeType;
    use onnx_protobuf::{AttributeProto, NodeProto};
    use std::collections::HashMap;

    fn importer() -> Importer {
        Importer {
            g: Graph::new("t"),
            vals: HashMap::new(),
            opset: 18,
            next_seed: 0,
            log_softmax_of: HashMap::new(),
            decode: Box::new(|_| Err("no tensors here".into())),
            bound: HashMap::new(),
            seqs: HashMap::new(),
            from_pytorch: false,
            forward_only: false,
        }
    }

    fn run(
        imp: &mut Importer,
        op: &str,
        ins: &[&str],
        attr: Option<(&str, i64)>,
    ) -> Result<(), String> {
        let node = NodeProto {
            op_type: op.into(),
            name: format!("/m/{op}"),
            input: ins.iter().map(|s| s.to_string()).collect(),
            output: vec!["y".into()],
            attribute: attr
                .map(|(name, i)| AttributeProto {
                    name: name.into(),
                    type_: AttributeType::INT.into(),
                    i,
                    ..AttributeProto::default()
                })
                .into_iter()
                .collect(),
            ..NodeProto::default()
        };
        let convert = OPS.iter().find(|(n, _)| *n == op).map(|(_, c)| *c).unwrap();
        convert(&mut NodeCx {
            imp,
            node: &node,
            module: ModuleId::ROOT,
        })
    }

    fn konst(imp: &mut Importer, name: &str, shape: &[usize], v: &[i64]) {
        let t = HostTensor::ints(DType::I64, shape.to_vec(), v.to_vec());
        imp.vals.insert(name.into(), Val::Const(t));
    }

    fn folded(imp: &Importer) -> (Vec<usize>, Vec<i64>) {
        match imp.vals.get("y") {
            Some(Val::Const(t)) => (t.shape.clone(), t.as_i64()),
            other => panic!("y is not a constant: {other:?}"),
        }
    }

    #[test]
    fn gather_elements_folds_like_torch_gather() {
        let mut imp = importer();
        // data [[1, 2], [3, 4]], gather(dim=1, [[0, 0], [1, 0]]) = [[1, 1], [4, 3]]
        konst(&mut imp, "d", &[2, 2], &[1, 2, 3, 4]);
        konst(&mut imp, "i", &[2, 2], &[0, 0, -1, 0]);
        run(&mut imp, "GatherElements", &["d", "i"], Some(("axis", 1))).unwrap();
        assert_eq!(folded(&imp), (vec![2, 2], vec![1, 1, 4, 3]));
        // axis 0, indices smaller than the data along the other axis
        konst(&mut imp, "j", &[1, 2], &[1, 0]);
        run(&mut imp, "GatherElements", &["d", "j"], Some(("axis", 0))).unwrap();
        assert_eq!(folded(&imp), (vec![1, 2], vec![3, 2]));
        konst(&mut imp, "oob", &[1, 2], &[2, 0]);
        let e = run(&mut imp, "GatherElements", &["d", "oob"], None).unwrap_err();
        assert!(e.contains("out of range"), "{e}");
    }

    #[test]
    fn gather_nd_of_a_graph_value_is_a_gather_of_flat_positions() {
        let mut imp = importer();
        let x = imp
            .g
            .add_input("m", TensorType::new(DType::I64, vec![2, 3, 4]));
        imp.vals.insert("m".into(), Val::Ir(x));
        // m[[0, 1], [2, -1]]: rows (0, 2) and (1, 2) -> flat rows 2 and 5.
        konst(&mut imp, "i", &[2, 2], &[0, 2, 1, -1]);
        run(&mut imp, "GatherND", &["m", "i"], None).unwrap();
        let Some(Val::Ir(y)) = imp.vals.get("y") else {
            panic!("y is a graph value")
        };
        assert_eq!(imp.g.value_type(*y).shape.dims(), &[2, 4]);
        let gather = imp.g.node(y.node);
        assert_eq!(gather.op, Op::Gather { axis: 0 });
        let ins = imp.g.inputs(y.node);
        assert_eq!(imp.g.value_type(ins[0]).shape.dims(), &[6, 4]);
        let Op::Constant { value } = &imp.g.node(ins[1].node).op else {
            panic!("constant positions")
        };
        assert_eq!(HostTensor::from_data(value).unwrap().as_i64(), vec![2, 5]);
    }

    #[test]
    fn gather_nd_folds_and_refuses_what_it_cannot_do() {
        let mut imp = importer();
        konst(&mut imp, "d", &[2, 2], &[1, 2, 3, 4]);
        konst(&mut imp, "i", &[3, 2], &[0, 1, 1, 0, 1, 1]);
        run(&mut imp, "GatherND", &["d", "i"], None).unwrap();
        assert_eq!(folded(&imp), (vec![3], vec![2, 3, 4]));
        let e = run(&mut imp, "GatherND", &["d", "i"], Some(("batch_dims", 1))).unwrap_err();
        assert!(e.contains("batch_dims"), "{e}");
        let ids = imp
            .g
            .add_input("ids", TensorType::new(DType::I64, vec![1, 2]));
        imp.vals.insert("ids".into(), Val::Ir(ids));
        let e = run(&mut imp, "GatherND", &["d", "ids"], None).unwrap_err();
        assert!(e.contains("constant"), "{e}");
        konst(&mut imp, "long", &[1, 3], &[0, 0, 0]);
        assert!(run(&mut imp, "GatherND", &["d", "long"], None).is_err());
    }
}
