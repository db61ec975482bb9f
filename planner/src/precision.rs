//! Mixed precision (PyTorch FSDP's `MixedPrecision(param_dtype,
//! reduce_dtype, buffer_dtype)`): the policy's parsers and checks, and the
//! pass that retypes a training program to it (`apply`, the `precision`
//! pass, after `freeze` and before units are assigned).
//!
//! Conventions (the schedule, the runtime and `Plan::validate` rely on them):
//! - The master copy is f32 whatever the policy: `ShardParams`, optimizer
//!   state and `ShardGrads` are f32 buffers; the optimizer updates f32.
//! - Parameters are read in `param_dtype`: every floating-point
//!   `ParamSpec` (frozen ones too) is retyped, so the graph's `Param` values
//!   are `param_dtype` and so is the gathered flat parameter (the all-gather
//!   casts each f32 shard before it is sent: the collective moves
//!   `param_dtype` bytes).
//! - Activations follow: the forward graph is rebuilt with every op's output
//!   types inferred again from its (now half) operands; where an op's
//!   floating-point operands would have different dtypes (a value the model
//!   casts to f32 explicitly, an f32 constant), the ones not in
//!   `param_dtype` are cast to it, in the consumer's module.
//! - Data inputs are unchanged (they are loaded as before); a floating-point
//!   input is cast to `param_dtype` right after it is loaded (PyTorch's
//!   `cast_forward_inputs`). Integer inputs (token ids, labels) are not
//!   touched.
//! - Constants (the model's fixed tensors, what PyTorch calls buffers) are
//!   cast to `buffer_dtype` after they are materialised; module buffers
//!   (running statistics) are stored in their own dtype, read through a
//!   cast to `buffer_dtype`, and their new value is cast back before it is
//!   written.
//! - The loss stays f32: the node computing the loss reads f32 casts of its
//!   half operands (what autocast does for `cross_entropy` and what
//!   torchtitan's and nanoGPT's losses do with `.float()`), so the loss and
//!   the first gradients of backward are f32 and the gradient is cast back
//!   to `param_dtype` where it leaves the loss.
//! - Backward is built again by `fsdpc_ir::autodiff` from the retyped
//!   forward: parameter gradients, and so `FlatGrads`, are in
//!   `param_dtype`. The reduction (`reduce_dtype`) converts on the wire.
//! - `reduce_dtype` must be f32 or `param_dtype`: a gradient is computed in
//!   `param_dtype`, and rounding an f32 gradient to a half type before the
//!   reduction would need a cast the schedule does not have.
//! - fp16 (in `param_dtype` or `reduce_dtype`) needs a loss scaler
//!   (`scaler`); bf16 has f32's exponent range and does not.

use crate::config::FsdpConfig;
use crate::error::PlanError;
use fsdpc_ir::{DType, Graph, NodeId, Op, Phase, TrainingProgram, ValueId};
use std::collections::{HashMap, HashSet};

/// The dtypes a policy may name.
pub const ALLOWED: &str = "f32 (fp32, float32), bf16 (bfloat16), fp16 (f16, float16)";

/// Parses one policy dtype: `f32`, `bf16` or `fp16` (and the spellings in
/// `ALLOWED`); `what` names the flag in the error.
pub fn parse_dtype(what: &'static str, s: &str) -> Result<DType, PlanError> {
    match s.trim().to_ascii_lowercase().as_str() {
        "f32" | "fp32" | "float32" => Ok(DType::F32),
        "bf16" | "bfloat16" => Ok(DType::Bf16),
        "fp16" | "f16" | "float16" | "half" => Ok(DType::F16),
        _ => Err(PlanError::BadConfig {
            what,
            value: s.to_string(),
            reason: format!("allowed values: {ALLOWED}"),
        }),
    }
}

/// The `--mixed-precision` shorthand: parameters, reduction and buffers all
/// in `bf16` or `fp16` (or all `f32`).
pub fn parse_mixed(s: &str) -> Result<DType, PlanError> {
    parse_dtype("mixed precision", s)
}

