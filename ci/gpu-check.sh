#!/usr/bin/env bash
# The CUDA backend on a machine with an NVIDIA GPU, from a bare machine that has the Rust
# toolchain, Python 3, the NVIDIA driver and this repository (CI's `cuda` job on a self-hosted
# runner labelled `gpu`; run it by hand the first time a GPU is at hand). About 5-8 minutes on
# one data-centre GPU, most of it the cold build.
#   1. NVRTC and cuBLAS from NVIDIA's PyPI wheels, matching the driver (ci/cuda/setup.sh
#      --runtime); no CUDA toolkit;
#   2. cargo build --release --features cuda;
#   3. the CUDA tests with a GPU required (CUDA_CONFORMANCE_REQUIRED=1: a missing GPU or
#      library fails instead of skipping): kernels' `cuda` binary (op conformance against the
#      CPU reference, NVRTC compiles), and every test named for CUDA in the other targets
#      (CPU-vs-CUDA parity on every family and format, goldens/cuda-<gpu>, which fail when this
#      GPU model has none committed; GPU_CHECK_BLESS=1 blesses them first, to commit);
#   4. harness parity --a backend=cpu --b backend=cuda on tiny Qwen3 and Qwen3.5 (both GDN
#      paths), kept as text;
#   5. a per-step vs chunked TTFT sweep of the bench Qwen3.5 on CUDA and its report.
# Results land in $GPU_CHECK_OUT (default <repo>/target/gpu-check), and also under $OUT when that
# is set. Exits non-zero when any step fails.
#
# Environment: GPU_CHECK_OUT, GPU_CHECK_LENGTHS (sweep prompt lengths, default
# 64,256,1024,4096), GPU_CHECK_REPEATS (default 3), GPU_CHECK_BLESS=1, GPU_CHECK_MLX=1 (also
# build `--features mlx-cuda` against the full `mlx[cuda13]` wheel (~2 GB) and sweep
# backend=mlx beside backend=cuda; adds several minutes).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
out="${GPU_CHECK_OUT:-$root/target/gpu-check}"
lengths="${GPU_CHECK_LENGTHS:-64,256,1024,4096}"
repeats="${GPU_CHECK_REPEATS:-3}"
mkdir -p "$out"
export PATH="$HOME/.cargo/bin:$PATH"
start=$(date +%s)
step() { echo; echo "== gpu-check [$(( $(date +%s) - start ))s]: $*"; }

step "GPU and driver"
nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv | tee "$out/gpu.csv"

step "NVRTC and cuBLAS from PyPI (matching the driver)"
libs="$(bash ci/cuda/setup.sh --runtime | tail -n 1)"
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"

step "cargo build --release --features cuda"
cargo build --release -p engine -p harness --features cuda
H="$root/target/release/harness"

if [ "${GPU_CHECK_BLESS:-}" = 1 ]; then
    step "bless goldens/cuda-<gpu> (commit the folder)"
    "$H" golden bless --backend cuda | tee "$out/goldens-bless.txt"
fi

step "the CUDA tests on the GPU (conformance, NVRTC, parity, goldens)"
export CUDA_CONFORMANCE_REQUIRED=1 CUDA_NVRTC_REQUIRED=1
{
    cargo test --release --features cuda -p kernels --test cuda --lib -- --nocapture
    cargo test --release --features cuda -p engine --lib --test engine -p harness --test harness \
        -- cuda --nocapture
} 2>&1 | tee "$out/tests.txt"

step "parity CPU vs CUDA (tiny Qwen3, tiny Qwen3.5 per step and chunked)"
"$H" parity --synth qwen3:tiny --a backend=cpu --b backend=cuda | tee "$out/parity.txt"
for gdn in perstep chunked; do
    "$H" parity --synth qwen3_5:tiny --a "backend=cpu+gdn=$gdn" --b "backend=cuda+gdn=$gdn" \
        | tee -a "$out/parity.txt"
done

step "TTFT sweep on CUDA: per-step vs chunked Gated DeltaNet, bench Qwen3.5 bf16"
rm -f "$out/sweep.jsonl"
"$H" sweep --synth qwen3_5:bench:bf16 --lengths "$lengths" \
    --paths backend=cuda+gdn=perstep,backend=cuda+gdn=chunked --repeats "$repeats" --max-repeats "$repeats" \
    --out "$out/sweep.jsonl"
"$H" report "$out/sweep.jsonl" --baseline backend=cuda+gdn=perstep \
    --compare backend=cuda+gdn=chunked --out "$out/report"
cat "$out/report/report.md"

if [ "${GPU_CHECK_MLX:-}" = 1 ]; then
    step "MLX on MLX's CUDA build: build, then sweep backend=mlx beside backend=cuda"
    cmake_dir="$(MLX_VENV="$root/target/mlx-cuda-full-venv" MLX_WHEEL='mlx[cuda13]==0.32.2' \
        bash ci/mlx/setup.sh | tail -n 1)"
    MLX_CMAKE_DIR="$cmake_dir" cargo build --release -p harness --features cuda,mlx-cuda
    "$H" sweep --synth qwen3_5:bench:bf16 \
        --lengths 64,256,1024 --paths backend=cuda+gdn=chunked,backend=mlx+gdn=chunked \
        --repeats "$repeats" --max-repeats "$repeats" --out "$out/sweep-mlx.jsonl"
    "$H" report "$out/sweep-mlx.jsonl" \
        --baseline backend=mlx+gdn=chunked --compare backend=cuda+gdn=chunked \
        --out "$out/report-cuda-vs-mlx"
fi

if [ -n "${OUT:-}" ] && [ "$OUT" != "$out" ]; then
    cp -r "$out/." "$OUT/"
fi
step "done: $out"
