#!/usr/bin/env bash
# The CUDA checks that need no GPU (`.ci/run` runs them in their own stage):
#   1. the workspace builds with `--features cuda` (engine and harness binaries, release);
#   2. the CUDA tests that run without a GPU: launch geometry, the row-major→cuBLAS mapping,
#      kernel-name and constant agreement with the .cu sources, every .cu file compiled by
#      NVRTC to PTX for compute capability 8.0, 9.0 and 12.1 with warnings failing (NVRTC from
#      NVIDIA's PyPI wheel; CUDA_NVRTC_REQUIRED=1 turns a missing library into a failure), the
#      conformance table's CPU side, and the no-GPU error paths (`engine generate --backend
#      cuda` exits non-zero with the reason; parity and golden tests skip saying why);
#   3. cargo clippy --all-targets --features cuda, warnings denied;
#   4. the MLX backend built and linked against MLX's CUDA wheel (`--features mlx-cuda`, link
#      only: mlx==0.32.2 + mlx-cuda-13==0.32.2 without their ~2 GB of CUDA libraries; the
#      binary cannot run without a GPU). Reuses ci/mlx/test.sh's target dir (target/mlx), so
#      run after it; CUDA_CHECK_SKIP_MLX=1 skips this step.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
start=$(date +%s)
crates=(-p kernels -p engine -p harness)

echo "== cuda: NVRTC from PyPI"
nvrtc_dirs="$(bash ci/cuda/setup.sh | tail -n 1)"
export LD_LIBRARY_PATH="$nvrtc_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t1=$(date +%s)

# No separate `cargo build`: the test and clippy steps below build (and check) every target
# they need with the feature, and the engine binary is built for its CLI test.
t2=$(date +%s)

echo "== cuda: tests that need no GPU (NVRTC compile for 8.0/9.0/12.1, host logic, error paths)"
export CUDA_NVRTC_REQUIRED=1
cargo test --release -p kernels --features cuda --lib --test cuda_nvrtc --test cuda_conformance \
    -- --nocapture
# The engine's and harness's CUDA tests (names containing `cuda`): the golden-key naming, the
# CLI error, CPU-vs-CUDA parity and CUDA goldens (both skip, saying why).
cargo test --release -p engine --features cuda --lib --test cli_errors -- --nocapture cuda
cargo test --release -p harness --features cuda --test parity --test golden -- --nocapture cuda
t3=$(date +%s)

echo "== cuda: cargo clippy --all-targets --features cuda"
cargo clippy --release "${crates[@]}" --all-targets --features cuda -- -D warnings
t4=$(date +%s)

if [ "${CUDA_CHECK_SKIP_MLX:-}" = 1 ] || [ "$(uname -s)" != Linux ]; then
    echo "== cuda: MLX-CUDA link check skipped"
else
    echo "== cuda: MLX backend against MLX's CUDA wheel (build and link only)"
    cmake_dir="$(MLX_VENV="$root/target/mlx-cuda-venv" MLX_NO_DEPS=1 \
        MLX_WHEEL='mlx==0.32.2 mlx-cuda-13==0.32.2' bash ci/mlx/setup.sh | tail -n 1)"
    # libmlx.so of the CUDA wheel needs libcuda.so.1 (the driver) and the CUDA libraries left
    # out above: their symbols are left to run time (rust-lld, the default linker on x86-64
    # Linux, does not resolve a shared library's own dependencies). `cargo test --no-run` of the
    # engine binary's test harness, like ci/mlx/test.sh's build, shares its dependencies in
    # target/mlx: only mlx-sys (feature cuda: mlx-c against the CUDA wheel), mlx-rs and the
    # workspace crates are rebuilt.
    MLX_CMAKE_DIR="$cmake_dir" CMAKE="$root/target/mlx-cuda-venv/bin/cmake" \
        CARGO_TARGET_DIR="$root/target/mlx" \
        cargo test -p engine --features mlx-cuda --no-run --bin engine 2>&1 | tee "$root/target/mlx-cuda-link.log"
    bin="$(grep -o '([^)]*deps/engine-[0-9a-f]*)' "$root/target/mlx-cuda-link.log" | tr -d '()' | tail -n 1)"
    if [ -z "$bin" ] || ! readelf -d "$bin" | grep -q 'NEEDED.*libmlx.so'; then
        echo "cuda: the engine test binary ($bin) does not link libmlx.so" >&2
        exit 1
    fi
    echo "linked: $bin against $cmake_dir/lib/libmlx.so ($(readelf -d "$cmake_dir/lib/libmlx.so" | grep -o 'lib\(cuda\|cublasLt\|nvrtc\|cudnn\)[^]]*' | paste -sd' ' -))"
fi
t5=$(date +%s)
echo "cuda: setup $((t1 - start))s, build $((t2 - t1))s, tests $((t3 - t2))s, clippy $((t4 - t3))s, mlx-cuda link $((t5 - t4))s"
