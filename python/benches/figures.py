"""The Python package's figures, written as docs/figures/python.md (run by
scripts/python-figures.sh, which builds and installs the release wheel
first): the wheel's size and build time; planning GPT-3 175B on 512 GPUs
from Python against the `fsdpc` command; a plan applied to PyTorch FSDP2
on 2 gloo processes against the unwrapped module; what `from_torch` of a
transformers Llama costs."""

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import fsdpc

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(HERE, "..", "tests")
RUNS = 5

GPT3 = dict(world=512, cluster="a100-80g-roce", mixed_precision="bf16", activation_checkpointing=True)
GPT3_ARGS = ["--world", "512", "--cluster", "a100-80g-roce", "--mixed-precision", "bf16", "--activation-checkpointing"]


def machine() -> str:
    model = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{model}, {os.cpu_count()} cores, {mem:.1f} GiB of memory"


def median_s(fn) -> float:
    times = []
    for _ in range(RUNS):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def planning(out: list) -> None:
    command = os.path.join(os.path.dirname(sys.executable), "fsdpc")
    tmp = tempfile.mkdtemp()
    path = os.path.join(tmp, "gpt3.json")
    py = median_s(lambda: fsdpc.compile("gpt3-175b", **GPT3))
    py_save = median_s(lambda: fsdpc.compile("gpt3-175b", **GPT3).save(path))
    cli = median_s(lambda: subprocess.run([command, "compile", "gpt3-175b", *GPT3_ARGS, "-o", path], check=True, capture_output=True))
    plan = fsdpc.compile("gpt3-175b", **GPT3)
    same = json.loads(plan.to_json()) == json.loads(open(path).read())
    shutil.rmtree(tmp)
    out.append("### Planning GPT-3 175B for 512 A100s (bf16, activation checkpointing)")
    out.append("")
    out.append(f"Median of {RUNS} runs each; the plan has {len(plan.units)} units and {len(plan.doc['instructions'])} instructions.")
    out.append("")
    out.append("| how | seconds |")
    out.append("|---|---|")
    out.append(f"| `fsdpc.compile(\"gpt3-175b\", world=512, ...)` in Python | {py:.3f} |")
    out.append(f"| the same, then `plan.save(path)` | {py_save:.3f} |")
    out.append(f"| `fsdpc compile gpt3-175b --world 512 ... -o FILE` (the wheel's command, a new process) | {cli:.3f} |")
    out.append("")
    out.append(f"The plan Python makes is the command's, field for field: {same}.")
    out.append("")


def fsdp2(out: list) -> None:
    result = os.path.join(tempfile.mkdtemp(), "run.json")
    env = dict(os.environ, PYTHONPATH=TESTS, OMP_NUM_THREADS="1")
    subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         os.path.join(TESTS, "fsdp2_worker.py"), result, "activation_checkpointing=true"],
        check=True, capture_output=True, env=env,
    )
    r = json.load(open(result))
    sys.path.insert(0, TESTS)
    from tiny import Tiny

    tiny = Tiny()
    params = list(tiny.parameters())
    out.append("### A plan applied to PyTorch FSDP2 against the unwrapped module")
    out.append("")
    out.append(
        f"The tests' tiny model ({len(tiny.blocks)} blocks, {len(params)} parameter tensors, "
        f"{sum(p.numel() for p in params):,} elements) planned with `from_torch(..., world=2, "
        "activation_checkpointing=True, optimizer=\"sgd\", lr=0.1)`, applied with "
        "`fsdpc.torch.apply` on 2 gloo processes, each training on its half of a batch of 4; "
        "beside it the unwrapped module on the whole batch (python/tests/fsdp2_worker.py)."
    )
    out.append("")
    out.append("| step | FSDP2 (mean of the ranks) | unwrapped | difference |")
    out.append("|---|---|---|---|")
    for i, (a, b) in enumerate(zip(r["losses"], r["reference"])):
        out.append(f"| {i + 1} | {a:.9f} | {b:.9f} | {abs(a - b):.1e} |")
    out.append("")
    out.append(f"Largest parameter difference after {len(r['losses'])} steps: {r['param_diff']:.1e}.")
    out.append("")


def llama(out: list) -> None:
    import torch
    import transformers

    rows = []
    for layers, hidden, inter, heads, kv, vocab, seq in [
        (4, 512, 1376, 8, 8, 32000, 128),
        (8, 1024, 2752, 16, 8, 32000, 256),
    ]:
        cfg = transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv, max_position_embeddings=seq, use_cache=False,
        )
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg)
        ids = torch.zeros(1, seq, dtype=torch.long)
        mask = torch.ones(1, seq, dtype=torch.long)
        t = time.perf_counter()
        # With an attention mask given, transformers computes no positions
        # from it (a CumSum fsdpc does not import).
        plan = fsdpc.from_torch(model, (ids, mask), loss="cross_entropy", world=8, cluster="h100-80g-ib",
                                mixed_precision="bf16")
        total = time.perf_counter() - t
        params = sum(p.numel() for p in model.parameters())
        names = sorted(p for u in plan.units for p in u.params)
        assert names == sorted(n for n, _ in model.named_parameters()), "the plan renamed parameters"
        rows.append((layers, hidden, seq, params, len(plan.units), plan.timings["export_s"], plan.timings["plan_s"], total))
    out.append("### `from_torch` of a transformers Llama")
    out.append("")
    out.append(
        f"`transformers.LlamaForCausalLM` (transformers {transformers.__version__}, torch {torch.__version__}), "
        "random weights, called as `model(input_ids, attention_mask)` at batch 1, exported by the dynamo "
        "exporter and planned for 8 H100s in bf16; the plan's parameter names are the model's."
    )
    out.append("")
    out.append("| layers | hidden | sequence | parameters | units | export s | plan s | total s |")
    out.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        out.append(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:,} | {r[4]} | {r[5]:.2f} | {r[6]:.3f} | {r[7]:.2f} |")
    out.append("")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--wheel", required=True)
    ap.add_argument("--build-s", type=float, required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    started = time.perf_counter()
    load = open("/proc/loadavg").read().split()[0]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    body: list = []
    body.append("### The wheel")
    body.append("")
    body.append("| wheel | size | `maturin build --release`, from nothing |")
    body.append("|---|---|---|")
    body.append(f"| `{os.path.basename(a.wheel)}` | {os.path.getsize(a.wheel) / 2**20:.2f} MiB | {a.build_s:.0f} s |")
    body.append("")
    body.append(
        "Built in a target directory of its own, every dependency compiled: what `pip install ./python` "
        "costs on this machine."
    )
    body.append("")
    planning(body)
    fsdp2(body)
    llama(body)
    took = time.perf_counter() - started
    head = [
        "## python: the Python package",
        "",
        "The wheel, planning from Python against the command line, a plan applied to PyTorch FSDP2, and `from_torch`.",
        "",
        "```sh",
        "bash scripts/python-figures.sh",
        "```",
        "",
        f"Run {now} on {machine()} (load average {load} at the start), Python {platform.python_version()}; it took {took:.1f} s.",
        "",
    ]
    with open(a.out, "w") as f:
        f.write("\n".join(head + body))
    print("\n".join(head + body))


if __name__ == "__main__":
    main()