/// Rejects policies the planner cannot honour (see the module header).
pub fn check(cfg: &FsdpConfig) -> Result<(), PlanError> {
    let bad = |what, d: DType, reason: String| PlanError::BadConfig {
        what,
        value: d.to_string(),
        reason,
    };
    for (what, d) in [
        ("param_dtype", cfg.param_dtype),
        ("reduce_dtype", cfg.reduce_dtype),
        ("buffer_dtype", cfg.buffer_dtype),
    ] {
        if !d.is_float() {
            return Err(bad(what, d, format!("allowed values: {ALLOWED}")));
        }
    }
    if cfg.reduce_dtype != DType::F32 && cfg.reduce_dtype != cfg.param_dtype {
        return Err(bad(
            "reduce_dtype",
            cfg.reduce_dtype,
            format!(
                "must be f32 or the param_dtype ({}): gradients are computed in the \
                 param_dtype",
                cfg.param_dtype
            ),
        ));
    }
    if let Some(s) = cfg.init_loss_scale {
        if !(s.is_finite() && s > 0.0) {
            return Err(PlanError::BadConfig {
                what: "init_loss_scale",
                value: s.to_string(),
                reason: "must be a finite number greater than 0".into(),
            });
        }
        if !needs_scaler(cfg) {
            return Err(PlanError::BadConfig {
                what: "init_loss_scale",
                value: s.to_string(),
                reason: "a loss scale needs fp16 parameters or reduction".into(),
            });
        }
    }
    Ok(())
}

/// True when the policy computes or reduces in fp16, so the plan needs a
/// dynamic loss scaler.
pub fn needs_scaler(cfg: &FsdpConfig) -> bool {
    cfg.param_dtype == DType::F16 || cfg.reduce_dtype == DType::F16
}

/// True when `apply` changes the program.
pub fn retypes(cfg: &FsdpConfig) -> bool {
    cfg.param_dtype != DType::F32 || cfg.buffer_dtype != DType::F32
}

/// Retypes `program` to the policy of `cfg` (see the module header); the
/// program is returned unchanged under an all-f32 policy.
pub fn apply(program: TrainingProgram, cfg: &FsdpConfig) -> Result<TrainingProgram, PlanError> {
    let bad = |reason: String| PlanError::Program {
        reason: format!("mixed precision: {reason}"),
    };
    if !retypes(cfg) {
        if let Some(p) = program
            .graph
            .params
            .iter()
            .find(|p| p.ty.dtype.is_float() && p.ty.dtype != DType::F32)
        {
            return Err(bad(format!(
                "parameter `{}` is {} but the param dtype is f32; give --param-dtype {}",
                p.name, p.ty.dtype, p.ty.dtype
            )));
        }
        return Ok(program);
    }
    let loss = program.loss;
    let mut forward = forward_of(&program.graph, loss);
    let kept: HashSet<NodeId> = forward.node_ids().collect();
    retype(&mut forward, loss, cfg).map_err(|e| bad(e.to_string()))?;
    let (forward, loss) = just_in_time(&forward, loss, &kept).map_err(|e| bad(e.to_string()))?;
    fsdpc_ir::build_training_program(forward, loss, program.optimizer)
        .map_err(|e| bad(e.to_string()))
}

/// `g` renumbered with the nodes not in `kept` (those a pass inserted)
/// right before their first reader (`Graph::reordered_just_in_time`), and
/// its loss `loss` renumbered with it.
pub(crate) fn just_in_time(
    g: &Graph,
    loss: ValueId,
    kept: &HashSet<NodeId>,
) -> Result<(Graph, ValueId), fsdpc_ir::IrError> {
    let (renumbered, map) = g.reordered_just_in_time(kept)?;
    let loss = ValueId {
        node: map.get(&loss.node).copied().unwrap_or(loss.node),
        slot: loss.slot,
    };
    Ok((renumbered, loss))
}

/// The forward graph of a training program: its backward nodes removed, the
/// loss its only output.
pub(crate) fn forward_of(graph: &Graph, loss: ValueId) -> Graph {
    let mut g = graph.clone();
    let backward: Vec<NodeId> = g
        .node_ids()
        .filter(|&n| g.node(n).phase == Phase::Backward)
        .collect();
    for n in backward {
        g.remove_node(n);
    }
    g.outputs = vec![loss];
    g
}

