#!/usr/bin/env bash
# The MLX backend built and linked against MLX's CUDA build (`--features mlx-cuda`): mlx==0.32.2
# and mlx-cuda-13==0.32.2 installed without their ~2 GB of CUDA libraries (enough to compile
# and link, not to run), then the engine binary's test harness built and checked to need
# libmlx.so. Runs in the GPU workflow (gpu.yml), where MLX's CUDA build is of use; any Linux
# machine can run it (about 4 minutes of build on 2 cores after the CPU build).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
if [ "$(uname -s)" != Linux ]; then
    echo "mlx-cuda link check: Linux only (MLX's CUDA wheels are for Linux)"
    exit 0
fi
cmake_dir="$(MLX_VENV="$root/target/mlx-cuda-venv" MLX_NO_DEPS=1 \
    MLX_WHEEL='mlx==0.32.2 mlx-cuda-13==0.32.2' bash ci/mlx/setup.sh | tail -n 1)"
# libmlx.so of the CUDA wheel needs libcuda.so.1 (the driver) and the CUDA libraries left out
# above: their symbols are left to run time (rust-lld, the default linker on x86-64 Linux, does
# not resolve a shared library's own dependencies). The shared target dir keeps these
# artifacts beside the `mlx` ones (other features, other hashes).
log="$root/target/mlx-cuda-link.log"
MLX_CMAKE_DIR="$cmake_dir" CMAKE="$root/target/mlx-cuda-venv/bin/cmake" \
    cargo test --release -p engine --features mlx-cuda --no-run --bin engine 2>&1 | tee "$log"
bin="$(grep -o '([^)]*deps/engine-[0-9a-f]*)' "$log" | tr -d '()' | tail -n 1)"
if [ -z "$bin" ] || ! readelf -d "$bin" | grep -q 'NEEDED.*libmlx.so'; then
    echo "mlx-cuda: the engine test binary ($bin) does not link libmlx.so" >&2
    exit 1
fi
echo "linked: $bin against $cmake_dir/lib/libmlx.so ($(readelf -d "$cmake_dir/lib/libmlx.so" |
    grep -o 'lib\(cuda\|cublasLt\|nvrtc\|cudnn\)[^]]*' | paste -sd' ' -))"
