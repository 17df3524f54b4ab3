#!/usr/bin/env bash
# The optional backends' tests: what the `mlx` and `cuda` features add or change, in release
# and in the CPU suite's target dir, so only the crates the features change are rebuilt.
#
#   Linux (default features mlx,cuda): MLX on its CPU device (op conformance, Gated DeltaNet,
#   the native path, CPU-vs-MLX parity, goldens/mlx-cpu, the mlx-lm oracle on MLX, MTP on MLX,
#   and on the real checkpoints of the `real` stage: f32 against transformers, the bf16 import
#   in its own dtype against mlx-lm)
#   and the CUDA checks that need no GPU (every kernels/cuda/*.cu compiled by NVRTC for compute
#   capability 8.0, 9.0 and 12.1 with warnings failing, launch geometry and cuBLAS mapping, the
#   conformance table's CPU side, the no-GPU error paths; on a GPU machine the same targets run
#   on the GPU, see ci/gpu-check.sh).
#   macOS (default feature metal): the same MLX tests on the Metal GPU plus the Metal-only ones.
#
# What runs: the backend-only test binaries (kernels' `mlx` and `cuda`, built only with their
# feature), and in the other targets the tests whose names say they use a backend (`mlx::`,
# `cuda`, `metal`); the CPU tests ran in the README's test command and are not run again.
#
# Installs what it needs (ci/mlx/setup.sh: libclang, the MLX wheel and cmake, mlx-c's sources;
# ci/cuda/setup.sh: NVRTC from PyPI). Environment: BACKEND_FEATURES (comma-separated; default
# as above), CARGO_TARGET_DIR, and what the two setup scripts read.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
if [ "$(uname -s)" = Darwin ]; then
    features="${BACKEND_FEATURES:-metal}"
else
    features="${BACKEND_FEATURES:-mlx,cuda}"
fi
has() { [[ ",$features," == *",$1,"* ]]; }
start=$(date +%s)

echo "== backends ($features): setup"
if has mlx || has metal; then
    MLX_CMAKE_DIR="$(bash ci/mlx/setup.sh | tail -n 1)"
    export MLX_CMAKE_DIR
    echo "MLX prefix: $MLX_CMAKE_DIR"
fi
# One package selection for every cargo call below: cargo resolves features per selection, so
# a narrower one would rebuild dependencies with other features.
pkgs=(-p kernels -p engine -p harness)
own=()
if has mlx || has metal; then own+=(--test mlx); fi
if has cuda; then
    nvrtc_dirs="$(bash ci/cuda/setup.sh | tail -n 1)"
    export LD_LIBRARY_PATH="$nvrtc_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    # CI always installs NVRTC: a missing library is a failure, not a skip.
    export CUDA_NVRTC_REQUIRED=1
    own+=(--test cuda)
fi
shared=(--lib --test engine --test harness)
t1=$(date +%s)

echo "== backends: build"
cargo test --release --features "$features" "${pkgs[@]}" "${own[@]}" "${shared[@]}" --no-run
t2=$(date +%s)

echo "== backends: the backend-only binaries (${own[*]})"
cargo test --release --features "$features" "${pkgs[@]}" "${own[@]}"
echo "== backends: the backend tests of the other targets"
cargo test --release --features "$features" "${pkgs[@]}" "${shared[@]}" -- mlx:: cuda metal
if has mlx; then
    # MLX's CPU device on real weights: the checkpoints ci/real/fetch.sh caches (the `real`
    # stage fetched them; fetching again only lists the folders). Per checkpoint: f32 against
    # transformers, the bf16 import in its own dtype against mlx-lm running that dtype.
    echo "== backends: MLX on the real checkpoints"
    mapfile -t folders < <(bash ci/real/fetch.sh)
    for reference in goldens/real/*.json; do
        key="$(basename "$reference" .json)"
        dir="$(printf '%s\n' "${folders[@]}" | grep "/$key\$" || true)"
        [ -n "$dir" ] || { echo "ci/backends/test.sh: no fetched folder for $reference" >&2; exit 1; }
        # The quantized folders are checked on the CPU only: MLX's CPU device is slow here (see
        # real_checkpoints.rs), and the mlx-written oracle cases hold MLX's quantized products.
        case "$key" in
        *-q4 | *-q8) continue ;;
        esac
        runs=("$dir mlx_references_match" "$dir-bf16 mlx_native_matches_mlx_lm")
        for run in "${runs[@]}"; do
            set -- $run
            log="$(mktemp)"
            E2E_MODEL_DIR="$1" E2E_MODEL_KEY="$key" cargo test --release --features "$features" \
                "${pkgs[@]}" --test harness -- --ignored --nocapture --exact \
                "real_checkpoints::on_mlx::$2" 2>&1 | tee "$log"
            if grep -q "E2E-SKIPPED" "$log" || ! grep -q "test result: ok. 1 passed" "$log"; then
                echo "ci/backends/test.sh: real_checkpoints::on_mlx::$2 did not pass on $1" >&2
                exit 1
            fi
            rm -f "$log"
        done
    done
fi
t3=$(date +%s)
echo "backends: setup $((t1 - start))s, build $((t2 - t1))s, tests $((t3 - t2))s"
