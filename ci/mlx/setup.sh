#!/usr/bin/env bash
# Prepares what the MLX backend (cargo feature `mlx`) needs to build on Linux or macOS, and
# prints the MLX cmake dir on its last line:
#   - a Python venv holding the pinned MLX wheel and cmake (both from PyPI);
#   - on Debian/Ubuntu, libclang-dev for bindgen (apt-get, only when missing and run as root);
#   - mlx-c's sources, which ship inside the published mlx-sys 0.7.0 crate: `cargo fetch` of a
#     throwaway manifest brings that crate into the cargo registry, where mlx-sys/build.rs finds
#     it. (They are never copied into this repository.)
# Safe to rerun: existing pieces are reused.
#
# Environment:
#   MLX_VENV    where the venv goes (default: <repo>/target/mlx-venv, ignored by git)
#   MLX_WHEEL   the pip requirement(s), space-separated (default: mlx[cpu]==0.32.2 on Linux,
#               mlx==0.32.2 on macOS, which pulls mlx-metal). mlx-c 0.7.0 matches MLX 0.32.2
#               exactly; 0.32.4 changed one gather_qmm signature and does not compile against
#               it. On NVIDIA Linux (DGX Spark): 'mlx[cuda13]==0.32.2', MLX's CUDA 13 build
#               with its CUDA libraries from PyPI; build with `--features mlx-cuda`.
#   MLX_NO_DEPS=1  install the wheel(s) without their dependencies: enough to compile and link
#               against MLX, not to run it. ci/cuda/mlx_link.sh links the CUDA build this way
#               (mlx==0.32.2 mlx-cuda-13==0.32.2, 90 MB instead of the ~2 GB of CUDA libraries
#               that are of no use without a GPU).
#   PYTHON      interpreter used to create the venv (default: python3)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${MLX_VENV:-$root/target/mlx-venv}"
python="${PYTHON:-python3}"
if [ "$(uname -s)" = Darwin ]; then
    wheel="${MLX_WHEEL:-mlx==0.32.2}"
else
    wheel="${MLX_WHEEL:-mlx[cpu]==0.32.2}"
fi

log() { echo "mlx setup: $*" >&2; }

# bindgen loads libclang at build time.
if [ "$(uname -s)" = Linux ] && ! ls /usr/lib/llvm-*/lib/libclang.so >/dev/null 2>&1 \
    && ! ls /usr/lib/*/libclang*.so >/dev/null 2>&1; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        log "installing libclang-dev (for bindgen)"
        apt-get update -qq >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-dev >&2
    else
        log "libclang not found: install your distribution's libclang-dev (needed by bindgen)"
        exit 1
    fi
fi

if [ ! -x "$venv/bin/python" ]; then
    log "creating venv $venv"
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
fi
log "installing $wheel and cmake into $venv${MLX_NO_DEPS:+ (without dependencies)}"
# $wheel is split on spaces on purpose: it may name several requirements.
# shellcheck disable=SC2086
"$venv/bin/pip" install --quiet ${MLX_NO_DEPS:+--no-deps} $wheel "cmake>=3.24,<4" >&2

# mlx-c sources: the published mlx-sys crate, fetched into the cargo registry.
fetch="$root/target/mlx-sys-fetch"
mkdir -p "$fetch/src"
cat > "$fetch/Cargo.toml" <<'TOML'
[package]
name = "mlx-sys-fetch"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
mlx-sys = "=0.7.0"

[workspace]
TOML
: > "$fetch/src/lib.rs"
log "fetching mlx-sys 0.7.0 (mlx-c sources) into the cargo registry"
cargo fetch --quiet --manifest-path "$fetch/Cargo.toml" >&2

if [ -n "${MLX_NO_DEPS:-}" ]; then
    # `python -m mlx` imports mlx.core, which needs the dependencies left out: the prefix is
    # the installed package's folder.
    cmake_dir="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"] + "/mlx")')"
    log "ready (link only): $(ls "$cmake_dir"/lib), $("$venv/bin/cmake" --version | head -1)"
else
    cmake_dir="$("$venv/bin/python" -m mlx --cmake-dir)"
    log "ready: $("$venv/bin/python" -c 'import mlx.core as mx; print("mlx", mx.__version__)'),"\
" $("$venv/bin/cmake" --version | head -1)"
fi
echo "$cmake_dir"
