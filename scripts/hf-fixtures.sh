#!/usr/bin/env bash
# Regenerates the tiny Hugging Face model directories in tests/fixtures/hf/
# with scripts/hf_fixtures.py (real `transformers` models, saved by
# `save_pretrained`, with the loss and gradients transformers computes). The
# tests read only the committed files; only regenerating them needs PyTorch.
#
# Uses the virtualenv of scripts/export-fixtures.sh (default
# /work/venv-torch, or $FSDPC_TORCH_VENV; created when missing) with torch
# and transformers.
#
#   scripts/hf-fixtures.sh [OUT_DIR]
#   scripts/hf-fixtures.sh --check-saved DIR --variant NAME
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FSDPC_TORCH_VENV:-/work/venv-torch}"
if [[ ! -x "$venv/bin/python" ]]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c 'import torch, transformers, safetensors' 2>/dev/null; then
    "$venv/bin/pip" install --quiet 'torch==2.15.*' transformers safetensors
fi
if [[ "${1:-}" == --check-saved ]]; then
    exec "$venv/bin/python" scripts/hf_fixtures.py "$@"
fi
"$venv/bin/python" scripts/hf_fixtures.py --out "${1:-tests/fixtures/hf}"
du -sh "${1:-tests/fixtures/hf}"
