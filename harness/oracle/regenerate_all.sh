#!/usr/bin/env bash
# Rewrites every stored mlx reference: the mlx-written fixture folders, their greedy references in
# goldens/oracle/mlx-written/, the references of the synthetic checkpoints in goldens/oracle/synth/
# (folders rewritten first by the harness binary, into the harness cache that `harness oracle
# check` and cargo test read), and the quantization byte-exactness fixtures in
# kernels/tests/fixtures/quant/. Run after `bash harness/oracle/setup.sh`. Deterministic: rerunning
# with the pinned requirements must leave `git status` clean.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
py="$here/.venv/bin/python"
[ -x "$py" ] || { echo "no venv: run bash harness/oracle/setup.sh first" >&2; exit 1; }

"$py" "$here/make_mlx_fixtures.py" --out "$repo/engine/tests/fixtures/mlx-written"
"$py" "$here/make_mlx_qwen35_fixtures.py" --out "$repo/engine/tests/fixtures/mlx-written"
"$py" "$here/make_mlx_lfm2_fixtures.py" --out "$repo/engine/tests/fixtures/mlx-written"
"$py" "$here/make_quant_fixtures.py" --out "$repo/kernels/tests/fixtures/quant"

# Prompt arguments (prompt_args.py): the Qwen3 references take the short id prompts and the
# chat messages; Qwen3.5 and LFM2 add the long id prompts; synthetic references take the id
# prompts only (7, 70 and 300 ids), for every family.
mapfile -t prompt_args < <("$py" "$here/prompt_args.py" short)
mapfile -t prompt_args_long < <("$py" "$here/prompt_args.py" long)
mapfile -t prompt_args_ids < <("$py" "$here/prompt_args.py" ids)
cd "$repo"
for dir in "$repo"/engine/tests/fixtures/mlx-written/qwen3-*/; do
    name="$(basename "$dir")"
    "$py" "$here/reference.py" --model "engine/tests/fixtures/mlx-written/$name" \
        "${prompt_args[@]}" --max-tokens 24 --top 8 \
        --out "$repo/goldens/oracle/mlx-written/$name.json"
done
# LFM2 (short-conv hybrid): the long prompts too, so the conv state crosses 300 positions.
for dir in "$repo"/engine/tests/fixtures/mlx-written/qwen3_5-*/ "$repo"/engine/tests/fixtures/mlx-written/lfm2-*/; do
    name="$(basename "$dir")"
    "$py" "$here/reference.py" --model "engine/tests/fixtures/mlx-written/$name" \
        "${prompt_args_long[@]}" --max-tokens 24 --top 8 \
        --out "$repo/goldens/oracle/mlx-written/$name.json"
done

# Synthetic checkpoints: the harness (re)writes each into its cache and prints SPEC, folder and
# checkpoint hash; the hash goes into the reference so a later synthesiser change is reported as
# "checkpoint changed, regenerate" instead of a numerics failure.
harness="${HARNESS:-}"
if [ -z "$harness" ]; then
    cargo build --release -p harness --bin harness --quiet
    harness="${CARGO_TARGET_DIR:-$repo/target}/release/harness"
fi
mkdir -p "$repo/goldens/oracle/synth"
folders="$("$harness" oracle prepare)"
while IFS=$'\t' read -r spec dir sha; do
    "$py" "$here/reference.py" --model "$dir" --label "synth:$spec" --synth "$spec" \
        --checkpoint-sha256 "$sha" "${prompt_args_ids[@]}" --max-tokens 24 --top 8 \
        --out "$repo/goldens/oracle/synth/${spec//:/-}.json"
done <<< "$folders"
