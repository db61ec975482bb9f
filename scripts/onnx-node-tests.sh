#!/usr/bin/env bash
# Fetches the ONNX project's backend node tests (test_*/model.onnx and
# test_data_set_0/{input,output}_*.pb) into DIR (default target/onnx-node-tests)
# for tests/it/onnx_conformance.rs. The onnx 1.22.0 wheel ships them; nothing is
# fetched when DIR already holds them. Needs python3 with pip.
set -euo pipefail
out=${1:-"$(dirname "$0")/../target/onnx-node-tests"}
if [ -d "$out/test_abs" ]; then exit 0; fi
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
python3 -m pip install -q --disable-pip-version-check --no-deps --target "$site" "onnx==1.22.0"
mkdir -p "$out.partial"
cp -r "$site/onnx/backend/test/data/node/." "$out.partial/"
rm -rf "$out" && mv "$out.partial" "$out"
echo "$(ls "$out" | wc -l) ONNX node tests in $out"
