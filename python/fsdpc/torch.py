"""Plans applied to PyTorch FSDP2: `apply(module, plan)` calls
`fully_shard` on exactly the plan's units, with its
`reshard_after_forward`, mixed precision, CPU offload, explicit prefetch
lists and activation checkpointing.

Needs torch (`pip install 'fsdpc[torch]'`); `import fsdpc` does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

try:
    import torch
except ImportError:
    raise ImportError("fsdpc.torch needs torch: pip install 'fsdpc[torch]'") from None
import torch.distributed as dist
from torch import nn

from ._plan import Plan, Unit

_DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16, "fp16": torch.float16}


@dataclass
class AppliedUnit:
    """One `fully_shard` call `apply` made."""

    #: The module's path in the model ("" for the root).
    path: str
    #: The plan's unit.
    unit: Unit
    reshard_after_forward: Union[bool, int]
    checkpointed: bool
    offloaded: bool
    #: The modules its forward and backward hooks prefetch, by path.
    forward_prefetch: List[str] = field(default_factory=list)
    backward_prefetch: List[str] = field(default_factory=list)


@dataclass
class Applied:
    """What `apply` did, unit by unit, and what of the plan FSDP2 cannot
    express."""

    units: List[AppliedUnit]
    mesh: Any
    mp_policy: Any
    #: The plan's parameter name -> the module's (`named_parameters`).
    param_names: Dict[str, str]
    #: The plan's settings FSDP2 has no equivalent for, one line each.
    notes: List[str] = field(default_factory=list)

    def torch_name(self, plan_name: str) -> str:
        return self.param_names[plan_name]

    def plan_name(self, torch_name: str) -> str:
        for p, t in self.param_names.items():
            if t == torch_name:
                return p
        raise KeyError(torch_name)


def _orders(plan: Plan) -> Tuple[List[int], List[int]]:
    """The units (ids) in the order the plan's schedule gathers them for
    forward, and in the order it reduces their gradients in backward (the
    order of their backward)."""
    forward: List[int] = []
    backward: List[int] = []
    for ins in plan.doc["instructions"]:
        op = ins.get("op")
        unit = ins.get("unit")
        if unit is None:
            continue
        if op == "all_gather" and unit not in forward:
            forward.append(unit)
        elif op in ("reduce_scatter", "all_reduce") and unit not in backward:
            backward.append(unit)
    for u in plan.doc["units"]:
        if u["id"] not in forward:
            forward.append(u["id"])
    for u in reversed(forward):
        if u not in backward:
            backward.append(u)
    return forward, backward


def prefetch_lists(plan: Plan) -> Tuple[Dict[int, List[int]], Dict[int, List[int]]]:
    """The explicit prefetch lists of the plan's non-root units: each unit's
    forward prefetches the next `prefetch_depth` units of the schedule's
    forward order (with `forward_prefetch`), and each unit's backward the
    next `prefetch_depth` resharded units of its backward order (with
    `backward_prefetch: pre`)."""
    config = plan.config
    depth = int(config.get("prefetch_depth", 1))
    units = {u.id: u for u in plan.units}
    forward, backward = _orders(plan)
    forward = [u for u in forward if u != 0]
    backward = [u for u in backward if u != 0]
    fwd: Dict[int, List[int]] = {u: [] for u in forward}
    bwd: Dict[int, List[int]] = {u: [] for u in backward}
    if config.get("forward_prefetch", True):
        for i, u in enumerate(forward):
            fwd[u] = forward[i + 1 : i + 1 + depth]
    if config.get("backward_prefetch", "pre") == "pre":
        for i, u in enumerate(backward):
            later = [v for v in backward[i + 1 :] if units[v].reshard_after_forward is not False]
            bwd[u] = later[:depth]
    return fwd, bwd


def _strip(name: str, prefix: str) -> str:
    return name[len(prefix) :] if prefix and name.startswith(prefix) else name


def _mesh(plan: Plan, device_type: str) -> Any:
    from torch.distributed.device_mesh import init_device_mesh

    world = plan.world
    f = int(plan.config.get("shard_factor", world))
    if plan.config.get("strategy") == "no_shard":
        f = 1
    if f == world:
        return init_device_mesh(device_type, (world,), mesh_dim_names=("shard",))
    return init_device_mesh(device_type, (world // f, f), mesh_dim_names=("replicate", "shard"))


def apply(
    module: nn.Module,
    plan: Plan,
    mesh: Optional[Any] = None,
    *,
    device_type: Optional[str] = None,
) -> Applied:
    """Shards `module` as `plan` says, with PyTorch FSDP2.

    Each of the plan's units is found by its module path and gets one
    `fully_shard` call (children before parents, the root last) with the
    plan's `reshard_after_forward` (True, False or N), a
    `MixedPrecisionPolicy` from its param and reduce dtypes, a
    `CPUOffloadPolicy` where the plan offloads the unit, and activation
    checkpointing (`torch.distributed._composable.checkpoint`, which keeps
    parameter names) where the plan checkpoints it. Then each unit's
    `set_modules_to_forward_prefetch` / `set_modules_to_backward_prefetch`
    get the plan's prefetch lists (`prefetch_lists`).

    mesh: a DeviceMesh of the plan's world (1-D, or 2-D (replicate, shard)
        for hybrid sharding); by default one is made from the initialised
        process group on `device_type` ("cuda" where the plan targets it and
        a GPU is present, else "cpu").

    Raises ValueError when the module has no module at a unit's path or the
    process group's size is not the plan's world, NotImplementedError for
    a plan FSDP2 cannot run (tensor parallelism).
    """
    from torch.distributed._composable import checkpoint
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    if not isinstance(plan, Plan):
        raise TypeError(f"apply(): plan is an fsdpc.Plan, not {type(plan).__name__}")
    if not isinstance(module, nn.Module):
        raise TypeError(f"apply(): module is a torch.nn.Module, not {type(module).__name__}")
    config = plan.config
    if int(config.get("tensor_parallel", 1)) > 1:
        raise NotImplementedError(
            f"apply(): the plan splits layers over --tensor-parallel {config['tensor_parallel']}; "
            "apply() runs FSDP only (plan with tensor_parallel=1)"
        )
    notes: List[str] = []
    if mesh is None:
        if not dist.is_initialized():
            raise ValueError("apply(): no process group; call torch.distributed.init_process_group first or pass mesh")
        if dist.get_world_size() != plan.world:
            raise ValueError(
                f"apply(): the plan is for {plan.world} ranks, the process group has {dist.get_world_size()}"
            )
        if device_type is None:
            target = plan.config.get("target", "threads")
            device_type = "cuda" if torch.cuda.is_available() and target == "cuda" else "cpu"
        mesh = _mesh(plan, device_type)
    elif mesh.size() != plan.world:
        raise ValueError(f"apply(): the plan is for {plan.world} ranks, the mesh has {mesh.size()}")

    param_dtype = _DTYPES[config.get("param_dtype", "f32")]
    reduce_dtype = _DTYPES[config.get("reduce_dtype", "f32")]
    mp_policy = MixedPrecisionPolicy(
        param_dtype=None if param_dtype == torch.float32 else param_dtype,
        reduce_dtype=None if reduce_dtype == param_dtype else reduce_dtype,
    )
    if config.get("buffer_dtype", "f32") != "f32":
        notes.append(f"buffer_dtype {config['buffer_dtype']}: FSDP2 does not cast buffers; cast them yourself")
    if config.get("offload_what", "params") == "optimizer":
        notes.append("offload_what=optimizer: FSDP2 offloads parameters, gradients and the optimizer together")
    if config.get("backward_prefetch") in ("post", "none"):
        notes.append(
            f"backward_prefetch={config['backward_prefetch']}: FSDP2 always prefetches one unit "
            "before each backward; applied as its default"
        )
    notes.append(
        f"limit_all_gathers={config.get('limit_all_gathers', 2)}: FSDP2 bounds in-flight "
        "all-gathers by its own streams, not by a count"
    )
    if int(config.get("grad_accum", 1)) > 1:
        notes.append(
            f"grad_accum={config['grad_accum']}: run that many micro-batches per optimizer step"
            + (" with module.set_requires_gradient_sync(False) on all but the last" if config.get("no_sync") else "")
        )
    for wire in ("allgather_wire", "reduce_scatter_wire"):
        if config.get(wire, "native") not in ("native", None) and not isinstance(config.get(wire), dict):
            notes.append(f"{wire}={config[wire]}: FSDP2 sends native dtypes")

    prefix = plan.module_prefix
    units = plan.units
    submodules: Dict[int, nn.Module] = {}
    paths: Dict[int, str] = {}
    for u in units:
        path = _strip(u.module, prefix)
        try:
            submodules[u.id] = module.get_submodule(path) if path else module
        except AttributeError:
            raise ValueError(
                f"apply(): the plan's unit {u.id} is the module `{path}` ({u.kind}), which this module does not have"
            ) from None
        paths[u.id] = path

    # The plan's parameter names against the module's.
    torch_names = {n for n, _ in module.named_parameters(remove_duplicate=False)}
    param_names: Dict[str, str] = {}
    for u in units:
        for p in u.params:
            t = _strip(p, prefix)
            if t in torch_names:
                param_names[p] = t
    missing = [p for u in units for p in u.params if p not in param_names]
    if missing:
        notes.append(
            f"{len(missing)} of the plan's parameters have no parameter of that name in the module "
            f"(first: {missing[0]}); the exporter renamed them"
        )

    for u in units:
        if u.checkpointed and u.id != 0:
            checkpoint(submodules[u.id])
    # Children before parents: a parent's fully_shard takes the parameters
    # its sharded children have not.
    order = sorted((u for u in units if u.id != 0), key=lambda u: -paths[u.id].count("."))
    applied: Dict[int, AppliedUnit] = {}
    for u in order + [units[0]]:
        reshard = False if u.id == 0 else u.reshard_after_forward
        fully_shard(
            submodules[u.id],
            mesh=mesh,
            reshard_after_forward=reshard,
            mp_policy=mp_policy,
            # Pinned host memory needs a GPU; a CPU mesh offloads unpinned.
            offload_policy=(
                CPUOffloadPolicy(pin_memory=mesh.device_type == "cuda") if u.offloaded else OffloadPolicy()
            ),
        )
        applied[u.id] = AppliedUnit(
            path=paths[u.id],
            unit=u,
            reshard_after_forward=reshard,
            checkpointed=u.checkpointed and u.id != 0,
            offloaded=u.offloaded,
        )

    fwd, bwd = prefetch_lists(plan)
    for uid, later in fwd.items():
        if later:
            submodules[uid].set_modules_to_forward_prefetch([submodules[v] for v in later])
            applied[uid].forward_prefetch = [paths[v] for v in later]
    for uid, later in bwd.items():
        if later:
            submodules[uid].set_modules_to_backward_prefetch([submodules[v] for v in later])
            applied[uid].backward_prefetch = [paths[v] for v in later]

    return Applied(
        units=[applied[u.id] for u in units],
        mesh=mesh,
        mp_policy=mp_policy,
        param_names=param_names,
        notes=notes,
    )


def optimizer(module: nn.Module, plan: Plan) -> torch.optim.Optimizer:
    """The plan's optimizer over `module`'s parameters: AdamW or SGD with
    its learning rate and hyperparameters, weight decay only on the
    parameters the plan decays (by default not norms, biases and
    embeddings). Call it after `apply`, on the sharded module."""
    opt = plan.doc["training"]["optimizer"]
    decayed = {
        _strip(p["name"], plan.module_prefix)
        for u in plan.doc["units"]
        for p in u["params"]
        if p.get("decay", True) and p.get("requires_grad", True)
    }
    named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    wd = float(opt.get("weight_decay", 0.0))
    groups = [
        {"params": [p for n, p in named if n in decayed], "weight_decay": wd},
        {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0},
    ]
    groups = [g for g in groups if g["params"]]
    if opt["kind"] == "sgd":
        return torch.optim.SGD(groups, lr=opt["lr"], momentum=float(opt.get("momentum", 0.0)))
    if opt["kind"] in ("adam_w", "adamw"):
        return torch.optim.AdamW(
            groups, lr=opt["lr"], betas=(opt["beta1"], opt["beta2"]), eps=opt["eps"]
        )
    raise ValueError(f"optimizer(): the plan's optimizer {opt['kind']!r} has no torch equivalent here")


__all__: Sequence[str] = ["apply", "optimizer", "prefetch_lists", "Applied", "AppliedUnit"]
