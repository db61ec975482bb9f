"""Measures the tables a GPU preset holds, through PyTorch's cuBLAS,
FlashAttention and copy kernels, on the GPU at hand, and prints them as
JSON: matrix products by shape and dtype, fused attention forward and
backward by sequence length and head size (PyTorch's default kernel,
recording which it is, then FlashAttention-2 and cuDNN attention by name),
memory-bound kernels by size, and the device memory a process holds
besides its allocations.

    python3 scripts/gpu-tables.py [OUT.json] [--seconds S]

Each figure is the median of timed repetitions (CUDA events) after
warm-up, on random data. No end-to-end training result goes in.
"""

import contextlib
import json
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def nvml_used():
    try:
        import pynvml

        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        return pynvml.nvmlDeviceGetMemoryInfo(h).used
    except Exception:  # noqa: BLE001 - NVML is optional here
        return None


def timed(fn, budget_s=0.15, min_reps=5):
    """Median seconds of one call of fn, after warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max(time.perf_counter() - t0, 1e-6)
    reps = max(min_reps, min(200, int(budget_s / one)))
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def matmuls(dtype, shapes, layout="nn"):
    """C[m, n] = op(A) op(B) with A stored [k, m] when layout[0] is 't' and
    B stored [n, k] when layout[1] is 't'."""
    rows = []
    for m, n, k in shapes:
        a = torch.randn(*((k, m) if layout[0] == "t" else (m, k)), device="cuda", dtype=dtype)
        b = torch.randn(*((n, k) if layout[1] == "t" else (k, n)), device="cuda", dtype=dtype)
        opa = a.t() if layout[0] == "t" else a
        opb = b.t() if layout[1] == "t" else b
        s = timed(lambda: opa @ opb)
        rows.append({"m": m, "n": n, "k": k, "layout": layout, "seconds": s,
                     "tflops": 2 * m * n * k / s / 1e12})
        del a, b, opa, opb
    return rows


def chosen_backend(q, k, v):
    """The SDPA kernel PyTorch picks for these operands by default."""
    try:
        return SDPBackend(torch._fused_sdp_choice(q, k, v, is_causal=True)).name
    except Exception as e:  # noqa: BLE001 - a private API; record why not
        return f"unknown ({type(e).__name__})"


def attention(seqs, heads_dims, tokens=16384, backend=None):
    """Causal bf16 attention by sequence and head size, through PyTorch's
    default SDPA kernel (backend None, recording which it is) or the named
    one (a `torch.nn.attention.SDPBackend`)."""
    rows = []
    for d, heads in heads_dims:
        for s in seqs:
            batch = max(1, tokens // s)
            q, k, v = (
                torch.randn(batch, heads, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(3)
            )
            row = {"seq": s, "head_dim": d, "heads": heads, "batch": batch,
                   "kernel": chosen_backend(q, k, v) if backend is None else backend.name}
            scope = contextlib.nullcontext() if backend is None else sdpa_kernel(backend)
            try:
                with scope:
                    fwd = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
                    out = fwd()
                    g = torch.randn_like(out)
                    t_f = timed(fwd)
                    t_fb = timed(lambda: torch.autograd.grad(fwd(), (q, k, v), g))
            except RuntimeError as e:
                row["error"] = str(e).splitlines()[0]
            else:
                # Causal: half the score matrix; 4*b*h*s*s*d/2 forward, 2.5x that backward.
                f_flops = 2 * batch * heads * s * s * d
                row.update({
                    "forward_s": t_f, "backward_s": t_fb - t_f,
                    "forward_tflops": f_flops / t_f / 1e12,
                    "backward_tflops": 2.5 * f_flops / max(t_fb - t_f, 1e-9) / 1e12,
                })
                del out, g
            rows.append(row)
            del q, k, v
    return rows


def memory_bound(sizes):
    rows = []
    for n in sizes:
        x = torch.empty(n // 2, device="cuda", dtype=torch.bfloat16).normal_()
        y = torch.empty_like(x)
        t_copy = timed(lambda: y.copy_(x))
        t_add = timed(lambda: torch.add(x, y, out=y))
        rows.append({
            "bytes": n,
            "copy_s": t_copy, "copy_gbps": 2 * n / t_copy / 1e9,
            "add_s": t_add, "add_gbps": 3 * n / t_add / 1e9,
        })
        del x, y
    return rows


def main():
    out = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else None
    before = nvml_used()
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    context = total - free
    a = torch.randn(256, 256, device="cuda")
    _ = a @ a
    torch.cuda.synchronize()
    free2, _ = torch.cuda.mem_get_info()
    cublas = (total - free2) - context - torch.cuda.memory_reserved()
    p = torch.cuda.get_device_properties(0)
    result = {
        "device": p.name,
        "multiprocessors": p.multi_processor_count,
        "total_bytes": total,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "date": time.strftime("%Y-%m-%d"),
        "nvml_used_before_bytes": before,
        "context_bytes": context,
        "cublas_first_product_bytes": cublas,
    }
    tok = [1024, 4096, 16384]
    nk = [(1024, 1024), (2048, 2048), (4096, 4096), (8192, 8192), (3 * 4096, 4096),
          (14336, 4096), (4096, 14336), (28672, 8192), (8192, 28672), (128256, 4096)]
    shapes = [(m, n, k) for m in tok for n, k in nk]
    torch.backends.cuda.matmul.allow_tf32 = False
    t0 = time.time()
    squares = [(d, d, d) for d in (256, 512, 1024, 2048, 4096, 8192, 16384)]
    skinny = [(r, n, k) for r in (16, 64) for n, k in ((4096, 4096), (14336, 4096), (8192, 8192))]
    result["matmul_bf16"] = [row for lay in ("nn", "nt", "tn")
                             for row in matmuls(torch.bfloat16, squares + shapes + skinny, lay)]
    result["matmul_f32"] = matmuls(torch.float32, [s for s in shapes if s[0] == 4096])
    torch.backends.cuda.matmul.allow_tf32 = True
    result["matmul_tf32"] = matmuls(torch.float32, [s for s in shapes if s[0] == 4096])
    seqs, dims = [512, 1024, 2048, 4096, 8192], [(64, 16), (128, 32)]
    result["attention_bf16_causal"] = attention(seqs, dims)
    result["cudnn_version"] = torch.backends.cudnn.version()
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION"):
        result[f"attention_bf16_causal_{name.lower()}"] = attention(seqs, dims, backend=getattr(SDPBackend, name))
    result["memory_bound_bf16"] = memory_bound([1 << e for e in range(20, 33, 2)])
    result["seconds"] = time.time() - t0
    text = json.dumps(result, indent=1)
    if out:
        with open(out, "w") as f:
            f.write(text)
    for key in ("matmul_bf16", "matmul_tf32", "matmul_f32"):
        print(key, " ".join(f"{r['layout']}{r['m']}x{r['n']}x{r['k']}:{r['tflops']:.0f}" for r in result[key]))
    for key in ("attention_bf16_causal", "attention_bf16_causal_flash_attention",
                "attention_bf16_causal_cudnn_attention"):
        for r in result[key]:
            if "error" in r:
                print(f"attention {r['kernel']} s={r['seq']} d={r['head_dim']}: {r['error']}")
            else:
                print(f"attention {r['kernel']} s={r['seq']} d={r['head_dim']}: "
                      f"fwd {r['forward_tflops']:.0f} bwd {r['backward_tflops']:.0f} TFLOP/s")
    for r in result["memory_bound_bf16"]:
        print(f"{r['bytes']} B: copy {r['copy_gbps']:.0f} GB/s add {r['add_gbps']:.0f} GB/s")
    print(f"context {context} B, cuBLAS first product {cublas} B, measured in {result['seconds']:.1f} s")


if __name__ == "__main__":
    main()