/// Retypes the forward graph `g` in place: parameters, casts after float
/// inputs and constants, casts where float operands would mix, f32 operands
/// for the loss, and every op's outputs inferred again.
fn retype(g: &mut Graph, loss: ValueId, cfg: &FsdpConfig) -> Result<(), fsdpc_ir::IrError> {
    let pd = cfg.param_dtype;
    for p in &mut g.params {
        if p.ty.dtype.is_float() {
            p.ty.dtype = pd;
        }
    }
    let order = g
        .topo_order()
        .map_err(|_| fsdpc_ir::IrError::Invalid("the forward graph has a cycle".into()))?;
    for n in order {
        let op = g.node(n).op.clone();
        match op {
            Op::Param { param } => {
                let ty = g.param(param).ty.clone();
                g.node_mut(n).outputs = vec![ty];
            }
            Op::Input { .. } => cast_source(g, n, pd)?,
            Op::Constant { .. } | Op::ModuleBuffer { .. } => cast_source(g, n, cfg.buffer_dtype)?,
            Op::WriteBuffer { buffer } => {
                // The buffer keeps its own dtype: the new value is cast
                // back to it.
                let to = g.buffer(buffer).ty.dtype;
                let v = g.inputs(n)[0];
                if g.value_type(v).dtype != to {
                    let node = g.node(n);
                    let (name, module) = (format!("{}.to_{to}", node.name), node.module);
                    let c = g.add1(Op::Cast { to }, &[v], name, module)?;
                    g.set_input(n, 0, c);
                }
            }
            _ => retype_node(g, n, n == loss.node, pd)?,
        }
    }
    Ok(())
}

/// Casts the floating-point output of source node `n` to `to` for all its
/// readers (one `Cast` next to it).
fn cast_source(g: &mut Graph, n: NodeId, to: DType) -> Result<(), fsdpc_ir::IrError> {
    let v = ValueId { node: n, slot: 0 };
    let from = g.value_type(v).dtype;
    if !from.is_float() || from == to {
        return Ok(());
    }
    if g.users(v).is_empty() {
        return Ok(());
    }
    let node = g.node(n);
    let (name, module) = (format!("{}.to_{to}", node.name), node.module);
    let c = g.add1(Op::Cast { to }, &[v], name, module)?;
    g.replace_uses(v, c);
    Ok(())
}

/// Casts the operands of node `n` where needed and infers its outputs again.
fn retype_node(
    g: &mut Graph,
    n: NodeId,
    is_loss: bool,
    pd: DType,
) -> Result<(), fsdpc_ir::IrError> {
    let node = g.node(n).clone();
    let inputs = g.inputs(n);
    if !matches!(node.op, Op::Cast { .. }) {
        let floats: Vec<DType> = inputs
            .iter()
            .map(|v| g.value_type(*v).dtype)
            .filter(|d| d.is_float())
            .collect();
        let mixed = floats.windows(2).any(|w| w[0] != w[1]);
        let target = if is_loss {
            Some(DType::F32)
        } else if mixed {
            Some(pd)
        } else {
            None
        };
        if let Some(to) = target {
            let mut made: HashMap<ValueId, ValueId> = HashMap::new();
            for (slot, v) in inputs.iter().enumerate() {
                let d = g.value_type(*v).dtype;
                if !d.is_float() || d == to {
                    continue;
                }
                let c = match made.get(v) {
                    Some(c) => *c,
                    None => {
                        let name = format!("{}.in{slot}.to_{to}", node.name);
                        let c = g.add1(Op::Cast { to }, &[*v], name, node.module)?;
                        made.insert(*v, c);
                        c
                    }
                };
                g.set_input(n, slot as u32, c);
            }
        }
    }
    infer_outputs(g, n)
}

/// Sets node `n`'s output types from its inputs' (after they changed).
pub(crate) fn infer_outputs(g: &mut Graph, n: NodeId) -> Result<(), fsdpc_ir::IrError> {
    let node = g.node(n);
    let types: Vec<&fsdpc_ir::TensorType> = g.inputs(n).iter().map(|v| g.value_type(*v)).collect();
    let outputs =
        fsdpc_ir::ops::infer(&node.op, &types).map_err(|reason| fsdpc_ir::IrError::Shape {
            node: format!("{} ({n})", node.name),
            op: node.op.name(),
            reason,
        })?;
    g.node_mut(n).outputs = outputs;
    Ok(())
}

/// f32: the serde default of a policy dtype absent from older plans.
pub fn f32() -> DType {
    DType::F32
}
