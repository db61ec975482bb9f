"""The plan as Python objects: `Plan` wraps the native plan (the contract
the runtimes execute) and reads its JSON for what Python code asks of it."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Dict, List, Optional, Tuple, Union

from . import _fsdpc

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Unit:
    """One FSDP unit: the parameters gathered, freed and reduced together
    (one `fully_shard` call in PyTorch FSDP2)."""

    id: int
    #: The module path that defines it (`transformer.h.2`; "" for the root).
    module: str
    #: The module's class (`GPT2Block`).
    kind: str
    #: Its parameters' names, in flat-parameter order.
    params: Tuple[str, ...]
    #: Elements of all its parameters.
    numel: int
    #: Elements each rank keeps (the padded flat parameter / F).
    shard_numel: int
    #: After forward: True (free the gathered parameters), False (keep
    #: them until backward) or N (keep a 1/N slice).
    reshard_after_forward: Union[bool, int]
    #: Whether its forward re-runs in backward (activation checkpointing).
    checkpointed: bool
    #: Whether its shards live in host memory (CPU offload).
    offloaded: bool

    @property
    def is_root(self) -> bool:
        return self.id == 0


@dataclass(frozen=True)
class Memory:
    """What a rank holds, in bytes, as planned (`fsdpc inspect`)."""

    #: The per-rank figure `compile` prints: arena, heap and the memory
    #: outside the arena.
    rank_bytes: int
    #: The arena's live peak, and the instruction it is reached at.
    peak_bytes: int
    peak_at: int
    #: The arena's size (its peak rounded to its alignment).
    arena_bytes: int
    #: The matrix library's and the runtime's heap beside the arena.
    heap_bytes: int
    #: The device's memory (the cluster's), the fit check's bound.
    capacity_bytes: int
    #: The arena's peak by kind (`shard_params`, `activation`, ...).
    breakdown: Dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Simulation:
    """The simulated step (`fsdpc simulate`) on one cluster."""

    cluster: str
    #: Whose kernels priced the operators: "fsdpc" or "pytorch-eager".
    kernels: str
    world: int
    step_time_s: float
    exposed_comm_s: float
    tflops_per_rank: float
    #: Model FLOPs utilisation: no recomputation counted.
    mfu: float
    #: Hardware FLOPs utilisation: recomputation counted.
    hfu: float
    model_flops_per_rank_step: float
    executed_flops_per_rank_step: float
    peak_bytes_per_rank: int
    comm_bytes_per_step: int
    #: Every figure, as `fsdpc simulate --json` prints it.
    data: Dict[str, Any] = field(repr=False, default_factory=dict)
    #: The text `fsdpc simulate` prints.
    text: str = field(repr=False, default="")

    def __str__(self) -> str:
        return self.text


@dataclass(frozen=True)
class AutoSearch:
    """What `fsdpc.auto` weighed: `compile --auto`'s table and its JSON."""

    text: str
    #: `{"record", "tensor_parallel", "chosen", "candidates"}`, as
    #: `compile --auto --json` prints it.
    data: Dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def candidates(self) -> List[Dict[str, Any]]:
        return list(self.data.get("candidates", []))

    def __str__(self) -> str:
        return self.text


def _reshard(value: Any) -> Union[bool, int]:
    if value == "full":
        return True
    if value == "keep":
        return False
    if isinstance(value, dict) and "to" in value:
        return int(value["to"])
    raise ValueError(f"unknown reshard_after_forward {value!r} in the plan")


