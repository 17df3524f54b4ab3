#!/usr/bin/env bash
# Rewrites every stored mlx reference: the mlx-written fixture folders, their greedy references in
# goldens/oracle/mlx-written/, and the quantization byte-exactness fixtures in
# kernels/tests/fixtures/quant/. Run after `bash harness/oracle/setup.sh`. Deterministic: rerunning
# with the pinned requirements must leave `git status` clean.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="$here/.venv/bin/python"
[ -x "$py" ] || { echo "no venv: run bash harness/oracle/setup.sh first" >&2; exit 1; }

"$py" "$here/make_mlx_fixtures.py" --out "$repo/engine/tests/fixtures/mlx-written"
"$py" "$here/make_mlx_qwen35_fixtures.py" --out "$repo/engine/tests/fixtures/mlx-written"
"$py" "$here/make_quant_fixtures.py" --out "$repo/kernels/tests/fixtures/quant"

# Prompt arguments from prompts.json: each id list, then each chat message. The Qwen3.5 references
# add the long id prompts (after the short ones); the Qwen3 ones keep only the short ones.
prompt_args_from() {
    "$py" - "$here/prompts.json" "$1" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for ids in p["prompt_ids"] + (p["long_prompt_ids"] if sys.argv[2] == "long" else []):
    print("--prompt-ids"); print(",".join(map(str, ids)))
for msg in p["chat"]:
    print("--chat"); print(msg)
PY
}
mapfile -t prompt_args < <(prompt_args_from short)
mapfile -t prompt_args_long < <(prompt_args_from long)
cd "$repo"
for dir in "$repo"/engine/tests/fixtures/mlx-written/qwen3-*/; do
    name="$(basename "$dir")"
    "$py" "$here/reference.py" --model "engine/tests/fixtures/mlx-written/$name" \
        "${prompt_args[@]}" --max-tokens 24 --top 8 \
        --out "$repo/goldens/oracle/mlx-written/$name.json"
done
for dir in "$repo"/engine/tests/fixtures/mlx-written/qwen3_5-*/; do
    name="$(basename "$dir")"
    "$py" "$here/reference.py" --model "engine/tests/fixtures/mlx-written/$name" \
        "${prompt_args_long[@]}" --max-tokens 24 --top 8 \
        --out "$repo/goldens/oracle/mlx-written/$name.json"
done
