"""Exports tiny PyTorch language models to ONNX as test fixtures for fsdpc.

Run through scripts/export-fixtures.sh, which makes the virtualenv. Every
model computes its loss in the graph from `labels`, as
`model(input_ids=..., labels=...).loss` does, and is exported by the dynamo
exporter (opset 18) and/or the TorchScript one (opset 17), in eval or training
mode, with inline or external weights (see FIXTURES below). Beside each
`<name>.onnx` goes `<name>.json`: how it was made, the exact inputs, the loss
PyTorch computed and the loss ONNX Runtime computed for the same inputs
(dropout-free fixtures only). The README.md table is written last.

Everything is seeded; eval fixtures get small seeded noise on every weight so
that no two initializers are equal, except the deliberately fresh ones.
"""

import argparse
import dataclasses
import json
import math
import os
import sys
import warnings

import numpy as np
import onnx
import onnxruntime
import onnxscript
import torch
import torch.nn as nn
import torch.nn.functional as F
import transformers

BATCH = 2
SEQ = 16
VOCAB = 128
SEED = 1234
# BERT: masked positions per sample (the same count in every sample, so a
# per-rank mean of the loss equals the global mean when the batch is split).
MASKED_PER_SAMPLE = 4
BERT_PAD = 3  # trailing padding positions of the second BERT sample
BERT_MASK_TOKEN = 4
# Relative agreement required between the PyTorch and ONNX Runtime losses.
ORT_RTOL = 1e-4


# --- nanoGPT -----------------------------------------------------------------


