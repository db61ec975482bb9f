#!/usr/bin/env python3
"""Read a plan written by `fsdpc compile ... -o plan.json` with nothing but
the standard library: per unit, its all-gathers and the bytes they gather in
a step, then the peak memory of a rank. `examples/read_plan.rs` prints the
same from Rust.

    fsdpc compile gpt2 --world 8 -o plan.json
    python3 examples/read_plan.py plan.json

The plan's fields (schema "fsdpc.plan/v1"): `units` (id, module, sizes),
`buffers` (id, kind, bytes, arena offset, lifetime), `instructions` (op,
stream and operands; an all-gather names its `unit` and its `dst` buffer),
`memory` (peak_bytes, arena_bytes, breakdown) and `estimates`.
"""

import json
import sys


def report(plan):
    """The report of a plan (a dict read from its JSON), as a string."""
    if not str(plan.get("schema", "")).startswith("fsdpc.plan/"):
        raise ValueError("not an fsdpc plan (no fsdpc.plan/ schema)")
    bytes_of = {b["id"]: b["bytes"] for b in plan["buffers"]}
    lines = [f"{'unit':>4}  {'module':<24} {'all-gathers':>11} {'gathered bytes/step':>20}"]
    for unit in plan["units"]:
        gathers = [i for i in plan["instructions"]
                   if i["op"] == "all_gather" and i["unit"] == unit["id"]]
        gathered = sum(bytes_of[i["dst"]] for i in gathers)
        module = unit["module"] or "(root)"
        lines.append(f"{unit['id']:>4}  {module:<24} {len(gathers):>11} {gathered:>20}")
    lines.append(f"peak bytes per rank: {plan['memory']['peak_bytes']}")
    return "\n".join(lines) + "\n"


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: read_plan.py PLAN.json (written by `fsdpc compile ... -o PLAN.json`)")
    with open(sys.argv[1], encoding="utf-8") as f:
        plan = json.load(f)
    sys.stdout.write(report(plan))


if __name__ == "__main__":
    main()
