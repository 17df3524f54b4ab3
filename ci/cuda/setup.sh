#!/usr/bin/env bash
# Installs the CUDA libraries the native CUDA backend loads at run time (cudarc's dynamic
# loading), from NVIDIA's PyPI wheels into a venv, and prints the directories to put on
# LD_LIBRARY_PATH (colon-separated) on its last line. No CUDA toolkit is needed.
#
#   bash ci/cuda/setup.sh             NVRTC only, pinned: what the NVRTC compile test needs
#                                     (CI, any machine, no GPU)
#   bash ci/cuda/setup.sh --runtime   NVRTC and cuBLAS matching the driver's CUDA version
#                                     (read from nvidia-smi): what `--backend cuda` needs.
#                                     NVRTC must not be newer than the driver, whose JIT
#                                     finishes NVRTC's PTX; CUDA 12 drivers get the -cu12 wheels
#                                     (cudarc falls back to the .so.12 names).
# Safe to rerun: an existing venv is reused.
#
# Environment:
#   CUDA_VENV            where the venv goes (default: <repo>/target/cuda-venv, ignored by git)
#   CUDA_NVRTC_VERSION   NVRTC wheel of the compile test (default 13.5.37)
#   PYTHON               interpreter used to create the venv (default: python3)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
venv="${CUDA_VENV:-$root/target/cuda-venv}"
python="${PYTHON:-python3}"
log() { echo "cuda setup: $*" >&2; }

if ! command -v "$python" >/dev/null 2>&1; then
    log "$python not found: a Python 3 (with venv) is needed to install NVIDIA's wheels"
    exit 1
fi
if [ ! -x "$venv/bin/pip" ]; then
    log "creating venv $venv"
    mkdir -p "$(dirname "$venv")"
    "$python" -m venv "$venv"
fi

if [ "${1:-}" = --runtime ]; then
    if ! command -v nvidia-smi >/dev/null 2>&1; then
        log "nvidia-smi not found: --runtime needs an NVIDIA driver"
        exit 1
    fi
    version="$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9]*\)\.\([0-9]*\).*/\1.\2/p' | head -n 1)"
    major="${version%%.*}"
    minor="${version#*.}"
    log "driver supports CUDA $version"
    case "$major" in
        13) wheels=("nvidia-cuda-nvrtc==13.$minor.*" "nvidia-cublas==13.*") ;;
        12) wheels=("nvidia-cuda-nvrtc-cu12==12.$minor.*" "nvidia-cublas-cu12==12.*") ;;
        *)
            log "CUDA $version is not supported (the backend is built for CUDA 13, and runs on 12)"
            exit 1
            ;;
    esac
else
    wheels=("nvidia-cuda-nvrtc==${CUDA_NVRTC_VERSION:-13.5.37}")
fi
log "installing ${wheels[*]} into $venv"
"$venv/bin/pip" install --quiet "${wheels[@]}" >&2

site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
dirs="$(find "$site/nvidia" -mindepth 2 -maxdepth 2 -type d -name lib | sort | paste -sd: -)"
if [ -z "$dirs" ]; then
    log "no nvidia/*/lib directory under $site"
    exit 1
fi
log "ready: $(find "$site/nvidia" -name 'lib*.so*' -printf '%f ' | head -c 300)"
echo "$dirs"