class Plan:
    """A compiled FSDP plan: units, shards, every collective and kernel on
    its stream, planned memory and the predicted step.

    Made by `fsdpc.compile`, `fsdpc.auto`, `fsdpc.from_torch` or
    `Plan.load`; the JSON it saves is `fsdpc compile`'s, which `fsdpc
    train`, `inspect`, `simulate` and `report` read.
    """

    def __init__(self, native: "_fsdpc.NativePlan", search: Optional[AutoSearch] = None):
        self._native = native
        #: With `fsdpc.auto`: the search that chose this plan.
        self.search = search
        #: With `fsdpc.from_torch`: the prefix the exported parameter names
        #: carry before the module's own ("" when they are the module's).
        self.module_prefix = ""

    # -- loading and saving -------------------------------------------------

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        """Parses and validates a plan's JSON."""
        if not isinstance(text, str):
            raise TypeError(f"Plan.from_json() takes a str, not {type(text).__name__}")
        return cls(_fsdpc.NativePlan.from_json(text))

    @classmethod
    def load(cls, path: PathLike) -> "Plan":
        """Reads a plan file (`fsdpc compile -o FILE`), as `fsdpc inspect`
        does: an IR model or other JSON is an error saying what it is."""
        return cls(_fsdpc.NativePlan.load(os.fspath(path)))

    def to_json(self) -> str:
        """The plan as `fsdpc compile` writes it."""
        return self._native.to_json()

    def save(self, path: PathLike) -> None:
        """Writes the plan file that `fsdpc train PLAN` runs."""
        with open(os.fspath(path), "w", encoding="utf-8") as f:
            f.write(self.to_json())

    # -- what was decided ---------------------------------------------------

    @cached_property
    def doc(self) -> Dict[str, Any]:
        """The whole plan as a dict (its JSON, parsed once)."""
        return json.loads(self._native.to_json())

    @property
    def model(self) -> str:
        return str(self.doc["model"]["name"])

    @property
    def world(self) -> int:
        return int(self.doc["cluster"]["world"])

    @property
    def cluster(self) -> str:
        return str(self.doc["cluster"]["preset"])

    @property
    def config(self) -> Dict[str, Any]:
        """The settings the plan was made with (strategy, wrap, prefetch,
        precision, ...), as the plan records them."""
        return dict(self.doc["config"])

    @cached_property
    def units(self) -> Tuple[Unit, ...]:
        """The FSDP units, root first, in forward order of their modules."""
        config = self.doc["config"]
        default = _reshard(config.get("reshard_after_forward", "full"))
        checkpointed = set(config.get("checkpointed_units", []))
        offloaded = set(config.get("offloaded_units", []))
        if config.get("cpu_offload") and not offloaded:
            offloaded = {u["id"] for u in self.doc["units"]}
        out = []
        for u in self.doc["units"]:
            own = u.get("reshard_after_forward")
            out.append(
                Unit(
                    id=u["id"],
                    module=u["module"],
                    kind=u["kind"],
                    params=tuple(p["name"] for p in u["params"]),
                    numel=u["flat_numel"],
                    shard_numel=u["shard_numel"],
                    reshard_after_forward=(
                        False if u["id"] == 0 else (_reshard(own) if own is not None else default)
                    ),
                    checkpointed=u["id"] in checkpointed,
                    offloaded=u["id"] in offloaded,
                )
            )
        return tuple(out)

    @property
    def memory(self) -> Memory:
        m = self.doc["memory"]
        return Memory(
            rank_bytes=int(m["rank_bytes"]),
            peak_bytes=int(m["peak_bytes"]),
            peak_at=int(m["peak_at"]),
            arena_bytes=int(m["arena_bytes"]),
            heap_bytes=int(m["heap_bytes"]),
            capacity_bytes=int(self.doc["cluster"]["memory_bytes"]),
            breakdown={k: int(v) for k, v in m["breakdown"]},
        )

    @property
    def step_time_s(self) -> float:
        """The predicted step on the plan's own cluster."""
        return float(self.doc["estimates"]["step_time_s"])

    # -- what fsdpc says of it ----------------------------------------------

    def summary(self) -> str:
        """`fsdpc inspect`'s table: units, shards, communication, memory."""
        return self._native.summary()

    def summary_json(self) -> Dict[str, Any]:
        """`fsdpc inspect --json`."""
        return json.loads(self._native.summary_json())

    def simulate(self, cluster: Optional[str] = None, kernels: Optional[str] = None) -> Simulation:
        """The step simulated on `cluster` (a preset or a cluster file; the
        plan's own by default), at the plan's world and ranks per node, its
        operators priced as `kernels` run them: "fsdpc" (its runtimes') or
        "pytorch-eager" (`fsdpc simulate --kernels`; the cluster's by
        default)."""
        if cluster is not None and not isinstance(cluster, (str, os.PathLike)):
            raise TypeError(f"simulate(): cluster is a preset name or a file, not {type(cluster).__name__}")
        if kernels is not None and not isinstance(kernels, str):
            raise TypeError(f"simulate(): kernels is 'fsdpc' or 'pytorch-eager', not {type(kernels).__name__}")
        data, text = self._native.simulate(None if cluster is None else os.fspath(cluster), kernels)
        d = json.loads(data)
        return Simulation(
            cluster=d["cluster"],
            kernels=d["kernels"],
            world=d["world"],
            step_time_s=d["step_time_s"],
            exposed_comm_s=d["exposed_comm_s"],
            tflops_per_rank=d["tflops_per_rank"],
            mfu=d["mfu"],
            hfu=d["hfu"],
            model_flops_per_rank_step=d["model_flops_per_rank_step"],
            executed_flops_per_rank_step=d["executed_flops_per_rank_step"],
            peak_bytes_per_rank=d["peak_bytes_per_rank"],
            comm_bytes_per_step=d["comm_bytes_per_step"],
            data=d,
            text=text,
        )

    def report(
        self,
        path: PathLike,
        cluster: Optional[str] = None,
        measured: Optional[PathLike] = None,
    ) -> str:
        """Writes `fsdpc report`'s HTML page to `path` (with a measured
        trace, `fsdpc train --trace`, beside the prediction); returns the
        path."""
        html = self._native.report(
            None if cluster is None else os.fspath(cluster),
            None if measured is None else os.fspath(measured),
        )
        path = os.fspath(path)
        with open(path, "w", encoding="utf-8") as f:
            f.write(html)
        return path

    def __repr__(self) -> str:
        m = self.memory
        return (
            f"<fsdpc.Plan {self.model} on {self.cluster} x{self.world}: "
            f"{len(self.doc['units'])} units, {self.config['strategy']}, "
            f"step {self.step_time_s:.4g} s, {m.rank_bytes / 2**30:.2f} GiB per rank>"
        )
