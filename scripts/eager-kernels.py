"""Lists the kernels PyTorch eager runs for an RMSNorm and a cross-entropy
loss, forward and backward, with the bytes each reads and writes per element
of the normalised (or logit) tensor: the table `planner/src/cost/eager.rs`
holds. Run with any torch; on the CPU, `rms_norm` runs the composite
(`to(f32)`, `pow`, `mean`, `add`, `rsqrt`, `mul`, `mul`, `type_as`) that CUDA
ran until PyTorch's fused RMSNorm kernel (pytorch/pytorch#153666, 2025).

    python scripts/eager-kernels.py
"""

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Operators that make a view or a scalar, not a kernel.
VIEWS = {
    "view", "_unsafe_view", "expand", "as_strided", "detach", "unsqueeze",
    "squeeze", "t", "transpose", "permute", "select", "slice", "alias",
    "_to_copy_scalar", "lift_fresh", "empty", "empty_like", "empty_strided",
}


class Kernels(TorchDispatchMode):
    def __init__(self, big):
        super().__init__()
        self.big = big
        self.rows = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if name in VIEWS:
            return out
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]

        def size(t):
            # An expanded operand is read once per stored element.
            return t.untyped_storage().nbytes() if t.dim() and 0 in t.stride() else t.numel() * t.element_size()

        read = sum(size(t) for t in ins if t.numel() >= self.big)
        written = sum(t.numel() * t.element_size() for t in outs if t.numel() >= self.big)
        small = all(t.numel() < self.big for t in ins + outs)
        self.rows.append((name, read, written, small))
        return out


def show(title, run, elements, big):
    mode = Kernels(big)
    with mode:
        run()
    full = [r for r in mode.rows if not r[3]]
    print(f"{title}: {len(mode.rows)} kernels, {len(full)} over the whole tensor")
    for name, read, written, small in mode.rows:
        tag = "row-sized" if small else f"reads {read / elements:.0f} B, writes {written / elements:.0f} B per element"
        print(f"  {name:<28} {tag}")
    total = sum(r[1] + r[2] for r in full) / elements
    print(f"  total {total:.0f} B per element")


def main():
    rows, dim = 512, 1024
    x = torch.randn(rows, dim, dtype=torch.bfloat16, requires_grad=True)
    w = torch.ones(dim, dtype=torch.bfloat16, requires_grad=True)
    y = None

    def forward():
        nonlocal y
        y = F.rms_norm(x, (dim,), w, 1e-5)

    show("rms_norm forward (bf16 input and weight)", forward, rows * dim, rows * dim // 2)
    dy = torch.randn_like(y)
    show("rms_norm backward", lambda: y.backward(dy), rows * dim, rows * dim // 2)

    vocab = 4096
    logits = torch.randn(rows, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (rows,))
    loss = None

    def ce():
        nonlocal loss
        # torchtitan's loss: the logits widened to f32 first.
        loss = F.cross_entropy(logits.float(), labels)

    show("cross_entropy forward (logits.float())", ce, rows * vocab, rows * vocab // 2)
    show("cross_entropy backward", lambda: loss.backward(), rows * vocab, rows * vocab // 2)


if __name__ == "__main__":
    main()
