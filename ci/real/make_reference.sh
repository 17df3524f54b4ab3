#!/usr/bin/env bash
# Makes goldens/real/<KEY>.json for a checkpoint folder with ci/real/reference.py, in a venv of
# ci/real/requirements.txt (target/real-venv): transformers and torch (CPU) in float32, or
# mlx-lm for MLX-quantized folders. Review the file (the texts it prints), then commit it.
#
# Usage: bash ci/real/make_reference.sh DIR KEY SOURCE REVISION [transformers|mlx-lm]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
[ $# -ge 4 ] || { sed -n '2,6p' "$0"; exit 2; }
dir="$1" key="$2" source="$3" revision="$4" tool="${5:-transformers}"
venv="${REAL_VENV:-$root/target/real-venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
"$venv/bin/pip" install --quiet -r "$root/ci/real/requirements.txt"
"$venv/bin/python" "$root/ci/real/reference.py" --model "$dir" --key "$key" --tool "$tool" \
    --source "$source" --revision "$revision" --out "$root/goldens/real/$key.json"
echo "wrote goldens/real/$key.json"
