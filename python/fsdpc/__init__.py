"""fsdpc: an ahead-of-time compiler for fully sharded data parallel (FSDP)
training, from Python.

    import fsdpc
    plan = fsdpc.compile("llama3-8b", world=64, cluster="h100-80g-ib",
                         mixed_precision="bf16", activation_checkpointing=True)
    print(plan.summary())                  # units, shards, memory per rank
    plan.simulate("a100-80g-roce").step_time_s
    plan.save("plan.json")                 # `fsdpc train plan.json` runs it

    best = fsdpc.auto("gpt2", world=8)     # the fastest plan that fits
    plan = fsdpc.from_torch(model, (ids,), loss="cross_entropy", world=8)
    fsdpc.torch.apply(model, plan)         # PyTorch FSDP2, as planned

Every flag of `fsdpc compile` is a keyword argument (`fsdpc.flags()` lists
them). Bad input raises TypeError (keywords, types) or FsdpcError (with
the command line's one-line message). `fsdpc.torch` needs torch; nothing
else does.
"""

from ._api import auto, compile, flags
from ._export import ExportError, from_torch
from ._fsdpc import FsdpcError, __version__
from ._plan import AutoSearch, Memory, Plan, Simulation, Unit

__all__ = [
    "AutoSearch",
    "ExportError",
    "FsdpcError",
    "Memory",
    "Plan",
    "Simulation",
    "Unit",
    "__version__",
    "auto",
    "compile",
    "flags",
    "from_torch",
]


def __getattr__(name: str):
    # `fsdpc.torch` imports torch, so only when asked for.
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module 'fsdpc' has no attribute {name!r}")
