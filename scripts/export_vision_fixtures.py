"""Exports the vision fixtures in tests/fixtures/vision/ with the real exporters.

A tiny ResNet assembled from torchvision's own `BasicBlock` (the ResNet-18
block: two 3x3 convolutions with batch normalisation, a strided 1x1
downsampling shortcut) behind the torchvision ResNet stem (7x7 stride-2
convolution, batch normalisation, 3x3 stride-2 max pool) and head (global
average pool, linear), and a tiny Hugging Face `ViTForImageClassification`;
each computes its cross-entropy loss in the graph from `labels`. Every fixture
records beside it the exact inputs, the loss PyTorch computed and the loss
ONNX Runtime computed for the same inputs.

Run it through scripts/export-fixtures.sh's virtualenv (torch, torchvision,
transformers, onnx, onnxscript, onnxruntime):

    /work/venv-torch/bin/python scripts/export_vision_fixtures.py
"""

import argparse
import dataclasses
import json
import os
import sys
import warnings

import numpy as np
import onnx
import onnxruntime
import onnxscript
import torch
import torchvision
import transformers
from torchvision.models.resnet import BasicBlock, conv1x1

BATCH = 2
IMAGE = 16
CLASSES = 10
SEED = 1234
ORT_RTOL = 1e-4
# The reference training of training-mode fixtures: plain SGD, so the
# comparison needs no optimizer detail beyond the learning rate.
REF_LR = 0.05
REF_STEPS = 3


