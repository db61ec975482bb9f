"""`fsdpc.from_torch`: plans the `torch.nn.Module` a user has, through the
ONNX exporter and fsdpc's importer."""

from __future__ import annotations

import os
import re
import tempfile
import time
import warnings
from typing import Any, Callable, Optional, Sequence, Union

from . import _fsdpc
from ._api import compile as _compile
from ._plan import Plan, PathLike


class ExportError(_fsdpc.FsdpcError):
    """The module did not export to ONNX; the message is the exporter's,
    shortened."""


def _short(e: BaseException) -> str:
    """The exporter's message, shortened: the first line of the innermost
    cause (where the exporter says what in the module failed), without
    terminal colours."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
    return first if len(first) <= 300 else first[:297] + "..."


def from_torch(
    module: Any,
    example_inputs: Any,
    loss: Union[None, str, Callable[..., Any]] = None,
    *,
    world: int,
    cluster: Optional[PathLike] = None,
    targets: Optional[Sequence[Any]] = None,
    exporter: str = "dynamo",
    path: Optional[PathLike] = None,
    **flags: Any,
) -> Plan:
    """Plans `module` as it is: exports it to ONNX with its loss, imports
    that and compiles it (`fsdpc.compile`'s keywords apply).

    example_inputs: one rank's micro-batch, a tensor or a tuple of them, in
        the order `module.forward` takes them.
    loss: None when the module's first output is already the scalar loss
        (a transformers model given its labels); `"cross_entropy"` or
        `"mse"` for fsdpc to add that loss to the module's first output
        (against a new `labels` / `target` input); or a callable
        `loss(output, *targets)` exported with the module, `targets` its
        example tensors.
    exporter: `"dynamo"` (`torch.onnx.export(dynamo=True)`, the default) or
        `"torchscript"`.
    path: where the ONNX file is kept (default: a temporary file, removed
        after planning).

    Parameter names in the plan are the module's `named_parameters()`
    names, so `fsdpc.torch.apply` finds each unit in the module. The plan's
    `timings` says what exporting and planning took.
    """
    try:
        import torch
    except ImportError:
        raise ImportError("fsdpc.from_torch needs torch: pip install 'fsdpc[torch]'") from None

    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"from_torch(): module is a torch.nn.Module, not {type(module).__name__}")
    inputs = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    if not all(isinstance(t, torch.Tensor) for t in inputs):
        raise TypeError("from_torch(): example_inputs are tensors (one, or a tuple of them)")
    if exporter not in ("dynamo", "torchscript"):
        raise ValueError(f"from_torch(): exporter is 'dynamo' or 'torchscript', not {exporter!r}")

    model = module
    if callable(loss) and not isinstance(loss, str):
        if targets is None:
            raise TypeError("from_torch(): a loss function needs its targets (targets=(labels,))")
        extra = (targets,) if isinstance(targets, torch.Tensor) else tuple(targets)
        model = _WithLoss(module, loss, len(inputs))
        inputs = inputs + extra
        loss_flag = None
    elif loss is None or isinstance(loss, str):
        if targets is not None:
            raise TypeError("from_torch(): targets go with a loss function (loss=callable)")
        loss_flag = loss
    else:
        raise TypeError(f"from_torch(): loss is None, a loss name or a callable, not {type(loss).__name__}")

    owned = path is None
    directory = tempfile.mkdtemp(prefix="fsdpc-") if owned else None
    file = os.path.join(directory, "model.onnx") if directory else os.fspath(path)
    started = time.perf_counter()
    try:
        _export(model, inputs, file, exporter, torch)
        exported = time.perf_counter()
        plan = _compile(file, world, cluster, loss=loss_flag, **flags)
        planned = time.perf_counter()
    finally:
        if owned:
            for name in os.listdir(directory):
                os.remove(os.path.join(directory, name))
            os.rmdir(directory)
    plan.timings = {"export_s": exported - started, "plan_s": planned - exported}
    return plan


def _export(model: Any, inputs: tuple, file: str, exporter: str, torch: Any) -> None:
    names = [f"input_{i}" for i in range(len(inputs))]
    try:
        with warnings.catch_warnings():
            # A module in training mode is what fsdpc plans (dropout and
            # normalisation as they train); the exporter warns about it.
            warnings.filterwarnings("ignore", message="Exporting a model while it is in training mode")
            _call_exporter(model, inputs, names, file, exporter, torch)
    except Exception as e:  # the exporter raises many kinds
        raise ExportError(f"the module did not export ({exporter} exporter): {_short(e)}") from e


def _call_exporter(model: Any, inputs: tuple, names: list, file: str, exporter: str, torch: Any) -> None:
    if exporter == "dynamo":
        # optimize=False: the exporter's optimisation merges equal
        # initializers (every fresh LayerNorm's ones) into one tensor, which
        # would train as one tied parameter.
        program = torch.onnx.export(model, inputs, dynamo=True, input_names=names, optimize=False, verbose=False)
        program.save(file)
        return
    torch.onnx.export(
        model,
        inputs,
        file,
        dynamo=False,
        input_names=names,
        training=torch.onnx.TrainingMode.PRESERVE,
        do_constant_folding=False,
    )


def _WithLoss(module: Any, loss: Callable[..., Any], n_inputs: int) -> Any:
    """`loss(module(*inputs), *targets)` as one module whose children,
    parameters and buffers are the module's own (the same dicts), so the
    exported names are the module's, with no prefix."""
    import torch

    class WithLoss(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self._modules = module._modules
            self._parameters = module._parameters
            self._buffers = module._buffers

        def forward(self, *args: Any) -> Any:
            return loss(module(*args[:n_inputs]), *args[n_inputs:])

    return WithLoss()
