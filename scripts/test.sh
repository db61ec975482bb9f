#!/usr/bin/env bash
# Runs every fsdpc test, after installing what the tests need. This is the
# README's test command; CI (.ci/run) calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

# Toolchain components (present on most machines; cheap when they are).
rustup component add rustfmt clippy >/dev/null 2>&1 || true

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
