#!/usr/bin/env bash
# The GPU check of the cuda target, for a machine with an
# NVIDIA GPU and driver: finds (or installs from PyPI) NVRTC, cuBLAS and
# NCCL for CUDA 13, builds with `--features cuda` (or takes the binaries
# `scripts/gpu-bundle.sh` made, for machines without cargo or crates.io),
# runs the GPU tests (every kernel against the CPU backend, a training step
# at world 1 against the CPU run, world 1 through NCCL, a traced step), a
# CLI run, a tensor-parallel run over two GPUs where there are two,
# `fsdpc calibrate --target cuda`, the prediction from the preset and from
# the calibrated file against a measured traced step, the hardware tables
# through PyTorch where it is installed, and the GPU benchmark, and prints
# what they printed (GPU_CHECK_OUT: where the cluster file, plans and
# traces go). Meant to finish well under
# 8 minutes on a fresh machine; every step has a timeout.
#
#   bash scripts/gpu-check.sh [--bundle DIR] [--quick]
#
# --bundle DIR: run the prebuilt binaries in DIR instead of building.
# --quick: the benchmark on a 4-layer GPT instead of the 24-layer one.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
bundle=""
quick=0
while [ $# -gt 0 ]; do
    case "$1" in
        --bundle) bundle=$(cd "$2" && pwd); shift 2 ;;
        --quick) quick=1; shift ;;
        *) echo "usage: $0 [--bundle DIR] [--quick]" >&2; exit 2 ;;
    esac
done
start=$(date +%s)
step() { echo; echo "=== [$(( $(date +%s) - start )) s] $*"; }
failures=()
run() { # run NAME TIMEOUT CMD...: a step that may fail without stopping the rest
    local name=$1 secs=$2; shift 2
    step "$name"
    if timeout "$secs" "$@"; then echo "--- $name: ok"; else
        local rc=$?; echo "--- $name: FAILED (exit $rc)"; failures+=("$name"); fi
}

step "GPU and driver"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || echo "nvidia-smi not found"

step "CUDA 13 libraries (NVRTC, cuBLAS, NCCL)"
# A Python whose site-packages hold NVIDIA's wheels: FSDPC_PYTHON, the
# image's, or a venv under target/ filled from PyPI.
find_site() { # prints the site-packages dir of $1 holding nvidia/cu13 and nvidia/nccl
    "$1" - <<'PY' 2>/dev/null
import os, site, sys
for p in site.getsitepackages() + [site.getusersitepackages()] + sys.path:
    n = os.path.join(p, "nvidia")
    if all(os.path.exists(os.path.join(n, f)) for f in ("cu13/lib/libnvrtc.so.13", "cu13/lib/libcublas.so.13", "nccl/lib/libnccl.so.2")):
        print(p); break
PY
}
site=""
for py in "${FSDPC_PYTHON:-}" python3 /opt/torch/.venv/bin/python3; do
    [ -n "$py" ] && command -v "$py" >/dev/null 2>&1 || continue
    site=$(find_site "$py" || true)
    if [ -n "$site" ]; then export FSDPC_PYTHON=$py; break; fi
done
if [ -z "$site" ]; then
    echo "not installed: installing nvidia-cuda-nvrtc, nvidia-cublas, nvidia-nccl-cu13 into target/gpu-venv"
    python3 -m venv target/gpu-venv
    timeout 300 target/gpu-venv/bin/pip install -q "nvidia-cuda-nvrtc>=13,<14" "nvidia-cublas>=13,<14" "nvidia-nccl-cu13"
    export FSDPC_PYTHON=$root/target/gpu-venv/bin/python
    site=$(find_site "$FSDPC_PYTHON")
fi
echo "site-packages: $site"
export FSDPC_CUDA_LIB_DIR=$site/nvidia/cu13/lib
# cudarc loads NCCL as libnccl.so from the loader's path; pip's is .so.2.
mkdir -p target/gpu-libs
ln -sf "$site/nvidia/nccl/lib/libnccl.so.2" target/gpu-libs/libnccl.so
export LD_LIBRARY_PATH=$root/target/gpu-libs:$site/nvidia/cu13/lib:$site/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
ls -l "$site/nvidia/cu13/lib" | grep -E "nvrtc|cublas" || true

if [ -n "$bundle" ]; then
    step "prebuilt binaries in $bundle"
    ls -l "$bundle"
    tests_runtime=$bundle/it-runtime
    tests_root=$bundle/it
    bench=$bundle/cuda_gpt
    cli=$bundle/fsdpc
else
    step "build (release, --features cuda)"
    command -v cargo >/dev/null || { echo "no cargo: build a bundle elsewhere (scripts/gpu-bundle.sh) and pass --bundle"; exit 1; }
    export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
    # Two binaries named `it`: the runtime's (NVRTC) and the root's (GPU
    # tests, the conformance suite).
    it_exe() { grep -o '"executable":"[^"]*/it-[^"]*"' | tail -1 | cut -d'"' -f4; }
    tests_runtime=$(timeout 420 cargo test --release -p fsdpc-runtime --features cuda --test it --no-run --message-format=json | it_exe)
    tests_root=$(timeout 420 cargo test --release --features cuda --test it --no-run --message-format=json | it_exe)
    timeout 300 cargo build --release --features cuda --example cuda_gpt
    timeout 300 cargo build --release --features cuda --bin fsdpc
    bench=$CARGO_TARGET_DIR/release/examples/cuda_gpt
    cli=$CARGO_TARGET_DIR/release/fsdpc