class TinyResNet(torch.nn.Module):
    """torchvision's ResNet layout at widths 8 and 16, one `BasicBlock` per
    stage (ResNet-18 has two per stage at widths 64 to 512)."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.relu = torch.nn.ReLU(inplace=True)
        self.maxpool = torch.nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = torch.nn.Sequential(BasicBlock(8, 8))
        down = torch.nn.Sequential(conv1x1(8, 16, 2), torch.nn.BatchNorm2d(16))
        self.layer2 = torch.nn.Sequential(BasicBlock(8, 16, stride=2, downsample=down))
        self.avgpool = torch.nn.AdaptiveAvgPool2d((1, 1))
        self.fc = torch.nn.Linear(16, CLASSES)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class WithLoss(torch.nn.Module):
    """`(pixel_values, labels) -> (loss, logits)` around a classifier."""

    def __init__(self, model, hf):
        super().__init__()
        self.model = model
        self.hf = hf

    def forward(self, pixel_values, labels):
        if self.hf:
            out = self.model(pixel_values=pixel_values, labels=labels, return_dict=True)
            return out.loss, out.logits
        logits = self.model(pixel_values)
        return torch.nn.functional.cross_entropy(logits, labels), logits


def vit():
    cfg = transformers.ViTConfig(
        image_size=IMAGE,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        num_labels=CLASSES,
    )
    return transformers.ViTForImageClassification(cfg)


@dataclasses.dataclass
class Fixture:
    name: str
    model: str  # resnet | vit
    exporter: str  # dynamo | torchscript
    mode: str = "eval"  # eval | train
    optimize: bool = True  # dynamo only: the exporter's default optimisation
    committed: bool = True  # in tests/fixtures/vision (else only with --extra)

    @property
    def opset(self):
        return 18 if self.exporter == "dynamo" else 17


FIXTURES = [
    Fixture("resnet_dynamo_eval", "resnet", "dynamo"),
    Fixture("resnet_torchscript_eval", "resnet", "torchscript"),
    Fixture("resnet_dynamo_train", "resnet", "dynamo", mode="train"),
    Fixture("resnet_dynamo_train_noopt", "resnet", "dynamo", mode="train", optimize=False),
    Fixture("resnet_torchscript_train", "resnet", "torchscript", mode="train"),
    Fixture("vit_dynamo_eval", "vit", "dynamo"),
    Fixture("vit_torchscript_eval", "vit", "torchscript"),
    Fixture("vit_dynamo_train", "vit", "dynamo", mode="train"),
    # Full size (11.7M parameters, 45 MB): written only by --extra DIR, for
    # tests/it/vision.rs's FSDPC_VISION_EXTRA=DIR.
    Fixture("resnet18_dynamo_eval", "resnet18", "dynamo", committed=False),
    Fixture("resnet18_torchscript_eval", "resnet18", "torchscript", committed=False),
    Fixture("resnet18_torchscript_train", "resnet18", "torchscript", mode="train", committed=False),
]


def build(fx):
    torch.manual_seed(SEED)
    if fx.model == "resnet18":
        model = torchvision.models.resnet18(num_classes=CLASSES)
    elif fx.model == "resnet":
        model = TinyResNet()
    else:
        model = vit()
    noise = torch.Generator().manual_seed(SEED + 2)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=noise))
        # Running statistics away from (0, 1), so inference mode differs
        # from an identity normalisation.
        for m in model.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.running_mean.copy_(0.1 * torch.randn(m.running_mean.shape, generator=noise))
                m.running_var.copy_(1.0 + 0.2 * torch.rand(m.running_var.shape, generator=noise))
    gen = torch.Generator().manual_seed(SEED + 1)
    # The full-size ResNet-18 sees CIFAR-sized images; in training mode
    # 64x64, so that its last stage (1/32 of the image) normalises more
    # than two values per channel: at 32x32 with two images each channel
    # has two, the normalisation divides by a variance near `eps`, and
    # float32 runs (PyTorch's among them) disagree with float64 by 1e-4.
    image = IMAGE if fx.model != "resnet18" else (64 if fx.mode == "train" else 32)
    inputs = {
        "pixel_values": torch.randn(BATCH, 3, image, image, generator=gen),
        "labels": torch.randint(0, CLASSES, (BATCH,), generator=gen),
    }
    model = WithLoss(model, hf=fx.model == "vit")
    model.train(fx.mode == "train")
    return model, inputs


def export(fx, model, inputs, path):
    names = list(inputs)
    args = tuple(inputs[n] for n in names)
    if fx.exporter == "dynamo":
        batch = torch.export.Dim("batch", min=1, max=64)
        prog = torch.onnx.export(
            model,
            args,
            dynamo=True,
            opset_version=fx.opset,
            input_names=names,
            output_names=["loss", "logits"],
            dynamic_shapes=({0: batch}, {0: batch}),
            optimize=fx.optimize,
        )
        prog.save(path)
        return
    # The TorchScript exporter keeps training-mode batch normalisation
    # (batch statistics, running-statistics outputs) when asked to.
    mode = torch.onnx.TrainingMode.TRAINING if fx.mode == "train" else torch.onnx.TrainingMode.EVAL
    torch.onnx.export(
        model,
        args,
        path,
        dynamo=False,
        training=mode,
        opset_version=fx.opset,
        input_names=names,
        output_names=["loss", "logits"],
        dynamic_axes={n: {0: "batch"} for n in names},
        # Keep BatchNormalization nodes (constant folding would fold them
        # into the convolutions).
        do_constant_folding=False,
    )


def reference_training(model, inputs, world, lr=REF_LR, steps=REF_STEPS):
    """PyTorch training of `model` (in training mode) on the recorded batch
    split over `world` data-parallel replicas, each normalising its own
    samples and updating its own running statistics (what FSDP and DDP do
    without SyncBatchNorm), gradients averaged over the replicas, SGD at
    REF_LR for REF_STEPS steps: the mean loss of each step and replica 0's
    running statistics after the last (the ones PyTorch saves)."""
    import copy

    replicas = [copy.deepcopy(model) for _ in range(world)]
    b = BATCH // world
    losses = []
    for _ in range(steps):
        total = 0.0
        for r, m in enumerate(replicas):
            m.zero_grad()
            part = [v[r * b : (r + 1) * b] for v in inputs.values()]
            loss = m(*part)[0]
            loss.backward()
            total += loss.item()
        losses.append(total / world)
        with torch.no_grad():
            for ps in zip(*(m.parameters() for m in replicas)):
                g = sum(p.grad for p in ps) / world
                for p in ps:
                    p.sub_(lr * g)
    buffers = {
        n: t.flatten().tolist()
        for n, t in replicas[0].named_buffers()
        if n.endswith(("running_mean", "running_var"))
    }
    return {"lr": lr, "world": world, "losses": losses, "buffers": buffers}


def make(fx, out_dir):
    model, inputs = build(fx)
    torch_params = sum(p.numel() for p in model.parameters())
    # The loss of the weights as exported: a training-mode forward would
    # also update the running statistics, so it runs on a copy.
    with torch.no_grad():
        import copy

        torch_loss = float(copy.deepcopy(model)(*inputs.values())[0])
    path = os.path.join(out_dir, fx.name + ".onnx")
    if os.path.exists(path):
        os.remove(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export(fx, model, inputs, path)
    proto = onnx.load(path)
    graph_inputs = [i.name for i in proto.graph.input]
    sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    ort = float(np.asarray(sess.run(None, {n: inputs[n].numpy() for n in graph_inputs})[0]))
    ops = {}
    for n in proto.graph.node:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    training_bn = sum(
        1
        for n in proto.graph.node
        if n.op_type == "BatchNormalization"
        and any(a.name == "training_mode" and a.i == 1 for a in n.attribute)
    )
    agrees = abs(ort - torch_loss) <= ORT_RTOL * abs(torch_loss)
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    record = {
        "name": fx.name,
        "file": fx.name + ".onnx",
        "model": fx.model,
        "exporter": fx.exporter,
        "opset": opset,
        "mode": fx.mode,
        "optimize": fx.optimize if fx.exporter == "dynamo" else None,
        "torch": torch.__version__,
        "torchvision": torchvision.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
        "onnxscript": onnxscript.__version__,
        "onnxruntime": onnxruntime.__version__,
        "seed": SEED,
        "batch": BATCH,
        "image": inputs["pixel_values"].shape[-1],
        "classes": CLASSES,
        "graph_inputs": graph_inputs,
        "nodes": len(proto.graph.node),
        "ops": dict(sorted(ops.items())),
        "training_batch_norms": training_bn,
        "initializers": len(proto.graph.initializer),
        "torch_params": torch_params,
        "inputs": {
            n: {"shape": list(inputs[n].shape), "data": inputs[n].flatten().tolist()}
            for n in graph_inputs
        },
        "torch_loss": torch_loss,
        "ort_loss": ort,
        "ort_agrees": agrees,
    }
    if fx.mode == "train" and fx.model in ("resnet", "resnet18"):
        # The full ResNet-18 memorises the two images within three steps at
        # the tiny model's rate (loss 2.2 to 0.002), so it steps at a tenth
        # of it, and twice: its second gradient already sits on ReLU kinks
        # (float64 PyTorch's gradient moves 4% when the first step's
        # parameters move 1e-7), so a third step's loss says which side of
        # a kink a float32 run fell on, not whether it computes right. Two
        # steps check both steps' forward (losses, running statistics)
        # and the first step's gradient.
        lr, steps = (REF_LR / 10, 2) if fx.model == "resnet18" else (REF_LR, REF_STEPS)
        record["torch_training"] = [
            reference_training(model, inputs, w, lr, steps) for w in (1, 2)
        ]
    with open(os.path.join(out_dir, fx.name + ".json"), "w") as f:
        json.dump(record, f, indent=1)
        f.write("\n")
    size = os.path.getsize(path)
    print(
        f"{fx.name}: opset {opset}, {record['nodes']} nodes {record['ops']}, {size / 1024:.0f} KiB, "
        f"{torch_params} params, torch loss {torch_loss:.6f}, ort loss {ort:.6f}"
        + ("" if agrees else " (DIFFERENT)")
    )
    return record


README = """# Real PyTorch vision exports

