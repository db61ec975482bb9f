#!/usr/bin/env bash
# Regenerates the real PyTorch ONNX exports in tests/fixtures/onnx/ (see the
# README there) with scripts/export_fixtures.py. The tests read only the
# committed files; only regenerating them needs PyTorch.
#
# Creates a throwaway virtualenv (default /work/venv-torch, or
# $FSDPC_TORCH_VENV; reused when it exists) and installs torch 2.15 (with its
# CUDA wheels from PyPI, several GB), transformers, onnx, onnxscript and
# onnxruntime into it. Needs python3 with the venv module.
#
#   scripts/export-fixtures.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FSDPC_TORCH_VENV:-/work/venv-torch}"
out="${1:-tests/fixtures/onnx}"
if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import torch, transformers, onnx, onnxscript, onnxruntime' 2>/dev/null; then
    "$venv/bin/pip" install --quiet 'torch==2.15.*' transformers onnx onnxscript onnxruntime
fi
"$venv/bin/python" scripts/export_fixtures.py --out "$out"
du -sh "$out"
