#!/usr/bin/env bash
# Builds the MLX backend from a fresh machine and runs the whole test suite with it:
# libclang-dev (apt), a venv with the pinned MLX wheel and cmake (PyPI), mlx-c's sources (the
# published mlx-sys crate, via cargo fetch), then `cargo test --workspace --features mlx`
# (`metal` on macOS): the CPU tests again plus the MLX ones (op conformance, CPU-vs-MLX parity,
# goldens/mlx-cpu, the oracle on MLX). On Linux it then type-checks the Metal-only code in
# mlx-sys's bindings-only mode. Uses its own target dir so the default build's artifacts stay.
#
# Environment: CARGO_TARGET_DIR (default <repo>/target/mlx), MLX_FEATURE (default `metal` on
# macOS, else `mlx`), plus everything ci/mlx/setup.sh reads.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target/mlx}"
if [ "$(uname -s)" = Darwin ]; then
    feature="${MLX_FEATURE:-metal}"
else
    feature="${MLX_FEATURE:-mlx}"
fi
start=$(date +%s)
echo "== mlx: setup (libclang, MLX wheel, cmake, mlx-c sources)"
cmake_dir="$(ci/mlx/setup.sh | tail -n 1)"
export MLX_CMAKE_DIR="$cmake_dir"
echo "MLX prefix: $MLX_CMAKE_DIR"
t1=$(date +%s)
echo "== mlx: build (mlx-c against the wheel, mlx-rs, the workspace with --features $feature)"
cargo test --workspace --features "$feature" --no-run
t2=$(date +%s)
echo "== mlx: cargo test --workspace --features $feature"
cargo test --workspace --features "$feature"
t3=$(date +%s)
if [ "$(uname -s)" != Darwin ]; then
    echo "== mlx: bindings-only type check of the metal feature"
    # Libraries and binaries only: the Metal test modules are type-checked (and run) by the
    # macOS job of ci/github/ci.yml; checking every test target here took minutes.
    MLX_SYS_BINDINGS_ONLY=1 cargo check --workspace --features metal
fi
t4=$(date +%s)
echo "mlx: setup $((t1 - start))s, build $((t2 - t1))s, tests $((t3 - t2))s, metal check $((t4 - t3))s"