Made by `scripts/export_vision_fixtures.py` (in scripts/export-fixtures.sh's
virtualenv) with torch {torch}, torchvision {torchvision}, transformers
{transformers}, onnx {onnx}, onnxscript {onnxscript} and onnxruntime
{onnxruntime}; read by `tests/it/vision.rs`. Batch {batch} of {image}x{image}
RGB images, {classes} classes, seed {seed}; every model returns `(loss,
logits)` with its cross-entropy loss computed in the graph from `labels`,
and its batch axis is symbolic (`batch`). Weights are moved by seeded noise
from their initialisation and every batch normalisation has running
statistics away from (0, 1).

- resnet: torchvision's ResNet layout (7x7 stride-2 stem convolution, batch
  normalisation, 3x3 stride-2 max pool, global average pool, linear head)
  with one torchvision `BasicBlock` per stage at widths 8 and 16 (the second
  with its strided 1x1 downsampling shortcut); ResNet-18 has two per stage at
  widths 64 to 512.
- vit: `transformers.ViTForImageClassification`, 4x4 patches, hidden 32,
  2 layers, 4 heads, no dropout.

Beside each `<name>.onnx` lies `<name>.json`: exporter, opset, mode,
versions, the ops in the file, the exact inputs, the loss PyTorch computed
and the loss ONNX Runtime computed for the same inputs.

