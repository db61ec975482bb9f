"""One process (torchrun, world 1) of the policy test in test_torch.py: a
bf16 plan with CPU offload applied to the tiny model; prints what
`fsdpc.torch.apply` gave `fully_shard` and what a forward and backward
produced, as JSON."""

import json

import torch
import torch.distributed as dist

import fsdpc
import fsdpc.torch
from gloo_exit import finish
from tiny import Tiny

dist.init_process_group("gloo")
torch.manual_seed(0)
model = Tiny()
ids = torch.zeros(2, 8, dtype=torch.long)
plan = fsdpc.from_torch(
    model, (ids,), "cross_entropy", world=1, cluster="cpu-local",
    mixed_precision="bf16", reduce_dtype="f32", cpu_offload=True,
)
applied = fsdpc.torch.apply(model, plan)
out = model(ids)
out.float().sum().backward()
print(json.dumps({
    "param_dtype": str(applied.mp_policy.param_dtype),
    "reduce_dtype": str(applied.mp_policy.reduce_dtype),
    "offloaded": [u.offloaded for u in applied.units],
    "output_dtype": str(out.dtype),
    "grad_dtype": str(next(model.parameters()).grad.dtype),
    "notes": applied.notes,
}))
finish()