@dataclasses.dataclass
class GPTConfig:
    """A tiny nanoGPT: its default dropout is 0, as in nanoGPT's train.py."""

    vocab_size: int = VOCAB
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32
    dropout: float = 0.0
    bias: bool = True


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd, bias=cfg.bias)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.n_head = cfg.n_head
        self.dropout = cfg.dropout

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        hd = c // self.n_head
        q = q.view(b, t, self.n_head, hd).transpose(1, 2)
        k = k.view(b, t, self.n_head, hd).transpose(1, 2)
        v = v.view(b, t, self.n_head, hd).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=cfg.bias)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=cfg.bias)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, bias=cfg.bias)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """nanoGPT's model: token + position embedding, pre-LN blocks, tied head."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
                wpe=nn.Embedding(cfg.block_size, cfg.n_embd),
                drop=nn.Dropout(cfg.dropout),
                h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
                ln_f=nn.LayerNorm(cfg.n_embd, bias=cfg.bias),
            )
        )
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, input_ids, labels):
        t = input_ids.shape[1]
        pos = torch.arange(0, t, dtype=torch.long, device=input_ids.device)
        x = self.transformer.drop(self.transformer.wte(input_ids) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(
            logits.view(-1, logits.size(-1)), labels.view(-1), ignore_index=-100
        )
        return loss, logits


# --- transformers models -----------------------------------------------------


class LmLoss(nn.Module):
    """A transformers LM called as
    `model(input_ids=..., attention_mask=..., labels=...)`, returning
    `(loss, logits)`. The wrapped model is the attribute `model`, so its
    parameter names gain a `model.` prefix in the exported file. (The
    TorchScript exporter does not pass keyword inputs through reliably, so both
    exporters see this positional signature. The attention mask is an input
    because without one transformers' causal models look for packed sequences
    with `torch.diff`, which the TorchScript exporter cannot export.)"""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask, labels):
        out = self.model(
            input_ids=input_ids, attention_mask=attention_mask, labels=labels, return_dict=True
        )
        return out.loss, out.logits


def gpt2(dropout):
    cfg = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=32,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=0,
        eos_token_id=0,
        resid_pdrop=dropout,
        embd_pdrop=dropout,
        attn_pdrop=dropout,
        use_cache=False,
    )
    return transformers.GPT2LMHeadModel(cfg)


def llama(dropout):
    assert dropout == 0.0, "Llama has no dropout but attention dropout, kept at 0"
    cfg = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        use_cache=False,
        tie_word_embeddings=False,
    )
    return transformers.LlamaForCausalLM(cfg)


def bert(dropout):
    cfg = transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
    )
    return transformers.BertForMaskedLM(cfg)


# --- inputs ------------------------------------------------------------------


def causal_inputs(gen, shift_inside):
    """`input_ids` and `labels` of a causal LM. With `shift_inside` (the
    transformers models shift inside the loss) the labels are the ids and an
    all-ones `attention_mask` comes too; otherwise (nanoGPT) the labels are
    the next tokens. Positions 1..2 of every
    sample are ignored (-100), the same count in each sample."""
    window = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=gen)
    ids = window[:, :SEQ].clone()
    labels = ids.clone() if shift_inside else window[:, 1:].clone()
    labels[:, 1:3] = -100
    if shift_inside:
        mask = torch.ones((BATCH, SEQ), dtype=torch.long)
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}
    return {"input_ids": ids, "labels": labels}


def masked_lm_inputs(gen):
    """BERT masked-LM inputs: MASKED_PER_SAMPLE masked positions per sample
    (labels -100 elsewhere), the second sample padded at its end."""
    ids = torch.randint(5, VOCAB, (BATCH, SEQ), generator=gen)
    labels = torch.full((BATCH, SEQ), -100, dtype=torch.long)
    mask = torch.ones((BATCH, SEQ), dtype=torch.long)
    mask[1, SEQ - BERT_PAD :] = 0
    ids[1, SEQ - BERT_PAD :] = 0
    for b in range(BATCH):
        real = SEQ - (BERT_PAD if b == 1 else 0)
        pos = torch.randperm(real - 1, generator=gen)[:MASKED_PER_SAMPLE] + 1
        labels[b, pos] = ids[b, pos]
        ids[b, pos] = BERT_MASK_TOKEN
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


# --- fixtures ----------------------------------------------------------------


@dataclasses.dataclass
class Fixture:
    name: str
    model: str  # nanogpt | gpt2 | llama | bert
    exporter: str  # dynamo | torchscript
    mode: str = "eval"  # eval | train
    weights: str = "inline"  # inline | external
    fresh: bool = False  # freshly initialised, no noise on the weights
    optimize: bool = True  # dynamo only: the exporter's default optimisation
    dropout: float = 0.0  # dropout probability in the model's config

    @property
    def opset(self):
        return 18 if self.exporter == "dynamo" else 17


FIXTURES = [
    Fixture("nanogpt_dynamo_eval", "nanogpt", "dynamo"),
    Fixture("nanogpt_torchscript_eval", "nanogpt", "torchscript"),
    Fixture("gpt2_dynamo_eval", "gpt2", "dynamo", dropout=0.1),
    Fixture("gpt2_torchscript_eval", "gpt2", "torchscript", dropout=0.1),
    Fixture("llama_dynamo_eval_external", "llama", "dynamo", weights="external"),
    Fixture("llama_torchscript_eval", "llama", "torchscript"),
    Fixture("bert_dynamo_eval", "bert", "dynamo", dropout=0.1),
    Fixture("bert_torchscript_eval_external", "bert", "torchscript", weights="external", dropout=0.1),
    Fixture("nanogpt_torchscript_train", "nanogpt", "torchscript", mode="train"),
    Fixture("llama_dynamo_train", "llama", "dynamo", mode="train"),
    Fixture("gpt2_dynamo_train", "gpt2", "dynamo", mode="train", dropout=0.1),
    Fixture("bert_torchscript_train", "bert", "torchscript", mode="train", dropout=0.1),
    Fixture("gpt2_dynamo_fresh", "gpt2", "dynamo", fresh=True, dropout=0.1),
    Fixture("gpt2_dynamo_fresh_noopt", "gpt2", "dynamo", fresh=True, optimize=False, dropout=0.1),
]


def build(fx):
    """The seeded model (wrapped to return `(loss, logits)`), its inputs in
    graph order, and the names of those inputs."""
    torch.manual_seed(SEED)
    gen = torch.Generator().manual_seed(SEED + 1)
    if fx.model == "nanogpt":
        model = GPT(GPTConfig(dropout=fx.dropout))
        inputs = causal_inputs(gen, shift_inside=False)
    elif fx.model in ("gpt2", "llama"):
        model = {"gpt2": gpt2, "llama": llama}[fx.model](fx.dropout)
        inputs = causal_inputs(gen, shift_inside=True)
    elif fx.model == "bert":
        model = bert(fx.dropout)
        inputs = masked_lm_inputs(gen)
    else:
        raise ValueError(f"unknown model {fx.model}")
    if not fx.fresh:
        noise = torch.Generator().manual_seed(SEED + 2)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.02 * torch.randn(p.shape, generator=noise))
    names = list(inputs)
    if fx.model != "nanogpt":
        model = LmLoss(model)
    model.train(fx.mode == "train")
    return model, inputs, names


def dims_of(model_proto):
    """Symbolic dimension names of the graph inputs and the sizes they take
    for the recorded inputs; also the symbol of the batch axis."""
    dims, batch_dim = {}, None
    for inp in model_proto.graph.input:
        for axis, d in enumerate(inp.type.tensor_type.shape.dim):
            if d.dim_param:
                dims[d.dim_param] = BATCH if axis == 0 else SEQ
                if axis == 0:
                    batch_dim = d.dim_param
    return dims, batch_dim


def export(fx, model, inputs, names, path):
    args = tuple(inputs[n] for n in names)
    if fx.exporter == "dynamo":
        batch = torch.export.Dim("batch", min=1, max=64)
        seq = torch.export.Dim("seq", min=2, max=32)
        dynamic = tuple({0: batch, 1: seq} for _ in names)
        prog = torch.onnx.export(
            model,
            args,
            dynamo=True,
            opset_version=fx.opset,
            input_names=names,
            output_names=["loss", "logits"],
            dynamic_shapes=dynamic,
            optimize=fx.optimize,
            external_data=fx.weights == "external",
        )
        prog.save(path, external_data=fx.weights == "external")
        return
    kwargs = {}
    if fx.mode == "train":
        kwargs = dict(training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False)
    torch.onnx.export(
        model,
        args,
        path,
        dynamo=False,
        opset_version=fx.opset,
        input_names=names,
        output_names=["loss", "logits"],
        dynamic_axes={n: {0: "batch", 1: "seq"} for n in names},
        **kwargs,
    )
    if fx.weights == "external":
        m = onnx.load(path)
        onnx.save_model(
            m,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=os.path.basename(path) + ".data",
        )


def ort_loss(path, inputs, graph_inputs):
    sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
    feeds = {n: inputs[n].numpy() for n in graph_inputs}
    out = sess.run(None, feeds)
    return float(np.asarray(out[0]))


def make(fx, out_dir):
    model, inputs, names = build(fx)
    with torch.no_grad():
        torch.manual_seed(SEED + 3)
        torch_loss = float(model(*(inputs[n] for n in names))[0])
    path = os.path.join(out_dir, fx.name + ".onnx")
    for stale in (path, path + ".data"):
        if os.path.exists(stale):
            os.remove(stale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        export(fx, model, inputs, names, path)
    proto = onnx.load(path, load_external_data=False)
    graph_inputs = [i.name for i in proto.graph.input]
    missing = [n for n in graph_inputs if n not in inputs]
    if missing:
        sys.exit(f"{fx.name}: graph inputs {missing} are not model inputs")
    dims, batch_dim = dims_of(proto)
    dropout_free = fx.mode == "eval" or fx.dropout == 0.0
    ort = ort_loss(path, inputs, graph_inputs) if dropout_free else None
    if ort is not None and abs(ort - torch_loss) > ORT_RTOL * abs(torch_loss):
        sys.exit(f"{fx.name}: ONNX Runtime loss {ort} differs from PyTorch's {torch_loss}")
    opset = next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))
    record = {
        "name": fx.name,
        "file": fx.name + ".onnx",
        "model": fx.model,
        "exporter": fx.exporter,
        "opset": opset,
        "mode": fx.mode,
        "weights": fx.weights,
        "external_data": fx.name + ".onnx.data" if fx.weights == "external" else None,
        "fresh": fx.fresh,
        "optimize": fx.optimize if fx.exporter == "dynamo" else None,
        "dropout": fx.dropout,
        "dropout_free": dropout_free,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
        "onnxscript": onnxscript.__version__,
        "onnxruntime": onnxruntime.__version__,
        "seed": SEED,
        "batch": BATCH,
        "seq": SEQ,
        "vocab": VOCAB,
        "dims": dims,
        "batch_dim": batch_dim,
        "graph_inputs": graph_inputs,
        "graph_outputs": [o.name for o in proto.graph.output],
        "nodes": len(proto.graph.node),
        "initializers": len(proto.graph.initializer),
        "torch_params": sum(p.numel() for p in model.parameters()),
        "inputs": "__INPUTS__",
        "torch_loss": torch_loss,
        "ort_loss": ort,
    }
    # One line per sample keeps the inputs readable.
    rows = {
        n: ",\n".join("   " + json.dumps(row) for row in inputs[n].tolist())
        for n in graph_inputs
    }
    body = ",\n".join(f'  "{n}": [\n{r}\n  ]' for n, r in rows.items())
    text = json.dumps(record, indent=1).replace('"__INPUTS__"', "{\n" + body + "\n }")
    with open(os.path.join(out_dir, fx.name + ".json"), "w") as f:
        f.write(text + "\n")
    record["inputs"] = {n: inputs[n].tolist() for n in graph_inputs}
    size = os.path.getsize(path) + (
        os.path.getsize(path + ".data") if os.path.exists(path + ".data") else 0
    )
    print(
        f"{fx.name}: opset {opset}, {record['nodes']} nodes, {size / 1024:.0f} KiB, "
        f"torch loss {torch_loss:.6f}, ort loss {ort}"
    )
    return record


README_HEAD = """# Real PyTorch ONNX exports

