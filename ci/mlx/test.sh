#!/usr/bin/env bash
# Builds the MLX backend from a fresh machine and runs its tests on MLX's CPU device:
# libclang-dev (apt), a venv with the pinned MLX wheel and cmake (PyPI), mlx-c's sources (the
# published mlx-sys crate, via cargo fetch), then the kernels and engine tests with `--features mlx`.
# Uses its own target dir so it never invalidates the default build's artifacts.
#
# Environment: CARGO_TARGET_DIR (default /work/tgt-mlx when /work exists, else target/mlx),
# plus everything ci/mlx/setup.sh reads.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
if [ -z "${CARGO_TARGET_DIR:-}" ]; then
    if [ -d /work ]; then export CARGO_TARGET_DIR=/work/tgt-mlx; else export CARGO_TARGET_DIR="$root/target/mlx"; fi
fi
start=$(date +%s)
echo "== mlx: setup (libclang, MLX wheel, cmake, mlx-c sources)"
cmake_dir="$(ci/mlx/setup.sh | tail -n 1)"
export MLX_CMAKE_DIR="$cmake_dir"
echo "MLX prefix: $MLX_CMAKE_DIR"
t1=$(date +%s)
echo "== mlx: build (mlx-c against the wheel, mlx-rs, kernels and engine --features mlx)"
cargo test -p kernels -p engine --features mlx --no-run
t2=$(date +%s)
echo "== mlx: tests on MLX's default device"
# One invocation for both crates: separate ones resolve features differently and would build
# mlx-c twice. mlx_backend: engine with every weight on MLX vs the CPU backend (greedy tokens).
cargo test -p kernels -p engine --features mlx --test mlx_conformance --test mlx_backend
t3=$(date +%s)
echo "== mlx: bindings-only type check of the metal feature"
MLX_SYS_BINDINGS_ONLY=1 cargo check -p kernels --features metal
t4=$(date +%s)
echo "mlx: setup $((t1 - start))s, build $((t2 - t1))s, tests $((t3 - t2))s, metal check $((t4 - t3))s"
