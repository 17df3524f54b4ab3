#!/usr/bin/env bash
# The CPU backend on aarch64 (DGX Spark's Grace, Apple Silicon, Graviton), checked on an x86-64
# machine: cross-builds the test binaries for aarch64-unknown-linux-gnu and runs them under
# qemu-user, so the aarch64 code paths (gemm's NEON kernels, the portable fallbacks of our
# x86-only kernels) are executed, not only compiled.
#
# Installs what it needs when missing: the Rust target (rustup), Debian's cross linker
# (gcc-aarch64-linux-gnu with libc6-dev-arm64-cross) and qemu-user (apt-get, as root or through
# sudo). Uses its own target dir (target/aarch64).
#
# What runs (chosen for coverage per emulated second, see ci/README.md for the timings):
#   kernels: ops (every op vs f64 references), matmul (dense/bf16/quantized vs references),
#            quant (MLX quantization formats);
#   engine:  loading (safetensors, configs, tokenizer), qwen3_5 (layers vs references,
#            per-step vs chunked);
#   harness: golden (the CPU goldens byte-identical on aarch64, tiny models, both families).
# Environment: AARCH64_TESTS overrides the cargo test selection.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
target=aarch64-unknown-linux-gnu
start=$(date +%s)

as_root() {
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi
}

echo "== aarch64: tools (rust target, cross gcc, qemu-user)"
if ! rustup target list --installed | grep -qx "$target"; then
    rustup target add "$target"
fi
if ! command -v aarch64-linux-gnu-gcc >/dev/null 2>&1 || ! command -v qemu-aarch64 >/dev/null 2>&1; then
    as_root apt-get update -qq
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user >/dev/null
fi
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR_AARCH64:-$root/target/aarch64}"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
# The synthetic checkpoints are target-independent: share the host's cache.
export HARNESS_CACHE="${HARNESS_CACHE:-$root/target/harness-cache}"
read -r -a tests <<< "${AARCH64_TESTS:--p kernels --test ops --test matmul --test quant -p engine --test loading --test qwen3_5 -p harness --test golden}"
t1=$(date +%s)

echo "== aarch64: build (cargo test --release --target $target --no-run)"
cargo test --release --target "$target" "${tests[@]}" --no-run
t2=$(date +%s)

echo "== aarch64: tests under qemu"
cargo test --release --target "$target" "${tests[@]}"
t3=$(date +%s)
echo "aarch64: tools $((t1 - start))s, build $((t2 - t1))s, tests under qemu $((t3 - t2))s"