Made by `scripts/export-fixtures.sh` (which runs `scripts/export_fixtures.py`
in a throwaway virtualenv) with torch {torch}, transformers {transformers},
onnx {onnx}, onnxscript {onnxscript} and onnxruntime {onnxruntime}; read by
`tests/it/onnx_fixtures.rs`. Every model is tiny (2 layers, hidden 32, vocabulary
{vocab}, batch {batch}, sequence {seq}; seed {seed}) and computes its loss in
the graph from `labels`, as `model(input_ids=..., labels=...).loss` does. The
batch and sequence axes of every input are symbolic (`batch`, `seq`); the
transformers models also take an `attention_mask` (all ones for the causal
ones), which they are called with.

Beside each `<name>.onnx` lies `<name>.json`: exporter, opset, mode, versions,
the exact inputs, the graph's input names, the loss PyTorch computed and the
loss ONNX Runtime computed for the same inputs (`null` where dropout is active).

- nanogpt: the nanoGPT module written in the script (token + position
  embedding, pre-LN blocks, causal `F.scaled_dot_product_attention`, GELU MLP,
  tied `lm_head`, `F.cross_entropy(..., ignore_index=-100)`; dropout 0 as in
  nanoGPT's defaults).
- gpt2: `transformers.GPT2LMHeadModel`; llama: `transformers.LlamaForCausalLM`
  (RMSNorm, rotary, SwiGLU, 4 query heads over 2 key/value heads);
  bert: `transformers.BertForMaskedLM` ({masked} masked positions per sample,
  labels -100 elsewhere; the second sample has {pad} padding positions in
  `attention_mask`).
- eval fixtures: every weight moved by seeded noise (std 0.02) from its init,
  so no two initializers are equal. `fresh`: freshly initialised, exported with
  the dynamo exporter's default optimisation (which merges equal initializers
  and folds transposed weights into `val_N` constants) and with
  `optimize=False`.
