"""Makes tiny Hugging Face model directories as test fixtures for fsdpc.

Run through scripts/hf-fixtures.sh, which makes the virtualenv. For every
variant below, `transformers` builds a tiny randomly initialised model of
that architecture, every weight gets small seeded noise (so biases and norm
weights are not all zeros and ones), and `save_pretrained` writes the
directory (config.json and safetensors; one variant sharded with an index,
one in bfloat16). Beside it go

- reference.json: the inputs (`ids`, `labels` = the next tokens), the mean
  cross-entropy of transformers' logits against the labels, and how the
  fixture was made;
- grads.safetensors: the gradients of that loss for a few parameters, under
  their Hugging Face names.

With `--check-saved DIR --variant NAME`, instead loads DIR (a directory
`fsdpc train --save-hf` wrote) with transformers and prints, as JSON, the
loss it computes on that variant's recorded inputs.
"""

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F
import transformers
from safetensors.torch import save_file

SEED = 1234
BATCH = 2
SEQ = 12
VOCAB = 64
NOISE = 0.02
GRADS = [
    "model.embed_tokens.weight",
    "model.layers.0.self_attn.q_proj.weight",
    "model.layers.0.self_attn.q_proj.bias",
    "model.layers.0.self_attn.q_norm.weight",
    "model.layers.0.self_attn.qkv_proj.weight",
    "model.layers.1.self_attn.k_proj.weight",
    "model.layers.1.mlp.down_proj.weight",
    "model.layers.1.mlp.gate_up_proj.weight",
    "model.norm.weight",
    "lm_head.weight",
    "transformer.wte.weight",
    "transformer.h.0.attn.c_attn.weight",
    "transformer.h.1.mlp.c_fc.bias",
    "transformer.ln_f.weight",
]


def small(**kw):
    base = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    base.update(kw)
    return base


# name -> (config class, config kwargs, save options)
VARIANTS = {
    "llama": ("LlamaConfig", small(), {"max_shard_size": "40KB"}),
    "llama31": (
        "LlamaConfig",
        small(
            rope_theta=500000.0,
            rope_scaling={
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
        {},
    ),
    "qwen2": ("Qwen2Config", small(tie_word_embeddings=True, rms_norm_eps=1e-6), {}),
    "qwen2_yarn": (
        "Qwen2Config",
        small(
            rope_theta=1000000.0,
            rope_scaling={
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        ),
        {},
    ),
    "qwen3": ("Qwen3Config", small(head_dim=16, rms_norm_eps=1e-6), {}),
    "mistral": ("MistralConfig", small(num_key_value_heads=1, sliding_window=5), {"dtype": "bfloat16"}),
    "phi3": (
        "Phi3Config",
        small(num_key_value_heads=4, sliding_window=5, pad_token_id=0, bos_token_id=1, eos_token_id=2),
        {},
    ),
    "gpt2": (
        "GPT2Config",
        dict(
            vocab_size=VOCAB,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=32,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        ),
        {},
    ),
}


def inputs(name):
    g = torch.Generator().manual_seed(SEED + sum(map(ord, name)))
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_of(model, ids, labels):
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1))


def make(name, out):
    cls, kw, save = VARIANTS[name]
    cfg = getattr(transformers, cls)(**kw)
    cfg._attn_implementation = "eager"
    torch.manual_seed(SEED)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager")
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(NOISE * torch.randn(p.shape, generator=g))
    dtype = save.get("dtype")
    if dtype:
        # Stored in bfloat16; the reference computes in f32 from those values.
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(getattr(torch, dtype)).float())
    model.train()
    ids, labels = inputs(name)
    loss = loss_of(model, ids, labels)
    loss.backward()
    d = os.path.join(out, name)
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    # The gradients first: converting the model for saving converts them too.
    named = dict(model.named_parameters())
    grads = {n: named[n].grad.float().clone() for n in GRADS if n in named and named[n].grad is not None}
    to_save = model.to(getattr(torch, dtype)) if dtype else model
    to_save.save_pretrained(d, max_shard_size=save.get("max_shard_size", "5GB"))
    save_file(grads, os.path.join(d, "grads.safetensors"))
    ref = {
        "variant": name,
        "config_class": cls,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "seed": SEED,
        "noise_std": NOISE,
        "stored_dtype": dtype or "float32",
        "batch": BATCH,
        "seq": SEQ,
        "ids": ids.tolist(),
        "labels": labels.tolist(),
        "loss": loss.item(),
        "grads": sorted(grads),
    }
    with open(os.path.join(d, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(f"{name}: loss {loss.item():.6f}, grads of {len(grads)} parameters, files {sorted(os.listdir(d))}")


def check_saved(path, name):
    ids, labels = inputs(name)
    model = transformers.AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    model.train()
    with torch.no_grad():
        loss = loss_of(model, ids, labels)
    print(json.dumps({"variant": name, "loss": loss.item(), "transformers": transformers.__version__}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/fixtures/hf")
    ap.add_argument("--check-saved")
    ap.add_argument("--variant")
    a = ap.parse_args()
    torch.use_deterministic_algorithms(True)
    if a.check_saved:
        check_saved(a.check_saved, a.variant)
        return
    for name in VARIANTS:
        make(name, a.out)


if __name__ == "__main__":
    sys.exit(main())
