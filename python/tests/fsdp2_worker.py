"""One rank of the FSDP2 test (run by torchrun; see test_torch.py): plans
the tiny model with fsdpc, applies the plan with `fsdpc.torch.apply`,
trains it on this rank's share of each batch and, beside it, an unwrapped
copy on the whole batch; rank 0 writes both runs' losses and parameters'
largest difference as JSON to argv[1]. argv[2:] are `KEY=VALUE` flags for
`fsdpc.from_torch` (values parsed as JSON where they parse)."""

import copy
import json
import sys

import torch
import torch.distributed as dist

import fsdpc
import fsdpc.torch
from gloo_exit import finish
from tiny import Tiny, cross_entropy

STEPS = 5
BATCH, SEQ, VOCAB = 4, 8, 64


def flag(text):
    key, value = text.split("=", 1)
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def main():
    out = sys.argv[1]
    flags = dict(flag(a) for a in sys.argv[2:])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Tiny(VOCAB)
    reference = copy.deepcopy(model)
    per_rank = BATCH // world
    example = torch.zeros(per_rank, SEQ, dtype=torch.long)
    plan = fsdpc.from_torch(
        model, (example,), loss="cross_entropy", world=world, cluster="cpu-local",
        optimizer="sgd", lr=0.1, **flags,
    )
    applied = fsdpc.torch.apply(model, plan)
    opt = fsdpc.torch.optimizer(model, plan)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)

    gen = torch.Generator().manual_seed(1)
    losses, ref_losses = [], []
    for _ in range(STEPS):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
        labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen)
        mine = slice(rank * per_rank, (rank + 1) * per_rank)
        loss = cross_entropy(model(ids[mine]), labels[mine])
        loss.backward()
        opt.step()
        opt.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)

        ref_loss = cross_entropy(reference(ids), labels)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(ref_loss.item())

    ref_params = dict(reference.named_parameters())
    diff = 0.0
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        diff = max(diff, (full.detach() - ref_params[name].detach()).abs().max().item())
    torch_names = sorted(n for n, _ in model.named_parameters())
    if rank == 0:
        with open(out, "w") as f:
            json.dump(
                {
                    "losses": losses,
                    "reference": ref_losses,
                    "param_diff": diff,
                    "plan_params": sorted(applied.param_names),
                    "mapped": sorted(applied.param_names.values()),
                    "torch_params": torch_names,
                    "units": [
                        {
                            "path": u.path,
                            "reshard": u.reshard_after_forward,
                            "checkpointed": u.checkpointed,
                            "forward_prefetch": u.forward_prefetch,
                            "backward_prefetch": u.backward_prefetch,
                            "fsdp": isinstance(
                                model.get_submodule(u.path) if u.path else model,
                                torch.distributed.fsdp.FSDPModule,
                            ),
                        }
                        for u in applied.units
                    ],
                    "notes": applied.notes,
                    "mesh": list(applied.mesh.shape),
                    "timings": plan.timings,
                },
                f,
            )
    finish()


if __name__ == "__main__":
    main()