- external: weights in `<name>.onnx.data` (dynamo: the exporter's own
  `external_data=True`; TorchScript: `onnx.save_model(...,
  save_as_external_data=True)`, tensors under 1 KiB stay inline).

| fixture | model | exporter | opset | mode | dropout | weights | nodes | PyTorch loss | ONNX Runtime loss |
|---|---|---|---|---|---|---|---|---|---|
"""


def write_readme(out_dir, records):
    r0 = records[0]
    text = README_HEAD.format(masked=MASKED_PER_SAMPLE, pad=BERT_PAD, **r0)
    for r in records:
        mode = r["mode"] + (" (fresh)" if r["fresh"] else "")
        if r["optimize"] is False:
            mode += ", optimize=False"
        ort = "—" if r["ort_loss"] is None else f"{r['ort_loss']:.6f}"
        text += (
            f"| `{r['name']}` | {r['model']} | {r['exporter']} | {r['opset']} | {mode} "
            f"| {r['dropout']} | {r['weights']} | {r['nodes']} | {r['torch_loss']:.6f} | {ort} |\n"
        )
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="tests/fixtures/onnx")
    ap.add_argument("--only", nargs="*", help="fixture names to export (default: all)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.use_deterministic_algorithms(True)
    records = [make(fx, a.out) for fx in FIXTURES if not a.only or fx.name in a.only]
    if not a.only:
        write_readme(a.out, records)


if __name__ == "__main__":
    main()
