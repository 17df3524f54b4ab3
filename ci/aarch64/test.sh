#!/usr/bin/env bash
# The CPU backend on aarch64 (DGX Spark's Grace, Apple Silicon, Graviton), checked on an x86-64
# machine: cross-builds the test binaries for aarch64-unknown-linux-gnu and runs them under
# qemu-user, so the aarch64 code paths (gemm's NEON kernels, the portable fallbacks of our
# x86-only kernels) are executed, not only compiled.
#
# Installs what it needs when missing: the Rust target (rustup), Debian's cross linker
# (gcc-aarch64-linux-gnu with libc6-dev-arm64-cross) and qemu-user (apt-get, as root or through
# sudo). Shares the CPU suite's target dir (the aarch64 artifacts go to its
# aarch64-unknown-linux-gnu/ folder) and its synthetic-checkpoint cache, which is the same on
# every target.
#
# What runs (chosen for coverage per emulated second):
#   kernels: ops (every op vs f64 references), matmul (dense/bf16/quantized vs references on
#            every instruction-set level qemu reports), quant and mlx_quant (the quantization
#            formats);
#   engine:  loading (safetensors, configs, tokenizer), qwen3_5 (layers vs references,
#            per-step vs chunked);
#   harness: golden (the CPU goldens byte-identical on aarch64, tiny models, every family).
# Environment: AARCH64_KERNELS, AARCH64_ENGINE, AARCH64_HARNESS override each crate's test
# filters (space-separated libtest filters; empty skips the crate).
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
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu"
export HARNESS_CACHE="${HARNESS_CACHE:-$CARGO_TARGET_DIR/harness-cache}"
declare -A filters=(
    [kernels]="${AARCH64_KERNELS-ops:: matmul:: quant::}"
    [engine]="${AARCH64_ENGINE-loading:: qwen3_5::}"
    [harness]="${AARCH64_HARNESS-golden::}"
)
# One package selection for every cargo call: cargo resolves features per selection, so a
# narrower one would rebuild dependencies with other features.
# Without the engine's `serve` feature: the HTTP server is portable Rust (tokio, axum) that the
# x86-64 stages test, and building its dependencies under the cross compiler cost ~45 s.
pkgs=(-p kernels -p engine -p harness --no-default-features --features engine/alloc-budget)
selected=()
for crate in kernels engine harness; do
    if [ -n "${filters[$crate]}" ]; then selected+=(--test "$crate"); fi
done
t1=$(date +%s)

echo "== aarch64: build (cargo test --release --target $target --no-run)"
cargo test --release --target "$target" "${pkgs[@]}" "${selected[@]}" --no-run
t2=$(date +%s)

echo "== aarch64: tests under qemu"
for crate in kernels engine harness; do
    [ -n "${filters[$crate]}" ] || continue
    read -r -a f <<< "${filters[$crate]}"
    cargo test --release --target "$target" "${pkgs[@]}" --test "$crate" -- "${f[@]}"
done
t3=$(date +%s)
echo "aarch64: tools $((t1 - start))s, build $((t2 - t1))s, tests under qemu $((t3 - t2))s"