What the exporters do with batch normalisation: the dynamo exporter writes
inference-mode `BatchNormalization` even for a module in training mode, and
its default optimisation folds each into the convolution before it (`_noopt`
keeps them), so its training-mode ResNet files compute the inference-mode
loss (ONNX Runtime's, not PyTorch's). The TorchScript exporter with
`training=TrainingMode.TRAINING` keeps training-mode `BatchNormalization`
(batch statistics, running-statistics outputs): fsdpc trains it, its
running statistics module buffers, and refuses the dynamo exporter's two
training-mode ResNet files naming the node (`tests/it/vision.rs`). The
training-mode ResNet records `torch_training`: PyTorch's losses and replica
0's running statistics after 3 SGD steps (lr 0.05) on the recorded batch,
on one replica and on two (one image each, each normalising its own).

| fixture | model | exporter | opset | mode | nodes | ops | PyTorch params | PyTorch loss | ONNX Runtime loss |
|---|---|---|---|---|---|---|---|---|---|
"""


def write_readme(out_dir):
    records = []
    for fx in FIXTURES:
        path = os.path.join(out_dir, fx.name + ".json")
        if not fx.committed:
            continue
        if os.path.exists(path):
            with open(path) as f:
                records.append(json.load(f))
    text = README.format(**records[0])
    for r in records:
        mode = r["mode"] + (", optimize=False" if r["optimize"] is False else "")
        ops = ", ".join(f"{k} {v}" for k, v in r["ops"].items())
        text += (
            f"| `{r['name']}` | {r['model']} | {r['exporter']} | {r['opset']} | {mode} "
            f"| {r['nodes']} | {ops} | {r['torch_params']} | {r['torch_loss']:.6f} "
            f"| {r['ort_loss']:.6f} |\n"
        )
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/vision")
    ap.add_argument("--only", nargs="*", help="fixture names to export (default: all)")
    ap.add_argument("--extra", help="export the full-size models, not committed, into this directory")
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    out = a.extra or a.out
    os.makedirs(out, exist_ok=True)
    for fx in FIXTURES:
        if fx.committed == (a.extra is None) and (not a.only or fx.name in a.only):
            make(fx, out)
    if a.extra is None:
        write_readme(out)


if __name__ == "__main__":
    sys.exit(main())
