#!/usr/bin/env bash
# Rewrites the native-dtype references in goldens/oracle/mlx-written-native/: mlx-lm on MLX's CPU
# device running each non-f32 mlx-written fixture as plain mlx_lm.load leaves it (bf16 stays bf16,
# quantized stays packed with its stored scales): what our MLX backend's native path
# (`--numerics fast` on MLX) is checked against. Made with the MLX the engine links
# (ci/mlx/setup.sh's mlx[cpu]==0.32.2 wheel), so both sides run the same MLX kernels.
#
# Usage: PY=/path/to/venv/bin/python bash harness/oracle/regenerate_native.sh
#   where the venv holds mlx[cpu]==0.32.2 and mlx-lm==0.32.2 (e.g. `python3 -m venv v &&
#   v/bin/pip install "mlx[cpu]==0.32.2" mlx-lm==0.32.2 transformers==5.23.0`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="${PY:-$here/.venv/bin/python}"
[ -x "$py" ] || { echo "no python at $py: set PY to a venv with mlx[cpu]==0.32.2 and mlx-lm==0.32.2" >&2; exit 1; }
"$py" -c 'import mlx.core as mx, sys; sys.exit(0 if mx.__version__ == "0.32.2" else f"mlx {mx.__version__}: the engine links 0.32.2")'

mapfile -t short < <("$py" "$here/prompt_args.py" short)
mapfile -t long < <("$py" "$here/prompt_args.py" long)
cd "$repo"
for dir in engine/tests/fixtures/mlx-written/*/; do
    name="$(basename "$dir")"
    case "$name" in *-f32) continue ;; esac
    case "$name" in qwen3-*) args=("${short[@]}") ;; *) args=("${long[@]}") ;; esac
    "$py" "$here/reference.py" --native --model "engine/tests/fixtures/mlx-written/$name" \
        "${args[@]}" --max-tokens 24 --top 8 \
        --out "$repo/goldens/oracle/mlx-written-native/$name.json"
done
