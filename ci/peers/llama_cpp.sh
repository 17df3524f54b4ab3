#!/usr/bin/env bash
# Fetch llama.cpp's source (vendored in the llama-cpp-python sdist on PyPI) and build
# llama-bench + llama-quantize twice: native (-march=native) and capped to AVX2 (the second
# only where the CPU has AVX-512; elsewhere native is that cap).
#
# Usage: bash ci/peers/llama_cpp.sh            (uses $PEERS_DIR, default target/peers)
# Idempotent: every step is skipped when its output exists. Prints nothing on success
# except progress lines; the build logs go to $PEERS_DIR/logs/.
#
# Env: PEERS_DIR, LLAMA_CPP_PY_VERSION (default: newest on PyPI), PEERS_JOBS (default nproc).
# PEERS_LLAMA_SERVER=1 builds llama-server instead (native, from the same source; for
# `harness bench-serve`, docs/serve.md) and installs only the build tools.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
PEERS_DIR=${PEERS_DIR:-$REPO/target/peers}
JOBS=${PEERS_JOBS:-$(nproc)}
VENV=$PEERS_DIR/venv
mkdir -p "$PEERS_DIR"/{sdist,src,logs,build}
log() { printf '[peers %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# 1. A venv with the build tools and the converter's dependencies. The vendored converter
#    imports torch at the top (its lazy tensors), so torch is installed too: PyPI's Linux wheel,
#    run on the CPU only.
if [ ! -x "$VENV/bin/python" ]; then
  log "creating venv $VENV"
  python3 -m venv "$VENV"
fi
SERVER_ONLY=${PEERS_LLAMA_SERVER:-0}
if [ "$SERVER_ONLY" = 1 ]; then
  "$VENV/bin/python" -c 'import cmake, ninja' 2>/dev/null || "$VENV/bin/pip" install -q cmake ninja
elif ! "$VENV/bin/python" -c 'import cmake, ninja, numpy, torch' 2>/dev/null; then
  log "pip install build tools + converter deps (torch: a large download, once)"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q cmake ninja numpy sentencepiece safetensors "transformers" matplotlib torch
fi
export PATH=$VENV/bin:$PATH

# 2. The sdist. `--no-binary llama-cpp-python` (not :all:, which would also build cmake
#    and ninja from source for the build backend) gives the .tar.gz with vendor/llama.cpp.
SPEC=llama-cpp-python${LLAMA_CPP_PY_VERSION:+==$LLAMA_CPP_PY_VERSION}
SDIST=$(ls "$PEERS_DIR"/sdist/llama_cpp_python-*.tar.gz 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$SDIST" ] || { [ -n "${LLAMA_CPP_PY_VERSION:-}" ] && [[ "$SDIST" != *-"$LLAMA_CPP_PY_VERSION".tar.gz ]]; }; then
  log "pip download $SPEC (sdist)"
  "$VENV/bin/pip" download -q --no-deps --no-binary llama-cpp-python "$SPEC" -d "$PEERS_DIR/sdist"
  SDIST=$(ls "$PEERS_DIR"/sdist/llama_cpp_python-*.tar.gz | sort -V | tail -1)
fi
PYVER=$(basename "$SDIST" .tar.gz); PYVER=${PYVER#llama_cpp_python-}
SRC=$PEERS_DIR/src/llama_cpp_python-$PYVER/vendor/llama.cpp
if [ ! -f "$SRC/CMakeLists.txt" ]; then
  log "unpacking $SDIST"
  tar xzf "$SDIST" -C "$PEERS_DIR/src"
fi
# The gguf package that matches the converter is the one vendored next to it.
if [ "$SERVER_ONLY" != 1 ] && ! "$VENV/bin/python" -c "import gguf,sys; sys.exit(0 if gguf.__file__.startswith('$SRC') else 1)" 2>/dev/null; then
  "$VENV/bin/pip" install -q -e "$SRC/gguf-py"
fi

# 3. Two builds. Only the two targets; no tests/examples/server, no HTTPS (the tools
#    never download here). OpenMP stays on (llama.cpp's default threadpool on Linux).
COMMON=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
        -DLLAMA_BUILD_SERVER=OFF -DGGML_OPENMP=ON -DGGML_BACKEND_DL=OFF -DGGML_CPU_ALL_VARIANTS=OFF)
NATIVE=(-DGGML_NATIVE=ON)
NATIVE_NAME=native
# ggml's AMX kernels (Q4_0/Q8_0 prefill on Sapphire Rapids and later) segfault in
# ggml_backend_amx_mul_mat on the VMs this runs on (llama-bench -p 512 on Q4_0; gdb shows it), so
# where the CPU has AMX the native build leaves it out unless PEERS_LLAMA_AMX=1. Everything else
# -march=native gives (AVX-512 VNNI/BF16, weight repacking) stays on; bf16 never used AMX.
if [ "${PEERS_LLAMA_AMX:-0}" != 1 ] && grep -qw amx_int8 /proc/cpuinfo; then
  NOAMX="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  NATIVE+=("-DCMAKE_C_FLAGS=$NOAMX" "-DCMAKE_CXX_FLAGS=$NOAMX")
  NATIVE_NAME=native-noamx
fi
AVX2=(-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
      -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF
      -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF)
TARGETS=(llama-bench llama-quantize)
build() {  # build NAME FLAGS...
  local name=$1; shift
  local dir=$PEERS_DIR/build/$PYVER-$name t present=1
  for t in "${TARGETS[@]}"; do [ -x "$dir/bin/$t" ] || present=0; done
  if [ "$present" = 1 ]; then
    log "llama.cpp $name build present: $dir/bin"; return; fi
  log "building llama.cpp ($name) in $dir; log: $PEERS_DIR/logs/build-$name.log"
  local t0=$SECONDS
  cmake -S "$SRC" -B "$dir" "${COMMON[@]}" "$@" >"$PEERS_DIR/logs/build-$name.log" 2>&1
  cmake --build "$dir" -j "$JOBS" --target "${TARGETS[@]}" >>"$PEERS_DIR/logs/build-$name.log" 2>&1 \
    || { tail -30 "$PEERS_DIR/logs/build-$name.log" >&2; exit 1; }
  log "built $name in $((SECONDS - t0)) s"
}
# One builder at a time (a second run.sh waits here instead of building into the same folder).
exec 9>"$PEERS_DIR/build/.lock"
flock 9
if [ "$SERVER_ONLY" = 1 ]; then
  TARGETS=(llama-server llama-quantize)
  COMMON=("${COMMON[@]/-DLLAMA_BUILD_SERVER=OFF/-DLLAMA_BUILD_SERVER=ON}")
  build "$NATIVE_NAME-server" "${NATIVE[@]}"
  log "llama-server ready: $PEERS_DIR/build/$PYVER-$NATIVE_NAME-server/bin/llama-server"
  exit 0
fi
build "$NATIVE_NAME" "${NATIVE[@]}"
# The AVX2-capped build differs from the native one only where the CPU has AVX-512; on an
# AVX2-only host the native build is that cap, so it is not built twice (PEERS_LLAMA_AVX2=1
# builds it anyway) and LLAMA_BIN_AVX2 stays empty: run.sh then runs the native rows only.
AVX2_BIN=
if grep -qw avx512f /proc/cpuinfo || [ "${PEERS_LLAMA_AVX2:-0}" = 1 ]; then
  build avx2 "${AVX2[@]}"
  AVX2_BIN=$PEERS_DIR/build/$PYVER-avx2/bin
fi

# What the rest of the scripts read.
cat >"$PEERS_DIR/llama_cpp.env" <<ENV
LLAMA_CPP_PY_VERSION=$PYVER
LLAMA_CPP_SRC=$SRC
LLAMA_BIN_NATIVE=$PEERS_DIR/build/$PYVER-$NATIVE_NAME/bin
LLAMA_BIN_AVX2=$AVX2_BIN
ENV
log "llama.cpp ready (llama-cpp-python $PYVER); see $PEERS_DIR/llama_cpp.env"