fi

# On this machine a missing GPU or library is a failure, not a skip.
export FSDPC_REQUIRE_GPU=1
run "kernels compile with this NVRTC (sm_80, sm_90)" 120 "$tests_runtime" --nocapture cuda_ptx::
run "GPU tests: kernels vs CPU, world-1 training vs CPU, NCCL at world 1" 240 \
    "$tests_root" --nocapture --test-threads=1 cuda::
run "fsdpc train --target cuda" 120 \
    "$cli" train gpt:layers=2,hidden=128,heads=4,seq=64,vocab=256,batch=4 --steps 5 --target cuda
run "conformance suite on the cuda target" 180 \
    env FSDPC_BIN="$cli" "$tests_root" --nocapture conformance::cuda
# A two-dimensional mesh (tensor parallelism over 2 GPUs, the vocabulary
# split too) needs two GPUs: two processes launched as torchrun would.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c GPU || true)
if [ "${gpus:-0}" -ge 2 ]; then
    mesh=target/gpu-check-tp2.json
    run "fsdpc train --target cuda, T = 2 over two GPUs" 180 bash -c '
        "$0" compile gpt:layers=2,hidden=128,heads=4,seq=64,vocab=256,batch=4 \
            --world 2 --tensor-parallel 2 --target cuda -o "$1" || exit $?
        for r in 0 1; do
            MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r \
                "$0" train "$1" --target cuda --steps 5 &
        done
        rc=0; for j in $(jobs -p); do wait "$j" || rc=$?; done; exit $rc' "$cli" "$mesh"
else
    step "T = 2 over two GPUs: skipped, ${gpus:-0} GPU(s) here"
fi
# The GPU measured (`fsdpc calibrate --target cuda`), then the plan's
# prediction from the preset of this GPU kind and from the calibrated file
# against one measured step, kernel by kernel (bf16, world 1).
case "$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)" in
    *H200*) preset=h200-141g-ib ;; *H100*) preset=h100-80g-ib ;;
    *A100*80GB*) preset=a100-80g-roce ;; *A100*) preset=a100-40g-efa ;;
    *L40S*) preset=l40s-48g-eth ;; *A10*) preset=a10-24g-eth ;; *) preset=h100-80g-ib ;;
esac
cmp_dir=${GPU_CHECK_OUT:-target/gpu-check-compare}
mkdir -p "$cmp_dir"
run "fsdpc calibrate --target cuda" 240 "$cli" calibrate --target cuda -o "$cmp_dir/calibrated.json"
gpt=gpt:layers=8,hidden=2048,heads=16,seq=2048,vocab=32000,batch=4
run "predicted (preset, calibrated) against measured: GPT 8 layers, hidden 2048, bf16" 240 bash -c '
    cli=$0 dir=$1 gpt=$2 preset=$3
    "$cli" compile "$gpt" --world 1 --target cuda --mixed-precision bf16 --cluster "$preset" \
        -o "$dir/plan.json" || exit $?
    "$cli" train "$dir/plan.json" --target cuda --steps 4 --trace "$dir/measured.json" || exit $?
    "$cli" trace "$dir/plan.json" -o "$dir/predicted-preset.json" || exit $?
    echo "--- against the $preset preset:"
    "$cli" compare "$dir/predicted-preset.json" "$dir/measured.json" || exit $?
    if [ -f "$dir/calibrated.json" ]; then
        "$cli" compile "$gpt" --world 1 --target cuda --mixed-precision bf16 \
            --cluster "$dir/calibrated.json" -o "$dir/plan-calibrated.json" || exit $?
        "$cli" trace "$dir/plan-calibrated.json" -o "$dir/predicted-calibrated.json" || exit $?
        echo "--- against the calibrated file:"
        "$cli" compare "$dir/predicted-calibrated.json" "$dir/measured.json"
    fi' "$cli" "$cmp_dir" "$gpt" "$preset"
# The tables a GPU preset holds, measured through PyTorch where it is
# installed (scripts/gpu-tables.py).
if [ "${GPU_TABLES:-1}" = 1 ] && "${FSDPC_PYTHON:-python3}" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    run "hardware tables through PyTorch (scripts/gpu-tables.py)" 150 \
        env PYTHONUNBUFFERED=1 "${FSDPC_PYTHON:-python3}" scripts/gpu-tables.py "${GPU_TABLES_OUT:-target/gpu-tables.json}"
fi
if [ "${GPU_BENCH:-1}" = 0 ]; then
    step "benchmark: skipped (GPU_BENCH=0)"
elif [ "$quick" = 1 ]; then
    run "benchmark (GPT 4 layers, hidden 2048, seq 2048, bf16)" 240 "$bench" --layers 4 --steps 5
else
    run "benchmark (GPT 24 layers, hidden 2048, seq 2048, bf16)" 300 "$bench" --layers 24 --steps 6
fi

step "done in $(( $(date +%s) - start )) s"
if [ ${#failures[@]} -gt 0 ]; then
    printf 'FAILED: %s\n' "${failures[@]}"
    exit 1
fi
echo "all GPU checks passed"
