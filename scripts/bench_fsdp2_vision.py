"""PyTorch FSDP2 reference for benches/vision.rs: torchvision's ResNet-18
(10 classes) on 32x32 images, trained with `fully_shard` on each
`BasicBlock` and the root over CPU ranks (gloo), one thread per rank.

Batch normalisation runs in training mode (each rank's batch statistics,
running statistics updated), as fsdpc's `resnet18` computes it. AdamW (lr 1e-3, weight decay 0.01); a fresh batch of
random images and labels every step, drawn before the step's timer starts. Prints one JSON line: images per second over the
timed steps (the median step), the median step time and the losses.

    python scripts/bench_fsdp2_vision.py --ranks 2 --batch 32 --steps 20
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torchvision
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def run(rank, a, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(a.threads)
    dist.init_process_group("gloo", rank=rank, world_size=a.ranks)
    mesh = init_device_mesh("cpu", (a.ranks,))
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10)
    for m in model.modules():
        if isinstance(m, torchvision.models.resnet.BasicBlock):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    gen = torch.Generator().manual_seed(1 + rank)
    times, losses = [], []
    for step in range(a.warmup + a.steps):
        # A fresh random batch every step, outside the timed part, as
        # fsdpc's built-in data.
        x = torch.randn(a.batch, 3, a.image, a.image, generator=gen)
        y = torch.randint(0, 10, (a.batch,), generator=gen)
        dist.barrier()
        t = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        dist.barrier()
        if step >= a.warmup:
            times.append(time.perf_counter() - t)
            losses.append(float(loss.detach()))
    if rank == 0:
        step_s = statistics.median(times)
        out.put(
            {
                "torch": torch.__version__,
                "ranks": a.ranks,
                "threads_per_rank": a.threads,
                "batch_per_rank": a.batch,
                "image": a.image,
                "step_s_median": step_s,
                "images_per_s": a.ranks * a.batch / step_s,
                "losses": losses,
            }
        )
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--batch", type=int, default=32, help="images per rank per step")
    ap.add_argument("--image", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="threads per rank")
    ap.add_argument("--port", type=int, default=29517)
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    mp.spawn(run, args=(a, a.port, out), nprocs=a.ranks, join=True)
    print(json.dumps(out.get()))


if __name__ == "__main__":
    main()
