#!/usr/bin/env bash
# macOS only: `engine generate --backend metal` on a synthetic Qwen3.5 must print the same 16
# greedy tokens as `--backend cpu` (the issue's end-to-end check, through the CLI).
# Run after ci/backends/test.sh (reuses its MLX venv and the shared target dir).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
export MLX_CMAKE_DIR="$(target/mlx-venv/bin/python -m mlx --cmake-dir)"
cargo build --release -p engine -p harness --features metal
bin="$CARGO_TARGET_DIR/release"
dir="$(mktemp -d)/qwen3_5-tiny-bf16"
"$bin/harness" synth --family qwen3_5 --size tiny --format bf16 --seed 1 --out "$dir"
ids="$(seq -s, 1 80)"
for b in cpu metal; do
    "$bin/engine" generate --model "$dir" --prompt-ids "$ids" --max-tokens 16 --ignore-eos \
        --backend "$b" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"])' \
        > "$dir.$b"
done
echo "cpu:   $(cat "$dir.cpu")"
echo "metal: $(cat "$dir.metal")"
cmp "$dir.cpu" "$dir.metal"
