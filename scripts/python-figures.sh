#!/usr/bin/env bash
# The Python package's figures (docs/figures/python.md; `bash
# scripts/figures.sh python` calls this): builds the release wheel, timing
# it, installs it into a venv with torch and transformers
# ($FSDPC_TORCH_VENV, default /work/venv-torch; made when missing) and runs
# python/benches/figures.py.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FSDPC_TORCH_VENV:-/work/venv-torch}"
if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet "maturin>=1.7,<2" 'torch==2.15.*' transformers onnx onnxscript
# From nothing, in a target directory of its own: what `pip install
# ./python` costs a user.
rm -rf target/wheels-release target/wheel-build
start=$(date +%s.%N)
CARGO_TARGET_DIR=target/wheel-build "$venv/bin/maturin" build --release -m python/Cargo.toml -o target/wheels-release
end=$(date +%s.%N)
rm -rf target/wheel-build
wheel=$(ls target/wheels-release/fsdpc-*.whl)
"$venv/bin/pip" install --quiet --force-reinstall --no-deps "$wheel"
"$venv/bin/python" python/benches/figures.py \
    --wheel "$wheel" --build-s "$(echo "$end - $start" | bc)" \
    --out "${FSDPC_FIGURES:-docs/figures}/python.md"
