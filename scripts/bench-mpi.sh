#!/usr/bin/env bash
# MPI process ranks against thread ranks: tokens/s of `fsdpc train` on the
# 2-layer GPT benchmark (2 ranks, 60 steps) and on a 20.0 M-parameter GPT
# (2 ranks, 10 steps). Builds the release binary with the `mpi` feature.
# Usage: bash scripts/bench-mpi.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --features mpi --quiet
bin=target/release/fsdpc
mpirun_() { mpirun --allow-run-as-root --oversubscribe -np "$@"; }

run() { # name model ranks steps
    local name=$1 model=$2 ranks=$3 steps=$4
    local t m
    t=$("$bin" train "$model" --ranks "$ranks" --steps "$steps" | grep -o '[0-9]* tokens/s')
    m=$(mpirun_ "$ranks" "$bin" train "$model" --steps "$steps" --backend mpi | grep -o '[0-9]* tokens/s')
    printf '%-10s %d ranks, %3d steps: threads %s, MPI %s\n' "$name" "$ranks" "$steps" "$t" "$m"
}

run "gpt-2L" "gpt:layers=2,hidden=128,heads=4,seq=128,vocab=1024,batch=8" 2 60
run "gpt-20M" "gpt:layers=6,hidden=512,heads=8,seq=128,vocab=2048,batch=4" 2 10
