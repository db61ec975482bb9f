#!/usr/bin/env bash
# Runs every fsdpc test, after installing what the tests need. This is the
# README's test command; CI (.ci/run) calls it.
set -euo pipefail
cd "$(dirname "$0")/.."

# Toolchain components (present on most machines; cheap when they are).
rustup component add rustfmt clippy >/dev/null 2>&1 || true

# MPI for the process-rank backend (`--features mpi`, tests/it/mpi.rs): the
# library, mpirun, and libclang for rsmpi's bindings. Installed as root when
# missing.
if ! command -v mpirun >/dev/null 2>&1 || ! dpkg -s libopenmpi-dev libclang-dev >/dev/null 2>&1; then
    apt-get update && apt-get install -y libopenmpi-dev openmpi-bin clang libclang-dev
fi

# Headless Chromium for tests/it/report.rs (opens the HTML report, screenshots it).
command -v chromium >/dev/null 2>&1 || { apt-get update && apt-get install -y chromium; }

# The ONNX backend node tests that tests/it/onnx_conformance.rs runs.
export FSDPC_ONNX_NODE_TESTS="${FSDPC_ONNX_NODE_TESTS:-$PWD/target/onnx-node-tests}"
bash scripts/onnx-node-tests.sh "$FSDPC_ONNX_NODE_TESTS"

# The MiniLM-L3 encoder that tests/it/minilm.rs imports and plans (it skips,
# saying why, when the download fails).
bash scripts/fetch-minilm.sh target/minilm || echo "MiniLM not fetched; tests/it/minilm.rs will skip"

cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The docs' commands, `fsdpc calibrate` among them (tests/it/docs.rs).
export FSDPC_DOCS_SLOW=1
cargo test --workspace
# MPI process ranks against thread ranks (mpirun as root needs
# --allow-run-as-root; the test passes it and --oversubscribe).
cargo clippy --features mpi --all-targets -- -D warnings
cargo test --features mpi --test it -- mpi:: conformance:: docs::

# The cuda backend (`--features cuda`, runtime/src/cuda/) builds and lints
# without CUDA. Its kernels compile with NVRTC alone, so pip's NVRTC (in a
# throwaway venv under target/) compiles every kernel file for sm_80 and
# sm_90 here (runtime/tests/it/cuda_ptx.rs fails under CI when NVRTC is
# missing); its GPU tests (tests/it/cuda.rs, the conformance suite's cuda
# part) skip without a GPU, and `fsdpc train --target cuda` must say in one
# line what is missing.
cuda_venv=target/cuda-venv
if [ ! -x "$cuda_venv/bin/python" ]; then python3 -m venv "$cuda_venv"; fi
"$cuda_venv/bin/pip" install -q "nvidia-cuda-nvrtc>=13,<14"
FSDPC_CUDA_LIB_DIR=$("$cuda_venv/bin/python" -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')
export FSDPC_CUDA_LIB_DIR
cargo clippy --workspace --features cuda --all-targets -- -D warnings
cargo test --features cuda -p fsdpc-runtime --lib targets::cuda::
cargo test --features cuda -p fsdpc-runtime --test it -- cuda_ptx:: cuda_emulate::
cargo test --features cuda --test it -- cuda:: targets:: conformance:: cli::cuda_backend

# The Python package (python/): the wheel built with maturin (the dev
# profile, whose dependencies are the test build's; `pip install ./python`
# builds release),
# installed into its own venv beside torch (PyPI's wheel, run on the CPU)
# and the exporter's packages, and its tests (python/tests/: the API, and
# plans applied to FSDP2 on 2 gloo processes) under pytest. Without torch
# the torch tests would skip; FSDPC_REQUIRE_TORCH makes them fail instead.
py_venv=target/py-venv
if [ ! -x "$py_venv/bin/python" ]; then python3 -m venv "$py_venv"; fi
"$py_venv/bin/pip" install -q "maturin>=1.7,<2" pytest "torch==2.15.*" onnx onnxscript
rm -rf target/wheels
"$py_venv/bin/maturin" build -m python/Cargo.toml -o target/wheels
"$py_venv/bin/pip" install -q --force-reinstall --no-deps target/wheels/fsdpc-*.whl
FSDPC_REQUIRE_TORCH=1 "$py_venv/bin/python" -m pytest -q -p no:cacheprovider python/tests

# Fuzz the ONNX import for a minute, seeded with the committed corpus
# (fuzz/corpus/onnx; frontends/tests/it/fuzz_corpus.rs replays it in every
# `cargo test`). cargo-fuzz needs nightly flags: RUSTC_BOOTSTRAP=1 allows them
# on stable, and --sanitizer none needs no sanitizer runtime. New inputs go to
# target/fuzz-corpus, not to the committed corpus; a crash fails this script.
if ! cargo fuzz --version >/dev/null 2>&1; then
    cargo install cargo-fuzz --locked >/dev/null 2>&1 ||
        echo "skipping the fuzz run: cargo-fuzz could not be installed (cargo install cargo-fuzz failed)"
fi
if cargo fuzz --version >/dev/null 2>&1; then
    mkdir -p target/fuzz-corpus
    # libFuzzer logs every new input; keep its log, show the summary (or
    # the end of the log when it finds a crash).
    if (cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none onnx_import \
        ../target/fuzz-corpus corpus/onnx -- \
        -max_total_time=60 -timeout=20 -rss_limit_mb=2048 -print_final_stats=1) \
        >target/fuzz.log 2>&1; then
        grep -E '^(Done|stat::)' target/fuzz.log
    else
        tail -n 60 target/fuzz.log
        echo "the ONNX fuzz run failed; the input is in fuzz/artifacts/onnx_import/ (log: target/fuzz.log)"
        exit 1
    fi
fi
