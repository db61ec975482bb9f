#!/usr/bin/env bash
# Runs every fsdpc test, after installing what the tests need. This is the
# README's test command; CI (.ci/run) calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

# Toolchain components (present on most machines; cheap when they are).
rustup component add rustfmt clippy >/dev/null 2>&1 || true

# The ONNX backend node tests that tests/onnx_conformance.rs runs.
export FSDPC_ONNX_NODE_TESTS="${FSDPC_ONNX_NODE_TESTS:-$PWD/target/onnx-node-tests}"
bash scripts/onnx-node-tests.sh "$FSDPC_ONNX_NODE_TESTS"

# The MiniLM-L3 encoder that tests/minilm.rs imports and plans (it skips,
# saying why, when the download fails).
bash scripts/fetch-minilm.sh target/minilm || echo "MiniLM not fetched; tests/minilm.rs will skip"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
