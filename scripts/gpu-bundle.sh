#!/usr/bin/env bash
# Builds what scripts/gpu-check.sh runs (the GPU tests, the NVRTC test, the
# benchmark, the CLI; release, `--features cuda`) and copies them, stripped,
# into DIR (default target/gpu-bundle), for a GPU machine that has no cargo
# or no crates.io: carry DIR there and run
# `bash scripts/gpu-check.sh --bundle DIR`. The binaries link only glibc
# and load the CUDA libraries at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-target/gpu-bundle}
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
# Two binaries named `it`: the runtime's (NVRTC) and the root's (GPU tests,
# the conformance suite).
it_exe() { grep -o '"executable":"[^"]*/it-[^"]*"' | tail -1 | cut -d'"' -f4; }
tests_runtime=$(cargo test --release -p fsdpc-runtime --features cuda --test it --no-run --message-format=json | it_exe)
tests_root=$(cargo test --release --features cuda --test it --no-run --message-format=json | it_exe)
cargo build --release --features cuda --example cuda_gpt
cargo build --release --features cuda --bin fsdpc
mkdir -p "$out"
cp "$tests_runtime" "$out/it-runtime"
cp "$tests_root" "$out/it"
cp "$CARGO_TARGET_DIR/release/examples/cuda_gpt" "$out/cuda_gpt"
cp "$CARGO_TARGET_DIR/release/fsdpc" "$out/fsdpc"
strip "$out"/* 2>/dev/null || true
ls -l "$out"
