"""`fsdpc.compile` and `fsdpc.auto`: the planner with the command line's
flags as keyword arguments."""

from __future__ import annotations

import json
import os
from typing import Any, List, Optional, Tuple

from . import _flags, _fsdpc
from ._plan import AutoSearch, Plan, PathLike

#: Flags of `fsdpc compile` these functions set themselves or that only
#: the command line has (where the plan is written, how the table prints).
_OWN = {"output", "auto", "auto_precision", "auto_gap", "verbose", "json", "world", "cluster"}


def _model_arg(function: str, model: Any) -> str:
    if isinstance(model, (str, os.PathLike)):
        text = os.fspath(model)
        if text:
            return text
    raise TypeError(
        f"{function}(): model is a zoo spec, an ONNX or IR file or an hf: directory "
        f"(a str or path), not {type(model).__name__ if not isinstance(model, str) else 'an empty str'}"
    )


def _common(function: str, model: Any, world: Any, cluster: Any) -> List[str]:
    if isinstance(world, bool) or not isinstance(world, int):
        raise TypeError(f"{function}(): world is the number of ranks (an int), not {type(world).__name__}")
    if world < 1:
        raise ValueError(f"{function}(): world must be at least 1, not {world}")
    args = [_model_arg(function, model), f"--world={world}"]
    if cluster is not None:
        if not isinstance(cluster, (str, os.PathLike)):
            raise TypeError(
                f"{function}(): cluster is a preset name or a cluster file, not {type(cluster).__name__}"
            )
        args.append(f"--cluster={os.fspath(cluster)}")
    return args


def _flag_args(function: str, flags: dict) -> List[str]:
    own = [k for k in flags if k in _OWN]
    if own:
        raise TypeError(f"{function}() sets {own[0]!r} itself; it is not a flag here")
    return _flags.to_args("compile", function, flags)


def compile(model: PathLike, world: int, cluster: Optional[PathLike] = None, **flags: Any) -> Plan:
    """Plans `model` for `world` ranks on `cluster`, as `fsdpc compile`.

    model: a zoo spec (`"gpt2"`, `"llama3-8b"`, `"gpt:layers=2,hidden=128"`),
        an ONNX file, an fsdpc IR file or `"hf:DIR"`.
    world: the number of ranks (GPUs).
    cluster: a preset (`"a100-80g-roce"`, the default; `"h100-80g-ib"`,
        `"cpu-local"`, ...) or a cluster file.
    flags: every flag of `fsdpc compile`, `-` as `_`:
        `strategy="hybrid_shard"`, `mixed_precision="bf16"`,
        `activation_checkpointing=True` (or `"every:2"`), `wrap="kind:Block"`,
        `reshard_after_forward={"h.11": False}`, `dim={"batch": 8}`,
        `freeze=["*.wte.weight"]`, `target="cuda"`, ... (`fsdpc.flags()`
        lists them). A switch takes True or False; None leaves a flag out.

    Raises TypeError for a keyword it does not take (naming close matches)
    or a value of the wrong type, and FsdpcError with the command line's
    message for a model, flag value or cluster it cannot plan.
    """
    args = _common("compile", model, world, cluster) + _flag_args("compile", flags)
    native, _, _ = _fsdpc.compile(args)
    return Plan(native)


def auto(
    model: PathLike,
    world: int,
    cluster: Optional[PathLike] = None,
    *,
    precision: Optional[str] = None,
    gap: Optional[float] = None,
    **flags: Any,
) -> Plan:
    """Searches for the fastest simulated plan that fits, as `fsdpc compile
    --auto`: wrap, strategy and F, tensor parallelism, activation
    checkpointing, CPU offload, prefetch and the rate limit. A flag given
    fixes its dimension (`auto("gpt2", 8, strategy="hybrid_shard")`).

    precision: `"given"` (default: the flags' precision) or `"bf16"` (also
        search bf16 parameters with f32 reduction).
    gap: the optimality gap in percent (default 0.5).

    Returns the chosen plan; its `.search` holds every candidate weighed.
    """
    args = _common("auto", model, world, cluster) + _flag_args("auto", flags) + ["--auto"]
    if precision is not None:
        args.append(f"--auto-precision={_flags._text('auto', 'precision', precision)}")
    if gap is not None:
        if isinstance(gap, bool) or not isinstance(gap, (int, float)):
            raise TypeError(f"auto(): gap is a percentage (a number), not {type(gap).__name__}")
        args.append(f"--auto-gap={gap}")
    native, text, data = _fsdpc.compile(args)
    return Plan(native, AutoSearch(text=text or "", data=json.loads(data) if data else {}))


def flags(command: str = "compile") -> List[Tuple[str, str, str]]:
    """The keyword arguments of `command`'s flags: (Python name, how it
    takes its value, help), `kind` one of switch, value, optional_value,
    repeated."""
    return [
        (name, kind, help)
        for name, (_, kind, help) in _flags.table(command).items()
        if command != "compile" or name not in _OWN
    ]
