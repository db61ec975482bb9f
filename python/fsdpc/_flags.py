"""Keyword arguments to command-line flags: `mixed_precision="bf16"` is
`--mixed-precision=bf16`. The flags and how each takes its value come from
the command line's own definition (`_fsdpc.flags`), so Python accepts
exactly what the command line does."""

from __future__ import annotations

import difflib
import os
from functools import lru_cache
from typing import Any, Dict, List, Mapping, Tuple

from . import _fsdpc


@lru_cache(maxsize=None)
def table(command: str) -> Dict[str, Tuple[str, str, str]]:
    """Python name -> (long flag, kind, help) of `fsdpc COMMAND`."""
    return {
        long.replace("-", "_"): (long, kind, help)
        for long, kind, help in _fsdpc.flags(command)
    }


def _text(function: str, key: str, value: Any) -> str:
    """One flag value as the command line spells it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise TypeError(
        f"{function}(): {key} takes a str, int, float or bool, not {type(value).__name__}"
    )


def _items(function: str, key: str, value: Any) -> List[str]:
    """The values of a repeatable flag: one value, a list of them, or a
    mapping (`dim={"batch": 8}`, `reshard_after_forward={"h.11": False}`)
    as NAME=VALUE pairs."""
    if isinstance(value, Mapping):
        return [f"{k}={_text(function, key, v)}" for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        out: List[str] = []
        for v in value:
            out.extend(_items(function, key, v))
        return out
    return [_text(function, key, value)]


def unknown(function: str, key: str, known: Any) -> TypeError:
    """The error for a keyword `function` does not take, with close matches."""
    close = difflib.get_close_matches(key, list(known), n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return TypeError(f"{function}() got an unexpected keyword argument {key!r}{hint}")


def to_args(command: str, function: str, kwargs: Mapping[str, Any]) -> List[str]:
    """`kwargs` as the flags of `fsdpc COMMAND`; None leaves a flag out."""
    flags = table(command)
    args: List[str] = []
    for key, value in kwargs.items():
        if key not in flags:
            raise unknown(function, key, flags)
        if value is None:
            continue
        long, kind, _ = flags[key]
        if kind == "switch":
            if not isinstance(value, bool):
                raise TypeError(
                    f"{function}(): {key} is a switch (True or False), not {type(value).__name__}"
                )
            if value:
                args.append(f"--{long}")
        elif kind == "optional_value":
            if value is True:
                args.append(f"--{long}")
            elif value is not False:
                args.append(f"--{long}={_text(function, key, value)}")
        elif kind == "repeated":
            args.extend(f"--{long}={v}" for v in _items(function, key, value))
        else:
            if isinstance(value, (list, tuple, Mapping)):
                raise TypeError(
                    f"{function}(): {key} takes one value, not a {type(value).__name__}"
                )
            args.append(f"--{long}={_text(function, key, value)}")
    return args
